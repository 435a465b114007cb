// test_multiprocess_gst.cpp - gst-launch-1.0 processes on either side of a pool:
// fan-out and late joiners bit-exact, slow consumers per policy, deaths, EOS.
#include "gst_common.hpp"

#include <sstream>

using namespace std::chrono_literals;
using xmem::gsttest::by_offset;
using xmem::gsttest::Consumer;
using xmem::gsttest::GstTest;
using xmem::gsttest::Pipeline;
using xmem::gsttest::Received;
using xmem::gsttest::stat_string;
using xmem::gsttest::stat_u64;
using xmem::test::eventually;
using xmem::test::Process;

namespace {

class MultiProcess : public GstTest
{
protected:
	void SetUp() override
	{
		GstTest::SetUp();
		launch_ = xmem::gsttest::tool_path("GST_LAUNCH");
		if (launch_.empty())
			GTEST_SKIP() << "gst-launch-1.0 not found (GST_LAUNCH unset)";
	}

	// gst-launch-1.0 running LINE (split on spaces: no quoting needed here).
	Process launch(const std::string &line) const
	{
		std::vector<std::string> args = { launch_, "-q" };
		std::istringstream in(line);
		for (std::string word; in >> word;)
			args.push_back(word);
		return Process(args);
	}

	std::string launch_;
};

size_t mismatches(const std::vector<Received> &frames)
{
	size_t n = 0;
	for (const auto &f : frames)
		n += !f.matches;
	return n;
}

// Waits for a process, giving its exit status (or -1 when it outlives TIMEOUT).
int finish(Process &p, std::chrono::milliseconds timeout = 60s)
{
	return p.wait(timeout);
}

} // namespace

TEST_F(MultiProcess, FanOutToThreeConsumersBitExact)
{
	const std::string caps = "video/x-raw,format=I420,width=96,height=72,framerate=30/1";
	const int n = 60;
	auto reference = xmem::gsttest::reference_frames(caps, "ball", n);
	ASSERT_EQ(int(reference.size()), n);
	GstVideoInfo info = xmem::gsttest::video_info(caps);

	Process producer =
		launch("videotestsrc num-buffers=" + std::to_string(n) + " pattern=ball ! " + caps +
		       " ! xmemsink pool-name=fan wait-for-consumers=3 policy=block block-timeout=30000000000");
	// Two consumers here (one slowed down by a queue and a sleeping identity), one in
	// its own gst-launch-1.0 writing every frame to a file.
	Consumer fast("xmemsrc name=src pool-name=fan is-live=false ! appsink name=sink sync=false",
		      by_offset(reference));
	Consumer slow("xmemsrc name=src pool-name=fan is-live=false ! queue ! identity sleep-time=3000 ! "
		      "appsink name=sink sync=false",
		      by_offset(reference));
	std::string file = dir_.path() + "/third.raw";
	Process third = launch("xmemsrc pool-name=fan is-live=false ! filesink location=" + file);
	ASSERT_TRUE(fast.start());
	ASSERT_TRUE(slow.start());

	EXPECT_EQ(finish(producer), 0) << producer.output();
	EXPECT_EQ(finish(third), 0) << third.output();
	for (Consumer *c : { &fast, &slow }) {
		ASSERT_TRUE(c->join(60s)) << "no EOS; " << c->count() << " frames";
		EXPECT_EQ(c->error(), "");
		auto frames = c->frames();
		ASSERT_EQ(frames.size(), size_t(n));
		for (size_t i = 0; i < frames.size(); i++)
			EXPECT_EQ(frames[i].offset, i + 1);
		EXPECT_EQ(mismatches(frames), 0u) << "frames differ from what videotestsrc makes";
	}

	// The third consumer's file: n frames of the caps' size, back to back.
	std::ifstream in(file, std::ios::binary);
	std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), {});
	ASSERT_EQ(bytes.size(), size_t(n) * info.size) << "the gst-launch consumer got a different number of frames";
	size_t wrong = 0;
	for (int i = 0; i < n; i++) {
		GstBuffer *b = gst_buffer_new_memdup(bytes.data() + size_t(i) * info.size, info.size);
		wrong += xmem::gsttest::visible_bytes(b, info) != reference[size_t(i)];
		gst_buffer_unref(b);
	}
	EXPECT_EQ(wrong, 0u) << "frames in the gst-launch consumer's file differ from videotestsrc's";
}

