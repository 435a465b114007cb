// test_threads.cpp - one process, many threads on the same handles: what a BufferPool
// promises by "thread-safe". Written for ThreadSanitizer (.ci/run builds the suite
// with it), which sees races only where threads of one process meet: two owner
// threads publishing, receivers sharing a consumer handle, references cloned and
// dropped on other threads, the format changing while stats and format are read, and
// consumers attaching and leaving while the owner's I/O thread admits and reaps them.
#include "common.hpp"

#include <poll.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
using xmem::BufferGuard;
using xmem::BufferPool;
using xmem::Errc;
using xmem::OpenOptions;
using xmem::Policy;
using xmem::PoolConfig;
using xmem::test::RuntimeDir;
using xmem::test::why;

constexpr uint64_t kFrames = 400;
constexpr uint64_t kSize = 1024;

std::byte pattern(uint64_t tag, uint64_t i)
{
	return std::byte((tag * 31 + i * 3) & 0xff);
}

bool intact(const BufferGuard &g)
{
	auto bytes = g.data();
	if (bytes.size() != kSize)
		return false;
	for (uint64_t i = 0; i < bytes.size(); i++)
		if (bytes[i] != pattern(g.meta().pts, i))
			return false;
	return true;
}

// Frames handed from a receiver thread to a releaser thread.
class Handoff
{
public:
	void put(BufferGuard g)
	{
		std::lock_guard lock(lock_);
		frames_.push_back(std::move(g));
		ready_.notify_one();
	}
	// The next frame, or an invalid guard once closed and empty.
	BufferGuard take()
	{
		std::unique_lock lock(lock_);
		ready_.wait(lock, [this] { return closed_ || !frames_.empty(); });
		if (frames_.empty())
			return {};
		BufferGuard g = std::move(frames_.front());
		frames_.pop_front();
		return g;
	}
	void close()
	{
		std::lock_guard lock(lock_);
		closed_ = true;
		ready_.notify_all();
	}

private:
	std::mutex lock_;
	std::condition_variable ready_;
	std::deque<BufferGuard> frames_;
	bool closed_ = false;
};

// One consumer handle shared by three receiver threads; each frame and a clone of it go
// to two releaser threads, which clone and drop them concurrently: every frame
// arrives exactly once, intact.
struct SharedConsumer {
	std::shared_ptr<BufferPool> pool;
	std::mutex lock;
	std::set<uint64_t> seen; // pts of the frames received, under lock
	std::vector<std::string> errors; // under lock
	std::atomic<uint64_t> received{ 0 };
	Handoff handoff;

	void error(std::string what)
	{
		std::lock_guard guard(lock);
		errors.push_back(std::move(what));
	}

	void receive_loop(const std::atomic<bool> &stop)
	{
		while (!stop.load(std::memory_order_acquire) && received.load() < kFrames) {
			auto g = pool->receive(20ms);
			if (!g) {
				if (g.code() != Errc::timed_out && g.code() != Errc::end_of_stream)
					error("receive: " + why(g));
				if (g.code() == Errc::end_of_stream)
					return;
				continue;
			}
			if (!intact(*g))
				error("frame " + std::to_string(g->meta().pts) + " corrupt");
			{
				std::lock_guard guard(lock);
				if (!seen.insert(g->meta().pts).second)
					error("frame " + std::to_string(g->meta().pts) + " received twice");
			}
			(void)g->format(); // a shared_ptr another thread may be replacing
			received.fetch_add(1);
			// Two references to one slot, dropped by two releaser threads at once.
			auto clone = g->clone_ref();
			if (!clone) {
				error("clone_ref: " + why(clone));
				continue;
			}
			handoff.put(std::move(*g));
			handoff.put(std::move(*clone));
		}
	}

	void release_loop()
	{
		for (BufferGuard g = handoff.take(); g.valid(); g = handoff.take()) {
			auto clone = g.clone_ref();
			if (!clone) {
				error("clone_ref: " + why(clone));
				continue;
			}
			// Two references here, and the owner's or the other consumer's maybe:
			// never writable in place.
			if (clone->try_make_writable())
				error("a frame with two references became writable");
			g.reset();
			if (!intact(*clone))
				error("frame corrupt after its first reference was dropped");
			clone->reset();
		}
	}
};

