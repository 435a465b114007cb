// test_multiprocess.cpp - producer and consumers as separate processes: fan-out,
// late joiners, slow consumers under each policy, deaths on either side.
#include "common.hpp"
#include "frames.hpp"

#include <cstring>

using namespace std::chrono_literals;
using xmem::test::eventually;
using xmem::test::Process;
using xmem::test::RuntimeDir;

namespace {

std::string peer()
{
	return xmem::test::peer_path();
}

std::shared_ptr<xmem::BufferPool> make_owner(const std::string &name, xmem::Policy policy, uint32_t slots = 8,
					     std::chrono::milliseconds block_timeout = 1000ms)
{
	xmem::PoolConfig config;
	config.slot_count = slots;
	config.slot_size = 4096;
	config.policy = policy;
	config.block_timeout = block_timeout;
	auto pool = xmem::BufferPool::create(name, config);
	EXPECT_TRUE(pool.ok()) << (pool ? "" : pool.error().message);
	return pool ? pool.value() : nullptr;
}

xmem::Result<void> publish_one(xmem::BufferPool &pool, std::chrono::milliseconds timeout = 2s)
{
	return xmem::test::publish_test_frame(pool, timeout);
}

} // namespace

TEST(MultiProcess, FanOutToThreeConsumersBitExact)
{
	RuntimeDir dir;
	Process producer({ peer(), "produce", "fan", "--frames", "300", "--policy", "block", "--wait-consumers", "3",
			   "--size", "65536", "--drain" });
	std::vector<Process> consumers;
	for (int i = 0; i < 3; i++)
		consumers.emplace_back(
			std::vector<std::string>{ peer(), "consume", "fan", "--hold", std::to_string(i) });
	for (auto &c : consumers) {
		EXPECT_EQ(c.wait(60s), 0) << c.output();
		EXPECT_EQ(c.field("received"), 300) << c.output();
		EXPECT_EQ(c.field("gaps"), 0);
		EXPECT_EQ(c.field("corrupt"), 0);
		EXPECT_EQ(c.field("eos"), 1);
	}
	EXPECT_EQ(producer.wait(60s), 0) << producer.output();
	EXPECT_EQ(producer.field("dropped"), 0);
	EXPECT_EQ(producer.field("free"), 8);
	EXPECT_TRUE(eventually([&] { return dir.entries().empty(); })) << "socket or lock file left behind";
}

TEST(MultiProcess, LateJoiningConsumerGetsFramesFromAttachOn)
{
	RuntimeDir dir;
	// fifo (block): the ten frames after the attach all reach the consumer however late
	// a loaded machine (a TSan run) schedules it; drop-oldest lost some there.
	auto owner = make_owner("late", xmem::Policy::block, 8, 10000ms);
	ASSERT_TRUE(owner);
	for (int i = 0; i < 20; i++)
		ASSERT_TRUE(publish_one(*owner).ok());
	Process consumer({ peer(), "consume", "late", "--frames", "10" });
	ASSERT_TRUE(consumer.wait_output("attached"));
	ASSERT_TRUE(eventually([&] { return owner->stats().consumers == 1; }));
	for (int i = 0; i < 10; i++) {
		ASSERT_TRUE(publish_one(*owner).ok());
		std::this_thread::sleep_for(2ms);
	}
	EXPECT_EQ(consumer.wait(30s), 0) << consumer.output();
	EXPECT_EQ(consumer.field("received"), 10);
	EXPECT_EQ(consumer.field("corrupt"), 0);
}

TEST(MultiProcess, SlowConsumerDropOldestKeepsProducerGoing)
{
	RuntimeDir dir;
	Process producer({ peer(), "produce", "slow", "--frames", "400", "--policy", "drop-oldest", "--wait-consumers",
			   "2", "--fps", "2000" });
	Process fast({ peer(), "consume", "slow" });
	Process slow({ peer(), "consume", "slow", "--work-us", "3000", "--queue", "2", "--hold", "1" });
	EXPECT_EQ(producer.wait(60s), 0) << producer.output();
	EXPECT_EQ(fast.wait(60s), 0) << fast.output();
	EXPECT_EQ(slow.wait(60s), 0) << slow.output();
	EXPECT_GT(slow.field("gaps"), 0) << slow.output();
	EXPECT_EQ(slow.field("corrupt"), 0);
	EXPECT_EQ(slow.field("eos"), 1);
	EXPECT_EQ(fast.field("corrupt"), 0);
	EXPECT_GE(producer.field("dropped"), slow.field("gaps"));
}

TEST(MultiProcess, SlowConsumerDropNewKeepsItsOldestFrames)
{
	RuntimeDir dir;
	auto owner = make_owner("dropnew", xmem::Policy::drop_new);
	ASSERT_TRUE(owner);
	Process consumer({ peer(), "consume", "dropnew", "--frames", "3", "--queue", "3" });
	ASSERT_TRUE(eventually([&] { return owner->stats().consumers == 1; }));
	// The consumer is not scheduled to receive in between: stop it while we publish.
	consumer.signal(SIGSTOP);
	for (int i = 0; i < 6; i++)
		ASSERT_TRUE(publish_one(*owner).ok());
	consumer.signal(SIGCONT);
	EXPECT_EQ(consumer.wait(30s), 0) << consumer.output();
	// Frames 1-3 were queued, 4-6 dropped: the consumer saw seq 1..3 without gaps.
	EXPECT_EQ(consumer.field("received"), 3);
	EXPECT_EQ(consumer.field("gaps"), 0);
	EXPECT_EQ(owner->stats().dropped, 3u);
}