TEST_F(MultiProcess, LateJoiningConsumer)
{
	const std::string caps = "video/x-raw,format=RGBA,width=64,height=48,framerate=50/1";
	const int n = 150;
	auto reference = xmem::gsttest::reference_frames(caps, "ball", n);
	ASSERT_EQ(int(reference.size()), n);

	// A live producer (3 s of frames) that waits for the first consumer only.
	Process producer =
		launch("videotestsrc is-live=true num-buffers=" + std::to_string(n) + " pattern=ball ! " + caps +
		       " ! xmemsink pool-name=late wait-for-consumers=1 policy=block "
		       "block-timeout=30000000000");
	Consumer early("xmemsrc name=src pool-name=late is-live=false ! appsink name=sink sync=false",
		       by_offset(reference));
	ASSERT_TRUE(early.start());
	ASSERT_TRUE(eventually([&] { return early.count() >= 20; }, 30s)) << "the first consumer gets no frames";
	size_t joined_at = early.count();
	Consumer late("xmemsrc name=src pool-name=late is-live=false ! appsink name=sink sync=false",
		      by_offset(reference));
	ASSERT_TRUE(late.start());

	EXPECT_EQ(finish(producer), 0) << producer.output();
	ASSERT_TRUE(early.join(30s));
	ASSERT_TRUE(late.join(30s)) << "the late consumer saw no EOS";
	EXPECT_EQ(early.error(), "");
	EXPECT_EQ(late.error(), "");
	auto e = early.frames();
	auto l = late.frames();
	EXPECT_EQ(e.size(), size_t(n));
	EXPECT_EQ(mismatches(e), 0u);
	ASSERT_FALSE(l.empty()) << "the late consumer got no frame (did the producer end before it attached?)";
	EXPECT_GT(l.front().offset, joined_at) << "the late consumer got frames published before it attached";
	EXPECT_EQ(l.back().offset, guint64(n));
	EXPECT_EQ(xmem::gsttest::gaps_in(l), 0u);
	EXPECT_TRUE(xmem::gsttest::strictly_increasing(l));
	EXPECT_EQ(mismatches(l), 0u) << "the late consumer's frames differ from videotestsrc's";
	for (const auto &f : l)
		EXPECT_EQ(f.width, 64);
}

// A consumer ten times slower than the producer, under each policy.
struct SlowCase {
	const char *policy;
	int frames;
	int sleep_us;
};

void PrintTo(const SlowCase &c, std::ostream *os)
{
	*os << "policy=" << c.policy << ", " << c.frames << " frames, consumer sleeps " << c.sleep_us << " us";
}

class SlowConsumer : public MultiProcess, public ::testing::WithParamInterface<SlowCase>
{
};

