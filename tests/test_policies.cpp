// test_policies.cpp - each consumer's own policy beside the others' (fifo, latest,
// drop-oldest, drop-new, fifo-spill), the spill tier (order, payloads, its cap and the
// fallbacks past it, memory given back), and a consumer killed with spilled frames.
#include "common.hpp"
#include "frames.hpp"
#include "layout.hpp"
#include "spin_wake.hpp"

#include <poll.h>

#include <cstdio>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
using xmem::BufferPool;
using xmem::Errc;
using xmem::OpenOptions;
using xmem::Policy;
using xmem::PoolConfig;
using xmem::test::eventually;
using xmem::test::Process;
using xmem::test::RuntimeDir;

std::shared_ptr<BufferPool> make_pool(const std::string &name, uint32_t slots, uint64_t spill_bytes = 0,
				      Policy policy = Policy::drop_oldest)
{
	PoolConfig config;
	config.slot_count = slots;
	config.slot_size = 8192;
	config.policy = policy;
	config.spill_bytes = spill_bytes;
	auto pool = BufferPool::create(name, config);
	EXPECT_TRUE(pool.ok()) << pool.error().message;
	return pool.ok() ? pool.value() : nullptr;
}

std::shared_ptr<BufferPool> attach(const std::string &name, std::optional<Policy> policy, uint32_t queue = 0,
				   Policy fallback = Policy::drop_oldest, std::chrono::nanoseconds block_timeout = 0ns)
{
	OpenOptions options;
	options.policy = policy;
	options.queue_size = queue;
	options.fallback = fallback;
	options.block_timeout = block_timeout;
	options.client = policy ? xmem::policy_name(*policy) : "pool-default";
	auto pool = BufferPool::open(name, options);
	EXPECT_TRUE(pool.ok()) << pool.error().message;
	return pool.ok() ? pool.value() : nullptr;
}

// The seqs a consumer receives without waiting, each frame's payload checked.
std::vector<uint64_t> drain(BufferPool &consumer, uint64_t *corrupt = nullptr)
{
	std::vector<uint64_t> seqs;
	for (;;) {
		auto f = consumer.receive(0ns);
		if (!f)
			break;
		if (corrupt && !xmem::test::check(f->data(), f->meta().seq))
			(*corrupt)++;
		seqs.push_back(f->meta().seq);
	}
	return seqs;
}

void publish(BufferPool &owner, int n, std::chrono::nanoseconds timeout = 2s)
{
	for (int i = 0; i < n; i++) {
		auto r = xmem::test::publish_test_frame(owner, timeout);
		ASSERT_TRUE(r.ok()) << "frame " << i << ": " << r.error().message;
	}
}

std::vector<uint64_t> range(uint64_t first, uint64_t last)
{
	std::vector<uint64_t> v;
	for (uint64_t s = first; s <= last; s++)
		v.push_back(s);
	return v;
}

} // namespace

// Four consumers with four policies on one pool: each gets what its own policy says,
// whatever the others chose.
TEST(Policies, EachConsumerIsServedByItsOwnPolicy)
{
	RuntimeDir dir;
	auto owner = make_pool("mixed", 16);
	ASSERT_TRUE(owner);
	auto latest = attach("mixed", Policy::latest);
	auto oldest = attach("mixed", Policy::drop_oldest, 3);
	auto newest = attach("mixed", Policy::drop_new, 3);
	auto fifo = attach("mixed", Policy::fifo, 8);
	ASSERT_TRUE(latest && oldest && newest && fifo);
	publish(*owner, 8);

	EXPECT_EQ(drain(*latest), std::vector<uint64_t>{ 8 });
	EXPECT_EQ(drain(*oldest), range(6, 8));
	EXPECT_EQ(drain(*newest), range(1, 3));
	EXPECT_EQ(drain(*fifo), range(1, 8));

	auto stats = latest->consumer_stats();
	ASSERT_TRUE(stats.ok());
	EXPECT_EQ(stats->policy, uint32_t(XMEM_POLICY_LATEST));
	EXPECT_EQ(stats->queue_size, 1u);
	EXPECT_EQ(stats->dropped, 7u);
	EXPECT_EQ(oldest->consumer_stats()->dropped, 5u);
	EXPECT_EQ(newest->consumer_stats()->dropped, 5u);
	EXPECT_EQ(fifo->consumer_stats()->dropped, 0u);
	EXPECT_EQ(fifo->consumer_stats()->received, 8u);
	// Replaced frames gave their slots back at once: nothing is queued or held.
	EXPECT_EQ(owner->stats().slots_free, 16u);
}

// latest: a mailbox of one. The replaced frame's slot comes back at once, so a pool of
// two slots never runs dry under a consumer that is never read.
TEST(Policies, LatestGivesTheReplacedSlotBackAtOnce)
{
	RuntimeDir dir;
	auto owner = make_pool("mailbox", 2, 0, Policy::drop_new);
	ASSERT_TRUE(owner);
	auto latest = attach("mailbox", Policy::latest);
	ASSERT_TRUE(latest);
	publish(*owner, 50, 0ns); // no acquire ever waits
	EXPECT_EQ(drain(*latest), std::vector<uint64_t>{ 50 });
	EXPECT_EQ(latest->consumer_stats()->dropped, 49u);
}

