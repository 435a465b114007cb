// test_qos.cpp - what a consumer may hold and what a late one is given: the cap on slots
// held (max_held: delivery stops at it, each policy's way of missing frames there, the
// default, and a producer that never runs short beside a consumer that keeps every
// frame), and history (the newest frames still in the pool, oldest first, then the live
// stream, also while the producer reuses slots under it).
#include "common.hpp"
#include "frames.hpp"

#include <xmem/snapshot.hpp>

#include <atomic>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
using xmem::BufferGuard;
using xmem::BufferPool;
using xmem::Errc;
using xmem::OpenOptions;
using xmem::Policy;
using xmem::test::eventually;
using xmem::test::make_pool;
using xmem::test::RuntimeDir;
using xmem::test::why;

std::shared_ptr<BufferPool> open_with(const std::string &name, OpenOptions options)
{
	auto pool = BufferPool::open(name, options);
	EXPECT_TRUE(pool.ok()) << pool.error().message;
	return pool.ok() ? pool.value() : nullptr;
}

// A consumer of NAME with POLICY, a cap of MAX_HELD (0: the default) and HISTORY.
std::shared_ptr<BufferPool> consumer(const std::string &name, Policy policy, uint32_t max_held, uint32_t queue = 0,
				     uint32_t history = 0)
{
	OpenOptions options;
	options.policy = policy;
	options.max_held = max_held;
	options.queue_size = queue;
	options.history = history;
	options.block_timeout = 2s;
	return open_with(name, options);
}

xmem::Result<void> publish(BufferPool &owner, std::chrono::nanoseconds timeout = 1s)
{
	return xmem::test::publish_test_frame(owner, timeout);
}

// The frames a consumer receives without waiting, each one's payload checked against
// its sequence number.
std::vector<uint64_t> drain(BufferPool &c)
{
	std::vector<uint64_t> seqs;
	for (;;) {
		auto f = c.receive(0ns);
		if (!f)
			break;
		EXPECT_TRUE(xmem::test::check(f->data(), f->meta().seq)) << "frame " << f->meta().seq;
		seqs.push_back(f->meta().seq);
	}
	return seqs;
}

// The slots consumer record INDEX holds as xmem-inspect sees them (queued ones too).
uint32_t held_seen(BufferPool &pool, uint32_t index)
{
	auto snap = xmem::snapshot(pool);
	EXPECT_TRUE(snap.ok());
	if (snap.ok())
		for (const auto &c : snap->consumers)
			if (c.index == index)
				return c.held;
	return UINT32_MAX;
}

} // namespace

// A consumer that keeps every frame it receives holds at most its cap; the producer,
// acquiring with a short timeout, never runs short; the frames it misses are counted;
// its receive says why nothing comes; and letting one frame go lets the next one in.
TEST(MaxHeld, AConsumerThatKeepsEveryFrameHoldsAtMostItsCap)
{
	RuntimeDir dir;
	auto owner = make_pool("keeper", 8);
	ASSERT_TRUE(owner);
	auto keeper = consumer("keeper", Policy::drop_oldest, 2);
	ASSERT_TRUE(keeper);
	std::vector<BufferGuard> kept;
	for (int i = 0; i < 30; i++) {
		ASSERT_OK(publish(*owner, 200ms)); // the producer never waits for a slot
		for (auto f = keeper->receive(0ns); f; f = keeper->receive(0ns))
			kept.push_back(std::move(f.value()));
		auto snap = xmem::snapshot(*owner);
		ASSERT_TRUE(snap.ok());
		ASSERT_EQ(snap->consumers.size(), 1u);
		EXPECT_LE(snap->consumers[0].held, 2u) << "after frame " << i + 1;
		EXPECT_EQ(snap->consumers[0].max_held, 2u);
	}
	EXPECT_EQ(kept.size(), 2u);
	auto stats = keeper->consumer_stats();
	ASSERT_OK(stats);
	EXPECT_EQ(stats->held, 2u);
	EXPECT_EQ(stats->max_held, 2u);
	EXPECT_EQ(stats->dropped, 28u) << "every frame it missed at its cap is counted";
	auto none = keeper->receive(50ms);
	EXPECT_ERRC(none, Errc::timed_out);
	EXPECT_NE(why(none).find("max_held 2"), std::string::npos) << why(none);
	EXPECT_EQ(owner->stats().slots_free, 6u);

	// One let go: the next frame reaches it.
	kept.erase(kept.begin());
	ASSERT_OK(publish(*owner));
	auto next = keeper->receive(1s);
	ASSERT_OK(next);
	EXPECT_EQ(next->meta().seq, 31u);
}

