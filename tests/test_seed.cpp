// test_seed.cpp - the seed design's C++ names (../shared/seeds/xmem-design.zh.md, sections
// 6-8) and what its reference counts mean here: set_ref_count(meta_index, n) publishes a
// written frame for n holders, each get(meta_index) in any process takes one, the slot
// comes back when they let go; a meta index names one frame, never a later one of its
// slot; bad counts and indices refused with the reason; holders killed before and after
// their get; the guards' accessors, forget() and copies into pool buffers. System memory
// here; tests/cuda/test_cuda_seed.cpp has the device side.
#include "common.hpp"
#include "frames.hpp"

#include <signal.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
using xmem::BufferGuard;
using xmem::BufferPool;
using xmem::Errc;
using xmem::test::attach;
using xmem::test::eventually;
using xmem::test::make_pool;
using xmem::test::Process;
using xmem::test::RuntimeDir;

constexpr uint64_t kSlotSize = 4096;

// A frame acquired with the seed's name and filled (frames.hpp: its bytes follow VALUE).
xmem::Result<BufferGuard> written(BufferPool &pool, uint64_t value, std::chrono::nanoseconds timeout = 2s)
{
	auto frame = pool.acquire_cpu(kSlotSize, timeout);
	if (frame)
		xmem::test::fill(frame->as_cpu_slice_mut().value(), kSlotSize, value);
	return frame;
}

bool has(const std::string &text, const std::string &part)
{
	return text.find(part) != std::string::npos;
}

} // namespace

// The seed's flow: set_ref_count(meta_index, 2), the index sent on, forget(); two holders
// get it, a third is refused, and the slot is free again once both let go, without
// waiting for the holds' lifetime. Then 24 frames through 2 slots, each to one holder.
TEST(Seed, ACountIsHoldersAndTheSlotComesBackWhenTheyLetGo)
{
	RuntimeDir dir;
	auto owner = make_pool("seed-count", 2);
	ASSERT_TRUE(owner);
	auto a = attach("seed-count"), b = attach("seed-count");
	ASSERT_TRUE(a && b);

	auto buf = written(*owner, 7);
	ASSERT_TRUE(buf.ok()) << buf.error().message;
	uint32_t meta_index = buf->meta_index();
	EXPECT_NE(meta_index, xmem::kNoMetaIndex);
	EXPECT_EQ(meta_index & ((1u << XMEM_META_SLOT_BITS) - 1), buf->index());
	ASSERT_OK(owner->set_ref_count(meta_index, 2));
	EXPECT_FALSE(buf->valid()) << "published: the guard holds nothing";
	EXPECT_EQ(buf->meta_index(), meta_index) << "still readable after set_ref_count";
	ASSERT_OK(buf->forget());
	EXPECT_EQ(buf->meta_index(), xmem::kNoMetaIndex);
	EXPECT_EQ(a->receive(0ns).code(), Errc::timed_out) << "a counted frame goes to no queue";

	auto fa = a->get(meta_index);
	auto fb = b->get(meta_index);
	ASSERT_TRUE(fa.ok() && fb.ok()) << (fa ? fb.error().message : fa.error().message);
	EXPECT_TRUE(xmem::test::check(fa->as_cpu_slice().value(), 7));
	EXPECT_TRUE(xmem::test::check(fb->as_cpu_slice().value(), 7));
	EXPECT_EQ(fa->meta().size, kSlotSize) << "a frame with no size set is its slot";
	EXPECT_EQ(fa->meta_index(), meta_index);
	auto third = a->get(meta_index);
	EXPECT_EQ(third.code(), Errc::not_held);
	EXPECT_TRUE(has(third.error().message, "holds")) << third.error().message;
	EXPECT_EQ(owner->ticket_stats().redeemed, 2u);

	// Both let go: the slot is free for the next acquire at once (the lifetime is 10 s).
	fa->reset();
	fb->reset();
	auto start = std::chrono::steady_clock::now();
	std::vector<BufferGuard> both;
	for (int i = 0; i < 2; i++) {
		auto f = owner->acquire_cpu(kSlotSize, 2s);
		ASSERT_TRUE(f.ok()) << f.error().message;
		both.push_back(std::move(f.value()));
	}
	EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
	both.clear();

	// 24 frames through 2 slots, each to one holder: no slot waits for a lifetime.
	start = std::chrono::steady_clock::now();
	for (uint64_t v = 100; v < 124; v++) {
		auto f = written(*owner, v, 3s);
		ASSERT_TRUE(f.ok()) << v << ": " << f.error().message;
		uint32_t mi = f->meta_index();
		ASSERT_OK(owner->set_ref_count(mi, 1));
		BufferPool &holder = v % 2 ? *a : *b;
		auto got = holder.get(mi);
		ASSERT_TRUE(got.ok()) << v << ": " << got.error().message;
		EXPECT_TRUE(xmem::test::check(got->as_cpu_slice().value(), v));
	}
	EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
	EXPECT_EQ(owner->ticket_stats().expired, 0u) << "no hold ran out: every one was taken";
}

