// test_tickets.cpp - frame tickets: a frame published to no queue, named by plain data,
// redeemed by as many gets as it was issued for, in this process and in another one fed
// over a pipe; expiry giving the slot back; stale, forged, garbled and foreign tickets
// refused, never another frame; a redeemer SIGKILLed before and after redeeming; the
// owner's close; redemptions racing expiry in threads.
#include "common.hpp"
#include "frames.hpp"

#include <signal.h>

#include <atomic>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
using xmem::BufferGuard;
using xmem::BufferPool;
using xmem::Errc;
using xmem::Ticket;
using xmem::test::attach;
using xmem::test::eventually;
using xmem::test::make_pool;
using xmem::test::Process;
using xmem::test::RuntimeDir;

constexpr uint64_t kSlotSize = 4096;

// A test frame (frames.hpp: its bytes follow its seq) made into a ticket.
xmem::Result<Ticket> ticket_frame(BufferPool &owner, uint32_t redemptions, std::chrono::nanoseconds ttl,
				  std::chrono::nanoseconds timeout = 2s)
{
	auto frame = owner.acquire(timeout);
	if (!frame)
		return frame.error();
	uint64_t seq = owner.stats().published + 1;
	xmem::test::fill(frame->data_mut().value(), kSlotSize, seq);
	frame->meta_mut().value()->size = kSlotSize;
	return owner.publish_ticket(std::move(*frame), redemptions, ttl);
}

void expect_frame(xmem::Result<BufferGuard> &frame, const Ticket &t)
{
	ASSERT_TRUE(frame.ok()) << frame.error().message;
	EXPECT_EQ(frame->meta().seq, t.seq);
	EXPECT_EQ(frame->index(), t.slot);
	EXPECT_TRUE(xmem::test::check(frame->data(), t.seq)) << "the ticket's frame, byte for byte";
}

} // namespace

// A ticket for two: two consumers redeem it, a third get is refused; once both let go
// and the owner looks, the slot is free again.
TEST(Tickets, EachRedemptionGetsTheFrameAsOftenAsIssued)
{
	RuntimeDir dir;
	auto owner = make_pool("tickets-n", 2);
	ASSERT_TRUE(owner);
	auto a = attach("tickets-n"), b = attach("tickets-n");
	ASSERT_TRUE(a && b);
	auto t = ticket_frame(*owner, 2, 10s);
	ASSERT_TRUE(t.ok()) << t.error().message;
	EXPECT_EQ(a->receive(0ns).code(), Errc::timed_out) << "a ticketed frame goes to no queue";

	auto fa = a->get(*t);
	expect_frame(fa, *t);
	auto fb = b->get(*t);
	expect_frame(fb, *t);
	auto third = a->get(*t);
	EXPECT_EQ(third.code(), Errc::bad_ticket) << "issued for two redemptions";
	EXPECT_NE(third.error().message.find("no redemption left"), std::string::npos) << third.error().message;

	auto s = owner->ticket_stats();
	EXPECT_EQ(s.issued, 1u);
	EXPECT_EQ(s.redeemed, 2u);
	EXPECT_EQ(s.expired, 0u);
	fa = xmem::Error{};
	fb = xmem::Error{};
	// The owner's hold goes at its next look (acquire); then both slots are free.
	auto x = owner->acquire(1s);
	ASSERT_TRUE(x.ok()) << x.error().message;
	auto y = owner->acquire(1s);
	ASSERT_TRUE(y.ok()) << "the ticket's slot came back: " << y.error().message;
	EXPECT_EQ(owner->ticket_stats().live, 0u);
}