// The default: half the pool's slots, but at least the queue it asked for and one frame
// in hand; a default of the whole pool is none; one asked for is kept.
TEST(MaxHeld, TheDefaultIsHalfThePoolOrTheQueueAndOne)
{
	RuntimeDir dir;
	auto owner = make_pool("default-cap", 8);
	ASSERT_TRUE(owner);
	struct Case {
		Policy policy;
		uint32_t queue;
		uint32_t max_held;
		uint32_t cap;
	};
	for (Case c :
	     { Case{ Policy::latest, 0, 0, 4 }, Case{ Policy::drop_oldest, 0, 0, 5 }, Case{ Policy::drop_new, 2, 0, 4 },
	       Case{ Policy::fifo, 8, 0, 0 }, Case{ Policy::fifo, 2, 3, 3 }, Case{ Policy::drop_oldest, 0, 8, 8 } }) {
		SCOPED_TRACE(std::string(xmem::policy_name(c.policy)) + " queue " + std::to_string(c.queue));
		auto pool = consumer("default-cap", c.policy, c.max_held, c.queue);
		ASSERT_TRUE(pool);
		auto stats = pool->consumer_stats();
		ASSERT_OK(stats);
		EXPECT_EQ(stats->max_held, c.cap);
	}
	auto small = make_pool("one-slot", 1);
	ASSERT_TRUE(small);
	auto alone = consumer("one-slot", Policy::latest, 0);
	ASSERT_TRUE(alone);
	EXPECT_EQ(alone->consumer_stats()->max_held, 0u) << "one slot: a cap of 1 is the whole pool, no cap";
}

// At its cap with frames queued, drop-oldest and latest make room by dropping the oldest
// queued one, so it gets the newest; drop-new keeps what it has and misses the new one.
TEST(MaxHeld, AtTheCapEachPolicyMissesItsOwnWay)
{
	RuntimeDir dir;
	for (Policy policy : { Policy::drop_oldest, Policy::drop_new }) {
		SCOPED_TRACE(xmem::policy_name(policy));
		std::string name = std::string("cap-") + xmem::policy_name(policy);
		auto owner = make_pool(name, 8);
		ASSERT_TRUE(owner);
		auto c = consumer(name, policy, 3, 4);
		ASSERT_TRUE(c);
		ASSERT_OK(publish(*owner));
		auto first = c->receive(1s);
		ASSERT_OK(first); // kept: 1 held, 2 more fit under the cap
		for (int i = 0; i < 4; i++)
			ASSERT_OK(publish(*owner));
		std::vector<uint64_t> want =
			policy == Policy::drop_oldest ? std::vector<uint64_t>{ 4, 5 } : std::vector<uint64_t>{ 2, 3 };
		EXPECT_EQ(drain(*c), want);
		EXPECT_EQ(c->consumer_stats()->dropped, 2u);
	}
}

// fifo at its cap: the publisher waits for a frame to be let go (not only taken), then
// delivers; nothing is lost. Past the block timeout its fallback applies.
TEST(MaxHeld, FifoWaitsForALetGoThenDelivers)
{
	RuntimeDir dir;
	auto owner = make_pool("cap-fifo", 8);
	ASSERT_TRUE(owner);
	auto c = consumer("cap-fifo", Policy::fifo, 2, 4);
	ASSERT_TRUE(c);
	ASSERT_OK(publish(*owner));
	ASSERT_OK(publish(*owner));
	auto one = c->receive(1s);
	auto two = c->receive(1s);
	ASSERT_OK(one);
	ASSERT_OK(two);
	std::atomic<bool> done{ false };
	std::thread producer([&] {
		EXPECT_OK(publish(*owner, 5s));
		done = true;
	});
	std::this_thread::sleep_for(100ms);
	EXPECT_FALSE(done.load()) << "a frame taken is still held: the publisher waits";
	one = BufferGuard();
	producer.join();
	EXPECT_EQ(drain(*c), (std::vector<uint64_t>{ 3 }));
	EXPECT_EQ(c->consumer_stats()->dropped, 0u);
}

