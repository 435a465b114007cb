// test_metas.cpp - GstMetas across a pool: the same metas out of xmemsrc, in another
// process, as went into xmemsink; the side data budget; hostile side data refused.
// The producer process is this program again (--metas-producer), so it can add metas.
#include "gst_common.hpp"
#include "layout.hpp"

#include <gst/gstmeta.h>
#include <gst/rtp/rtp.h>

#include <climits>
#include <condition_variable>
#include <unistd.h>

using namespace std::chrono_literals;
using xmem::gsttest::GstTest;
using xmem::gsttest::Pipeline;
using xmem::gsttest::stat_u64;
using xmem::test::Process;

namespace {

constexpr const char *kCaps = "video/x-raw,format=GRAY8,width=16,height=16,framerate=30/1";
constexpr const char *kCustomMeta = "XmemTestMeta";
constexpr const char *kReference = "timestamp/x-ntp";

void register_custom_meta()
{
	static const gchar *tags[] = { nullptr };
	static const GstMetaInfo *info = gst_meta_register_custom(kCustomMeta, tags, nullptr, nullptr, nullptr);
	(void)info;
}

// The daily jam the time codes carry: a fixed moment, in UTC.
GDateTime *daily_jam()
{
	return g_date_time_new_utc(2024, 5, 6, 7, 8, 9.25);
}

std::string param_text(int i, size_t pad = 0)
{
	return "detection, label=(string)person, confidence=(double)0.5, frame=(int)" + std::to_string(i) +
	       ", note=(string)" + std::string(pad + 1, 'n');
}

// Frame I's metas: a reference timestamp, a region of interest with one param, a time
// code on even frames, and a custom meta (which only GStreamer >= 1.24 can serialize).
void add_metas(GstBuffer *buffer, int i)
{
	GstCaps *reference = gst_caps_new_empty_simple(kReference);
	gst_buffer_add_reference_timestamp_meta(buffer, reference, GstClockTime(i) * GST_SECOND + 7, 33 * GST_MSECOND);
	gst_caps_unref(reference);
	GstVideoRegionOfInterestMeta *roi =
		gst_buffer_add_video_region_of_interest_meta(buffer, "face", guint(i), 2, 10, 12);
	roi->id = 100 + i;
	roi->parent_id = -1;
	gst_video_region_of_interest_meta_add_param(roi, gst_structure_from_string(param_text(i).c_str(), nullptr));
	if (i % 2 == 0) {
		GDateTime *jam = daily_jam();
		gst_buffer_add_video_time_code_meta_full(buffer, 30, 1, jam, GST_VIDEO_TIME_CODE_FLAGS_NONE, 1, 2, 3,
							 guint(i % 30), 0);
		g_date_time_unref(jam);
	}
	GstCustomMeta *custom = gst_buffer_add_custom_meta(buffer, kCustomMeta);
	gst_structure_set(gst_custom_meta_get_structure(custom), "frame", G_TYPE_INT, i, "label", G_TYPE_STRING,
			  "custom", nullptr);
}

// What differs between BUFFER's metas and frame I's ("" when they are the same).
std::string compare_metas(GstBuffer *buffer, int i)
{
	std::string diff;
	GstCaps *reference = gst_caps_new_empty_simple(kReference);
	GstReferenceTimestampMeta *ts = gst_buffer_get_reference_timestamp_meta(buffer, reference);
	gst_caps_unref(reference);
	if (!ts)
		diff += " no reference timestamp;";
	else if (ts->timestamp != GstClockTime(i) * GST_SECOND + 7 || ts->duration != 33 * GST_MSECOND)
		diff += " reference timestamp differs;";

	int rois = 0;
	gpointer state = nullptr;
	while (GstMeta *m =
		       gst_buffer_iterate_meta_filtered(buffer, &state, GST_VIDEO_REGION_OF_INTEREST_META_API_TYPE)) {
		auto *roi = reinterpret_cast<GstVideoRegionOfInterestMeta *>(m);
		rois++;
		if (std::string(g_quark_to_string(roi->roi_type)) != "face" || roi->id != 100 + i ||
		    roi->parent_id != -1 || roi->x != guint(i) || roi->y != 2 || roi->w != 10 || roi->h != 12)
			diff += " region of interest differs;";
		GstStructure *want = gst_structure_from_string(param_text(i).c_str(), nullptr);
		GstStructure *got = gst_video_region_of_interest_meta_get_param(roi, "detection");
		if (!got || !gst_structure_is_equal(got, want) || g_list_length(roi->params) != 1)
			diff += " region of interest param differs;";
		gst_structure_free(want);
	}
	if (rois != 1)
		diff += " " + std::to_string(rois) + " regions of interest;";

	GstVideoTimeCodeMeta *tc = gst_buffer_get_video_time_code_meta(buffer);
	if (i % 2 == 0) {
		GDateTime *jam = daily_jam();
		if (!tc)
			diff += " no time code;";
		else if (tc->tc.config.fps_n != 30 || tc->tc.config.fps_d != 1 || tc->tc.hours != 1 ||
			 tc->tc.minutes != 2 || tc->tc.seconds != 3 || tc->tc.frames != guint(i % 30) ||
			 tc->tc.field_count != 0 || !tc->tc.config.latest_daily_jam ||
			 !g_date_time_equal(tc->tc.config.latest_daily_jam, jam))
			diff += " time code differs;";
		g_date_time_unref(jam);
	} else if (tc) {
		diff += " a time code on an odd frame;";
	}

	GstCustomMeta *custom = gst_buffer_get_custom_meta(buffer, kCustomMeta);
#if GST_CHECK_VERSION(1, 24, 0)
	int frame = -1;
	if (!custom)
		diff += " no custom meta;";
	else if (!gst_structure_get_int(gst_custom_meta_get_structure(custom), "frame", &frame) || frame != i ||
		 g_strcmp0(gst_structure_get_string(gst_custom_meta_get_structure(custom), "label"), "custom") != 0)
		diff += " custom meta differs;";
#else
	if (custom)
		diff += " a custom meta, which GStreamer < 1.24 cannot serialize;";
#endif
	return diff;
}

// Metas frame I carries across the pool.
guint64 metas_of(int i)
{
	guint64 n = 2 + (i % 2 == 0);
#if GST_CHECK_VERSION(1, 24, 0)
	n++;
#endif
	return n;
}

GstElement *app_producer(Pipeline &p)
{
	auto *src = GST_APP_SRC(p.by_name("src"));
	GstCaps *caps = gst_caps_from_string(kCaps);
	gst_app_src_set_caps(src, caps);
	gst_caps_unref(caps);
	return GST_ELEMENT(src);
}

GstBuffer *frame(int i)
{
	GstBuffer *b = gst_buffer_new_allocate(nullptr, 256, nullptr);
	gst_buffer_memset(b, 0, guint8(i), 256);
	GST_BUFFER_PTS(b) = GstClockTime(i) * 33 * GST_MSECOND;
	GST_BUFFER_DURATION(b) = 33 * GST_MSECOND;
	return b;
}

// --metas-producer POOL N: publishes N frames with add_metas() through xmemsink once a
// consumer is attached, then EOS; prints the sink's metas counters.
int run_producer(const std::string &pool, int n)
{
	gst_init(nullptr, nullptr);
	register_custom_meta();
	Pipeline p("appsrc name=src format=time ! xmemsink name=sink pool-name=" + pool +
		   " wait-for-consumers=1 wait-timeout=30000000000 policy=block block-timeout=30000000000");
	if (!p)
		return 2;
	GstElement *src = app_producer(p);
	if (p.play() == GST_STATE_CHANGE_FAILURE)
		return 3;
	for (int i = 0; i < n; i++) {
		GstBuffer *b = frame(i);
		add_metas(b, i);
		if (gst_app_src_push_buffer(GST_APP_SRC(src), b) != GST_FLOW_OK)
			return 4;
	}
	gst_app_src_end_of_stream(GST_APP_SRC(src));
	std::string end = p.wait_eos(60s);
	GstElement *sink = p.by_name("sink");
	std::printf("metas-sent=%llu metas-dropped=%llu %s\n", (unsigned long long)stat_u64(sink, "metas-sent"),
		    (unsigned long long)stat_u64(sink, "metas-dropped"), end.c_str());
	return end.empty() ? 0 : 5;
}

std::string self_path()
{
	char path[PATH_MAX];
	ssize_t n = ::readlink("/proc/self/exe", path, sizeof(path) - 1);
	return n > 0 ? std::string(path, size_t(n)) : std::string();
}

// Pulls every sample of an "appsink name=sink" until EOS, handing each buffer to CHECK
// and dropping it at once (a buffer holds its slot); the number of buffers.
size_t pull_all(Pipeline &p, const std::function<void(GstBuffer *)> &check, std::chrono::seconds timeout = 30s)
{
	size_t n = 0;
	auto *sink = GST_APP_SINK(p.by_name("sink"));
	auto deadline = std::chrono::steady_clock::now() + timeout;
	while (std::chrono::steady_clock::now() < deadline) {
		GstSample *s = gst_app_sink_try_pull_sample(sink, 100 * GST_MSECOND);
		if (!s) {
			if (gst_app_sink_is_eos(sink))
				break;
			continue;
		}
		check(gst_sample_get_buffer(s));
		gst_sample_unref(s);
		n++;
	}
	return n;
}

class Metas : public GstTest
{
protected:
	void SetUp() override
	{
		GstTest::SetUp();
		register_custom_meta();
	}
};

} // namespace