// fifo: the publisher waits for this consumer up to its own block timeout, then its
// fallback applies; a latest consumer beside it is not held back by its queue.
TEST(Policies, FifoWaitsItsOwnTimeoutThenFallsBack)
{
	RuntimeDir dir;
	auto owner = make_pool("fifo", 8, 0, Policy::drop_oldest);
	ASSERT_TRUE(owner);
	auto fifo = attach("fifo", Policy::fifo, 2, Policy::drop_new, 100ms);
	auto latest = attach("fifo", Policy::latest);
	ASSERT_TRUE(fifo && latest);
	publish(*owner, 2);
	auto t0 = std::chrono::steady_clock::now();
	publish(*owner, 1); // fifo's queue is full: waits 100 ms, then drop-new
	auto waited = std::chrono::steady_clock::now() - t0;
	EXPECT_GE(waited, 95ms);
	EXPECT_EQ(drain(*fifo), range(1, 2));
	EXPECT_EQ(fifo->consumer_stats()->dropped, 1u);
	EXPECT_EQ(drain(*latest), std::vector<uint64_t>{ 3 });

	// Room in its queue while the publisher waits: nothing is lost.
	publish(*owner, 2);
	std::thread reader([&] {
		std::this_thread::sleep_for(20ms);
		auto f = fifo->receive(1s);
		EXPECT_TRUE(f.ok());
	});
	publish(*owner, 1);
	reader.join();
	EXPECT_EQ(drain(*fifo), range(5, 6));
	EXPECT_EQ(fifo->consumer_stats()->dropped, 1u);
	auto s = fifo->consumer_stats();
	EXPECT_EQ(s->policy, uint32_t(XMEM_POLICY_FIFO));
	EXPECT_EQ(s->fallback, uint32_t(XMEM_POLICY_DROP_NEW));
	EXPECT_EQ(s->block_timeout_ns, 100'000'000u);
}

// The pool's policy is the default; a consumer's own policy overrides it.
TEST(Policies, ThePoolsPolicyIsTheDefault)
{
	RuntimeDir dir;
	auto owner = make_pool("default", 8, 0, Policy::drop_new);
	ASSERT_TRUE(owner);
	auto by_default = attach("default", std::nullopt, 2);
	auto own = attach("default", Policy::drop_oldest, 2);
	ASSERT_TRUE(by_default && own);
	EXPECT_EQ(by_default->consumer_stats()->policy, uint32_t(XMEM_POLICY_DROP_NEW));
	publish(*owner, 4);
	EXPECT_EQ(drain(*by_default), range(1, 2));
	EXPECT_EQ(drain(*own), range(3, 4));
}

TEST(Policies, BadRequestsAreRefusedWithTheReason)
{
	RuntimeDir dir;
	auto owner = make_pool("refusals", 4);
	ASSERT_TRUE(owner);
	OpenOptions spill;
	spill.policy = Policy::fifo_spill;
	auto r = BufferPool::open("refusals", spill);
	EXPECT_ERRC(r, Errc::invalid_argument);
	EXPECT_NE(r.error().message.find("spill"), std::string::npos) << r.error().message;

	OpenOptions fallback;
	fallback.policy = Policy::fifo;
	fallback.fallback = Policy::latest;
	EXPECT_ERRC(BufferPool::open("refusals", fallback), Errc::invalid_argument);
	OpenOptions unknown;
	unknown.policy = Policy(17);
	EXPECT_ERRC(BufferPool::open("refusals", unknown), Errc::invalid_argument);
	OpenOptions negative;
	negative.block_timeout = -1ms;
	EXPECT_ERRC(BufferPool::open("refusals", negative), Errc::invalid_argument);
	OpenOptions wake;
	wake.wake = xmem::Wake(7);
	EXPECT_ERRC(BufferPool::open("refusals", wake), Errc::invalid_argument);
	for (auto budget : { 0us, std::chrono::microseconds(2'000'000) }) {
		OpenOptions spin;
		spin.wake = xmem::Wake::spin_before;
		spin.spin_budget = budget;
		EXPECT_ERRC(BufferPool::open("refusals", spin), Errc::invalid_argument);
	}

	PoolConfig config;
	config.slot_size = 4096;
	config.policy = Policy::fifo_spill;
	EXPECT_ERRC(BufferPool::create("no-tier", config), Errc::invalid_argument);
	config.policy = Policy::drop_oldest;
	config.spill_frames = 4;
	EXPECT_ERRC(BufferPool::create("frames-only", config), Errc::invalid_argument);
	config.spill_bytes = 1 << 20;
	config.spill_frames = xmem::layout::kMaxSpillFrames + 1;
	EXPECT_ERRC(BufferPool::create("too-many", config), Errc::invalid_argument);
}