// A meta index names one frame: the frame while the slot holds it (counted or not), never
// a later frame of the slot, and nothing for an index no frame had.
TEST(Seed, AMetaIndexNamesOneFrameNeverALaterOne)
{
	RuntimeDir dir;
	auto owner = make_pool("seed-names", 1);
	ASSERT_TRUE(owner);
	auto c = attach("seed-names");
	ASSERT_TRUE(c);

	// Published to queues: get(meta_index) holds it while the slot has it.
	auto f = written(*owner, 1);
	ASSERT_TRUE(f.ok());
	uint32_t first = f->meta_index();
	ASSERT_OK(owner->publish(std::move(*f)));
	auto queued = c->receive(2s);
	ASSERT_TRUE(queued.ok()) << queued.error().message;
	EXPECT_EQ(queued->meta_index(), first);
	auto again = c->get(first);
	ASSERT_TRUE(again.ok()) << again.error().message;
	EXPECT_TRUE(xmem::test::check(again->as_cpu_slice().value(), 1));
	queued->reset();
	again->reset();

	// The slot's next frame: the first index is refused, the new one is another.
	auto g = written(*owner, 2);
	ASSERT_TRUE(g.ok()) << g.error().message;
	uint32_t second = g->meta_index();
	EXPECT_NE(second, first);
	EXPECT_EQ(second & 1023u, first & 1023u) << "the same slot";
	ASSERT_OK(owner->set_ref_count(second, 1));
	auto stale = c->get(first);
	EXPECT_EQ(stale.code(), Errc::not_held);
	EXPECT_TRUE(has(stale.error().message, "another frame now")) << stale.error().message;
	// Its slot index is refused too: its holders are counted.
	auto by_slot = c->get(second & 1023u);
	EXPECT_EQ(by_slot.code(), Errc::not_held);
	EXPECT_TRUE(has(by_slot.error().message, std::to_string(second))) << by_slot.error().message;
	// An index no frame had yet (the slot's next generation), and one of no slot.
	EXPECT_EQ(c->get(second + (1u << XMEM_META_SLOT_BITS)).code(), Errc::not_held);
	EXPECT_EQ(c->get((5u << XMEM_META_SLOT_BITS) | 3u).code(), Errc::out_of_range);
	EXPECT_EQ(c->get(xmem::kNoMetaIndex).code(), Errc::out_of_range);
	EXPECT_EQ(c->get(1u << XMEM_META_SLOT_BITS | 1000u).code(), Errc::out_of_range);
	auto got = c->get(second);
	ASSERT_TRUE(got.ok()) << got.error().message;
	EXPECT_TRUE(xmem::test::check(got->as_cpu_slice().value(), 2));
	// Held, a frame's meta index serves the non-RAII calls too.
	ASSERT_OK(c->add_ref(second));
	EXPECT_EQ(c->ref_count(second), 2u);
	ASSERT_OK(c->release(second));
	EXPECT_EQ(c->add_ref(first).code(), Errc::not_held) << "an earlier frame's index";
}

