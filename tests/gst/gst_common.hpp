// gst_common.hpp - what the GStreamer plugin's tests share: GStreamer set up once,
// pipelines run and torn down with bounded waits, and frames compared pixel by pixel.
#pragma once

#include "../common.hpp"

#include <gst/app/gstappsink.h>
#include <gst/app/gstappsrc.h>
#include <gst/gst.h>
#include <gst/video/video.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace xmem::gsttest {

using namespace std::chrono_literals;

// A test with GStreamer initialised and its own XDG_RUNTIME_DIR, so plain pool
// names never collide with other tests, here or in the processes they spawn.
class GstTest : public ::testing::Test
{
protected:
	void SetUp() override
	{
		gst_init(nullptr, nullptr);
		GstElementFactory *factory = gst_element_factory_find("xmemsink");
		ASSERT_NE(factory, nullptr)
			<< "the xmem plugin is not found: is GST_PLUGIN_PATH set to the build's gst/ folder?";
		gst_object_unref(factory);
	}

	xmem::test::RuntimeDir dir_;
};

// The path in environment variable NAME (set by tests/gst/meson.build), or "".
inline std::string tool_path(const char *name)
{
	const char *p = std::getenv(name);
	return p && *p ? p : "";
}

// The error a bus message carries, as "message | debug".
struct ErrorText {
	std::string message;
	std::string debug;
	std::string source;
	GQuark domain = 0;
	int code = 0;
	std::string all() const { return message + " | " + debug; }
	// all(), lower-cased, for matching words whatever their case.
	std::string lower() const
	{
		std::string out = all();
		for (auto &c : out)
			c = char(g_ascii_tolower(c));
		return out;
	}
};

inline ErrorText parse_error(GstMessage *msg)
{
	ErrorText e;
	GError *error = nullptr;
	gchar *debug = nullptr;
	gst_message_parse_error(msg, &error, &debug);
	if (error) {
		e.message = error->message;
		e.domain = error->domain;
		e.code = error->code;
		g_error_free(error);
	}
	if (debug)
		e.debug = debug;
	g_free(debug);
	if (GST_MESSAGE_SRC(msg))
		e.source = GST_OBJECT_NAME(GST_MESSAGE_SRC(msg));
	return e;
}

// A pipeline from a launch line, set to NULL and freed when it goes out of scope.
class Pipeline
{
public:
	explicit Pipeline(const std::string &description)
	{
		GError *error = nullptr;
		element_ = gst_parse_launch(description.c_str(), &error);
		EXPECT_EQ(error, nullptr) << description << ": " << (error ? error->message : "");
		if (error)
			g_error_free(error);
		if (element_ && !GST_IS_PIPELINE(element_)) {
			// A single element: put it in a pipeline so it has a bus and a clock.
			GstElement *p = gst_pipeline_new(nullptr);
			gst_bin_add(GST_BIN(p), element_);
			element_ = p;
		}
	}
	~Pipeline()
	{
		if (element_) {
			gst_element_set_state(element_, GST_STATE_NULL);
			gst_object_unref(element_);
		}
	}
	Pipeline(const Pipeline &) = delete;
	Pipeline &operator=(const Pipeline &) = delete;

	GstElement *get() const { return element_; }
	explicit operator bool() const { return element_ != nullptr; }
	// Element NAME inside the pipeline (borrowed: the pipeline keeps it alive).
	GstElement *by_name(const char *name) const
	{
		GstElement *e = gst_bin_get_by_name(GST_BIN(element_), name);
		if (e)
			gst_object_unref(e);
		return e;
	}
	GstStateChangeReturn play() { return gst_element_set_state(element_, GST_STATE_PLAYING); }
	GstStateChangeReturn stop() { return gst_element_set_state(element_, GST_STATE_NULL); }

