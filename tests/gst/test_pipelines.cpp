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

// Caps change twice within slots big enough for both: 640x480, 320x240, 640x480.
TEST_F(InProcess, CapsChangeMidStreamReachesConsumerFirst)
{
	xmem::gsttest::run_caps_changes("change", { { 640, 480 }, { 320, 240 }, { 640, 480 } }, 4, 0, 1);
}

// 320x240, then 640x480: the frames no longer fit the slots, so xmemsink adds a size
// class for them to its pool; the consumer stays attached, imports the class and
// loses no frame. Back at 320x240 the first class serves again.
TEST_F(InProcess, CapsChangeToLargerFramesAddsASizeClass)
{
	xmem::gsttest::run_caps_changes("grow", { { 320, 240 }, { 640, 480 }, { 320, 240 } }, 4, 0, 2);
}

// Frames growing ten times, with room for eight classes of 8 slots after the first
// (max_slots: 8 + 64 records): the ninth larger size finds no room, so xmemsink
// replaces its pool under the same name (its class 0 of that size), the consumer
// follows without losing frames, and the last size is a class of the new pool.
TEST_F(InProcess, CapsChangesPastTheRoomForClassesRecreateThePool)
{
	std::vector<std::pair<int, int>> sizes;
	for (int k = 1; k <= 11; k++)
		sizes.emplace_back(16 * k, 16);
	xmem::gsttest::run_caps_changes("outgrow", sizes, 2, 1, 2);
}

// A consumer whose pipeline keeps frames (an unbounded queue before a slow element, a
// common pipeline) beside a healthy one, at 8 slots: the keeper holds no more than its
// cap, so the healthy consumer and the producer keep their rate, and the keeper still
// receives every frame it is sent, as copies past its cap. Rates as ratios of what the
// producer published meanwhile, so a busy machine slows all alike.
TEST_F(InProcess, AConsumerThatKeepsFramesCostsTheOthersNoSlot)
{
	Pipeline producer("videotestsrc is-live=true ! video/x-raw,format=I420,width=160,height=120,framerate=30/1 ! "
			  "xmemsink name=sink pool-name=hoard buffers=8");
	Pipeline keeper("xmemsrc name=src pool-name=hoard ! queue max-size-buffers=0 max-size-time=0 "
			"max-size-bytes=0 ! identity sleep-time=200000 ! fakesink");
	Pipeline healthy("xmemsrc name=src pool-name=hoard ! fakesink");
	ASSERT_TRUE(producer && keeper && healthy);
	ASSERT_NE(producer.play(), GST_STATE_CHANGE_FAILURE);
	ASSERT_NE(keeper.play(), GST_STATE_CHANGE_FAILURE);
	ASSERT_NE(healthy.play(), GST_STATE_CHANGE_FAILURE);
	GstElement *sink = producer.by_name("sink");
	GstElement *kept = keeper.by_name("src");
	GstElement *fine = healthy.by_name("src");
	// From the moment both receive: the keeper's cap fills within a few frames.
	ASSERT_TRUE(xmem::test::eventually(
		[&] { return stat_u64(kept, "received") > 0 && stat_u64(fine, "received") > 0; }));
	std::this_thread::sleep_for(500ms);
	guint64 published0 = stat_u64(sink, "published");
	guint64 healthy0 = stat_u64(fine, "received");
	guint64 kept0 = stat_u64(kept, "received");
	guint64 lost0 = stat_u64(kept, "lost");
	std::this_thread::sleep_for(3s);
	guint64 published = stat_u64(sink, "published") - published0;
	guint64 got_healthy = stat_u64(fine, "received") - healthy0;
	guint64 got_kept = stat_u64(kept, "received") - kept0;
	EXPECT_GE(published, 60u) << "the producer fell below 20 fps: its upstream waited for slots";
	EXPECT_GE(got_healthy * 10, published * 9) << got_healthy << " of " << published;
	EXPECT_GE(got_kept * 10, published * 9) << got_kept << " of " << published;
	EXPECT_LE(stat_u64(kept, "lost") - lost0, published / 20) << "frames the keeper missed at its cap";
	EXPECT_GT(stat_u64(kept, "copied-held"), 0u);
	EXPECT_LE(stat_u64(kept, "held"), stat_u64(kept, "max-held"));
	EXPECT_EQ(stat_u64(kept, "max-held"), 5u) << "the default for drop-oldest's queue of 4";
	printf("published %llu; healthy received %llu, keeper %llu (%llu copied near its cap)\n",
	       (unsigned long long)published, (unsigned long long)got_healthy, (unsigned long long)got_kept,
	       (unsigned long long)stat_u64(kept, "copied-held"));
}