TEST(Threads, ManyThreadsOnTheSameHandles)
{
	RuntimeDir dir;
	PoolConfig c;
	c.slot_count = 8;
	c.slot_size = kSize;
	c.policy = Policy::block;
	c.block_timeout = 10s; // lossless: the test counts every frame
	auto owner_r = BufferPool::create("threads", c);
	ASSERT_TRUE(owner_r) << why(owner_r);
	std::shared_ptr<BufferPool> owner = owner_r.value();

	SharedConsumer consumers[2];
	for (auto &sc : consumers) {
		OpenOptions o;
		o.queue_size = 4;
		o.client = "threads";
		auto r = BufferPool::open("threads", o);
		ASSERT_TRUE(r) << why(r);
		sc.pool = r.value();
	}

	std::atomic<bool> stop{ false };
	std::atomic<uint64_t> next_tag{ 0 };
	std::atomic<uint64_t> publish_errors{ 0 };
	std::vector<std::thread> threads;
	std::vector<std::thread> releasers; // joined last: they drain what receivers handed over

	// Two publishing threads on the owner; one of them changes the format now and then.
	for (int t = 0; t < 2; t++)
		threads.emplace_back([&, t] {
			for (;;) {
				uint64_t tag = next_tag.fetch_add(1);
				if (tag >= kFrames)
					return;
				if (t == 0 && tag % 50 == 0 &&
				    !owner->set_format("video/x-raw,format=GRAY8,width=" + std::to_string(tag + 1) +
						       ",height=1"))
					publish_errors++;
				auto g = owner->acquire(10s);
				if (!g) {
					publish_errors++;
					continue;
				}
				auto bytes = g->data_mut().value();
				for (uint64_t i = 0; i < kSize; i++)
					bytes[i] = pattern(tag, i);
				g->meta_mut().value()->size = kSize;
				g->meta_mut().value()->pts = tag;
				if (!owner->publish(std::move(*g)))
					publish_errors++;
			}
		});
	// Three receivers and two releasers per consumer handle.
	for (auto &sc : consumers) {
		for (int t = 0; t < 3; t++)
			threads.emplace_back([&] { sc.receive_loop(stop); });
		for (int t = 0; t < 2; t++)
			releasers.emplace_back([&] { sc.release_loop(); });
	}
	// Readers of what every handle shares: stats, the format, the pollable fd.
	threads.emplace_back([&] {
		while (!stop.load(std::memory_order_acquire)) {
			for (auto *p : { owner.get(), consumers[0].pool.get(), consumers[1].pool.get() }) {
				(void)p->stats();
				(void)p->format();
			}
			std::this_thread::sleep_for(1ms);
		}
	});
	// Consumers that come and go while the others run: the I/O thread admits and
	// reaps them concurrently with publishing.
	threads.emplace_back([&] {
		while (!stop.load(std::memory_order_acquire)) {
			OpenOptions o;
			o.client = "passer-by";
			auto r = BufferPool::open("threads", o);
			if (r) {
				auto g = r.value()->receive(5ms);
				std::this_thread::sleep_for(2ms);
			}
		}
	});

	auto deadline = std::chrono::steady_clock::now() + 120s;
	while ((consumers[0].received.load() < kFrames || consumers[1].received.load() < kFrames) &&
	       std::chrono::steady_clock::now() < deadline)
		std::this_thread::sleep_for(10ms);
	stop.store(true, std::memory_order_release);
	for (auto &t : threads)
		t.join();
	// Only now, with no receiver left to hand a frame over: a frame put after the
	// releasers had gone would keep its consumer attached past the end.
	for (auto &sc : consumers)
		sc.handoff.close();
	for (auto &t : releasers)
		t.join();

	EXPECT_EQ(publish_errors.load(), 0u);
	for (auto &sc : consumers) {
		EXPECT_EQ(sc.seen.size(), kFrames);
		EXPECT_TRUE(sc.errors.empty()) << sc.errors.size() << " errors, the first: " << sc.errors.front();
	}
	// Everything let go: no slot held by any holder but the owner's frame in flight.
	consumers[0].pool.reset();
	consumers[1].pool.reset();
	EXPECT_TRUE(xmem::test::eventually([&] { return owner->stats().consumers == 0; }, 10s))
		<< owner->stats().consumers << " consumers still attached";
	EXPECT_TRUE(xmem::test::eventually([&] { return owner->stats().slots_free == c.slot_count; }, 10s))
		<< owner->stats().slots_free << " of " << c.slot_count << " slots free";
}

