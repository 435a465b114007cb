// test_pipelines.cpp - xmemsink and xmemsrc in two pipelines of one process: every
// frame arrives bit-exact and in order, EOS crosses, and caps changes mid-stream.
#include "gst_common.hpp"

#include <gst/app/gstappsrc.h>

using namespace std::chrono_literals;
using xmem::gsttest::Consumer;
using xmem::gsttest::GstTest;
using xmem::gsttest::Pipeline;
using xmem::gsttest::stat_u64;

namespace {

class InProcess : public GstTest
{
};

// A frame whose every visible byte depends on N and position.
GstBuffer *painted_frame(const GstVideoInfo &info, unsigned n)
{
	GstBuffer *buffer = gst_buffer_new_allocate(nullptr, info.size, nullptr);
	GstMapInfo map;
	gst_buffer_map(buffer, &map, GST_MAP_WRITE);
	for (gsize i = 0; i < map.size; i++)
		map.data[i] = uint8_t(n * 37 + i * 5 + (i >> 10));
	gst_buffer_unmap(buffer, &map);
	return buffer;
}

} // namespace

TEST_F(InProcess, TwoPipelinesDeliverEveryFrame)
{
	const std::string caps = "video/x-raw,format=I420,width=96,height=72,framerate=30/1";
	const int n = 60;
	auto reference = xmem::gsttest::reference_frames(caps, "ball", n);
	ASSERT_EQ(int(reference.size()), n);

	Pipeline producer("videotestsrc num-buffers=" + std::to_string(n) + " pattern=ball ! " + caps +
			  " ! xmemsink name=sink pool-name=pair wait-for-consumers=1 policy=block "
			  "block-timeout=30000000000");
	ASSERT_TRUE(producer);
	Consumer consumer("xmemsrc name=src pool-name=pair is-live=false ! appsink name=sink sync=false",
			  [&](guint64 offset, const GstVideoInfo &) {
				  return offset >= 1 && offset <= reference.size() ? &reference[offset - 1] : nullptr;
			  });
	ASSERT_NE(producer.play(), GST_STATE_CHANGE_FAILURE);
	ASSERT_TRUE(consumer.start());

	EXPECT_EQ(producer.wait_eos(60s), "") << "producer pipeline";
	ASSERT_TRUE(consumer.join(60s)) << "the consumer saw no EOS; it has " << consumer.count() << " frames";
	EXPECT_TRUE(consumer.eos());
	EXPECT_EQ(consumer.error(), "");
	auto frames = consumer.frames();
	ASSERT_EQ(frames.size(), size_t(n));
	for (size_t i = 0; i < frames.size(); i++) {
		EXPECT_EQ(frames[i].offset, i + 1);
		EXPECT_TRUE(frames[i].matches) << "frame " << i << " differs from videotestsrc's";
		EXPECT_EQ(frames[i].size, frames[i].caps_size);
	}
	GstElement *sink = producer.by_name("sink");
	EXPECT_EQ(stat_u64(sink, "published"), guint64(n));
	EXPECT_EQ(stat_u64(sink, "zero-copy"), guint64(n)) << "videotestsrc did not write into the proposed slots";
	EXPECT_EQ(stat_u64(sink, "copied"), 0u);
	EXPECT_EQ(stat_u64(sink, "dropped"), 0u);
	EXPECT_EQ(stat_u64(consumer.src(), "received"), guint64(n));
	EXPECT_EQ(stat_u64(consumer.src(), "dropped"), 0u);
}

namespace {

// An appsrc producer pushes PER_SIZE frames at each of SIZES, setting new caps each
// time; the consumer must get every frame, each with the caps it was made in.
// SAME_POOL: the slots fit every size, so frame numbers (the pool's seq, as buffer
// offsets) keep increasing; a recreated pool numbers its frames from 1 again.
void run_caps_changes(const std::string &pool, const std::vector<std::pair<int, int>> &sizes, unsigned per_size,
		      bool same_pool = true)
{
	std::vector<GstVideoInfo> infos;
	for (auto [w, h] : sizes)
		infos.push_back(xmem::gsttest::video_info("video/x-raw,format=RGBA,width=" + std::to_string(w) +
							  ",height=" + std::to_string(h) + ",framerate=30/1"));

	Pipeline producer("appsrc name=src format=time ! xmemsink name=sink pool-name=" + pool +
			  " wait-for-consumers=1 policy=block block-timeout=30000000000");
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
		"xmemsrc name=src pool-name=" + pool + " is-live=false ! appsink name=sink sync=false",
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
	if (same_pool) {
		EXPECT_TRUE(xmem::gsttest::strictly_increasing(frames));
	}
}

} // namespace

// Caps change twice within slots big enough for both: 640x480, 320x240, 640x480.
TEST_F(InProcess, CapsChangeMidStreamReachesConsumerFirst)
{
	run_caps_changes("change", { { 640, 480 }, { 320, 240 }, { 640, 480 } }, 4);
}

// 320x240, then 640x480: the frames no longer fit the slots, so xmemsink replaces
// its pool under the same name, and the consumer must follow without losing frames.
TEST_F(InProcess, CapsChangeToLargerFramesLosesNoFrame)
{
	run_caps_changes("grow", { { 320, 240 }, { 640, 480 }, { 320, 240 } }, 4, false);
}
