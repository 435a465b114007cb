// owner/tickets.cpp - the owner's frame tickets: check words, the live tickets' slots,
// their end when used up or expired, and the expiry timer.
#include "tickets.hpp"

#include "io_poll.hpp"

#include <sys/random.h>
#include <unistd.h>

namespace xmem::owner {

using layout::SlotRecord;

namespace {

// SplitMix64's finalizer: a bijection that scatters consecutive inputs.
uint64_t mix64(uint64_t x)
{
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
	return x ^ (x >> 31);
}

// 64 random bits from the kernel; the clock and pid where it has none to give
// (GRND_NONBLOCK: never waits for entropy at boot).
uint64_t random_key()
{
	uint64_t key = 0;
	if (::getrandom(&key, sizeof(key), GRND_NONBLOCK) != ssize_t(sizeof(key)))
		key = mix64(monotonic_ns() ^ (uint64_t(::getpid()) << 32));
	return key;
}

} // namespace

Tickets::Tickets(PoolImpl &pool) : pool_(pool), seg(pool.seg), key(random_key())
{
}

Result<void> Tickets::start()
{
	timer_ = monotonic_timer();
	if (!timer_.valid())
		return errno_error(pool_.where() + ": timerfd");
	return {};
}

uint64_t Tickets::draw_check()
{
	uint64_t check = 0;
	while (check == 0)
		check = mix64(key + count.fetch_add(1, std::memory_order_relaxed) + 1);
	return check;
}

void Tickets::add(uint32_t slot, uint64_t deadline_ns)
{
	tickets.push_back({ slot, deadline_ns });
	uint64_t next = std::min(next_ns.load(std::memory_order_relaxed), deadline_ns);
	next_ns.store(next, std::memory_order_relaxed);
	arm(next);
	live.fetch_add(1, std::memory_order_relaxed);
	seg.header->tickets_issued.fetch_add(1, std::memory_order_relaxed);
	seg.header->tickets_live.fetch_add(1, std::memory_order_relaxed);
}

void Tickets::end(bool all)
{
	uint64_t now = monotonic_ns(), next = UINT64_MAX;
	for (auto it = tickets.begin(); it != tickets.end();) {
		SlotRecord &slot = seg.slots[it->slot];
		if (!all && now < it->deadline_ns && slot.ticket_left.load(std::memory_order_seq_cst) != 0) {
			next = std::min(next, it->deadline_ns);
			++it;
			continue;
		}
		// Left to 0 first: a redeemer's CAS fails from here on, and one that made its
		// redemption before holds the slot by its own bit.
		if (slot.ticket_left.exchange(0, std::memory_order_seq_cst) != 0)
			seg.header->tickets_expired.fetch_add(1, std::memory_order_relaxed);
		slot.ticket_check.store(0, std::memory_order_seq_cst);
		(void)pool_.release(it->slot, nullptr, false);
		seg.header->tickets_live.fetch_sub(1, std::memory_order_relaxed);
		live.fetch_sub(1, std::memory_order_relaxed);
		it = tickets.erase(it);
	}
	next_ns.store(next, std::memory_order_relaxed);
	arm(next);
}

void Tickets::arm(uint64_t at_ns)
{
	if (at_ns != timer_ns)
		arm_timer(timer_, at_ns, timer_ns);
}

} // namespace xmem::owner