// Nobody redeems: at the TTL the owner's hold goes, the slot is written again, and the
// ticket is refused from then on, never the slot's new frame.
TEST(Tickets, AnUnredeemedTicketExpiresAndGivesItsSlotBack)
{
	RuntimeDir dir;
	auto owner = make_pool("tickets-expire", 1);
	ASSERT_TRUE(owner);
	auto consumer = attach("tickets-expire");
	ASSERT_TRUE(consumer);
	auto t = ticket_frame(*owner, 1, 100ms);
	ASSERT_TRUE(t.ok()) << t.error().message;
	EXPECT_EQ(owner->acquire(0ns).code(), Errc::timed_out) << "the only slot is held for the ticket";
	auto start = std::chrono::steady_clock::now();
	auto next = owner->acquire(5s);
	ASSERT_TRUE(next.ok()) << "the expiry ends the wait: " << next.error().message;
	EXPECT_GE(std::chrono::steady_clock::now() - start, 50ms);
	EXPECT_EQ(next->index(), t->slot);
	xmem::test::fill(next->data_mut().value(), kSlotSize, 99);
	next->meta_mut().value()->size = kSlotSize;
	ASSERT_TRUE(owner->publish(std::move(*next)).ok());

	auto late = consumer->get(*t);
	EXPECT_EQ(late.code(), Errc::bad_ticket);
	auto s = owner->ticket_stats();
	EXPECT_EQ(s.expired, 1u);
	EXPECT_EQ(s.redeemed, 0u);
	EXPECT_EQ(s.live, 0u);
	auto queued = consumer->receive(1s);
	ASSERT_TRUE(queued.ok()) << "the slot's new frame came through the queue";
	EXPECT_TRUE(xmem::test::check(queued->data(), 99));
}

// An owner that acquires nothing after the ticket still ends it at its TTL (its I/O
// thread's timer): the redemption after it is refused and the slot is free.
TEST(Tickets, AnIdleOwnerStillEndsItsTicketsOnTime)
{
	RuntimeDir dir;
	auto owner = make_pool("tickets-idle", 2);
	ASSERT_TRUE(owner);
	auto consumer = attach("tickets-idle");
	ASSERT_TRUE(consumer);
	auto t = ticket_frame(*owner, 1, 100ms);
	ASSERT_TRUE(t.ok()) << t.error().message;
	EXPECT_EQ(owner->stats().slots_free, 1u);
	EXPECT_TRUE(eventually([&] { return owner->ticket_stats().live == 0; }, 5000ms));
	EXPECT_EQ(owner->ticket_stats().expired, 1u);
	EXPECT_EQ(owner->stats().slots_free, 2u);
	EXPECT_EQ(consumer->get(*t).code(), Errc::bad_ticket);
}

// What is not a live ticket of this pool is refused with Errc::bad_ticket, and the slot
// it names is not held afterwards.
TEST(Tickets, StaleForgedGarbledAndForeignTicketsAreRefused)
{
	RuntimeDir dir;
	auto owner = make_pool("tickets-bad", 2);
	auto other = make_pool("tickets-other", 2);
	ASSERT_TRUE(owner && other);
	auto consumer = attach("tickets-bad");
	ASSERT_TRUE(consumer);
	auto t = ticket_frame(*owner, 1, 10s);
	auto foreign = ticket_frame(*other, 1, 10s);
	ASSERT_TRUE(t.ok() && foreign.ok());

	Ticket forged = *t;
	forged.check ^= 1;
	Ticket stale = *t;
	stale.seq -= 1;
	Ticket nowhere = *t;
	nowhere.slot = 1000;
	Ticket zero = *t;
	zero.check = 0;
	Ticket moved = *foreign;
	moved.slot = t->slot; // another pool's check word on this pool's slot
	for (const Ticket &bad : { forged, stale, nowhere, zero, *foreign, moved }) {
		auto f = consumer->get(bad);
		EXPECT_EQ(f.code(), Errc::bad_ticket) << bad.to_string();
		EXPECT_EQ(consumer->ref_count(t->slot), 0u) << "a refused ticket leaves no hold";
	}
	EXPECT_EQ(owner->ticket_stats().redeemed, 0u);
	auto real = consumer->get(*t);
	expect_frame(real, *t); // the real one still works, once

	for (const char *text : { "", "xmem-ticket:", "xmem-ticket:0:1:", "xmem-ticket:0:1:00000000000000000",
				  "xmem-ticket:0:1:000000000000000g", "xmem-ticket:x:1:0000000000000001",
				  "xmem-ticket:0:1:0000000000000000", "ticket:0:1:0000000000000001",
				  "xmem-ticket:99999999999:1:0000000000000001" }) {
		auto parsed = Ticket::parse(text);
		EXPECT_EQ(parsed.code(), Errc::bad_ticket) << "'" << text << "'";
	}
	auto round = Ticket::parse(t->to_string());
	ASSERT_TRUE(round.ok()) << round.error().message;
	EXPECT_EQ(*round, *t);
}

