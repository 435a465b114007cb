// test_guests.cpp - producers besides the owner (guests): an attached consumer acquires a
// slot (leased by the owner), writes it through its own mapping and publishes it or makes a
// ticket of it; its own frames are not queued back to it; slots dropped unpublished go
// back; bad publishes are refused with the slot given back; a guest waits for a slot
// freed; a guest in another process publishes and makes tickets; a guest SIGKILLed while
// writing leaks no slot; the owner's close ends a guest's requests; a hostile guest's
// requests (for slots not leased to it, garbage) are refused or hung up on, and leak nothing.
#include "common.hpp"
#include "frames.hpp"
#include "protocol.hpp"
#include "rendezvous.hpp"
#include "system.hpp"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <sstream>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
using xmem::BufferGuard;
using xmem::BufferPool;
using xmem::Errc;
using xmem::PoolConfig;
using xmem::Ticket;
using xmem::test::eventually;
using xmem::test::Process;
using xmem::test::RuntimeDir;

constexpr uint64_t kSlotSize = 4096;

std::shared_ptr<BufferPool> make_pool(const std::string &name, uint32_t slots)
{
	PoolConfig config;
	config.slot_count = slots;
	config.slot_size = kSlotSize;
	config.producer = "owner";
	auto pool = BufferPool::create(name, config);
	EXPECT_TRUE(pool.ok()) << pool.error().message;
	return pool.ok() ? pool.value() : nullptr;
}

std::shared_ptr<BufferPool> attach(const std::string &name)
{
	auto pool = BufferPool::open(name);
	EXPECT_TRUE(pool.ok()) << pool.error().message;
	return pool.ok() ? pool.value() : nullptr;
}

// A guest's frame: its bytes follow PTS (frames.hpp), with a dtype, a shape, a content
// type and side data.
xmem::Result<BufferGuard> guest_frame(BufferPool &guest, uint64_t pts, std::chrono::nanoseconds timeout = 2s)
{
	auto frame = guest.acquire(timeout);
	if (!frame)
		return frame.error();
	xmem::test::fill(frame->data_mut().value(), kSlotSize, pts);
	xmem::FrameMeta *m = frame->meta_mut().value();
	m->size = kSlotSize;
	m->pts = pts;
	m->dts = pts - 1;
	m->duration = 40;
	m->flags = 5;
	m->dtype = XMEM_DTYPE_F32;
	m->ndim = 2;
	m->shape[0] = 32;
	m->shape[1] = 32;
	std::strcpy(m->content_type, "tensor/guest");
	const char side[] = "side data of the guest";
	EXPECT_TRUE(frame->set_side_data(std::as_bytes(std::span(side))).ok());
	return frame;
}

void expect_guest_frame(xmem::Result<BufferGuard> &frame, uint64_t pts)
{
	ASSERT_TRUE(frame.ok()) << frame.error().message;
	const xmem::FrameMeta &m = frame->meta();
	EXPECT_EQ(m.pts, pts);
	EXPECT_EQ(m.dts, pts - 1);
	EXPECT_EQ(m.duration, 40u);
	EXPECT_EQ(m.flags, 5u);
	EXPECT_EQ(m.dtype, XMEM_DTYPE_F32);
	EXPECT_EQ(m.ndim, 2u);
	EXPECT_EQ(m.shape[1], 32u);
	EXPECT_STREQ(m.content_type, "tensor/guest");
	EXPECT_EQ(m.size, kSlotSize);
	EXPECT_TRUE(xmem::test::check(frame->data(), pts)) << "the bytes the guest wrote";
	std::string side(reinterpret_cast<const char *>(frame->side_data().data()), frame->side_data().size());
	EXPECT_EQ(side, std::string("side data of the guest") + '\0');
}