// The case in one process: a fifo-spill recorder that reads nothing while a
// latest detector reads every frame. The producer never waits, the detector gets the
// newest frame each time, and the recorder later gets every frame, in order, intact.
TEST(Spill, AStalledRecorderLosesNothingAndHoldsNobodyBack)
{
	RuntimeDir dir;
	constexpr int kFrames = 60;
	auto owner = make_pool("spill", 4, 64 * 8192);
	ASSERT_TRUE(owner);
	auto recorder = attach("spill", Policy::fifo_spill);
	auto detector = attach("spill", Policy::latest);
	ASSERT_TRUE(recorder && detector);
	// Every slot record (4, and 64 for size classes to come) and every spill buffer (64).
	EXPECT_EQ(recorder->consumer_stats()->queue_size, 4u + 64u + 64u);
	for (int i = 1; i <= kFrames; i++) {
		auto r = xmem::test::publish_test_frame(*owner, 0ns); // never waits
		ASSERT_TRUE(r.ok()) << "frame " << i << ": " << r.error().message;
		auto f = detector->receive(0ns);
		ASSERT_TRUE(f.ok()) << f.error().message;
		EXPECT_EQ(f->meta().seq, uint64_t(i));
		EXPECT_TRUE(xmem::test::check(f->data(), f->meta().seq));
	}
	auto spill = owner->spill_stats();
	EXPECT_GE(spill.spilled, uint64_t(kFrames - 4));
	EXPECT_EQ(spill.frames, spill.spilled);
	EXPECT_EQ(spill.bytes, spill.frames * 8192);
	EXPECT_EQ(spill.full, 0u);
	EXPECT_GE(spill.resident_bytes, spill.bytes) << "the memfd holds the spilled frames' pages";
	EXPECT_EQ(recorder->consumer_stats()->spilled, spill.spilled);

	uint64_t corrupt = 0;
	EXPECT_EQ(drain(*recorder, &corrupt), range(1, kFrames));
	EXPECT_EQ(corrupt, 0u);
	EXPECT_EQ(recorder->consumer_stats()->dropped, 0u);
	// Read and released: the next publish gives the tier's memory back.
	publish(*owner, 1);
	EXPECT_EQ(owner->spill_stats().frames, 0u);
	EXPECT_EQ(owner->spill_stats().bytes, 0u);
	EXPECT_GE(owner->spill_stats().peak_bytes, uint64_t(kFrames - 4) * 8192);
}

// A spilled frame read while its slot is rewritten: the copy is the frame as published,
// with its metadata, format and side data.
TEST(Spill, ASpilledFrameKeepsItsMetadataFormatAndSideData)
{
	RuntimeDir dir;
	auto owner = make_pool("spill-meta", 2, 16 * 8192);
	ASSERT_TRUE(owner);
	ASSERT_TRUE(owner->set_format("video/x-raw,format=GRAY8,width=64,height=128").ok());
	auto recorder = attach("spill-meta", Policy::fifo_spill);
	ASSERT_TRUE(recorder);
	for (uint64_t i = 1; i <= 6; i++) {
		auto g = owner->acquire(0ns);
		ASSERT_TRUE(g.ok()) << g.error().message;
		xmem::test::fill(g->data_mut().value(), 8192, i);
		auto *m = g->meta_mut().value();
		m->size = 8192;
		m->pts = i * 1000;
		m->flags = uint32_t(i);
		std::snprintf(m->content_type, sizeof(m->content_type), "frame-%llu", (unsigned long long)i);
		std::byte side[3] = { std::byte(i), std::byte(2 * i), std::byte(3 * i) };
		ASSERT_TRUE(g->set_side_data(side).ok());
		ASSERT_TRUE(owner->publish(std::move(*g)).ok());
	}
	EXPECT_GE(owner->spill_stats().spilled, 4u);
	for (uint64_t i = 1; i <= 6; i++) {
		auto f = recorder->receive(0ns);
		ASSERT_TRUE(f.ok()) << f.error().message;
		EXPECT_EQ(f->meta().seq, i);
		EXPECT_EQ(f->meta().pts, i * 1000);
		EXPECT_EQ(f->meta().flags, uint32_t(i));
		EXPECT_EQ(std::string(f->meta().content_type), "frame-" + std::to_string(i));
		EXPECT_TRUE(xmem::test::check(f->data(), i));
		EXPECT_EQ(f->format(), "video/x-raw,format=GRAY8,width=64,height=128");
		ASSERT_EQ(f->side_data().size(), 3u);
		EXPECT_EQ(f->side_data()[2], std::byte(3 * i));
		EXPECT_EQ(f->storage(), xmem::Storage::system);
		// Writable only as a copy: a spilled frame is never written in place.
		EXPECT_FALSE(f->writable());
	}
}

// Past the tier's cap the consumer's fallback applies, and is counted: drop-new keeps the
// oldest frames in order; drop-oldest keeps the newest.
TEST(Spill, PastTheCapTheFallbackApplies)
{
	for (Policy fallback : { Policy::drop_new, Policy::drop_oldest }) {
		SCOPED_TRACE(xmem::policy_name(fallback));
		RuntimeDir dir;
		auto owner = make_pool("capped", 2, 4 * 8192);
		ASSERT_TRUE(owner);
		auto recorder = attach("capped", Policy::fifo_spill, 0, fallback);
		ASSERT_TRUE(recorder);
		publish(*owner, 30, 0ns); // never waits, cap or not
		auto spill = owner->spill_stats();
		EXPECT_GT(spill.full, 0u);
		EXPECT_LE(spill.bytes, 4u * 8192);
		uint64_t corrupt = 0;
		std::vector<uint64_t> got = drain(*recorder, &corrupt);
		EXPECT_EQ(corrupt, 0u);
		ASSERT_FALSE(got.empty());
		EXPECT_TRUE(std::is_sorted(got.begin(), got.end()));
		EXPECT_EQ(std::adjacent_find(got.begin(), got.end()), got.end());
		auto s = recorder->consumer_stats();
		EXPECT_EQ(s->dropped + got.size(), 30u) << "every frame received or counted as dropped";
		if (fallback == Policy::drop_new)
			EXPECT_EQ(got.front(), 1u) << "drop-new keeps the oldest";
		else
			EXPECT_EQ(got.back(), 30u) << "drop-oldest keeps the newest";
	}
}