// Frames published before a consumer attached, still in the pool, reach a late joiner
// first, oldest first and intact; then the live stream. History is bounded by its
// queue (latest: the newest only), and a consumer that asked for none gets none.
TEST(History, ALateJoinerGetsTheNewestFramesStillInThePoolOldestFirst)
{
	RuntimeDir dir;
	auto owner = make_pool("history", 8);
	ASSERT_TRUE(owner);
	// Twelve frames in eight slots: the oldest four are gone, reused.
	for (int i = 0; i < 12; i++)
		ASSERT_OK(publish(*owner));
	auto three = consumer("history", Policy::fifo, 0, 4, 3);
	auto all = consumer("history", Policy::fifo, 0, 8, 100);
	auto newest = consumer("history", Policy::latest, 0, 0, 5);
	auto none = consumer("history", Policy::fifo, 0, 4, 0);
	ASSERT_TRUE(three && all && newest && none);
	EXPECT_EQ(drain(*three), (std::vector<uint64_t>{ 10, 11, 12 }));
	EXPECT_EQ(drain(*all), (std::vector<uint64_t>{ 5, 6, 7, 8, 9, 10, 11, 12 }));
	EXPECT_EQ(drain(*newest), (std::vector<uint64_t>{ 12 }));
	EXPECT_EQ(drain(*none), std::vector<uint64_t>{});
	ASSERT_OK(publish(*owner));
	for (auto *c : { &three, &all, &newest, &none })
		EXPECT_EQ(drain(**c), (std::vector<uint64_t>{ 13 }));
	EXPECT_EQ(held_seen(*owner, 0), 0u);
}

// A pool that publishes rarely: a late joiner asking for history has the last frame at
// once, not at the next publish.
TEST(History, ARarelyPublishingPoolGivesALateJoinerItsLastFrameAtOnce)
{
	RuntimeDir dir;
	auto owner = make_pool("rare", 4);
	ASSERT_TRUE(owner);
	ASSERT_OK(publish(*owner));
	std::this_thread::sleep_for(100ms);
	auto late = consumer("rare", Policy::latest, 0, 0, 1);
	ASSERT_TRUE(late);
	auto start = std::chrono::steady_clock::now();
	auto f = late->receive(500ms);
	ASSERT_OK(f);
	EXPECT_EQ(f->meta().seq, 1u);
	EXPECT_LT(std::chrono::steady_clock::now() - start, 500ms);
}

// Consumers attaching with history while the producer reuses every slot as fast as it
// can: each frame given is the one its sequence number says (never a slot's next frame),
// in order, and no slot is left held.
TEST(History, HistoryTakenWhileTheProducerReusesSlotsIsAlwaysTheRightFrame)
{
	RuntimeDir dir;
	auto owner = make_pool("history-race", 4, 65536);
	ASSERT_TRUE(owner);
	std::atomic<bool> stop{ false };
	std::thread producer([&] {
		while (!stop)
			(void)publish(*owner, 100ms);
	});
	int given = 0;
	for (int round = 0; round < 200; round++) {
		auto late = consumer("history-race", Policy::drop_oldest, 0, 2, 2);
		ASSERT_TRUE(late);
		uint64_t last = 0;
		for (int k = 0; k < 2; k++) {
			auto f = late->receive(0ns);
			if (!f)
				break;
			ASSERT_TRUE(xmem::test::check(f->data(), f->meta().seq)) << "round " << round;
			EXPECT_GT(f->meta().seq, last);
			last = f->meta().seq;
			given++;
		}
	}
	stop = true;
	producer.join();
	EXPECT_GT(given, 0) << "no history was ever given";
	EXPECT_TRUE(eventually([&] { return owner->stats().slots_free == 4; })) << owner->stats().slots_free;
}