// A consumer publishes: the owner's other consumers receive the frame as the guest wrote it,
// the guest does not get its own frame back, and the owner numbers it.
TEST(Guests, AConsumerPublishesToTheOthers)
{
	RuntimeDir dir;
	auto owner = make_pool("guests-publish", 4);
	ASSERT_TRUE(owner);
	auto guest = attach("guests-publish");
	auto reader = attach("guests-publish");
	ASSERT_TRUE(guest && reader);
	for (uint64_t n = 0; n < 10; n++) {
		auto frame = guest_frame(*guest, 500 + n);
		ASSERT_TRUE(frame.ok()) << frame.error().message;
		EXPECT_TRUE(frame->writable());
		EXPECT_EQ(owner->stats().slots_free, 3u) << "the lease is the owner's hold";
		ASSERT_TRUE(guest->publish(std::move(*frame)).ok());
		auto got = reader->receive(2s);
		expect_guest_frame(got, 500 + n);
		EXPECT_EQ(got->meta().seq, n + 1);
		EXPECT_EQ(got->meta().producer_pid, uint32_t(::getpid())) << "the guest's process";
		EXPECT_STREQ(got->meta().producer, "owner");
	}
	EXPECT_EQ(guest->receive(0s).code(), Errc::timed_out) << "a guest's own frames are not queued for it";
	// The owner's frames still reach the guest, as any consumer.
	ASSERT_TRUE(xmem::test::publish_test_frame(*owner, 1s).ok());
	auto own = guest->receive(2s);
	ASSERT_TRUE(own.ok()) << own.error().message;
	EXPECT_EQ(own->meta().seq, 11u);
	EXPECT_EQ(owner->stats().published, 11u);
}

// A guest's ticket is redeemed by another consumer, as the owner's are.
TEST(Guests, AGuestMakesTickets)
{
	RuntimeDir dir;
	auto owner = make_pool("guests-tickets", 4);
	ASSERT_TRUE(owner);
	auto guest = attach("guests-tickets");
	auto reader = attach("guests-tickets");
	ASSERT_TRUE(guest && reader);
	auto frame = guest_frame(*guest, 77);
	ASSERT_TRUE(frame.ok());
	auto t = guest->publish_ticket(std::move(*frame), 2, 5s);
	ASSERT_TRUE(t.ok()) << t.error().message;
	auto text = Ticket::parse(t->to_string());
	ASSERT_TRUE(text.ok());
	auto a = reader->get(*text);
	expect_guest_frame(a, 77);
	auto b = owner->ticket_stats();
	EXPECT_EQ(b.issued, 1u);
	EXPECT_EQ(b.redeemed, 1u);
	auto again = reader->get(*t);
	ASSERT_TRUE(again.ok()) << again.error().message;
	EXPECT_EQ(reader->get(*t).code(), Errc::bad_ticket) << "used up";
	EXPECT_EQ(reader->receive(0s).code(), Errc::timed_out) << "a ticket's frame is queued for nobody";
	auto wrong = guest_frame(*guest, 78);
	ASSERT_TRUE(wrong.ok());
	EXPECT_EQ(guest->publish_ticket(std::move(*wrong), 0, 1s).code(), Errc::invalid_argument);
	EXPECT_TRUE(eventually([&] { return owner->stats().slots_free == 3; })) << "the refused frame's slot is back";
}

// A slot leased and dropped unpublished goes back; a guest that finds none free waits for
// one, and times out when none comes.
TEST(Guests, LeasesGoBackAndWaitForAFreeSlot)
{
	RuntimeDir dir;
	auto owner = make_pool("guests-wait", 2);
	ASSERT_TRUE(owner);
	auto guest = attach("guests-wait");
	ASSERT_TRUE(guest);
	auto a = guest->acquire(1s);
	auto b = guest->acquire(1s);
	ASSERT_TRUE(a.ok() && b.ok());
	EXPECT_NE(a->index(), b->index());
	EXPECT_EQ(owner->stats().slots_free, 0u);
	EXPECT_EQ(guest->add_ref(a->index()).code(), Errc::invalid_argument) << "a slot being written";
	EXPECT_EQ(guest->set_local_refs(a->index(), 3).code(), Errc::invalid_argument);
	auto start = std::chrono::steady_clock::now();
	EXPECT_EQ(guest->acquire(50ms).code(), Errc::timed_out);
	EXPECT_GE(std::chrono::steady_clock::now() - start, 50ms);
	EXPECT_EQ(owner->acquire(0s).code(), Errc::timed_out) << "the owner's acquire sees the leases";
	a->reset(); // given back, unpublished
	EXPECT_EQ(owner->stats().slots_free, 1u) << "back once the guard is gone";
	// A guest waiting in acquire() takes a slot as soon as one is freed.
	auto held = owner->acquire(1s);
	ASSERT_TRUE(held.ok());
	std::atomic<bool> got{ false };
	std::thread waiter([&] {
		auto c = guest->acquire(5s);
		got = c.ok();
	});
	std::this_thread::sleep_for(30ms);
	EXPECT_FALSE(got.load());
	held->reset();
	waiter.join();
	EXPECT_TRUE(got.load());
	b->reset();
	EXPECT_TRUE(eventually([&] { return owner->stats().slots_free == 2; }));
}