	// The next message of TYPES on the bus, or nullptr after TIMEOUT (caller unrefs).
	GstMessage *pop(GstMessageType types, std::chrono::milliseconds timeout) const
	{
		GstBus *bus = gst_element_get_bus(element_);
		GstMessage *msg = gst_bus_timed_pop_filtered(bus, GstClockTime(timeout.count()) * GST_MSECOND, types);
		gst_object_unref(bus);
		return msg;
	}
	// Waits for EOS or an error: "" on EOS, the error text otherwise.
	std::string wait_eos(std::chrono::milliseconds timeout = 30s) const
	{
		GstMessage *msg = pop(GstMessageType(GST_MESSAGE_EOS | GST_MESSAGE_ERROR), timeout);
		if (!msg)
			return "neither EOS nor an error within the timeout";
		std::string out;
		if (GST_MESSAGE_TYPE(msg) == GST_MESSAGE_ERROR)
			out = "error: " + parse_error(msg).all();
		gst_message_unref(msg);
		return out;
	}
	// The first error posted within TIMEOUT, if any.
	std::optional<ErrorText> wait_error(std::chrono::milliseconds timeout) const
	{
		GstMessage *msg = pop(GST_MESSAGE_ERROR, timeout);
		if (!msg)
			return std::nullopt;
		ErrorText e = parse_error(msg);
		gst_message_unref(msg);
		return e;
	}

private:
	GstElement *element_ = nullptr;
};

inline bool same_caps(const std::string &a, const std::string &b)
{
	GstCaps *ca = gst_caps_from_string(a.c_str());
	GstCaps *cb = gst_caps_from_string(b.c_str());
	bool same = ca && cb && gst_caps_is_equal(ca, cb);
	if (ca)
		gst_caps_unref(ca);
	if (cb)
		gst_caps_unref(cb);
	return same;
}

// A structure property ("stats") as a GstStructure the caller frees.
inline GstStructure *get_stats(GstElement *element)
{
	GstStructure *s = nullptr;
	g_object_get(element, "stats", &s, nullptr);
	return s;
}

// A string field of ELEMENT's stats; "" when it has none.
inline std::string stat_string(GstElement *element, const char *field)
{
	GstStructure *s = get_stats(element);
	std::string v;
	if (const gchar *text = s ? gst_structure_get_string(s, field) : nullptr)
		v = text;
	if (s)
		gst_structure_free(s);
	return v;
}

inline guint64 stat_u64(GstElement *element, const char *field)
{
	GstStructure *s = get_stats(element);
	guint64 v = G_MAXUINT64;
	if (s && !gst_structure_get_uint64(s, field, &v)) {
		guint u;
		if (gst_structure_get_uint(s, field, &u))
			v = u;
	}
	if (s)
		gst_structure_free(s);
	return v;
}

// The visible bytes of a video frame, plane by plane and row by row: what two
// frames must share to look the same, whatever their strides and padding. Empty
// when BUFFER cannot be mapped with INFO (its GstVideoMeta is honoured).
inline std::vector<uint8_t> visible_bytes(GstBuffer *buffer, const GstVideoInfo &info)
{
	std::vector<uint8_t> out;
	GstVideoFrame frame;
	if (!gst_video_frame_map(&frame, const_cast<GstVideoInfo *>(&info), buffer, GST_MAP_READ))
		return out;
	for (guint p = 0; p < GST_VIDEO_FRAME_N_PLANES(&frame); p++) {
		auto *data = static_cast<const uint8_t *>(GST_VIDEO_FRAME_PLANE_DATA(&frame, p));
		gsize row = gsize(GST_VIDEO_FRAME_COMP_WIDTH(&frame, p)) * GST_VIDEO_FRAME_COMP_PSTRIDE(&frame, p);
		for (gint y = 0; y < GST_VIDEO_FRAME_COMP_HEIGHT(&frame, p); y++) {
			const uint8_t *line = data + gsize(y) * gsize(GST_VIDEO_FRAME_PLANE_STRIDE(&frame, p));
			out.insert(out.end(), line, line + row);
		}
	}
	gst_video_frame_unmap(&frame);
	return out;
}

