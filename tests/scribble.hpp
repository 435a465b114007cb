// scribble.hpp - what a hostile same-user peer has: a writable view of a pool's slot
// records through an attached handle's mapping of the control segment (every consumer
// maps it read-write). For tests that rewrite what another process would read.
#pragma once

#include "layout.hpp"

#include <xmem/xmem.hpp>

namespace xmem::test {

inline layout::SlotRecord *slot_record(BufferPool &pool, uint32_t index)
{
	std::span<const std::byte> seg = pool.control_segment();
	auto *base = const_cast<std::byte *>(seg.data()) + layout::slots_offset();
	return reinterpret_cast<layout::SlotRecord *>(base) + index;
}

} // namespace xmem::test
