// owner/slot_claim.hpp - how the owner takes back a slot no process holds, and arms the
// timers its parts poll on the I/O thread: what every part of the owner shares.
#pragma once

#include "../layout.hpp"
#include "../system.hpp"

#include <ctime>

#include <sys/timerfd.h>

namespace xmem::owner {

// Slot SLOT, free or published with no holder, becomes TO (the owner's: WRITING for an
// acquire or a trim, FREE for a reap); false when a process holds it or took it first.
inline bool try_reclaim(layout::SlotRecord &slot, layout::SlotState to)
{
	uint32_t s = slot.state.load(std::memory_order_acquire);
	if (s == layout::kSlotFree)
		return slot.state.compare_exchange_strong(s, to, std::memory_order_seq_cst);
	if ((s != layout::kSlotPublished && s != layout::kSlotExclusive) || layout::holders_of(slot) != 0)
		return false;
	if (!slot.state.compare_exchange_strong(s, layout::kSlotReclaiming, std::memory_order_seq_cst))
		return false;
	// A consumer's get() sets its bit, then reads the state: after our CAS either we
	// see its bit here, or it sees RECLAIMING/`to` and backs off.
	if (layout::holders_of(slot) == 0) {
		slot.state.store(to, std::memory_order_seq_cst);
		return true;
	}
	slot.state.store(s, std::memory_order_seq_cst);
	return false;
}

// Arms TIMER (a timerfd, if any) for monotonic AT_NS (UINT64_MAX: disarms it); ARMED
// says for when it is armed once it is.
inline void arm_timer(const UniqueFd &timer, uint64_t at_ns, uint64_t &armed)
{
	if (!timer.valid())
		return;
	itimerspec t{};
	if (at_ns != UINT64_MAX) {
		t.it_value.tv_sec = time_t(at_ns / 1'000'000'000);
		t.it_value.tv_nsec = long(at_ns % 1'000'000'000);
	}
	if (::timerfd_settime(timer.get(), TFD_TIMER_ABSTIME, &t, nullptr) == 0)
		armed = at_ns;
}

// A timerfd of the monotonic clock for the I/O thread to poll; invalid when none can be made.
inline UniqueFd monotonic_timer()
{
	return UniqueFd(::timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
}

} // namespace xmem::owner