// set_ref_count refuses what it cannot do, with the reason, and leaves the frame acquired.
TEST(Seed, BadCountsAndIndicesAreRefused)
{
	RuntimeDir dir;
	auto owner = make_pool("seed-bad", 2);
	ASSERT_TRUE(owner);
	auto c = attach("seed-bad");
	ASSERT_TRUE(c);
	auto f = written(*owner, 3);
	ASSERT_TRUE(f.ok());
	uint32_t mi = f->meta_index();
	for (int32_t count : { 0, -1, -2147483647 - 1, 65 }) {
		auto r = owner->set_ref_count(mi, count);
		EXPECT_EQ(r.code(), Errc::invalid_argument) << count;
		EXPECT_TRUE(f->valid()) << "the frame stays acquired";
	}
	EXPECT_TRUE(has(owner->set_ref_count(mi, 65).error().message, "limit of 64")) << "the pool's consumer limit";
	EXPECT_EQ(owner->set_ref_count(mi, 1, 0ns).code(), Errc::invalid_argument);
	EXPECT_EQ(owner->set_ref_count(f->index(), 1).code(), Errc::invalid_argument) << "a slot index";
	EXPECT_EQ(owner->set_ref_count(mi + (1u << XMEM_META_SLOT_BITS), 1).code(), Errc::not_held)
		<< "another frame of the slot";
	EXPECT_EQ(c->set_ref_count(mi, 1).code(), Errc::not_held) << "another process's frame";
	auto writing = c->get(mi);
	EXPECT_EQ(writing.code(), Errc::not_held) << "a frame being written is not published";
	EXPECT_TRUE(has(writing.error().message, "not published")) << writing.error().message;
	// What is refused here can still be published.
	ASSERT_OK(owner->set_ref_count(mi, 64));
	EXPECT_EQ(owner->set_ref_count(mi, 1).code(), Errc::not_held) << "published already";
	// forget() of a frame acquired and not published would lose its slot.
	auto g = written(*owner, 4);
	ASSERT_TRUE(g.ok());
	auto lost = g->forget();
	EXPECT_EQ(lost.code(), Errc::invalid_argument);
	EXPECT_TRUE(has(lost.error().message, "not published")) << lost.error().message;
	EXPECT_TRUE(g->valid());
}

// The guards' seed accessors: slices and device pointers of the right memory only, write
// access only through a writable guard; forget() keeps a received frame's reference.
TEST(Seed, GuardsGiveTheirMemoryAndForgetKeepsTheReference)
{
	RuntimeDir dir;
	auto owner = make_pool("seed-guard", 2);
	ASSERT_TRUE(owner);
	auto c = attach("seed-guard");
	ASSERT_TRUE(c);
	auto f = written(*owner, 5);
	ASSERT_TRUE(f.ok());
	EXPECT_EQ(f->as_cpu_slice_mut()->size(), kSlotSize);
	EXPECT_EQ(f->as_cuda_ptr().code(), Errc::invalid_argument) << "system memory has no device pointer";
	EXPECT_EQ(f->as_cuda_ptr_mut().code(), Errc::invalid_argument);
	uint32_t mi = f->meta_index();
	ASSERT_OK(owner->set_ref_count(mi, 1));
	auto got = c->get(mi);
	ASSERT_TRUE(got.ok()) << got.error().message;
	EXPECT_EQ(got->as_cpu_slice()->size(), kSlotSize);
	EXPECT_EQ(got->as_cpu_slice_mut().code(), Errc::read_only);
	EXPECT_EQ(BufferGuard().as_cpu_slice().code(), Errc::invalid_argument);
	// forget(): the guard goes, the reference stays this process's until release().
	ASSERT_OK(got->forget());
	EXPECT_FALSE(got->valid());
	EXPECT_EQ(c->ref_count(mi), 1u);
	ASSERT_OK(c->release(mi));
	EXPECT_EQ(c->ref_count(mi), 0u);
	EXPECT_TRUE(eventually([&] {
		std::vector<BufferGuard> all;
		for (int i = 0; i < 2; i++)
			if (auto s = owner->acquire_cpu(kSlotSize, 0ns))
				all.push_back(std::move(s.value()));
		return all.size() == 2;
	})) << "the slot came back with the released reference";
}