TEST_P(SlowConsumer, PolicyDecidesWhoWaits)
{
	const SlowCase c = GetParam();
	const std::string caps = "video/x-raw,format=RGBA,width=64,height=48,framerate=100/1";
	auto reference = xmem::gsttest::reference_frames(caps, "ball", c.frames);
	ASSERT_EQ(int(reference.size()), c.frames);

	Consumer consumer("xmemsrc name=src pool-name=slow is-live=false queue-size=2 ! identity sleep-time=" +
				  std::to_string(c.sleep_us) + " ! appsink name=sink sync=false",
			  by_offset(reference));
	ASSERT_TRUE(consumer.start());
	Process producer =
		launch("videotestsrc is-live=true num-buffers=" + std::to_string(c.frames) + " pattern=ball ! " + caps +
		       " ! xmemsink pool-name=slow buffers=8 wait-for-consumers=1 " +
		       "block-timeout=30000000000 policy=" + c.policy);
	int status = finish(producer);
	size_t when_producer_ended = consumer.count();
	EXPECT_EQ(status, 0) << producer.output();
	ASSERT_TRUE(consumer.join(60s)) << "no EOS; " << consumer.count() << " frames";
	EXPECT_EQ(consumer.error(), "");
	auto frames = consumer.frames();
	ASSERT_FALSE(frames.empty());
	EXPECT_EQ(mismatches(frames), 0u) << "corrupt frames: a slot was reused under a consumer";
	EXPECT_TRUE(xmem::gsttest::strictly_increasing(frames));
	guint64 gaps = xmem::gsttest::gaps_in(frames);
	guint64 dropped = stat_u64(consumer.src(), "dropped");

	if (std::string(c.policy) == "block") {
		// The producer waited: it could not finish more than the consumer's queue
		// (2) and the frames in flight ahead of the consumer.
		EXPECT_EQ(frames.size(), size_t(c.frames));
		EXPECT_EQ(gaps, 0u);
		EXPECT_EQ(dropped, 0u);
		EXPECT_GE(when_producer_ended, size_t(c.frames - 8))
			<< "the producer did not wait for the slow consumer";
	} else {
		// The producer kept its rate: it ended long before the consumer caught up.
		EXPECT_LE(when_producer_ended, size_t(c.frames / 2)) << "the producer waited for the slow consumer";
		EXPECT_GT(gaps, 0u) << "no frames dropped for a consumer ten times slower";
		EXPECT_GT(dropped, 0u) << "xmemsrc's stats count no drops";
		EXPECT_EQ(dropped, gaps);
		EXPECT_LT(frames.size(), size_t(c.frames));
	}
}

INSTANTIATE_TEST_SUITE_P(Policies, SlowConsumer,
			 ::testing::Values(SlowCase{ "block", 40, 40000 }, SlowCase{ "drop-oldest", 50, 100000 },
					   SlowCase{ "drop-new", 50, 100000 }),
			 [](const ::testing::TestParamInfo<SlowCase> &info) {
				 std::string name = info.param.policy;
				 for (auto &ch : name)
					 if (ch == '-')
						 ch = '_';
				 return name;
			 });

// The README's recorder and detector on one pool, each with its own policy: the recorder
// (fifo-spill) is slower than the producer and gets every frame, from the spill tier when
// the producer needs their slots; the detector (latest) beside it is never held back, and
// neither is the producer.
TEST_F(MultiProcess, RecorderAndDetectorEachWithItsOwnPolicy)
{
	const int kFrames = 60;
	const std::string caps = "video/x-raw,format=RGBA,width=64,height=48,framerate=100/1";
	auto reference = xmem::gsttest::reference_frames(caps, "ball", kFrames);
	ASSERT_EQ(int(reference.size()), kFrames);
	Consumer recorder("xmemsrc name=src pool-name=mixed is-live=false policy=fifo-spill ! identity "
			  "sleep-time=25000 ! appsink name=sink sync=false",
			  by_offset(reference));
	Consumer detector("xmemsrc name=src pool-name=mixed is-live=false policy=latest ! appsink name=sink sync=false",
			  by_offset(reference));
	ASSERT_TRUE(recorder.start());
	ASSERT_TRUE(detector.start());
	Process producer =
		launch("videotestsrc is-live=true num-buffers=" + std::to_string(kFrames) + " pattern=ball ! " + caps +
		       " ! xmemsink pool-name=mixed buffers=4 spill-size=4000000 wait-for-consumers=2");
	int status = finish(producer);
	size_t when_producer_ended = recorder.count();
	EXPECT_EQ(status, 0) << producer.output();
	ASSERT_TRUE(recorder.join(60s)) << "no EOS; " << recorder.count() << " frames";
	ASSERT_TRUE(detector.join(60s)) << "no EOS; " << detector.count() << " frames";
	EXPECT_EQ(recorder.error(), "");
	EXPECT_EQ(detector.error(), "");
	auto recorded = recorder.frames();
	EXPECT_EQ(recorded.size(), size_t(kFrames));
	EXPECT_EQ(xmem::gsttest::gaps_in(recorded), 0u);
	EXPECT_EQ(mismatches(recorded), 0u) << "a spilled frame differs from what was published";
	EXPECT_TRUE(xmem::gsttest::strictly_increasing(recorded));
	EXPECT_LT(when_producer_ended, size_t(kFrames)) << "the producer waited for the recorder";
	EXPECT_GT(stat_u64(recorder.src(), "spilled"), 0u);
	EXPECT_EQ(stat_u64(recorder.src(), "lost"), 0u);
	EXPECT_EQ(stat_string(recorder.src(), "policy"), "fifo-spill");
	EXPECT_EQ(stat_string(detector.src(), "policy"), "latest");
	auto detected = detector.frames();
	EXPECT_EQ(mismatches(detected), 0u);
	EXPECT_TRUE(xmem::gsttest::strictly_increasing(detected));
}