// The spill thread spills ahead of the producer's next acquire, and a full tier stops
// it there: it drops nothing, since no acquire needs a slot yet and a consumer catching
// up may empty the tier meanwhile. Before, it applied the fallback at once, and a
// recorder that had read up to frame 29 lost frame 30, the newest, to drop-oldest (CI,
// stop 29; tests/model/README.md, Finding 11).
TEST(Spill, AFullTierCostsNoFrameUntilTheProducerNeedsASlot)
{
	RuntimeDir dir;
	auto owner = make_pool("ahead", 2, 4 * 8192);
	ASSERT_TRUE(owner);
	auto recorder = attach("ahead", Policy::fifo_spill, 0, Policy::drop_oldest);
	ASSERT_TRUE(recorder);
	publish(*owner, 30, 0ns);
	uint64_t dropped = recorder->consumer_stats()->dropped;
	EXPECT_GT(dropped, 0u);
	// The last publish left no slot free and woke the spill thread, which finds the
	// tier full. Time for it to act, were it to drop anything.
	std::this_thread::sleep_for(200ms);
	EXPECT_EQ(recorder->consumer_stats()->dropped, dropped) << "dropped with no acquire waiting";
	uint64_t corrupt = 0;
	std::vector<uint64_t> got = drain(*recorder, &corrupt);
	EXPECT_EQ(corrupt, 0u);
	EXPECT_EQ(got.size() + dropped, 30u);
	ASSERT_FALSE(got.empty());
	EXPECT_EQ(got.back(), 30u);
	EXPECT_EQ(recorder->consumer_stats()->dropped, dropped);
	// The producer's next acquire still applies the fallback when the tier is full.
	publish(*owner, 30, 0ns);
	std::vector<uint64_t> more = drain(*recorder, &corrupt);
	EXPECT_EQ(corrupt, 0u);
	ASSERT_FALSE(more.empty());
	EXPECT_EQ(more.back(), 60u);
	EXPECT_EQ(got.size() + more.size() + recorder->consumer_stats()->dropped, 60u);
}

// The tier is shared: a recorder that stopped reading fills it, and past the cap it is
// the one that loses frames (it will read the most of the tier last), not a slow
// recorder beside it that stays within half the tier, whatever the stuck one's fallback
// (drop-new keeps its oldest frames, so it keeps up to its share). Before, the frame's
// consumers each lost it.
TEST(Spill, AStuckRecorderPastTheCapCostsASlowOneNothing)
{
	for (Policy fallback : { Policy::drop_oldest, Policy::drop_new }) {
		SCOPED_TRACE(xmem::policy_name(fallback));
		RuntimeDir dir;
		constexpr int kFrames = 80;
		auto owner = make_pool("stuck", 2, 40 * 8192);
		ASSERT_TRUE(owner);
		auto stuck = attach("stuck", Policy::fifo_spill, 0, fallback);
		auto slow = attach("stuck", Policy::fifo_spill);
		ASSERT_TRUE(stuck && slow);
		std::vector<uint64_t> got;
		uint64_t corrupt = 0;
		for (int i = 0; i < kFrames; i++) {
			publish(*owner, 1, 0ns); // never waits
			if (i % 2 == 1 || i >= kFrames / 2) {
				// Half the producer's rate for a while, so it lags 15 frames behind.
				auto f = slow->receive(0ns);
				ASSERT_TRUE(f.ok()) << "frame " << i << ": " << f.error().message;
				corrupt += !xmem::test::check(f->data(), f->meta().seq);
				got.push_back(f->meta().seq);
			}
		}
		for (uint64_t seq : drain(*slow, &corrupt))
			got.push_back(seq);
		EXPECT_GT(owner->spill_stats().full, 0u) << "the tier never filled: nothing tested";
		EXPECT_EQ(got, range(1, kFrames)) << "the slow recorder lost frames to the stuck one";
		EXPECT_EQ(slow->consumer_stats()->dropped, 0u);
		EXPECT_EQ(corrupt, 0u);
		std::vector<uint64_t> kept = drain(*stuck, &corrupt);
		EXPECT_EQ(corrupt, 0u);
		EXPECT_TRUE(std::is_sorted(kept.begin(), kept.end()));
		auto s = stuck->consumer_stats();
		EXPECT_GT(s->dropped, 0u);
		EXPECT_EQ(s->dropped + kept.size(), uint64_t(kFrames)) << "every frame received or counted as dropped";
	}
}

// A fifo-spill consumer SIGKILLed with spilled frames queued: its buffers go back, the
// memory with them, and the producer never waits on it.
TEST(Spill, AConsumerKilledWithSpilledFramesGivesThemBack)
{
	RuntimeDir dir;
	auto owner = make_pool("killed", 4, 32 * 8192);
	ASSERT_TRUE(owner);
	Process peer({ xmem::test::peer_path(), "consume", "killed", "--policy", "fifo-spill", "--frames", "1",
		       "--hold", "1", "--hold-forever" });
	ASSERT_TRUE(eventually([&] { return owner->stats().consumers == 1; }));
	publish(*owner, 1);
	ASSERT_TRUE(peer.wait_output("holding=1"));
	publish(*owner, 20, 0ns);
	EXPECT_GE(owner->spill_stats().frames, 10u);
	peer.signal(SIGKILL);
	EXPECT_GE(peer.wait(), 0);
	ASSERT_TRUE(eventually([&] { return owner->stats().reaped == 1; }));
	EXPECT_EQ(owner->spill_stats().frames, 0u);
	EXPECT_EQ(owner->spill_stats().bytes, 0u);
	EXPECT_EQ(owner->stats().slots_free, 4u);
	publish(*owner, 10, 0ns);
}