TEST_F(Metas, SameMetasOutInAnotherProcess)
{
	const int n = 20;
	Process producer({ self_path(), "--metas-producer", "metas", std::to_string(n) });
	Pipeline consumer("xmemsrc name=src pool-name=metas is-live=false timeout=30000000000 ! "
			  "appsink name=sink sync=false");
	ASSERT_NE(consumer.play(), GST_STATE_CHANGE_FAILURE);
	guint64 want = 0;
	size_t got = pull_all(consumer, [&](GstBuffer *b) {
		int i = int(GST_BUFFER_OFFSET(b)) - 1; // the producer's sequence number, from 1
		EXPECT_EQ(compare_metas(b, i), "") << "frame " << i;
		want += metas_of(i);
	});
	ASSERT_EQ(producer.wait(30s), 0) << producer.output();
	ASSERT_EQ(got, size_t(n)) << consumer.wait_eos(0ms);
	GstElement *src = consumer.by_name("src");
	EXPECT_EQ(stat_u64(src, "metas-received"), want);
	EXPECT_EQ(stat_u64(src, "metas-skipped"), 0u);
	EXPECT_EQ(stat_u64(src, "metas-refused"), 0u);
	EXPECT_NE(producer.output().find("metas-sent=" + std::to_string(want) + " metas-dropped=0"), std::string::npos)
		<< producer.output();
}

