// owner/config.hpp - a pool's configuration as its owner checks it: PoolConfig's bounds
// (its memory by arena.hpp's check_memory) and the slot records it reserves.
#pragma once

#include <xmem/xmem.hpp>

#include <cstdint>
#include <string>

namespace xmem::owner {

// The largest slot a class may have (1 TiB): sizes past it are refused, never rounded.
constexpr uint64_t kMaxSlotSize = uint64_t{ 1 } << 40;

// CONFIG within its bounds, or why not (WHERE: the pool, for the message).
Result<void> validate_config(const std::string &where, const PoolConfig &config);
// Slot records a pool of CONFIG reserves: its first class's and room for later classes.
uint32_t slot_records(const PoolConfig &config);

} // namespace xmem::owner