// A guest asks for memory of a kind the owner made a class of, named as the owner names
// it: memory the pool has no class of is refused here, naming it, before any request
// (no driver needed for that: the pool is of system memory), and a bad kind or device
// as the owner's acquire refuses it.
TEST(Guests, MemoryThePoolHasNoClassOfIsRefusedNamingIt)
{
	RuntimeDir dir;
	auto owner = make_pool("guests-memory", 2);
	ASSERT_TRUE(owner);
	auto guest = attach("guests-memory");
	ASSERT_TRUE(guest);
	auto cuda = guest->acquire(kSlotSize, xmem::Storage::cuda, 0, 100ms);
	ASSERT_FALSE(cuda.ok());
	EXPECT_EQ(cuda.code(), Errc::out_of_range);
	EXPECT_NE(cuda.error().message.find("no size class of memory of CUDA device 0"), std::string::npos)
		<< cuda.error().message;
	auto device = guest->acquire(kSlotSize, xmem::Storage::system, 1, 100ms);
	ASSERT_FALSE(device.ok());
	EXPECT_EQ(device.code(), Errc::invalid_argument);
	EXPECT_NE(device.error().message.find("a device is only for CUDA storage"), std::string::npos);
	auto kind = guest->acquire(kSlotSize, xmem::Storage(7), 0, 100ms);
	ASSERT_FALSE(kind.ok());
	EXPECT_EQ(kind.code(), Errc::invalid_argument);
	EXPECT_NE(kind.error().message.find("unknown storage type 7"), std::string::npos);
	// System memory, which it has, is leased: nothing above cost a slot.
	auto frame = guest->acquire(kSlotSize, xmem::Storage::system, 0, 1s);
	ASSERT_TRUE(frame.ok()) << frame.error().message;
	frame->reset();
	EXPECT_TRUE(eventually([&] { return owner->stats().slots_free == 2; }));
}

// What a guest may not publish: a frame it received, a buffer of another pool, a frame whose
// layout does not fit its slot (refused by the owner, its slot given back), a frame twice.
TEST(Guests, BadPublishesAreRefused)
{
	RuntimeDir dir;
	auto owner = make_pool("guests-bad", 3);
	auto other = make_pool("guests-bad-other", 1);
	ASSERT_TRUE(owner && other);
	auto guest = attach("guests-bad");
	ASSERT_TRUE(guest);
	ASSERT_TRUE(xmem::test::publish_test_frame(*owner, 1s).ok());
	auto received = guest->receive(1s);
	ASSERT_TRUE(received.ok());
	EXPECT_EQ(guest->publish(std::move(*received)).code(), Errc::read_only);
	auto foreign = other->acquire(1s);
	ASSERT_TRUE(foreign.ok());
	EXPECT_EQ(guest->publish(std::move(*foreign)).code(), Errc::invalid_argument);
	EXPECT_EQ(guest->publish(BufferGuard{}).code(), Errc::invalid_argument);
	auto big = guest->acquire(1s);
	ASSERT_TRUE(big.ok());
	big->meta_mut().value()->size = kSlotSize + 1;
	auto refused = guest->publish(std::move(*big));
	EXPECT_EQ(refused.code(), Errc::out_of_range) << refused.error().message;
	auto shape = guest->acquire(1s);
	ASSERT_TRUE(shape.ok());
	xmem::FrameMeta *m = shape->meta_mut().value();
	m->size = 16;
	m->dtype = XMEM_DTYPE_F32;
	m->ndim = 1;
	m->shape[0] = 1000; // 4000 bytes, not 16
	EXPECT_EQ(guest->publish(std::move(*shape)).code(), Errc::invalid_argument);
	EXPECT_TRUE(eventually([&] { return owner->stats().slots_free == 3; })) << "refused slots are back";
	EXPECT_EQ(owner->stats().published, 1u);
	EXPECT_EQ(guest->acquire(0, xmem::Storage::cuda, 0, 0s).code(), Errc::out_of_range)
		<< "no class of device memory";
	EXPECT_EQ(guest->acquire(kSlotSize + 1, 0s).code(), Errc::out_of_range) << "no class that large";
}