// add-reference-timestamp-meta adds a capture time only to frames without one: frames
// that carry the producer's own (a camera's, an RTSP source's) keep it, and only it.
TEST_F(Metas, TheProducersOwnReferenceTimestampIsKeptOverTheCaptureTime)
{
	const int n = 6;
	Process producer({ self_path(), "--metas-producer", "own-ntp", std::to_string(n) });
	Pipeline consumer("xmemsrc name=src pool-name=own-ntp is-live=false timeout=30000000000 "
			  "add-reference-timestamp-meta=true ! appsink name=sink sync=false");
	ASSERT_NE(consumer.play(), GST_STATE_CHANGE_FAILURE);
	size_t got = pull_all(consumer, [&](GstBuffer *b) {
		int i = int(GST_BUFFER_OFFSET(b)) - 1;
		EXPECT_EQ(compare_metas(b, i), "") << "frame " << i;
		int references = 0;
		gpointer state = nullptr;
		while (gst_buffer_iterate_meta_filtered(b, &state, GST_REFERENCE_TIMESTAMP_META_API_TYPE))
			references++;
		EXPECT_EQ(references, 1) << "frame " << i;
	});
	ASSERT_EQ(producer.wait(30s), 0) << producer.output();
	EXPECT_EQ(got, size_t(n));
}