// copy_to_cpu() is a buffer of the pool, writable, with its own meta index, to publish in
// turn, in the owner and in a consumer (a guest).
TEST(Seed, CopiesAreBuffersOfThePool)
{
	RuntimeDir dir;
	auto owner = make_pool("seed-copy", 2);
	ASSERT_TRUE(owner);
	auto slots = owner->preallocate_cpu(8 * kSlotSize, 2);
	ASSERT_TRUE(slots.ok()) << slots.error().message;
	EXPECT_EQ(*slots, (std::vector<uint32_t>{ 2, 3 }));
	auto c = attach("seed-copy");
	ASSERT_TRUE(c);
	auto f = written(*owner, 9);
	ASSERT_TRUE(f.ok());
	auto copy = f->copy_to_cpu();
	ASSERT_TRUE(copy.ok()) << copy.error().message;
	EXPECT_TRUE(copy->writable());
	EXPECT_FALSE(copy->is_copy()) << "a slot of the pool, not a private copy";
	EXPECT_NE(copy->meta_index(), f->meta_index());
	EXPECT_NE(copy->meta_index(), xmem::kNoMetaIndex);
	EXPECT_TRUE(xmem::test::check(copy->as_cpu_slice().value().first(kSlotSize), 9));
	uint32_t mi = copy->meta_index();
	ASSERT_OK(owner->set_ref_count(mi, 1));
	auto got = c->get(mi);
	ASSERT_TRUE(got.ok()) << got.error().message;
	EXPECT_TRUE(xmem::test::check(got->as_cpu_slice().value(), 9));
	// A consumer's copy is a slot the owner leases it (a guest), published as the owner's.
	auto theirs = got->copy_to_cpu();
	ASSERT_TRUE(theirs.ok()) << theirs.error().message;
	EXPECT_NE(theirs->meta_index(), mi);
	uint32_t their_mi = theirs->meta_index();
	ASSERT_OK(c->set_ref_count(their_mi, 1));
	auto back = owner->get(their_mi);
	ASSERT_TRUE(back.ok()) << back.error().message;
	EXPECT_TRUE(xmem::test::check(back->as_cpu_slice().value(), 9));
	// A private copy has no meta index.
	auto mine = got->private_copy_to_cpu();
	ASSERT_TRUE(mine.ok());
	EXPECT_EQ(mine->meta_index(), xmem::kNoMetaIndex);
}

// Holders in another process, fed meta indices over a pipe: one killed after its get (its
// hold goes with it), one that dies before (the hold nobody took goes at the lifetime's end).
TEST(Seed, HoldersKilledBeforeOrAfterTheirGetLeakNothing)
{
	::signal(SIGPIPE, SIG_IGN);
	RuntimeDir dir;
	auto owner = make_pool("seed-kill", 2);
	ASSERT_TRUE(owner);
	Process holder;
	holder.start({ xmem::test::peer_path(), "redeem", "seed-kill", "--hold" }, true);
	ASSERT_TRUE(holder.wait_output("attached"));
	auto f1 = written(*owner, 11), f2 = written(*owner, 12);
	ASSERT_TRUE(f1.ok() && f2.ok());
	uint32_t m1 = f1->meta_index(), m2 = f2->meta_index();
	ASSERT_OK(owner->set_ref_count(m1, 1));
	ASSERT_OK(owner->set_ref_count(m2, 1, 300ms)); // its holder never comes
	ASSERT_TRUE(holder.write_stdin(std::to_string(m1) + "\n"));
	ASSERT_TRUE(holder.write_stdin(std::to_string(m1) + "\n")); // a second time: refused
	ASSERT_TRUE(holder.wait_output("refused code=" + std::to_string(-XMEM_ENOTHELD))) << holder.output();
	EXPECT_TRUE(has(holder.output(), "redeemed seq=")) << holder.output();
	holder.signal(SIGKILL);
	EXPECT_EQ(holder.wait(), 128 + SIGKILL);
	// Both slots come back: m1's once the reaper cleared the dead holder's bit, m2's at the
	// end of its lifetime.
	std::vector<BufferGuard> all;
	for (int i = 0; i < 2; i++) {
		auto f = owner->acquire_cpu(kSlotSize, 5s);
		ASSERT_TRUE(f.ok()) << "slot " << i << ": " << f.error().message;
		all.push_back(std::move(f.value()));
	}
	auto s = owner->ticket_stats();
	EXPECT_EQ(s.redeemed, 1u);
	EXPECT_EQ(s.expired, 1u);
	EXPECT_EQ(s.live, 0u);
}