inline GstVideoInfo video_info(const std::string &caps_string)
{
	GstVideoInfo info;
	gst_video_info_init(&info);
	GstCaps *caps = gst_caps_from_string(caps_string.c_str());
	EXPECT_NE(caps, nullptr) << caps_string;
	if (caps) {
		EXPECT_TRUE(gst_video_info_from_caps(&info, caps)) << caps_string;
		gst_caps_unref(caps);
	}
	return info;
}

// What videotestsrc makes of the first N frames with CAPS and PATTERN, in this
// process: the reference that frames which crossed a pool must match.
inline std::vector<std::vector<uint8_t>> reference_frames(const std::string &caps, const std::string &pattern, int n)
{
	std::vector<std::vector<uint8_t>> frames;
	Pipeline p("videotestsrc num-buffers=" + std::to_string(n) + " pattern=" + pattern + " ! " + caps +
		   " ! appsink name=sink sync=false");
	if (!p)
		return frames;
	GstVideoInfo info = video_info(caps);
	EXPECT_NE(p.play(), GST_STATE_CHANGE_FAILURE);
	auto *sink = GST_APP_SINK(p.by_name("sink"));
	while (GstSample *sample = gst_app_sink_try_pull_sample(sink, 10 * GST_SECOND)) {
		frames.push_back(visible_bytes(gst_sample_get_buffer(sample), info));
		gst_sample_unref(sample);
	}
	EXPECT_EQ(int(frames.size()), n) << "reference pipeline for " << caps;
	return frames;
}

// One frame as a consumer's appsink saw it.
struct Received {
	guint64 offset = 0; // the producer's publish sequence number, from 1
	int width = 0;
	int height = 0;
	gsize size = 0; // bytes in the buffer
	gsize caps_size = 0; // bytes a frame of its caps takes (GstVideoInfo.size)
	bool matches = false; // visible bytes equal the expected frame (see Consumer)
};

// An in-process consumer: a launch line ending in "appsink name=sink", pulled by its
// own thread until EOS, an error, or stop(). EXPECTED (optional) gives the visible
// bytes frame OFFSET must have; frames are checked as they arrive, so a slot reused
// under a held buffer is caught.
class Consumer
{
public:
	using Expected = std::function<const std::vector<uint8_t> *(guint64 offset, const GstVideoInfo &info)>;

	explicit Consumer(const std::string &description, Expected expected = {})
		: pipeline_(description), expected_(std::move(expected))
	{
	}
	~Consumer() { stop(); }

	GstElement *src() const { return pipeline_.by_name("src"); }

	bool start()
	{
		if (!pipeline_ || pipeline_.play() == GST_STATE_CHANGE_FAILURE)
			return false;
		thread_ = std::thread([this] { run(); });
		return true;
	}
	// Waits for the thread to finish on its own (EOS or error); false on timeout.
	bool join(std::chrono::milliseconds timeout = 60s)
	{
		if (!xmem::test::eventually([this] { return done_.load(); }, timeout))
			return false;
		if (thread_.joinable())
			thread_.join();
		return true;
	}
	void stop()
	{
		stopping_ = true;
		if (thread_.joinable())
			thread_.join();
		pipeline_.stop();
	}

	size_t count() const { return count_.load(); }
	bool eos() const { return eos_.load(); }
	bool done() const { return done_.load(); }
	std::string error() const
	{
		std::lock_guard lock(lock_);
		return error_;
	}
	std::vector<Received> frames() const
	{
		std::lock_guard lock(lock_);
		return frames_;
	}

private:
	void run()
	{
		auto *sink = GST_APP_SINK(pipeline_.by_name("sink"));
		while (!stopping_ && !take_error()) {
			GstSample *sample = gst_app_sink_try_pull_sample(sink, 50 * GST_MSECOND);
			if (!sample) {
				// A source that fails posts its error, then sends EOS.
				if (gst_app_sink_is_eos(sink)) {
					eos_ = !take_error();
					break;
				}
				continue;
			}
			record(sample);
			gst_sample_unref(sample);
		}
		done_ = true;
	}