// A guest in another process: its frames reach a consumer here, its tickets are redeemed here.
TEST(Guests, AGuestInAnotherProcess)
{
	RuntimeDir dir;
	auto owner = make_pool("guests-peer", 4);
	ASSERT_TRUE(owner);
	// fifo: the guest's frames wait for this reader however far ahead that process runs
	// (drop-oldest would give their slots to the guest's next leases).
	xmem::OpenOptions fifo;
	fifo.policy = xmem::Policy::fifo;
	fifo.block_timeout = 10s;
	auto opened = BufferPool::open("guests-peer", fifo);
	ASSERT_TRUE(opened.ok()) << opened.error().message;
	auto reader = opened.value();
	Process publisher({ xmem::test::peer_path(), "guest", "guests-peer", "--frames", "12" });
	for (uint64_t n = 0; n < 12; n++) {
		auto frame = reader->receive(10s);
		ASSERT_TRUE(frame.ok()) << frame.error().message;
		EXPECT_EQ(frame->meta().pts, 1000 + n);
		EXPECT_TRUE(xmem::test::check(frame->data(), 1000 + n));
		EXPECT_EQ(frame->meta().producer_pid, uint32_t(publisher.pid()));
	}
	EXPECT_EQ(publisher.wait(), 0);

	Process tickets({ xmem::test::peer_path(), "guest", "guests-peer", "--frames", "3", "--tickets", "1" });
	ASSERT_EQ(tickets.wait(), 0);
	std::istringstream lines(tickets.output());
	std::string line;
	uint64_t n = 0;
	while (std::getline(lines, line)) {
		ASSERT_EQ(line.rfind("ticket=", 0), 0u) << line;
		auto t = Ticket::parse(line.substr(7));
		ASSERT_TRUE(t.ok()) << line;
		auto frame = reader->get(*t);
		ASSERT_TRUE(frame.ok()) << frame.error().message;
		EXPECT_EQ(frame->meta().pts, 1000 + n);
		EXPECT_TRUE(xmem::test::check(frame->data(), 1000 + n));
		n++;
	}
	EXPECT_EQ(n, 3u);
}

// A guest SIGKILLed while it writes leased slots leaks none of them; nor does one that
// exits holding leases.
TEST(Guests, AKilledGuestLeaksNoSlot)
{
	RuntimeDir dir;
	auto owner = make_pool("guests-kill", 4);
	ASSERT_TRUE(owner);
	for (int round = 0; round < 3; round++) {
		Process guest({ xmem::test::peer_path(), "guest", "guests-kill", "--frames", "2", "--hold", "3" });
		ASSERT_TRUE(guest.wait_output("leased=3"));
		EXPECT_EQ(owner->stats().slots_free, 1u);
		EXPECT_EQ(owner->acquire(0, 0s).ok(), true);
		guest.signal(SIGKILL);
		EXPECT_EQ(guest.wait(), 128 + SIGKILL);
		EXPECT_TRUE(eventually([&] { return owner->stats().slots_free == 4; })) << "round " << round;
	}
	// Every slot is the owner's again.
	std::vector<BufferGuard> all;
	for (int i = 0; i < 4; i++) {
		auto g = owner->acquire(1s);
		ASSERT_TRUE(g.ok()) << g.error().message;
		all.push_back(std::move(*g));
	}
}