// connect(): the seed's new(name), in any order. A consumer connected before the pool
// exists waits in get() for it; the first acquire or preallocate makes it; a handle that
// finds it attaches. Until then the handle says so, and reads zero.
TEST(Seed, ConnectInAnyOrder)
{
	RuntimeDir dir;
	auto early = BufferPool::connect("seed-connect");
	ASSERT_TRUE(early.ok()) << early.error().message;
	BufferPool &c = **early;
	EXPECT_EQ(c.role(), xmem::Role::none);
	EXPECT_EQ(c.name(), "seed-connect");
	EXPECT_EQ(c.stats().slots_total, 0u);
	EXPECT_EQ(c.slot_count(), 0u);
	EXPECT_EQ(c.fd(), -1);
	auto early_stats = c.consumer_stats();
	EXPECT_EQ(early_stats.code(), Errc::not_found);
	EXPECT_TRUE(has(early_stats.error().message, "before this handle made or found the pool"))
		<< early_stats.error().message;
	EXPECT_EQ(c.set_ref_count(1u << XMEM_META_SLOT_BITS, 1).code(), Errc::not_found);

	// The consumer's get waits for the pool and the frame (another thread here).
	std::atomic<uint32_t> sent{ xmem::kNoMetaIndex };
	xmem::Result<BufferGuard> got = xmem::Error{};
	std::thread reader([&] {
		while (sent.load() == xmem::kNoMetaIndex)
			std::this_thread::sleep_for(1ms);
		got = c.get(sent.load());
	});
	auto producer = BufferPool::connect("seed-connect");
	ASSERT_TRUE(producer.ok()) << producer.error().message;
	BufferPool &p = **producer;
	auto slots = p.preallocate_cpu(kSlotSize, 2);
	ASSERT_TRUE(slots.ok()) << slots.error().message;
	EXPECT_EQ(*slots, (std::vector<uint32_t>{ 0, 1 })) << "its first class is the pool's class 0";
	EXPECT_EQ(p.role(), xmem::Role::owner);
	auto f = written(p, 21);
	ASSERT_TRUE(f.ok()) << f.error().message;
	uint32_t mi = f->meta_index();
	ASSERT_OK(p.set_ref_count(mi, 1));
	sent.store(mi);
	reader.join();
	ASSERT_TRUE(got.ok()) << got.error().message;
	EXPECT_TRUE(xmem::test::check(got->as_cpu_slice().value(), 21));
	EXPECT_EQ(c.role(), xmem::Role::consumer);
	EXPECT_EQ(c.consumer_stats()->policy, XMEM_POLICY_LATEST) << "a connected consumer keeps one queued frame";

	// A late handle finds it: a consumer, whose preallocate is refused and whose acquire
	// is leased by the owner.
	auto late = BufferPool::connect("seed-connect");
	ASSERT_TRUE(late.ok());
	EXPECT_EQ((*late)->role(), xmem::Role::consumer);
	EXPECT_EQ((*late)->preallocate_cpu(kSlotSize, 1).code(), Errc::wrong_role);
	auto leased = written(**late, 22);
	ASSERT_TRUE(leased.ok()) << leased.error().message;
}