TEST(Tickets, BadRequestsAreRefusedWithTheReason)
{
	RuntimeDir dir;
	auto owner = make_pool("tickets-args", 2);
	ASSERT_TRUE(owner);
	auto consumer = attach("tickets-args");
	ASSERT_TRUE(consumer);
	auto frame = owner->acquire(1s);
	ASSERT_TRUE(frame.ok());
	EXPECT_EQ(owner->publish_ticket(std::move(*frame), 0, 1s).code(), Errc::invalid_argument);
	frame = owner->acquire(1s);
	ASSERT_TRUE(frame.ok());
	EXPECT_EQ(owner->publish_ticket(std::move(*frame), 1, 0s).code(), Errc::invalid_argument);
	auto t = ticket_frame(*owner, 1, 1s);
	ASSERT_TRUE(t.ok()) << t.error().message;
	EXPECT_EQ(owner->get(*t).code(), Errc::wrong_role) << "the owner holds it already";
	auto f = consumer->receive(0ns);
	EXPECT_EQ(f.code(), Errc::timed_out);
	EXPECT_EQ(consumer->publish_ticket(BufferGuard{}, 1, 1s).code(), Errc::invalid_argument);
}

// The owner closes: its tickets end with the pool.
TEST(Tickets, AClosedPoolsTicketsAreRefused)
{
	RuntimeDir dir;
	auto owner = make_pool("tickets-close", 2);
	ASSERT_TRUE(owner);
	auto consumer = attach("tickets-close");
	ASSERT_TRUE(consumer);
	auto t = ticket_frame(*owner, 2, 10s);
	ASSERT_TRUE(t.ok());
	auto held = consumer->get(*t);
	expect_frame(held, *t);
	owner.reset();
	auto after = consumer->get(*t);
	EXPECT_TRUE(after.code() == Errc::closed || after.code() == Errc::bad_ticket) << after.error().message;
	EXPECT_TRUE(xmem::test::check(held->data(), t->seq)) << "a redeemed frame outlives the owner's close";
}

// Tickets travel over a pipe to another process, which redeems them; killed with frames
// redeemed, or before redeeming, it leaks nothing: the reaper takes its holds back and
// unredeemed tickets expire.
TEST(Tickets, ARedeemerInAnotherProcessKilledBeforeOrAfterRedeemingLeaksNothing)
{
	::signal(SIGPIPE, SIG_IGN); // a write to a killed redeemer's stdin fails instead
	RuntimeDir dir;
	auto owner = make_pool("tickets-kill", 3);
	ASSERT_TRUE(owner);
	Process redeemer;
	redeemer.start({ xmem::test::peer_path(), "redeem", "tickets-kill", "--hold" }, true);
	ASSERT_TRUE(redeemer.wait_output("attached"));

	auto t1 = ticket_frame(*owner, 1, 10s);
	auto t2 = ticket_frame(*owner, 1, 300ms); // sent, never redeemed: it expires
	ASSERT_TRUE(t1.ok() && t2.ok());
	ASSERT_TRUE(redeemer.write_stdin(t1->to_string() + "\n"));
	ASSERT_TRUE(redeemer.write_stdin(t1->to_string() + "\n")); // a second time: refused
	ASSERT_TRUE(redeemer.wait_output("refused code=" + std::to_string(-XMEM_EBADTICKET))) << redeemer.output();
	EXPECT_NE(redeemer.output().find("redeemed seq=" + std::to_string(t1->seq) + " ok=1"), std::string::npos)
		<< redeemer.output();
	redeemer.signal(SIGKILL);
	EXPECT_EQ(redeemer.wait(), 128 + SIGKILL);

	// Every slot comes back: t1's once the reaper cleared the dead redeemer's bit and the
	// owner's hold went (used up), t2's at its expiry; the third was never taken.
	std::vector<BufferGuard> all;
	for (int i = 0; i < 3; i++) {
		auto f = owner->acquire(5s);
		ASSERT_TRUE(f.ok()) << "slot " << i << ": " << f.error().message;
		all.push_back(std::move(f.value()));
	}
	auto s = owner->ticket_stats();
	EXPECT_EQ(s.issued, 2u);
	EXPECT_EQ(s.redeemed, 1u);
	EXPECT_EQ(s.expired, 1u);
	EXPECT_EQ(s.live, 0u);
	// The reaper counts it last, after releasing what it held.
	EXPECT_TRUE(eventually([&] { return owner->stats().reaped >= 1; }));
}

