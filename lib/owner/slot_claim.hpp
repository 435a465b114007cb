// owner/slot_claim.hpp - how the owner takes back a slot no process holds: what the
// frame path, the trims and the reaper share.
#pragma once

#include "../layout.hpp"
#include "../system.hpp"

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

} // namespace xmem::owner