	// Whether an error was posted (kept in error_).
	bool take_error()
	{
		GstMessage *msg = pipeline_.pop(GST_MESSAGE_ERROR, 0ms);
		if (!msg)
			return false;
		std::lock_guard lock(lock_);
		error_ = parse_error(msg).all();
		gst_message_unref(msg);
		return true;
	}

	void record(GstSample *sample)
	{
		Received r;
		GstBuffer *buffer = gst_sample_get_buffer(sample);
		r.offset = GST_BUFFER_OFFSET(buffer);
		r.size = gst_buffer_get_size(buffer);
		GstVideoInfo info;
		GstCaps *caps = gst_sample_get_caps(sample);
		if (caps && gst_video_info_from_caps(&info, caps)) {
			r.width = GST_VIDEO_INFO_WIDTH(&info);
			r.height = GST_VIDEO_INFO_HEIGHT(&info);
			r.caps_size = info.size;
			if (expected_) {
				auto bytes = visible_bytes(buffer, info);
				const std::vector<uint8_t> *want = expected_(r.offset, info);
				r.matches = want && !bytes.empty() && *want == bytes;
			}
		}
		std::lock_guard lock(lock_);
		frames_.push_back(std::move(r));
		count_ = frames_.size();
	}

	Pipeline pipeline_;
	Expected expected_;
	std::thread thread_;
	std::atomic<bool> stopping_{ false };
	std::atomic<bool> done_{ false };
	std::atomic<bool> eos_{ false };
	std::atomic<size_t> count_{ 0 };
	mutable std::mutex lock_;
	std::string error_;
	std::vector<Received> frames_;
};

// Offsets missing between consecutive frames (the producer's sequence numbers).
inline guint64 gaps_in(const std::vector<Received> &frames)
{
	guint64 gaps = 0;
	for (size_t i = 1; i < frames.size(); i++)
		if (frames[i].offset > frames[i - 1].offset + 1)
			gaps += frames[i].offset - frames[i - 1].offset - 1;
	return gaps;
}

inline bool strictly_increasing(const std::vector<Received> &frames)
{
	for (size_t i = 1; i < frames.size(); i++)
		if (frames[i].offset <= frames[i - 1].offset)
			return false;
	return true;
}

// Looks a frame up by its offset (the publish sequence number, from 1) in REFERENCE.
inline Consumer::Expected by_offset(const std::vector<std::vector<uint8_t>> &reference)
{
	return [&reference](guint64 offset, const GstVideoInfo &) {
		return offset >= 1 && offset <= reference.size() ? &reference[offset - 1] : nullptr;
	};
}

// A frame whose every visible byte depends on N and position.
inline GstBuffer *painted_frame(const GstVideoInfo &info, unsigned n)
{
	GstBuffer *buffer = gst_buffer_new_allocate(nullptr, info.size, nullptr);
	GstMapInfo map;
	gst_buffer_map(buffer, &map, GST_MAP_WRITE);
	for (gsize i = 0; i < map.size; i++)
		map.data[i] = uint8_t(n * 37 + i * 5 + (i >> 10));
	gst_buffer_unmap(buffer, &map);
	return buffer;
}