TEST(MultiProcess, BlockPolicyWaitsForAStoppedConsumerThenDrops)
{
	RuntimeDir dir;
	auto owner = make_owner("block", xmem::Policy::block, 8, 300ms);
	ASSERT_TRUE(owner);
	Process consumer({ peer(), "consume", "block", "--queue", "2" });
	ASSERT_TRUE(eventually([&] { return owner->stats().consumers == 1; }));
	consumer.signal(SIGSTOP);
	ASSERT_TRUE(publish_one(*owner).ok());
	ASSERT_TRUE(publish_one(*owner).ok());
	auto t0 = std::chrono::steady_clock::now();
	ASSERT_TRUE(publish_one(*owner).ok());
	auto waited = std::chrono::steady_clock::now() - t0;
	EXPECT_GE(waited, 250ms) << "block policy did not wait";
	EXPECT_EQ(owner->stats().dropped, 1u) << "after block-timeout the oldest is dropped";
	// A dead consumer ends the wait at once.
	consumer.signal(SIGKILL);
	consumer.wait();
	t0 = std::chrono::steady_clock::now();
	for (int i = 0; i < 5; i++)
		ASSERT_TRUE(publish_one(*owner).ok());
	EXPECT_LT(std::chrono::steady_clock::now() - t0, 250ms * 5);
	EXPECT_TRUE(eventually([&] { return owner->stats().slots_free == 8; }));
}

TEST(MultiProcess, ConsumerKilledWhileHoldingFramesReleasesThem)
{
	RuntimeDir dir;
	auto owner = make_owner("held", xmem::Policy::drop_oldest);
	ASSERT_TRUE(owner);
	Process consumer({ peer(), "consume", "held", "--hold", "5", "--queue", "8", "--frames", "1000000" });
	ASSERT_TRUE(eventually([&] { return owner->stats().consumers == 1; }));
	for (int i = 0; i < 6; i++)
		ASSERT_TRUE(publish_one(*owner).ok());
	ASSERT_TRUE(eventually([&] { return owner->stats().slots_free == 3; })) << owner->stats().slots_free;
	consumer.signal(SIGKILL);
	consumer.wait();
	// The reaper marks the consumer dead first, frees its slots, and counts it last:
	// wait for all three, or a slow machine (TSan) reads the count before it moves.
	EXPECT_TRUE(eventually([&] {
		auto s = owner->stats();
		return s.slots_free == 8 && s.consumers == 0 && s.reaped == 1;
	})) << owner->stats().reaped;
	EXPECT_EQ(owner->stats().reaped, 1u);
	// The producer carries on with every slot.
	std::vector<xmem::BufferGuard> all;
	for (int i = 0; i < 8; i++) {
		auto g = owner->acquire(100ms);
		ASSERT_TRUE(g.ok()) << g.error().message;
		all.push_back(std::move(g.value()));
	}
}

TEST(MultiProcess, ProducerKilledAndRestartedWithAnotherFormat)
{
	RuntimeDir dir;
	Process first({ peer(), "produce", "restart", "--frames", "100000", "--fps", "500", "--format",
			"video/x-raw,width=640,height=480", "--no-eos" });
	ASSERT_TRUE(first.wait_output("ready"));
	Process consumer({ peer(), "consume", "restart", "--hold", "3", "--reconnect", "--timeout-ms", "20000" });
	ASSERT_TRUE(consumer.wait_output("attached format=video/x-raw,width=640,height=480"));
	std::this_thread::sleep_for(100ms);
	first.signal(SIGKILL);
	first.wait();
	// The dead owner's socket stays behind until the next owner replaces it.
	Process second({ peer(), "produce", "restart", "--frames", "50", "--fps", "500", "--format",
			 "video/x-raw,width=1280,height=720", "--wait-consumers", "1", "--linger-ms", "200" });
	EXPECT_EQ(second.wait(30s), 0) << second.output();
	EXPECT_EQ(consumer.wait(30s), 0) << consumer.output();
	EXPECT_NE(consumer.output().find("attached format=video/x-raw,width=1280,height=720"), std::string::npos)
		<< consumer.output();
	EXPECT_EQ(consumer.field("reconnects"), 1);
	EXPECT_EQ(consumer.field("eos"), 1);
	EXPECT_EQ(consumer.field("corrupt"), 0) << "frames held across the owner's death must stay intact";
}

TEST(MultiProcess, FramesHeldStayReadableAfterOwnerDies)
{
	RuntimeDir dir;
	auto owner = make_owner("limbo", xmem::Policy::drop_oldest);
	ASSERT_TRUE(owner);
	for (int i = 0; i < 3; i++)
		ASSERT_TRUE(publish_one(*owner).ok());
	// Consumer in another process holds 3 frames, then the owner goes away (here:
	// destroyed; the SIGKILL case is ProducerKilledAndRestartedWithAnotherFormat).
	Process consumer({ peer(), "consume", "limbo", "--hold", "3", "--timeout-ms", "5000" });
	ASSERT_TRUE(eventually([&] { return owner->stats().consumers == 1; }));
	for (int i = 0; i < 3; i++)
		ASSERT_TRUE(publish_one(*owner).ok());
	ASSERT_TRUE(eventually([&] { return owner->stats().slots_free == 5; }));
	auto t0 = std::chrono::steady_clock::now();
	owner.reset();
	EXPECT_LT(std::chrono::steady_clock::now() - t0, 500ms) << "closing must not wait for consumers";
	EXPECT_EQ(consumer.wait(30s), 0) << consumer.output();
	EXPECT_EQ(consumer.field("received"), 3);
	EXPECT_EQ(consumer.field("closed"), 1);
	EXPECT_EQ(consumer.field("corrupt"), 0);
}