// Two holders of one slot in one process's two consumer handles, on two threads at
// once: A makes its reference writable in place while B drops its own and takes the
// slot again. At most one of them may win: A writing in place while B holds the frame
// is a torn read. The old clear_holder_bit let B's release turn A's fresh EXCLUSIVE
// back to PUBLISHED between A's claim and A's sole-holder check (the model's
// unpatched-exclusive, tests/model); each round lines the two threads up on a spin
// barrier so that window is hit.
TEST(Threads, AReleaseNeverUndoesAnotherHoldersWriteClaim)
{
	RuntimeDir dir;
	PoolConfig c;
	c.slot_count = 2;
	c.slot_size = kSize;
	auto owner_r = BufferPool::create("claim", c);
	ASSERT_TRUE(owner_r) << why(owner_r);
	std::shared_ptr<BufferPool> owner = owner_r.value();
	std::shared_ptr<BufferPool> a, b;
	for (auto *h : { &a, &b }) {
		OpenOptions o;
		o.client = "claim";
		auto r = BufferPool::open("claim", o);
		ASSERT_TRUE(r) << why(r);
		*h = r.value();
	}
	auto g = owner->acquire(1s);
	ASSERT_TRUE(g) << why(g);
	uint32_t index = g->index();
	g->meta_mut().value()->size = kSize;
	ASSERT_TRUE(owner->publish(std::move(*g)));
	// The consumers' queued copies go; the slot stays published, held by no one.
	for (auto *h : { &a, &b }) {
		auto f = (*h)->receive(5s);
		ASSERT_TRUE(f) << why(f);
	}

	// Rounds until a time bound: a sanitizer build on a busy machine runs fewer. Past it,
	// rounds go on until each side has won once (on a loaded machine the two spinning
	// threads may run one at a time for seconds: CI once saw 2464 rounds and no win of
	// A's in 8 s), up to a hard bound that still fails the test below.
	constexpr int kRounds = 1000000;
	auto deadline = std::chrono::steady_clock::now() + 8s;
	auto hard_deadline = deadline + 52s;
	std::atomic<int> last{ kRounds };
	std::atomic<int> arrived{ 0 };
	std::atomic<int> round{ -1 };
	auto line_up = [&](int r) {
		// Both threads leave together: the last to arrive opens round r.
		if (arrived.fetch_add(1) % 2 == 1)
			round.store(r);
		while (round.load() < r)
			;
	};
	std::atomic<int> won_a{ 0 }, got_b{ 0 }, both{ 0 }, errors{ 0 };
	std::atomic<bool> b_holds{ false };
	std::atomic<int> looked{ -1 };
	std::thread ta([&] {
		for (int r = 0;; r++) {
			auto ga = a->get(index);
			if (!ga)
				errors++;
			// A alone decides which round is the last, before lining up: B learns
			// it after the line-up, so both stop at the same round.
			auto now = std::chrono::steady_clock::now();
			bool raced = won_a.load() > 0 && got_b.load() > 0;
#ifdef __SANITIZE_THREAD__
			raced = true; // see below: the race is not asked for under ThreadSanitizer
#endif
			if (r == kRounds - 1 || (now >= deadline && raced) || now >= hard_deadline)
				last.store(r);
			line_up(2 * r);
			if (r == last.load())
				break;
			bool won = ga && ga->try_make_writable();
			line_up(2 * r + 1); // B has taken the slot again, or failed to
			won_a += won;
			both += won && b_holds.load();
			if (ga)
				ga->reset(); // before B's next get(), which A's EXCLUSIVE would refuse
			looked.store(r);
		}
	});
	std::thread tb([&] {
		for (int r = 0;; r++) {
			auto gb = b->get(index);
			if (!gb)
				errors++;
			line_up(2 * r);
			if (r == last.load())
				break;
			if (gb)
				gb->reset();
			auto again = b->get(index);
			b_holds.store(again.ok());
			got_b += again.ok();
			line_up(2 * r + 1);
			while (looked.load() < r) // B holds it until A has looked
				;
		}
	});
	ta.join();
	tb.join();
	std::printf("%d rounds: A wrote in place %d times, B took the slot again %d times\n", last.load(), won_a.load(),
		    got_b.load());
	EXPECT_EQ(errors.load(), 0);
	EXPECT_EQ(both.load(), 0) << "A held the slot writable in place while B held it";
#ifndef __SANITIZE_THREAD__
	// ThreadSanitizer runs the two spinning threads nearly one at a time (about a
	// thousand rounds here, A never first): the race is exercised only without it.
	EXPECT_GT(won_a.load(), 0) << "A never won: the race was not exercised";
	EXPECT_GT(got_b.load(), 0) << "B never won: the race was not exercised";
#endif
}

