// owner/config.hpp - a pool's configuration as its owner checks it: PoolConfig's bounds,
// the slot records it reserves, the memory a class may be of, and how its GPU work is ordered.
#pragma once

#include <xmem/xmem.hpp>

#include <cstdint>
#include <string>

namespace xmem::owner {

// The largest slot a class may have (1 TiB): sizes past it are refused, never rounded.
constexpr uint64_t kMaxSlotSize = uint64_t{ 1 } << 40;

// CONFIG within its bounds, or why not (WHERE: the pool, for the message).
Result<void> validate_config(const std::string &where, const PoolConfig &config);
// STORAGE is a memory xmem has (system or CUDA), and DEVICE one it may be on: the one
// check that PoolConfig, preallocate() and a guest's lease share.
Result<void> check_memory(const std::string &where, Storage storage, uint32_t device);
// Slot records a pool of CONFIG reserves: its first class's and room for later classes.
uint32_t slot_records(const PoolConfig &config);
// Stream memory operations where DEVICE has them, unless XMEM_CUDA_SYNC=cpu asks for the
// CPU fallback (to compare the two, or to work around a driver).
bool gpu_ordering_wanted(uint32_t device);

} // namespace xmem::owner