// Consumers in their own processes, each with its own policy, over thousands of frames:
// a fifo-spill consumer slower than the producer loses nothing; a latest one beside it
// keeps up; the producer is never held back.
TEST(Spill, ASlowSpillConsumerInAnotherProcessGetsEveryFrame)
{
	RuntimeDir dir;
	constexpr int kFrames = 400;
	auto owner = make_pool("slow", 4, 512 * 8192);
	ASSERT_TRUE(owner);
	Process slow({ xmem::test::peer_path(), "consume", "slow", "--policy", "fifo-spill", "--frames",
		       std::to_string(kFrames), "--work-us", "2000" });
	Process fast({ xmem::test::peer_path(), "consume", "slow", "--policy", "latest", "--timeout-ms", "3000" });
	ASSERT_TRUE(eventually([&] { return owner->stats().consumers == 2; }));
	for (int i = 0; i < kFrames; i++) {
		auto r = xmem::test::publish_test_frame(*owner, 0ns);
		ASSERT_TRUE(r.ok()) << "frame " << i << ": " << r.error().message;
		std::this_thread::sleep_for(200us);
	}
	EXPECT_EQ(slow.wait(60s), 0) << slow.output();
	EXPECT_EQ(slow.field("received"), kFrames) << slow.output();
	EXPECT_EQ(slow.field("gaps"), 0) << slow.output();
	EXPECT_GT(owner->spill_stats().spilled, 0u);
	ASSERT_TRUE(owner->end_of_stream().ok());
	EXPECT_EQ(fast.wait(30s), 0) << fast.output();
	EXPECT_EQ(fast.field("corrupt"), 0) << fast.output();
}