// A poller (fd(), then receive(0), as xmemsrc is one) against a producer whose frames
// come while it is busy, and while it sleeps: fd() turns readable for a frame, or for
// an eventfd write that landed after its frame was taken (read then), never again
// for nothing. Before arming exchanged `armed`, a consumer that took a frame between
// the owner's tail store and its exchange of `armed` armed over it and left the
// owner's write unread: fd() stayed readable, and the poller woke for nothing, again
// and again, until the next frame (model Finding 6). The race is narrow: with a real
// owner, six runs of this test on the code before the fix did not meet it;
// FakeOwner.EveryEventfdWriteIsReadWheneverTheArmIsTaken (test_bad_input.cpp) does,
// by taking the arm at any moment, and the model always.
TEST(Threads, APollerIsNeverWokenForNothing)
{
	RuntimeDir dir;
	PoolConfig config;
	config.slot_count = 8;
	config.slot_size = kSize;
	config.policy = Policy::drop_oldest;
	auto owner = BufferPool::create("wakes", config);
	ASSERT_TRUE(owner.ok()) << owner.error().message;
	OpenOptions options;
	options.queue_size = 8;
	auto consumer = BufferPool::open("wakes", options);
	ASSERT_TRUE(consumer.ok()) << consumer.error().message;
	constexpr uint64_t kPublished = 4000;
	std::thread producer([&] {
		std::mt19937 rng(7);
		for (uint64_t i = 0; i < kPublished; i++) {
			auto f = (*owner)->acquire(1s);
			ASSERT_TRUE(f.ok()) << f.error().message;
			f->meta_mut().value()->size = 16;
			ASSERT_TRUE((*owner)->publish(std::move(*f)).ok());
			// Mostly a gap of up to 100 µs (the poller is asleep), else none (busy).
			if (rng() % 4 != 0)
				std::this_thread::sleep_for(std::chrono::microseconds(rng() % 100));
		}
		ASSERT_TRUE((*owner)->end_of_stream().ok());
	});
	uint64_t received = 0, wakes = 0, idle_wakes = 0;
	bool woken = false;
	for (;;) {
		auto f = (*consumer)->receive(0ns);
		if (f.ok()) {
			received++;
			woken = false;
			continue;
		}
		if (f.code() == Errc::end_of_stream)
			break;
		ASSERT_EQ(f.code(), Errc::timed_out) << f.error().message;
		if (woken)
			idle_wakes++; // readable, yet nothing came of it
		pollfd p{ (*consumer)->fd(), POLLIN, 0 };
		ASSERT_EQ(::poll(&p, 1, 10000), 1) << "no frame, no end of stream for 10 s";
		wakes++;
		woken = true;
	}
	producer.join();
	auto s = (*consumer)->consumer_stats();
	ASSERT_TRUE(s.ok());
	EXPECT_EQ(received + s->dropped, kPublished);
	// At most one late write per frame taken.
	EXPECT_LE(idle_wakes, received) << wakes << " wakes for " << received << " frames";
	std::printf("%llu frames received, %llu wakes, %llu of them idle\n", (unsigned long long)received,
		    (unsigned long long)wakes, (unsigned long long)idle_wakes);
}

} // namespace