// Redemptions race expiry, in threads of two consumers against the owner's acquire: each
// get returns the ticket's own frame, byte for byte, or bad_ticket; no more than issued;
// and every slot is free at the end.
TEST(Tickets, RedemptionsRacingExpiryGetTheirFrameOrNothing)
{
	RuntimeDir dir;
	constexpr uint32_t kSlots = 4;
	auto owner = make_pool("tickets-race", kSlots);
	ASSERT_TRUE(owner);
	auto a = attach("tickets-race"), b = attach("tickets-race");
	ASSERT_TRUE(a && b);
	constexpr int kTickets = 300;
	std::vector<Ticket> issued(kTickets);
	std::atomic<int> ready{ 0 };
	std::atomic<uint64_t> wrong{ 0 }, redeemed{ 0 }, refused{ 0 }, other{ 0 };
	auto redeem = [&](BufferPool &consumer) {
		for (int i = 0; i < kTickets; i++) {
			while (ready.load(std::memory_order_acquire) <= i)
				std::this_thread::yield();
			// Some right away, some after the ticket's TTL may have run out.
			if (i % 3 == 0)
				std::this_thread::sleep_for(std::chrono::microseconds(300 + (i % 7) * 100));
			const Ticket &t = issued[size_t(i)];
			auto f = consumer.get(t);
			if (f) {
				redeemed++;
				if (f->meta().seq != t.seq || !xmem::test::check(f->data(), t.seq))
					wrong++;
			} else if (f.code() == Errc::bad_ticket) {
				refused++;
			} else {
				other++;
			}
		}
	};
	std::thread ta(redeem, std::ref(*a)), tb(redeem, std::ref(*b));
	for (int i = 0; i < kTickets; i++) {
		// Most expire within a millisecond, racing the redemptions; every fourth lives 5 s,
		// so that a loaded machine still has redemptions made.
		auto ttl = i % 4 == 0 ? std::chrono::microseconds(5'000'000)
				      : std::chrono::microseconds(200 + (i % 5) * 200);
		auto t = ticket_frame(*owner, 1 + i % 2, ttl, 10s);
		ASSERT_TRUE(t.ok()) << i << ": " << t.error().message;
		issued[size_t(i)] = *t;
		ready.store(i + 1, std::memory_order_release);
	}
	ta.join();
	tb.join();
	EXPECT_EQ(wrong.load(), 0u) << "a redemption returned another frame";
	EXPECT_EQ(other.load(), 0u);
	EXPECT_EQ(redeemed + refused, 2u * kTickets);
	EXPECT_GT(redeemed.load(), 0u);
	EXPECT_GE(refused.load(), uint64_t(kTickets) / 2) << "a ticket for one, two gets: one is refused";
	auto s = owner->ticket_stats();
	EXPECT_EQ(s.redeemed, redeemed.load());
	EXPECT_LE(s.redeemed, uint64_t(kTickets) * 3 / 2) << "no more redemptions than issued";
	std::vector<BufferGuard> all;
	for (uint32_t i = 0; i < kSlots; i++) {
		auto f = owner->acquire(5s);
		ASSERT_TRUE(f.ok()) << "slot " << i << " was not given back: " << f.error().message;
		all.push_back(std::move(f.value()));
	}
	EXPECT_EQ(owner->ticket_stats().live, 0u);
}