// Handles that make the pool at once, in threads: one owns it, the others attach, every
// time; and a get with nobody making the pool gives up after the timeout, saying so.
TEST(Seed, OneOfTheHandlesThatMakeThePoolAtOnceOwnsIt)
{
	RuntimeDir dir;
	for (int round = 0; round < 20; round++) {
		std::string name = "seed-race-" + std::to_string(round);
		std::vector<std::shared_ptr<BufferPool>> handles;
		for (int k = 0; k < 3; k++) {
			auto h = BufferPool::connect(name);
			ASSERT_TRUE(h.ok()) << h.error().message;
			handles.push_back(h.value());
		}
		std::vector<std::thread> threads;
		std::atomic<int> failed{ 0 };
		for (auto &h : handles)
			threads.emplace_back([&failed, h] {
				if (!h->acquire_cpu(kSlotSize, 2s))
					failed++;
			});
		for (auto &t : threads)
			t.join();
		EXPECT_EQ(failed.load(), 0) << "round " << round;
		int owners = 0;
		for (auto &h : handles)
			owners += h->role() == xmem::Role::owner;
		EXPECT_EQ(owners, 1) << "round " << round;
	}
	xmem::ConnectOptions quick;
	quick.timeout = 200ms;
	auto lonely = BufferPool::connect("seed-nobody", quick);
	ASSERT_TRUE(lonely.ok());
	auto start = std::chrono::steady_clock::now();
	auto none = (*lonely)->get(1u << XMEM_META_SLOT_BITS);
	EXPECT_EQ(none.code(), Errc::not_found);
	EXPECT_TRUE(has(none.error().message, "no process made it within")) << none.error().message;
	EXPECT_GE(std::chrono::steady_clock::now() - start, 200ms);
	EXPECT_EQ(BufferPool::connect("bad/../name//").code(), Errc::bad_name);
}

// A pool from connect() allocates on demand within its caps (the seed's allocation on
// demand): a size no class holds makes a slot, reused for the next frame of that size;
// past the cap, acquire says which cap. The owner's exit closes the pool for the others.
TEST(Seed, AConnectedPoolAllocatesOnDemandWithinItsCaps)
{
	RuntimeDir dir;
	xmem::ConnectOptions small;
	small.memory_cap = 1 << 20;
	auto owner = BufferPool::connect("seed-grow", small);
	ASSERT_TRUE(owner.ok());
	auto first = (*owner)->acquire_cpu(kSlotSize);
	ASSERT_TRUE(first.ok()) << first.error().message;
	EXPECT_EQ((*owner)->role(), xmem::Role::owner);
	auto c = BufferPool::connect("seed-grow");
	ASSERT_TRUE(c.ok());
	std::vector<uint32_t> slots;
	for (uint64_t v = 1; v <= 3; v++) {
		auto f = (*owner)->acquire_cpu(256 * 1024);
		ASSERT_TRUE(f.ok()) << f.error().message;
		xmem::test::fill(f->as_cpu_slice_mut().value(), 256 * 1024, v);
		slots.push_back(f->index());
		uint32_t mi = f->meta_index();
		ASSERT_OK((*owner)->set_ref_count(mi, 1));
		auto got = (*c)->get(mi);
		ASSERT_TRUE(got.ok()) << got.error().message;
		EXPECT_TRUE(xmem::test::check(got->as_cpu_slice().value(), v));
	}
	EXPECT_EQ(slots[0], slots[2]) << "a slot made on demand is reused";
	EXPECT_EQ((*owner)->growth_stats().memory_cap, 1u << 20);
	std::vector<BufferGuard> held;
	xmem::Result<BufferGuard> more = xmem::Error{};
	for (int i = 0; i < 8; i++) {
		more = (*owner)->acquire_cpu(256 * 1024, 0ns);
		if (!more)
			break;
		held.push_back(std::move(more.value()));
	}
	ASSERT_FALSE(more.ok()) << "1 MiB holds no more than four 256 KiB slots";
	EXPECT_EQ(more.code(), Errc::timed_out) << "every slot of that size is held, and no more fits";
	auto huge = (*owner)->acquire_cpu(2 << 20, 0ns);
	EXPECT_EQ(huge.code(), Errc::full);
	EXPECT_TRUE(has(huge.error().message, "memory cap")) << huge.error().message;
	held.clear();
	first->reset();
	owner->reset();
	auto after = (*c)->get(1u << XMEM_META_SLOT_BITS);
	EXPECT_EQ(after.code(), Errc::closed) << after.error().message;
}