// wake=spin-before's learning, step by step, without a clock: the period from publish
// timestamps, the window around the next expected arrival, irregular streams, gaps.
TEST(SpinBefore, TheWindowFollowsThePeriodAndIrregularStreamsSleep)
{
	constexpr uint64_t kMs = 1'000'000, kBudget = 200'000;
	xmem::SpinWake w(kBudget);
	uint64_t now = 1000 * kMs;
	for (uint64_t seq = 1; seq <= 3; seq++)
		w.observe(seq, seq * 10 * kMs, now + seq * 10 * kMs, true);
	EXPECT_FALSE(w.window(now + 35 * kMs)) << "three frames are not a period yet";
	for (uint64_t seq = 4; seq <= 8; seq++)
		w.observe(seq, seq * 10 * kMs, now + seq * 10 * kMs, true);
	auto win = w.window(now + 81 * kMs);
	ASSERT_TRUE(win);
	// A perfectly regular stream: the spin starts 20 µs ahead and may last the budget.
	EXPECT_EQ(win->first, now + 90 * kMs - 20'000);
	EXPECT_EQ(win->second, now + 90 * kMs - 20'000 + kBudget);
	w.spun(win->second);
	EXPECT_FALSE(w.window(now + 90 * kMs)) << "one spin per window";
	// A frame taken without waiting (it was queued already) moves the period on, not the
	// arrival: the window after it is the one after.
	w.observe(9, 90 * kMs, now + 95 * kMs, false);
	win = w.window(now + 95 * kMs);
	ASSERT_TRUE(win);
	EXPECT_EQ(win->first, now + 100 * kMs - 20'000);
	// Far past the last arrival (a paused stream): no window until a frame is seen.
	EXPECT_FALSE(w.window(now + 200 * kMs));

	// Wake-ups that come late: the spin starts earlier by the lateness learned, at
	// most half the budget ahead of the expected arrival. (Timestamps and arrivals on
	// one clock here, as on a machine: a frame's timestamp is its publish time.)
	xmem::SpinWake late(kBudget);
	for (uint64_t seq = 1; seq <= 8; seq++)
		late.observe(seq, now + seq * 10 * kMs, now + seq * 10 * kMs, true);
	win = late.window(now + 81 * kMs);
	ASSERT_TRUE(win);
	EXPECT_EQ(win->first, now + 90 * kMs - 20'000);
	late.sleeping_until(win->first);
	late.woke(win->first + 60'000); // the sleep ended 60 µs late
	EXPECT_EQ(late.wake_late(), 30'000u) << "a later wake-up than learned: halfway to it at once";
	late.spun(win->second);
	late.observe(9, now + 90 * kMs, now + 90 * kMs, true);
	win = late.window(now + 91 * kMs);
	ASSERT_TRUE(win);
	EXPECT_EQ(win->first, now + 100 * kMs - 20'000 - 30'000);
	// A frame published after the window opened, taken without a spin: the wake-up
	// that brought it was late by that much too.
	late.sleeping_until(win->first);
	late.observe(10, now + 100 * kMs, win->first + 150'000, true);
	constexpr uint64_t kLearned = (30'000 + 150'000) / 2;
	EXPECT_EQ(late.wake_late(), kLearned);
	// One published before the window opened teaches nothing about wake-ups.
	late.sleeping_until(now + 110 * kMs + 5'000);
	late.observe(11, now + 110 * kMs, now + 110 * kMs + 6'000, true);
	EXPECT_EQ(late.wake_late(), kLearned);
	// Nor does a look before the window opens; one on time brings it down, slowly.
	late.sleeping_until(now + 200 * kMs);
	late.woke(now + 200 * kMs - 1);
	EXPECT_EQ(late.wake_late(), kLearned);
	late.woke(now + 200 * kMs);
	EXPECT_EQ(late.wake_late(), 7 * kLearned / 8);
	// An outlier (an application stalled for 50 ms) counts as the budget at most.
	late.sleeping_until(now + 210 * kMs);
	late.woke(now + 260 * kMs);
	EXPECT_EQ(late.wake_late(), (7 * kLearned / 8 + kBudget) / 2);
	// However late, the spin starts at most half the budget ahead.
	late.observe(12, now + 120 * kMs, now + 120 * kMs, true);
	win = late.window(now + 121 * kMs);
	ASSERT_TRUE(win);
	EXPECT_EQ(win->first, now + 130 * kMs - kBudget / 2);
	EXPECT_EQ(win->second, now + 130 * kMs + kBudget / 2);

	// An irregular stream: intervals of 5 and 15 ms. Its jitter is far over the budget.
	xmem::SpinWake irregular(kBudget);
	for (uint64_t seq = 1; seq <= 20; seq++) {
		uint64_t ts = seq * 10 * kMs + (seq % 2 ? 0 : 5 * kMs);
		irregular.observe(seq, ts, now + ts, true);
	}
	EXPECT_FALSE(irregular.window(now + 201 * kMs));
}

namespace {

// A frame stamped TIMESTAMP_NS, published now.
xmem::Result<void> publish_stamped(BufferPool &pool, uint64_t timestamp_ns)
{
	auto frame = pool.acquire(1s);
	if (!frame)
		return frame.error();
	auto *m = frame->meta_mut().value();
	m->size = 64;
	m->timestamp = timestamp_ns;
	return pool.publish(std::move(*frame));
}

uint64_t monotonic_now()
{
	return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
				std::chrono::steady_clock::now().time_since_epoch())
				.count());
}

} // namespace

// wake=spin-before, by the clock but not by the machine's speed: the stream's period
// is learned from the frames' timestamps (100 ms apart, though published at once),
// and the window opens one period per frame after the arrival of the first, which
// this consumer waited for. With nothing published after, the poller's fd() turns
// readable when the window opens, not before, and receive(0) spins it; a blocking
// receive spins a later window. On a loaded machine a wake-up may come late; the
// windows, 20 ms wide, leave room for that.
TEST(SpinBefore, AnOpeningWindowWakesAPollerAndABlockingReceive)
{
	RuntimeDir dir;
	auto owner = make_pool("spin-window", 16);
	ASSERT_TRUE(owner);
	OpenOptions options;
	options.wake = xmem::Wake::spin_before;
	options.spin_budget = 20ms;
	options.queue_size = 8;
	auto consumer = BufferPool::open("spin-window", options);
	ASSERT_TRUE(consumer.ok()) << consumer.error().message;
	ASSERT_EQ((*consumer)->receive(0ns).code(), Errc::timed_out) << "nothing is published yet";

	constexpr uint64_t kPeriod = 100'000'000, kFrames = 6;
	const uint64_t start = monotonic_now();
	for (uint64_t i = 0; i < kFrames; i++)
		ASSERT_TRUE(publish_stamped(*owner, start + i * kPeriod).ok());
	for (uint64_t seq = 1; seq <= kFrames; seq++) {
		auto f = (*consumer)->receive(0ns);
		ASSERT_TRUE(f.ok()) << f.error().message;
		EXPECT_EQ(f->meta().seq, seq);
	}
	auto s = (*consumer)->consumer_stats();
	ASSERT_TRUE(s.ok());
	EXPECT_EQ(s->spins, 0u) << "the frames were queued: nothing to spin for";

	// The poller: receive(0) until it has spun a window, poll(fd()) in between. The
	// window opens a period per frame (600 ms) after the first frame arrived, less a
	// lead of at most half the budget.
	uint64_t spun_at = 0;
	while (monotonic_now() < start + 5'000'000'000) {
		auto f = (*consumer)->receive(0ns);
		ASSERT_EQ(f.code(), Errc::timed_out) << "no frame was published";
		s = (*consumer)->consumer_stats();
		ASSERT_TRUE(s.ok());
		if (s->spins > 0) {
			spun_at = monotonic_now();
			break;
		}
		pollfd p{ (*consumer)->fd(), POLLIN, 0 };
		ASSERT_GE(::poll(&p, 1, 1000), 0);
	}
	ASSERT_NE(spun_at, 0u) << "fd() never woke the poller for a window";
	EXPECT_GE(spun_at, start + kFrames * kPeriod - 10'000'000) << "woken before the window opened";
	EXPECT_EQ(s->spins, 1u);
	EXPECT_EQ(s->spins_caught, 0u);
	EXPECT_GT(s->spin_ns, 0u);

	// A blocking receive, its timeout past the next windows (one period apart, up to
	// four periods after the last arrival expected): it spins at least one of them,
	// then times out.
	auto f = (*consumer)->receive(1s);
	EXPECT_EQ(f.code(), Errc::timed_out);
	s = (*consumer)->consumer_stats();
	ASSERT_TRUE(s.ok());
	EXPECT_GE(s->spins, 2u) << "the blocking receive slept through every window";
	EXPECT_LE(s->spins, 4u) << "one spin per window, and no windows past four periods";
	EXPECT_EQ(s->spins_caught, 0u);
	EXPECT_EQ(s->received, kFrames);
}

// wake=spin-before against a steady producer: every frame arrives, in order, whichever
// way the consumer waits (a blocking receive, or fd() and receive(0) as xmemsrc does),
// and no spin outlasts its budget. Whether spins catch the frames depends on how
// promptly this machine wakes threads: bench/ measures that (xmem-bench-core --wake
// spin-before); the figures are printed here.
TEST(SpinBefore, ASteadyStreamArrivesInOrderWhicheverWayTheConsumerWaits)
{
	for (bool poller : { false, true }) {
		SCOPED_TRACE(poller ? "fd() and receive(0)" : "receive(1 s)");
		RuntimeDir dir;
		auto owner = make_pool("spin", 8);
		ASSERT_TRUE(owner);
		OpenOptions options;
		options.wake = xmem::Wake::spin_before;
		options.spin_budget = 2000us;
		auto consumer = BufferPool::open("spin", options);
		ASSERT_TRUE(consumer.ok()) << consumer.error().message;
		constexpr int kFrames = 60;
		std::thread producer([&] {
			for (int i = 0; i < kFrames; i++) {
				std::this_thread::sleep_for(8ms);
				ASSERT_TRUE(xmem::test::publish_test_frame(*owner, 1s).ok());
			}
		});
		std::vector<uint64_t> seqs;
		auto give_up = std::chrono::steady_clock::now() + 20s;
		while (seqs.size() < size_t(kFrames) && std::chrono::steady_clock::now() < give_up) {
			// A poller as xmemsrc is one: receive(0) until the queue is empty, then
			// poll fd() (readable on a frame, or when a spin should start).
			auto f = (*consumer)->receive(poller ? 0ns : std::chrono::nanoseconds(1s));
			if (poller && f.code() == Errc::timed_out) {
				pollfd p{ (*consumer)->fd(), POLLIN, 0 };
				ASSERT_GE(::poll(&p, 1, 2000), 0);
				continue;
			}
			ASSERT_TRUE(f.ok()) << f.error().message;
			seqs.push_back(f->meta().seq);
		}
		producer.join();
		EXPECT_EQ(seqs, range(1, kFrames));
		auto s = (*consumer)->consumer_stats();
		ASSERT_TRUE(s.ok());
		EXPECT_LE(s->spins_caught, s->spins);
		EXPECT_LE(s->spin_ns, s->spins * 2'100'000) << "a spin stays within its budget";
		EXPECT_LE(s->spins, uint64_t(kFrames)) << "one spin per window, a window per frame";
		EXPECT_EQ(s->received, uint64_t(kFrames));
		std::printf("%s: spins %llu, caught %llu, spun %.1f us per frame\n", poller ? "poller" : "blocking",
			    (unsigned long long)s->spins, (unsigned long long)s->spins_caught,
			    double(s->spin_ns) / 1000.0 / kFrames);
	}
}

namespace {

// The owner's view of its control segment, writable: what another process could write.
std::byte *segment_of(BufferPool &owner)
{
	return const_cast<std::byte *>(owner.control_segment().data());
}

xmem::layout::ConsumerRecord *consumer_record(BufferPool &owner, uint32_t i)
{
	auto *h = reinterpret_cast<xmem::layout::ControlHeader *>(segment_of(owner));
	return reinterpret_cast<xmem::layout::ConsumerRecord *>(segment_of(owner) +
								xmem::layout::consumers_offset(h->slot_count) +
								uint64_t{ i } * h->consumer_record_size);
}

xmem::layout::SlotRecord *slot_record(BufferPool &owner, uint32_t i)
{
	return reinterpret_cast<xmem::layout::SlotRecord *>(segment_of(owner) + xmem::layout::slots_offset()) + i;
}

} // namespace

// A slot held by a fifo consumer's received frame and queued for a stalled fifo-spill
// one: not spillable, not free. When the fifo consumer lets go, the waiting acquire
// spills it at once (tests/model found the wait looked for free slots only).
TEST(Spill, AnAcquireWaitingForASlotSpillsOneThatBecomesSpillable)
{
	RuntimeDir dir;
	auto owner = make_pool("spillable", 2, 8 * 8192);
	ASSERT_TRUE(owner);
	auto recorder = attach("spillable", Policy::fifo_spill);
	auto reader = attach("spillable", Policy::fifo, 2);
	ASSERT_TRUE(recorder && reader);
	publish(*owner, 2);
	auto first = reader->receive(0ns);
	auto second = reader->receive(0ns);
	ASSERT_TRUE(first.ok() && second.ok());
	std::thread lets_go([&] {
		std::this_thread::sleep_for(100ms);
		first->reset();
	});
	auto t0 = std::chrono::steady_clock::now();
	auto slot = owner->acquire(5s);
	auto waited = std::chrono::steady_clock::now() - t0;
	lets_go.join();
	ASSERT_TRUE(slot.ok()) << slot.error().message;
	EXPECT_LT(waited, 2s) << "the acquire slept past the release that made a slot spillable";
	EXPECT_EQ(owner->spill_stats().spilled, 1u);
}

// A slot left EXCLUSIVE (its in-place writer killed between its CAS and its check)
// whose remaining holders are fifo-spill queues: spilled like a published one.
TEST(Spill, ASlotLeftExclusiveIsSpilledToo)
{
	RuntimeDir dir;
	auto owner = make_pool("exclusive", 1, 4 * 8192);
	ASSERT_TRUE(owner);
	auto recorder = attach("exclusive", Policy::fifo_spill);
	ASSERT_TRUE(recorder);
	publish(*owner, 1);
	slot_record(*owner, 0)->state.store(xmem::layout::kSlotExclusive);
	auto slot = owner->acquire(0ns);
	ASSERT_TRUE(slot.ok()) << slot.error().message;
	slot->reset();
	auto f = recorder->receive(0ns);
	ASSERT_TRUE(f.ok()) << f.error().message;
	EXPECT_EQ(f->meta().seq, 1u);
	EXPECT_TRUE(xmem::test::check(f->data(), 1));
}

// A consumer whose ring another process wrote (an entry for another position at its
// head, its queue full): the owner hangs up on it and goes on; publish and EOS never
// loop on it (they did, forever, under the publish lock).
TEST(Policies, APublishNeverLoopsOnAScribbledRing)
{
	RuntimeDir dir;
	auto owner = make_pool("scribbled", 4);
	ASSERT_TRUE(owner);
	auto victim = attach("scribbled", Policy::drop_oldest, 1);
	auto other = attach("scribbled", Policy::latest);
	ASSERT_TRUE(victim && other);
	publish(*owner, 1);
	xmem::layout::ConsumerRecord *rec = consumer_record(*owner, 0);
	uint64_t h = rec->head.load();
	auto *h_ = reinterpret_cast<xmem::layout::ControlHeader *>(segment_of(*owner));
	xmem::layout::ring_of(rec)[h % h_->ring_capacity].store(xmem::layout::ring_entry(h + 7, 0));
	std::atomic<bool> done{ false };
	std::thread publisher([&] {
		publish(*owner, 3);
		EXPECT_TRUE(owner->end_of_stream().ok());
		done = true;
	});
	bool finished = eventually([&] { return done.load(); }, 10s);
	if (!finished)
		::abort(); // the publisher would never return: do not hang the suite
	publisher.join();
	EXPECT_TRUE(eventually([&] { return owner->stats().reaped == 1; })) << "the scribbled consumer stays attached";
	auto f = other->receive(0ns);
	ASSERT_TRUE(f.ok()) << f.error().message;
	EXPECT_EQ(f->meta().seq, 4u);
}

// max_age, with each policy: a frame older than the consumer's limit when receive() would
// hand it out (by the producer's timestamp) is given back unread and counted, never
// delivered; younger frames come as before, in order; and the slot of an expired frame
// is free again. A consumer without a limit beside it gets every frame.
TEST(MaxAge, StaleFramesAreGivenBackUnreadAndCounted)
{
	RuntimeDir dir;
	for (Policy policy : { Policy::fifo, Policy::drop_oldest, Policy::latest }) {
		SCOPED_TRACE(xmem::policy_name(policy));
		std::string name = std::string("max-age-") + xmem::policy_name(policy);
		auto owner = make_pool(name, 8);
		ASSERT_TRUE(owner);
		OpenOptions options;
		options.policy = policy;
		options.queue_size = policy == Policy::latest ? 0 : 8;
		options.max_age = 500ms; // generous: a loaded machine may take a while to receive
		auto fresh = BufferPool::open(name, options);
		ASSERT_TRUE(fresh.ok()) << fresh.error().message;
		auto all = attach(name, Policy::fifo, 8);
		ASSERT_TRUE(all);
		uint64_t now = monotonic_now();
		// Stamped 2 s ago (a capture time the producer set), 10 ms ago, and now.
		ASSERT_OK(publish_stamped(*owner, now - 2'000'000'000));
		ASSERT_OK(publish_stamped(*owner, now - 10'000'000));
		ASSERT_OK(publish_stamped(*owner, monotonic_now()));
		std::vector<uint64_t> got;
		for (;;) {
			auto f = (*fresh)->receive(0ns);
			if (!f)
				break;
			got.push_back(f->meta().seq);
		}
		auto stats = (*fresh)->consumer_stats();
		ASSERT_TRUE(stats.ok());
		if (policy == Policy::latest) {
			EXPECT_EQ(got, (std::vector<uint64_t>{ 3 })) << "a mailbox of one holds the newest";
		} else {
			EXPECT_EQ(got, (std::vector<uint64_t>{ 2, 3 }));
			EXPECT_EQ(stats->expired, 1u);
		}
		EXPECT_EQ(drain(*all), range(1, 3)) << "no limit: every frame";
		// Frames left to age in the queue expire there too.
		ASSERT_OK(publish_stamped(*owner, monotonic_now()));
		std::this_thread::sleep_for(700ms);
		EXPECT_EQ((*fresh)->receive(0ns).code(), Errc::timed_out);
		EXPECT_EQ((*fresh)->consumer_stats()->expired, policy == Policy::latest ? 1u : 2u);
		drain(*all);
		// Every slot is free: nothing expired is held.
		EXPECT_TRUE(eventually([&] { return owner->stats().slots_free == 8; })) << owner->stats().slots_free;
	}
}