// The owner closes under a guest: its leases end, its requests say closed.
TEST(Guests, TheOwnersCloseEndsAGuest)
{
	RuntimeDir dir;
	auto owner = make_pool("guests-close", 2);
	ASSERT_TRUE(owner);
	auto guest = attach("guests-close");
	ASSERT_TRUE(guest);
	auto frame = guest_frame(*guest, 9);
	ASSERT_TRUE(frame.ok());
	owner->close();
	EXPECT_EQ(guest->publish(std::move(*frame)).code(), Errc::closed);
	EXPECT_EQ(guest->acquire(0s).code(), Errc::closed);
}

// Threads of one guest lease and publish at once; a consumer gets every frame intact.
TEST(Guests, ThreadsOfAGuest)
{
	RuntimeDir dir;
	auto owner = make_pool("guests-threads", 8);
	ASSERT_TRUE(owner);
	auto guest = attach("guests-threads");
	xmem::OpenOptions fifo;
	fifo.policy = xmem::Policy::fifo;
	fifo.block_timeout = 5s;
	fifo.queue_size = 8;
	auto reader = BufferPool::open("guests-threads", fifo);
	ASSERT_TRUE(guest && reader.ok());
	constexpr int kThreads = 4, kEach = 50;
	std::atomic<int> failed{ 0 };
	std::vector<std::thread> threads;
	for (int t = 0; t < kThreads; t++)
		threads.emplace_back([&, t] {
			for (int n = 0; n < kEach; n++) {
				auto frame = guest_frame(*guest, uint64_t(t) * 1000 + uint64_t(n) + 10, 10s);
				if (!frame || !guest->publish(std::move(*frame)))
					failed++;
			}
		});
	int received = 0;
	while (received < kThreads * kEach) {
		auto frame = (*reader)->receive(10s);
		ASSERT_TRUE(frame.ok()) << frame.error().message;
		expect_guest_frame(frame, frame->meta().pts);
		received++;
	}
	for (auto &t : threads)
		t.join();
	EXPECT_EQ(failed.load(), 0);
	EXPECT_EQ(owner->stats().published, uint64_t(kThreads * kEach));
}

