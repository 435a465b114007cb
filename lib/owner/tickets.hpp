// owner/tickets.hpp - frame tickets as the owner keeps them: the check words it draws,
// each live ticket's slot and expiry, and the timer that ends them on time.
#pragma once

#include "../pool_impl.hpp"

#include <vector>

namespace xmem::owner {

// The owner's live tickets (BufferPool::publish_ticket; docs/design.md, "Frame tickets").
// Its list and timer are under the owner's publish_lock, which callers of add() and end()
// hold; draw_check(), any_live() and next_expiry_ns() take no lock.
class Tickets
{
public:
	explicit Tickets(PoolImpl &pool);

	// Makes the expiry timer; an error when the system has none to give.
	Result<void> start();
	// Polls readable when a ticket's time is up (the I/O thread then calls end()).
	const UniqueFd &timer() const { return timer_; }
	// A new ticket's check word: unpredictable and never 0, so a ticket of another pool
	// or of an earlier frame of the slot does not match by chance. Any thread.
	uint64_t draw_check();
	// Slot SLOT, published with its ticket words, is held by the owner for a ticket until
	// DEADLINE_NS or its redemptions are made. publish_lock held.
	void add(uint32_t slot, uint64_t deadline_ns);
	// Tickets whose redemptions are all made or whose time is up (ALL: every one, at
	// close) end: their redemptions left are refused and the owner's hold on their slots
	// goes. publish_lock held.
	void end(bool all);
	// Whether a ticket is live, and the earliest expiry: hints for acquire's waits.
	bool any_live() const { return live.load(std::memory_order_relaxed) != 0; }
	uint64_t next_expiry_ns() const { return next_ns.load(std::memory_order_relaxed); }

private:
	// The timer for the next ticket's expiry, set to AT_NS (UINT64_MAX: disarmed) unless
	// it is already. publish_lock held.
	void arm(uint64_t at_ns);

	PoolImpl &pool_;
	ControlSegment &seg;
	struct LiveTicket {
		uint32_t slot;
		uint64_t deadline_ns;
	};
	std::vector<LiveTicket> tickets; // under publish_lock
	// Their count and the earliest expiry, for acquire() to look at without the lock.
	std::atomic<uint32_t> live{ 0 };
	std::atomic<uint64_t> next_ns{ UINT64_MAX };
	UniqueFd timer_; // polled by the I/O thread
	uint64_t timer_ns = UINT64_MAX; // what it is armed for, under publish_lock
	// Check words: a key drawn at create, mixed with a count (any publishing thread).
	uint64_t key = 0;
	std::atomic<uint64_t> count{ 0 };
};

} // namespace xmem::owner