// xmemrtphdrextcapture (the bridge's): a frame's timestamp/x-ntp crosses RTP in the header
// extension alone. The packets lose every meta on the way (as on a network), and a frame
// spans many packets; GStreamer before 1.24 reads a frame's extensions from its last
// packet, later versions from all of them: either way exactly one meta, the sender's.
TEST_F(Metas, TheCaptureTimeCrossesRtpInItsHeaderExtensionOnly)
{
	const int n = 5;
	Pipeline p("appsrc name=src format=time caps=video/x-raw,format=I420,width=64,height=64,framerate=30/1 "
		   "! rtpvrawpay mtu=400 ! application/x-rtp,extmap-1=(string)urn:xmem:rtp-hdrext:capture-time "
		   "! identity name=wire ! rtpvrawdepay ! appsink name=sink sync=false");
	ASSERT_TRUE(p);
	std::atomic<int> packets{ 0 };
	GstPad *wire = gst_element_get_static_pad(p.by_name("wire"), "src");
	gst_pad_add_probe(
		wire, GST_PAD_PROBE_TYPE_BUFFER,
		[](GstPad *, GstPadProbeInfo *info, gpointer counter) {
			// The packet's bytes in a new buffer: no meta travels beside them.
			GstBuffer *packet = GST_PAD_PROBE_INFO_BUFFER(info);
			GstMapInfo map;
			gst_buffer_map(packet, &map, GST_MAP_READ);
			GstBuffer *bare = gst_buffer_new_memdup(map.data, map.size);
			gst_buffer_unmap(packet, &map);
			gst_buffer_copy_into(bare, packet,
					     GstBufferCopyFlags(GST_BUFFER_COPY_FLAGS | GST_BUFFER_COPY_TIMESTAMPS), 0,
					     0);
			gst_buffer_unref(packet);
			GST_PAD_PROBE_INFO_DATA(info) = bare;
			(*static_cast<std::atomic<int> *>(counter))++;
			return GST_PAD_PROBE_OK;
		},
		&packets, nullptr);
	gst_object_unref(wire);
	auto *src = GST_APP_SRC(p.by_name("src"));
	ASSERT_NE(p.play(), GST_STATE_CHANGE_FAILURE);
	GstCaps *ntp = gst_caps_new_empty_simple(kReference);
	// NTP times of 2026, one a frame, with odd nanoseconds.
	auto captured = [](int i) {
		return GstClockTime(3'973'000'000ULL + guint64(i)) * GST_SECOND + 123'457;
	};
	for (int i = 0; i < n; i++) {
		GstBuffer *b = gst_buffer_new_allocate(nullptr, 64 * 64 * 3 / 2, nullptr);
		gst_buffer_memset(b, 0, guint8(i), 64 * 64 * 3 / 2);
		GST_BUFFER_PTS(b) = GstClockTime(i) * 33 * GST_MSECOND;
		gst_buffer_add_reference_timestamp_meta(b, ntp, captured(i), GST_CLOCK_TIME_NONE);
		ASSERT_EQ(gst_app_src_push_buffer(src, b), GST_FLOW_OK);
	}
	gst_app_src_end_of_stream(src);
	int i = 0;
	size_t got = pull_all(p, [&](GstBuffer *b) {
		int references = 0;
		gpointer state = nullptr;
		while (GstMeta *m =
			       gst_buffer_iterate_meta_filtered(b, &state, GST_REFERENCE_TIMESTAMP_META_API_TYPE)) {
			auto *ts = reinterpret_cast<GstReferenceTimestampMeta *>(m);
			references++;
			EXPECT_TRUE(gst_caps_is_equal(ts->reference, ntp));
			// 64-bit NTP counts 2^-32 s: a nanosecond either way.
			EXPECT_LE(std::llabs(gint64(ts->timestamp) - gint64(captured(i))), 1) << "frame " << i;
		}
		EXPECT_EQ(references, 1) << "frame " << i;
		i++;
	});
	gst_caps_unref(ntp);
	EXPECT_EQ(got, size_t(n));
	EXPECT_GE(packets.load(), n * 10) << "each frame should span many packets";
}

// What comes off the network may be short or hostile: an extension of fewer than its 8
// bytes is refused and adds nothing; a frame without a capture time sends none.
TEST_F(Metas, TheCaptureTimeExtensionRefusesShortDataAndWritesNothingWithoutATime)
{
	GstElement *element = gst_element_factory_make("xmemrtphdrextcapture", nullptr);
	ASSERT_NE(element, nullptr);
	auto *ext = GST_RTP_HEADER_EXTENSION(element);
	gst_rtp_header_extension_set_id(ext, 1); // as extmap-1 in caps sets it
	const auto one_byte = GST_RTP_HEADER_EXTENSION_ONE_BYTE;
	GstCaps *ntp = gst_caps_new_empty_simple(kReference);
	const guint8 wire[8] = { 0xec, 0xd1, 0x5f, 0x00, 0x80, 0x00, 0x00, 0x00 }; // 2025-11, + 0.5 s

	GstBuffer *out = gst_buffer_new();
	EXPECT_FALSE(gst_rtp_header_extension_read(ext, one_byte, wire, 7, out));
	EXPECT_EQ(gst_buffer_get_reference_timestamp_meta(out, ntp), nullptr);
	EXPECT_TRUE(gst_rtp_header_extension_read(ext, one_byte, wire, 8, out));
	GstReferenceTimestampMeta *meta = gst_buffer_get_reference_timestamp_meta(out, ntp);
	ASSERT_NE(meta, nullptr);
	EXPECT_EQ(meta->timestamp, 0xecd15f00ULL * GST_SECOND + GST_SECOND / 2);
	// A second packet of the same frame: still one meta.
	EXPECT_TRUE(gst_rtp_header_extension_read(ext, one_byte, wire, 8, out));
	int references = 0;
	gpointer state = nullptr;
	while (gst_buffer_iterate_meta_filtered(out, &state, GST_REFERENCE_TIMESTAMP_META_API_TYPE))
		references++;
	EXPECT_EQ(references, 1);
	gst_buffer_unref(out);

	guint8 data[8] = {};
	GstBuffer *input = gst_buffer_new();
	GstBuffer *packet = gst_buffer_new();
	EXPECT_EQ(gst_rtp_header_extension_write(ext, input, one_byte, packet, data, sizeof(data)), 0)
		<< "a frame without a capture time";
	gst_buffer_add_reference_timestamp_meta(input, ntp, 0xecd15f00ULL * GST_SECOND + GST_SECOND / 2,
						GST_CLOCK_TIME_NONE);
	EXPECT_EQ(gst_rtp_header_extension_write(ext, input, one_byte, packet, data, sizeof(data)), 8);
	EXPECT_EQ(std::memcmp(data, wire, sizeof(wire)), 0);
	gst_buffer_unref(input);
	gst_buffer_unref(packet);
	gst_caps_unref(ntp);
	gst_object_unref(element);
}

namespace {

std::atomic<int> budget_warnings{ 0 };

void count_budget_warnings(GstDebugCategory *category, GstDebugLevel level, const gchar *, const gchar *, gint,
			   GObject *, GstDebugMessage *message, gpointer)
{
	if (level == GST_LEVEL_WARNING && std::string(gst_debug_category_get_name(category)) == "xmemmeta" &&
	    std::string(gst_debug_message_get(message)).find("budget") != std::string::npos)
		budget_warnings++;
}

} // namespace

// The macros of gst_debug_*_log_function compare a function with a void * (-Wpedantic):
// called by name, in parentheses.
TEST_F(Metas, OverTheBudgetTheFrameGoesWithTheMetasThatFitAndTheDropIsCounted)
{
	gst_debug_set_threshold_for_name("xmemmeta", GST_LEVEL_WARNING);
	(gst_debug_add_log_function)(count_budget_warnings, nullptr, nullptr);
	budget_warnings = 0;
	const int n = 5;
	Pipeline producer("appsrc name=src format=time ! xmemsink name=sink pool-name=budget wait-for-consumers=1 "
			  "policy=block block-timeout=30000000000");
	Pipeline consumer("xmemsrc name=src pool-name=budget is-live=false ! appsink name=sink sync=false");
	GstElement *src = app_producer(producer);
	ASSERT_NE(producer.play(), GST_STATE_CHANGE_FAILURE);
	ASSERT_NE(consumer.play(), GST_STATE_CHANGE_FAILURE);
	// Per frame, in this order: two regions of interest with a 1700-byte param each
	// fill 3680 of the 4096 bytes; a third one goes without its param, which does not
	// fit; a reference timestamp with 400-byte reference caps does not fit at all; a
	// small one after it does.
	for (int i = 0; i < n; i++) {
		GstBuffer *b = frame(i);
		for (int r = 0; r < 3; r++) {
			GstVideoRegionOfInterestMeta *roi =
				gst_buffer_add_video_region_of_interest_meta(b, "face", guint(r), 0, 1, 1);
			roi->id = r;
			gst_video_region_of_interest_meta_add_param(
				roi, gst_structure_from_string(param_text(r, 1700).c_str(), nullptr));
		}
		GstCaps *big = gst_caps_new_simple("timestamp/x-big", "note", G_TYPE_STRING,
						   std::string(400, 'n').c_str(), nullptr);
		gst_buffer_add_reference_timestamp_meta(b, big, 41, GST_CLOCK_TIME_NONE);
		gst_caps_unref(big);
		GstCaps *reference = gst_caps_new_empty_simple(kReference);
		gst_buffer_add_reference_timestamp_meta(b, reference, 42, GST_CLOCK_TIME_NONE);
		gst_caps_unref(reference);
		ASSERT_EQ(gst_app_src_push_buffer(GST_APP_SRC(src), b), GST_FLOW_OK);
	}
	gst_app_src_end_of_stream(GST_APP_SRC(src));
	size_t got = pull_all(consumer, [&](GstBuffer *b) {
		std::vector<guint> params;
		gpointer state = nullptr;
		while (GstMeta *m = gst_buffer_iterate_meta_filtered(b, &state,
								     GST_VIDEO_REGION_OF_INTEREST_META_API_TYPE)) {
			auto *roi = reinterpret_cast<GstVideoRegionOfInterestMeta *>(m);
			params.push_back(g_list_length(roi->params));
		}
		EXPECT_EQ(params, (std::vector<guint>{ 1, 1, 0 }))
			<< "regions of interest received, by their params (the third one's did not fit)";
		GstCaps *reference = gst_caps_new_empty_simple(kReference);
		GstReferenceTimestampMeta *ts = gst_buffer_get_reference_timestamp_meta(b, reference);
		gst_caps_unref(reference);
		EXPECT_TRUE(ts && ts->timestamp == 42) << "the small meta after the large ones travels";
		GstCaps *big = gst_caps_new_empty_simple("timestamp/x-big");
		EXPECT_EQ(gst_buffer_get_reference_timestamp_meta(b, big), nullptr);
		gst_caps_unref(big);
	});
	EXPECT_EQ(producer.wait_eos(30s), "");
	(gst_debug_remove_log_function)(count_budget_warnings);
	ASSERT_EQ(got, size_t(n)) << "every frame goes, whatever its metas";
	GstElement *sink = producer.by_name("sink");
	// Each frame: the third region's param and the large timestamp left out; three
	// regions and the small timestamp sent.
	EXPECT_EQ(stat_u64(sink, "metas-dropped"), guint64(2 * n));
	EXPECT_EQ(stat_u64(sink, "metas-sent"), guint64(4 * n));
	EXPECT_EQ(budget_warnings.load(), 1) << "the drop is logged at WARNING, once";
}

namespace {

// Side data in xmemsink's encoding, written by hand (gstxmemmeta.h).
class Encoder
{
public:
	Encoder() { u32(0x314d4758); }
	Encoder &u32(guint32 v)
	{
		guint8 b[4];
		GST_WRITE_UINT32_LE(b, v);
		bytes_.insert(bytes_.end(), b, b + 4);
		return *this;
	}
	Encoder &u64(guint64 v)
	{
		guint8 b[8];
		GST_WRITE_UINT64_LE(b, v);
		bytes_.insert(bytes_.end(), b, b + 8);
		return *this;
	}
	Encoder &str(const std::string &s)
	{
		u32(guint32(s.size()));
		bytes_.insert(bytes_.end(), s.begin(), s.end());
		return *this;
	}
	Encoder &raw(const std::vector<guint8> &b)
	{
		bytes_.insert(bytes_.end(), b.begin(), b.end());
		return *this;
	}
	// A record: TAG, then the payload PAYLOAD built (its length, unless LENGTH is given).
	Encoder &record(guint32 tag, const Encoder &payload, std::optional<guint32> length = std::nullopt)
	{
		u32(tag);
		u32(length ? *length : guint32(payload.bytes_.size() - 4));
		bytes_.insert(bytes_.end(), payload.bytes_.begin() + 4, payload.bytes_.end());
		return *this;
	}
	static Encoder payload() { return Encoder(0); }
	std::span<const std::byte> bytes() const
	{
		return { reinterpret_cast<const std::byte *>(bytes_.data()), bytes_.size() };
	}
	// Without the magic: for a producer that is not xmemsink.
	std::span<const std::byte> without_magic() const { return bytes().subspan(4); }

private:
	explicit Encoder(int) { u32(0); } // a payload: its first 4 bytes are never copied
	std::vector<guint8> bytes_;
};

Encoder reference_timestamp(guint64 ts, const std::string &caps = kReference)
{
	return Encoder::payload().u64(ts).u64(GST_CLOCK_TIME_NONE).str(caps);
}

// gst_meta_serialize()'s header: [total u32][name_len u32][name][\0][version u8].
std::vector<guint8> serialized_header(const std::string &name, guint32 total, guint32 name_len)
{
	std::vector<guint8> b(8);
	GST_WRITE_UINT32_LE(b.data(), total);
	GST_WRITE_UINT32_LE(b.data() + 4, name_len);
	b.insert(b.end(), name.begin(), name.end());
	b.push_back(0);
	b.push_back(0);
	return b;
}

std::vector<guint8> serialized(const std::string &name, const std::string &payload)
{
	auto b = serialized_header(name, guint32(8 + name.size() + 2 + payload.size()), guint32(name.size()));
	b.insert(b.end(), payload.begin(), payload.end());
	return b;
}

struct HostileFrame {
	const char *what;
	Encoder side;
	bool magic = true;
	int added = 0; // metas the source adds
	int skipped = 0;
	int refused = 0;
};

std::vector<HostileFrame> hostile_frames()
{
	constexpr bool serializes = GST_CHECK_VERSION(1, 24, 0);
	std::vector<HostileFrame> f;
	f.push_back({ "a well-formed record", Encoder().record(1, reference_timestamp(1)), true, 1, 0, 0 });
	f.push_back(
		{ "a record longer than the data", Encoder().record(1, reference_timestamp(2), 5000), true, 0, 0, 1 });
	f.push_back({ "a record shorter than its fields", Encoder().record(1, Encoder::payload().u64(3).u32(0)), true,
		      0, 0, 1 });
	f.push_back({ "caps that do not parse, then a good record",
		      Encoder().record(1, reference_timestamp(4, "((((")).record(1, reference_timestamp(4)), true, 1, 0,
		      1 });
	f.push_back({ "a string longer than its record",
		      Encoder().record(1, Encoder::payload().u64(5).u64(0).u32(0xfffffff0)), true, 0, 0, 1 });
	f.push_back({ "a string that is not UTF-8",
		      Encoder().record(1, Encoder::payload().u64(6).u64(0).u32(3).raw({ 0xff, 0xfe, 0x80 })), true, 0,
		      0, 1 });
	f.push_back({ "an unknown tag, then a good record",
		      Encoder().record(99, Encoder::payload().u64(1)).record(1, reference_timestamp(7)), true, 1, 1,
		      0 });
	f.push_back({ "side data without the magic", Encoder().record(1, reference_timestamp(8)), false, 0, 1, 0 });
	f.push_back({ "a region of interest claiming 4 billion params",
		      Encoder().record(2, Encoder::payload()
						  .str("face")
						  .u32(1)
						  .u32(0)
						  .u32(0)
						  .u32(0)
						  .u32(1)
						  .u32(1)
						  .u32(0xffffffff)
						  .str("a, b=(int)1")),
		      true, 0, 0, 1 });
	f.push_back({ "a region of interest with a param that does not parse",
		      Encoder().record(
			      2, Encoder::payload().str("face").u32(1).u32(0).u32(0).u32(0).u32(1).u32(1).u32(1).str(
					 "((((")),
		      true, 0, 0, 1 });
	f.push_back({ "a region of interest without a type",
		      Encoder().record(2, Encoder::payload().str("").u32(1).u32(0).u32(0).u32(0).u32(1).u32(1).u32(0)),
		      true, 0, 0, 1 });
	f.push_back({ "a time code at 0 frames per second",
		      Encoder().record(
			      3, Encoder::payload().u32(0).u32(1).u32(0).u32(1).u32(2).u32(3).u32(4).u32(0).str("")),
		      true, 0, 0, 1 });
	f.push_back({ "a time code at hour 99",
		      Encoder().record(
			      3, Encoder::payload().u32(30).u32(1).u32(0).u32(99).u32(2).u32(3).u32(4).u32(0).str("")),
		      true, 0, 0, 1 });
	f.push_back(
		{ "a time code with a daily jam that is no date",
		  Encoder().record(3, Encoder::payload().u32(30).u32(1).u32(0).u32(1).u32(2).u32(3).u32(4).u32(0).str(
					      "yesterday")),
		  true, 0, 0, 1 });
	// gst_meta_deserialize() reads the name up to name_len unchecked: a huge one must
	// be refused before it is called.
	f.push_back({ "a serialized meta with a name past the record",
		      Encoder().record(4, Encoder::payload().raw(serialized_header("Xmem", 20, 0xfffffff0))), true, 0,
		      serializes ? 0 : 1, serializes ? 1 : 0 });
	f.push_back({ "a serialized meta of a type nobody registered",
		      Encoder().record(4, Encoder::payload().raw(serialized("NoSuchMetaType", "x"))), true, 0, 1, 0 });
	// A GstVideoMeta would describe our memory with the producer's offsets and strides.
	f.push_back({ "a serialized GstVideoMeta",
		      Encoder().record(4, Encoder::payload().raw(serialized("GstVideoMeta", std::string(64, '\x7f')))),
		      true, 0, 1, 0 });
	f.push_back({ "a serialized custom meta whose payload is garbage",
		      Encoder().record(4, Encoder::payload().raw(serialized(kCustomMeta, "\x01\x02((("))), true, 0,
		      serializes ? 0 : 1, serializes ? 1 : 0 });
	return f;
}

guint64 total(const std::vector<HostileFrame> &frames, int HostileFrame::*field)
{
	guint64 n = 0;
	for (const auto &f : frames)
		n += guint64(f.*field);
	return n;
}

// Holds xmemsrc's streaming thread on its first buffer until release().
class Gate
{
public:
	explicit Gate(GstElement *element)
	{
		GstPad *pad = gst_element_get_static_pad(element, "src");
		gst_pad_add_probe(pad, GST_PAD_PROBE_TYPE_BUFFER, &Gate::probe, this, nullptr);
		gst_object_unref(pad);
	}
	bool wait_held(std::chrono::seconds timeout)
	{
		std::unique_lock lock(lock_);
		return cv_.wait_for(lock, timeout, [this] { return held_; });
	}
	void release()
	{
		std::lock_guard lock(lock_);
		open_ = true;
		cv_.notify_all();
	}

private:
	static GstPadProbeReturn probe(GstPad *, GstPadProbeInfo *, gpointer data)
	{
		auto *self = static_cast<Gate *>(data);
		std::unique_lock lock(self->lock_);
		self->held_ = true;
		self->cv_.notify_all();
		self->cv_.wait_for(lock, 30s, [self] { return self->open_; });
		return GST_PAD_PROBE_REMOVE;
	}

	std::mutex lock_;
	std::condition_variable cv_;
	bool held_ = false;
	bool open_ = false;
};

} // namespace

TEST_F(Metas, HostileSideDataIsRefusedAndCountedAndTheStreamGoesOn)
{
	xmem::PoolConfig config;
	config.slot_count = 8;
	config.slot_size = 256;
	config.format = kCaps;
	config.policy = xmem::Policy::block;
	config.block_timeout = 30s;
	auto created = xmem::BufferPool::create("hostile", config);
	ASSERT_TRUE(created.ok()) << xmem::test::why(created);
	auto owner = created.value();
	Pipeline consumer("xmemsrc name=src pool-name=hostile is-live=false ! appsink name=sink sync=false");
	Gate gate(consumer.by_name("src"));
	ASSERT_NE(consumer.play(), GST_STATE_CHANGE_FAILURE);
	ASSERT_TRUE(xmem::test::eventually([&] { return owner->stats().consumers == 1; }));

	auto publish = [&](std::span<const std::byte> side) {
		auto g = owner->acquire(5s);
		EXPECT_TRUE(g.ok()) << xmem::test::why(g);
		if (!g)
			return UINT32_MAX;
		xmem::FrameMeta *m = g->meta_mut().value();
		m->size = 256;
		m->n_planes = 1;
		m->plane_stride[0] = 16;
		m->pts = 0;
		EXPECT_TRUE(g->set_side_data(side).ok());
		uint32_t index = g->index();
		EXPECT_TRUE(owner->publish(std::move(*g)).ok());
		return index;
	};
	// The first frame holds the source in its push; the second waits in its queue
	// while a hostile peer rewrites its size in the slot record.
	publish({});
	ASSERT_TRUE(gate.wait_held(10s));
	uint32_t scribbled = publish(Encoder().record(1, reference_timestamp(9)).bytes());
	auto *slots = reinterpret_cast<xmem::layout::SlotRecord *>(
		const_cast<std::byte *>(owner->control_segment().data()) + xmem::layout::slots_offset());
	slots[scribbled].side_data_size = 100000;
	gate.release();

	auto frames = hostile_frames();
	std::thread producer([&] {
		for (const auto &f : frames)
			publish(f.magic ? f.side.bytes() : f.side.without_magic());
		EXPECT_TRUE(owner->end_of_stream().ok());
	});
	size_t index = 0;
	size_t got = pull_all(consumer, [&](GstBuffer *b) {
		int metas = 0;
		gpointer state = nullptr;
		while (GstMeta *m = gst_buffer_iterate_meta(b, &state))
			metas += m->info->api != GST_VIDEO_META_API_TYPE;
		// The first two frames: none, and the one whose side data was refused.
		if (index >= 2 && index - 2 < frames.size())
			EXPECT_EQ(metas, frames[index - 2].added) << frames[index - 2].what;
		else
			EXPECT_EQ(metas, 0) << "frame " << index;
		index++;
	});
	producer.join();
	ASSERT_EQ(got, frames.size() + 2) << "the stream goes on: " << consumer.wait_eos(0ms);
	GstElement *src = consumer.by_name("src");
	EXPECT_EQ(stat_u64(src, "metas-received"), total(frames, &HostileFrame::added));
	EXPECT_EQ(stat_u64(src, "metas-skipped"), total(frames, &HostileFrame::skipped));
	EXPECT_EQ(stat_u64(src, "metas-refused"), total(frames, &HostileFrame::refused) + 1)
		<< "and one for the side data whose size was scribbled";
}

int main(int argc, char **argv)
{
	if (argc == 4 && std::string(argv[1]) == "--metas-producer")
		return run_producer(argv[2], std::atoi(argv[3]));
	::testing::InitGoogleTest(&argc, argv);
	return RUN_ALL_TESTS();
}