// An appsrc producer pushes PER_SIZE frames at each of SIZES, setting new caps each
// time; the consumer must get every frame, each with the caps it was made in.
// xmemsink must have replaced its pool RECREATED times (frames outgrowing its slots
// get a size class instead, while the pool has room for one) and end with CLASSES
// size classes. Without a recreation the consumer never reattaches and frame numbers
// (the pool's seq, as buffer offsets) keep increasing; a recreated pool numbers its
// frames from 1 again.
// SINK_OPTIONS are added to xmemsink's properties, CONSUMER_CAPS (if any) filter what
// xmemsrc gives.
inline void run_caps_changes(const std::string &pool, const std::vector<std::pair<int, int>> &sizes, unsigned per_size,
			     guint64 recreated, guint classes, const std::string &sink_options = "",
			     const std::string &consumer_caps = "")
{
	std::vector<GstVideoInfo> infos;
	for (auto [w, h] : sizes)
		infos.push_back(xmem::gsttest::video_info("video/x-raw,format=RGBA,width=" + std::to_string(w) +
							  ",height=" + std::to_string(h) + ",framerate=30/1"));

	Pipeline producer("appsrc name=src format=time ! xmemsink name=sink pool-name=" + pool +
			  " wait-for-consumers=1 policy=block block-timeout=30000000000 " + sink_options);
	ASSERT_TRUE(producer);
	// The frames come in push order: the consumer checks frame k against the k-th one pushed.
	std::vector<std::vector<uint8_t>> pushed;
	for (size_t s = 0; s < sizes.size(); s++)
		for (unsigned i = 0; i < per_size; i++) {
			GstBuffer *b = painted_frame(infos[s], unsigned(s * per_size + i));
			pushed.push_back(xmem::gsttest::visible_bytes(b, infos[s]));
			gst_buffer_unref(b);
		}
	size_t next = 0;
	Consumer consumer(
		"xmemsrc name=src pool-name=" + pool + " is-live=false ! " +
			(consumer_caps.empty() ? "" : consumer_caps + " ! ") + "appsink name=sink sync=false",
		[&](guint64, const GstVideoInfo &) { return next < pushed.size() ? &pushed[next++] : nullptr; });
	ASSERT_NE(producer.play(), GST_STATE_CHANGE_FAILURE);
	ASSERT_TRUE(consumer.start());

	auto *appsrc = GST_APP_SRC(producer.by_name("src"));
	for (size_t s = 0; s < sizes.size(); s++) {
		GstCaps *caps = gst_video_info_to_caps(&infos[s]);
		gst_app_src_set_caps(appsrc, caps);
		gst_caps_unref(caps);
		for (unsigned i = 0; i < per_size; i++) {
			unsigned n = unsigned(s * per_size + i);
			GstBuffer *b = painted_frame(infos[s], n);
			GST_BUFFER_PTS(b) = n * GST_SECOND / 30;
			GST_BUFFER_DURATION(b) = GST_SECOND / 30;
			ASSERT_EQ(gst_app_src_push_buffer(appsrc, b), GST_FLOW_OK);
		}
	}
	gst_app_src_end_of_stream(appsrc);

	EXPECT_EQ(producer.wait_eos(60s), "") << "producer pipeline";
	ASSERT_TRUE(consumer.join(60s)) << "the consumer saw no EOS; it has " << consumer.count() << " frames";
	EXPECT_EQ(consumer.error(), "");
	auto frames = consumer.frames();
	EXPECT_EQ(frames.size(), pushed.size()) << "frames were lost across the caps changes";
	for (size_t k = 0; k < frames.size() && k < pushed.size(); k++) {
		SCOPED_TRACE("frame " + std::to_string(k));
		auto [w, h] = sizes[k / per_size];
		EXPECT_EQ(frames[k].width, w) << "the frame arrived with the wrong caps";
		EXPECT_EQ(frames[k].height, h);
		EXPECT_EQ(frames[k].size, frames[k].caps_size) << "the buffer does not match its caps' size";
		EXPECT_TRUE(frames[k].matches) << "payload differs";
	}
	EXPECT_EQ(stat_u64(producer.by_name("sink"), "recreated"), recreated) << "pools xmemsink replaced";
	EXPECT_EQ(stat_u64(producer.by_name("sink"), "classes"), classes) << "size classes of the last pool";
	if (recreated == 0) {
		EXPECT_EQ(stat_u64(consumer.src(), "reconnects"), 0u) << "the consumer had to reattach";
		EXPECT_TRUE(strictly_increasing(frames));
	}
}

} // namespace xmem::gsttest