TEST_F(MultiProcess, KilledConsumerGivesSlotsBack)
{
	Pipeline producer("videotestsrc is-live=true pattern=ball ! "
			  "video/x-raw,format=RGBA,width=64,height=48,framerate=50/1 ! "
			  "xmemsink name=sink pool-name=kill buffers=12");
	ASSERT_TRUE(producer);
	ASSERT_NE(producer.play(), GST_STATE_CHANGE_FAILURE);
	GstElement *sink = producer.by_name("sink");
	// The consumer hoards frames: a full queue ahead of an identity that sleeps.
	Process consumer = launch("xmemsrc pool-name=kill ! queue max-size-buffers=4 max-size-bytes=0 "
				  "max-size-time=0 ! identity sleep-time=500000 ! fakesink sync=false");
	ASSERT_TRUE(eventually([&] { return stat_u64(sink, "consumers") == 1; }, 20s)) << "the consumer never attached";
	ASSERT_TRUE(eventually([&] { return stat_u64(sink, "free-slots") <= 7; }, 20s))
		<< "the consumer holds fewer frames than expected: free-slots " << stat_u64(sink, "free-slots");

	consumer.signal(SIGKILL);
	EXPECT_EQ(consumer.wait(10s), 128 + SIGKILL);
	guint64 published = stat_u64(sink, "published");
	EXPECT_TRUE(eventually([&] { return stat_u64(sink, "consumers") == 0; }, 20s)) << "the dead consumer stays";
	EXPECT_TRUE(eventually([&] { return stat_u64(sink, "reaped") >= 1; }, 20s));
	EXPECT_TRUE(eventually([&] { return stat_u64(sink, "published") >= published + 25; }, 20s))
		<< "the producer stopped after the consumer died";
	EXPECT_EQ(producer.pop(GST_MESSAGE_ERROR, 0ms), nullptr) << "the producer posted an error";

	// Once the producer is done with its own frames, every slot is free again.
	gst_element_send_event(producer.get(), gst_event_new_eos());
	EXPECT_EQ(producer.wait_eos(20s), "");
	EXPECT_TRUE(eventually([&] { return stat_u64(sink, "free-slots") == 12; }, 20s))
		<< "free-slots " << stat_u64(sink, "free-slots") << " of 12 after the consumer's death";
}