// What a hostile guest sends on its own connection: a Hello naming a consumer it is not,
// requests for slots not leased to it, an unknown memory, a layout that does not fit,
// garbage. Refused with their codes, or hung up on, with its leases given back.
TEST(Guests, AHostileGuestsRequests)
{
	namespace protocol = xmem::protocol;
	RuntimeDir dir;
	auto owner = make_pool("guests-hostile", 4);
	ASSERT_TRUE(owner);
	auto consumer = attach("guests-hostile"); // consumer record 0, of this process
	ASSERT_TRUE(consumer);
	auto deadline = [] {
		return xmem::monotonic_ns() + 5'000'000'000;
	};
	auto hello = [&](uint32_t consumer_index) {
		auto conn = xmem::rendezvous::connect(owner->path(), deadline());
		EXPECT_TRUE(conn.ok());
		protocol::Hello h = protocol::make_hello(protocol::PeerRole::producer, 0, "hostile");
		h.class_index = consumer_index;
		EXPECT_TRUE(xmem::rendezvous::send_message(conn->get(), &h, sizeof(h), nullptr, 0).ok());
		auto msg = xmem::rendezvous::receive_message(conn->get(), deadline(), "test", 0);
		EXPECT_TRUE(msg.ok());
		auto reply = protocol::parse_reply(msg->data, "test");
		return std::make_pair(std::move(conn.value()), reply.ok() ? Errc{} : reply.code());
	};
	EXPECT_EQ(hello(5).second, Errc::invalid_argument) << "no consumer 5 is attached";
	EXPECT_EQ(hello(100000).second, Errc::invalid_argument);
	auto [conn, welcomed] = hello(0);
	ASSERT_EQ(welcomed, Errc{});
	auto ask = [&](const protocol::Request &r) -> xmem::Result<protocol::Answer> {
		EXPECT_TRUE(xmem::rendezvous::send_message(conn.get(), &r, sizeof(r), nullptr, 0).ok());
		auto msg = xmem::rendezvous::receive_message(conn.get(), deadline(), "test", 0);
		if (!msg)
			return msg.error();
		return protocol::parse_answer(msg->data, "test");
	};
	protocol::Request r = protocol::make_request(protocol::RequestOp::publish);
	r.slot = 1;
	EXPECT_EQ(ask(r).code(), Errc::not_held) << "a slot not leased to it";
	r.op = protocol::RequestOp::give_back;
	EXPECT_EQ(ask(r).code(), Errc::not_held);
	r = protocol::make_request(protocol::RequestOp::lease);
	r.storage = 7;
	EXPECT_EQ(ask(r).code(), Errc::invalid_argument);
	r.storage = uint32_t(xmem::Storage::system);
	r.size = kSlotSize + 1;
	EXPECT_EQ(ask(r).code(), Errc::out_of_range);
	r.size = 0;
	auto leased = ask(r);
	ASSERT_TRUE(leased.ok()) << leased.error().message;
	EXPECT_EQ(owner->stats().slots_free, 3u);
	protocol::Request p = protocol::make_request(protocol::RequestOp::publish);
	p.slot = leased->slot;
	p.meta.size = kSlotSize + 1;
	EXPECT_EQ(ask(p).code(), Errc::out_of_range) << "a frame larger than its slot";
	EXPECT_EQ(owner->stats().slots_free, 4u) << "the refused frame's slot is back";
	p.meta.size = 16;
	EXPECT_EQ(ask(p).code(), Errc::not_held) << "published (refused) once: no longer leased";
	p.op = protocol::RequestOp(9);
	EXPECT_FALSE(ask(p).ok()) << "an unknown request: hung up on";
	EXPECT_EQ(owner->stats().published, 0u);

	// Leases of a guest that sends garbage go back when the owner hangs up on it.
	auto [conn2, welcomed2] = hello(0);
	ASSERT_EQ(welcomed2, Errc{});
	conn = std::move(conn2);
	for (int i = 0; i < 2; i++)
		ASSERT_TRUE(ask(r).ok());
	EXPECT_EQ(owner->stats().slots_free, 2u);
	const char garbage[] = "not a request";
	ASSERT_TRUE(xmem::rendezvous::send_message(conn.get(), garbage, sizeof(garbage), nullptr, 0).ok());
	EXPECT_TRUE(eventually([&] { return owner->stats().slots_free == 4; }));
	auto after = xmem::rendezvous::receive_message(conn.get(), deadline(), "test", 0);
	EXPECT_EQ(after.code(), Errc::closed) << "hung up on";
}

// A fifo consumer that publishes from the thread it receives on: while it is in a guest's
// call (which the owner's I/O thread serves, needing the publish lock), the owner's publish
// does not wait for room in its queue for the block timeout; the consumer's fallback
// applies at once. Before, each such publish held the owner up for the whole timeout.
TEST(Guests, AFifoConsumerThatPublishesDoesNotStallTheOwner)
{
	RuntimeDir dir;
	PoolConfig config;
	config.slot_count = 8;
	config.slot_size = kSlotSize;
	auto owner = BufferPool::create("guests-fifo", config);
	ASSERT_TRUE(owner.ok());
	xmem::OpenOptions fifo;
	fifo.policy = xmem::Policy::fifo;
	fifo.queue_size = 1;
	fifo.block_timeout = 10s;
	auto stage = BufferPool::open("guests-fifo", fifo);
	ASSERT_TRUE(stage.ok());
	std::atomic<bool> done{ false };
	std::thread consume_and_produce([&] {
		while (!done.load()) {
			auto in = (*stage)->receive(50ms);
			if (!in)
				continue;
			auto out = guest_frame(**stage, in->meta().seq + 100);
			if (out)
				(void)(*stage)->publish(std::move(*out));
		}
	});
	auto start = std::chrono::steady_clock::now();
	for (int n = 0; n < 40; n++)
		ASSERT_TRUE(xmem::test::publish_test_frame(**owner, 10s).ok());
	auto took = std::chrono::steady_clock::now() - start;
	// The stage's queue holds a frame still: it publishes once more at least.
	EXPECT_TRUE(eventually([&] { return (*owner)->stats().published > 40; })) << "the stage published too";
	done = true;
	consume_and_produce.join();
	EXPECT_LT(took, 5s) << "the owner waited for a consumer blocked in its own publish";
}

} // namespace