// The consumer is slower than the producer, so it still has frames queued when the
// producer dies and reattaches once the dead process is fully gone (a consumer that
// is waiting reattaches at once: ProducerKilledWhileConsumerWaits).
TEST_F(MultiProcess, ProducerKilledAndRestartedWithNewResolution)
{
	auto producer_line = [](int w, int h) {
		return "videotestsrc is-live=true ! video/x-raw,format=RGBA,width=" + std::to_string(w) +
		       ",height=" + std::to_string(h) + ",framerate=30/1 ! xmemsink pool-name=restart";
	};
	Process first = launch(producer_line(160, 120));
	Consumer consumer("xmemsrc name=src pool-name=restart ! identity sleep-time=60000 ! "
			  "appsink name=sink sync=false");
	ASSERT_TRUE(consumer.start());
	ASSERT_TRUE(eventually([&] { return consumer.count() >= 5; }, 30s)) << "no frames from the first producer";
	first.signal(SIGKILL);
	EXPECT_EQ(first.wait(10s), 128 + SIGKILL);
	size_t before = consumer.count();

	Process second = launch(producer_line(320, 240));
	auto count_wide = [&] {
		size_t n = 0;
		for (const auto &f : consumer.frames())
			n += f.width == 320;
		return n;
	};
	EXPECT_TRUE(eventually([&] { return count_wide() >= 5; }, 30s))
		<< "no 320x240 frames after the restart (" << consumer.count() - before << " frames since)";
	EXPECT_EQ(consumer.error(), "") << "the consumer posted an error";
	EXPECT_FALSE(consumer.done()) << "the consumer stopped";
	EXPECT_GE(stat_u64(consumer.src(), "reconnects"), 1u);
	consumer.stop();
	second.kill_wait();

	auto frames = consumer.frames();
	bool switched = false;
	for (const auto &f : frames) {
		switched |= f.width == 320;
		EXPECT_EQ(f.width, switched ? 320 : 160) << "offset " << f.offset;
		EXPECT_EQ(f.height, switched ? 240 : 120);
		EXPECT_EQ(f.size, f.caps_size) << "a buffer does not match its caps";
	}
}

// A producer killed while the consumer waits for its next frame: the consumer sees
// the death at once and must wait for the next owner, whatever it finds meanwhile.
TEST_F(MultiProcess, ProducerKilledWhileConsumerWaits)
{
	Consumer consumer("xmemsrc name=src pool-name=dying is-live=false ! appsink name=sink sync=false");
	ASSERT_TRUE(consumer.start());
	for (int round = 0; round < 40 && !HasFailure(); round++) {
		SCOPED_TRACE("round " + std::to_string(round));
		size_t before = consumer.count();
		Process producer({ xmem::test::peer_path(), "produce", "dying", "--frames", "100000", "--fps", "200",
				   "--size", "4096", "--format", "video/x-raw,format=GRAY8,width=64,height=64" });
		ASSERT_TRUE(eventually([&] { return consumer.count() >= before + 3 || consumer.done(); }, 20s))
			<< "no frames from producer " << round;
		producer.signal(SIGKILL);
		EXPECT_EQ(producer.wait(10s), 128 + SIGKILL);
		std::this_thread::sleep_for(20ms);
		ASSERT_EQ(consumer.error(), "") << "the consumer gave up after the producer's death";
		ASSERT_FALSE(consumer.done());
	}
}

TEST_F(MultiProcess, EosEndToEnd)
{
	const int n = 25;
	Process producer = launch("videotestsrc num-buffers=" + std::to_string(n) +
				  " ! video/x-raw,format=I420,width=64,height=48 ! xmemsink pool-name=e2e "
				  "wait-for-consumers=2 policy=block block-timeout=30000000000");
	Pipeline here("xmemsrc name=src pool-name=e2e is-live=false ! fakesink");
	ASSERT_TRUE(here);
	ASSERT_NE(here.play(), GST_STATE_CHANGE_FAILURE);
	Process there = launch("xmemsrc pool-name=e2e is-live=false ! fakesink");

	EXPECT_EQ(here.wait_eos(60s), "") << "no EOS on the consumer's bus";
	EXPECT_EQ(stat_u64(here.by_name("src"), "received"), guint64(n));
	EXPECT_EQ(finish(there), 0) << "the gst-launch consumer did not end at EOS: " << there.output();
	EXPECT_EQ(finish(producer), 0) << producer.output();
}
