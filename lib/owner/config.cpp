// owner/config.cpp - the owner's checks of a PoolConfig and the choices made from it
// before anything is created.
#include "config.hpp"

#include "../arena.hpp"
#include "../layout.hpp"
#include "../spill.hpp"

#include <algorithm>

namespace xmem::owner {

using layout::kMaxSpillFrames;
using layout::round_up;

namespace {

// Slot records a pool reserves for size classes added later, unless PoolConfig::max_slots
// says otherwise. A record untouched costs no memory (the segment is a memfd).
constexpr uint32_t kDefaultSpareSlots = 64;

} // namespace

Result<void> validate_config(const std::string &where, const PoolConfig &config)
{
	if (config.slot_count < 1 || config.slot_count > XMEM_MAX_SLOTS)
		return make_error(Errc::invalid_argument, where + ": slot count " + std::to_string(config.slot_count) +
								  " out of range 1.." + std::to_string(XMEM_MAX_SLOTS));
	if (config.slot_size == 0 || config.slot_size > kMaxSlotSize)
		return make_error(Errc::invalid_argument, where + ": slot size " + std::to_string(config.slot_size) +
								  " out of range 1.." + std::to_string(kMaxSlotSize));
	if (config.max_consumers < 1 || config.max_consumers > XMEM_MAX_CONSUMERS)
		return make_error(Errc::invalid_argument,
				  where + ": max consumers " + std::to_string(config.max_consumers) +
					  " out of range 1.." + std::to_string(XMEM_MAX_CONSUMERS));
	if (!policy_name(config.policy))
		return make_error(Errc::invalid_argument,
				  where + ": unknown policy " + std::to_string(int(config.policy)));
	if (config.policy == Policy::fifo_spill && config.spill_bytes == 0)
		return make_error(Errc::invalid_argument,
				  where + ": the fifo-spill policy needs a spill tier (a spill size)");
	if (auto memory = check_memory(where, config.storage, config.device); !memory)
		return memory;
	if (config.mode & ~0777u)
		return make_error(Errc::invalid_argument, where + ": mode must be within 0777");
	if ((config.mode & 0600) != 0600)
		return make_error(Errc::invalid_argument, where + ": mode must give the owner read and write (0600)");
	if (config.block_timeout.count() < 0)
		return make_error(Errc::invalid_argument, where + ": negative block timeout");
	if (config.producer.size() >= XMEM_PRODUCER_MAX)
		return make_error(Errc::invalid_argument, where + ": producer name longer than " +
								  std::to_string(XMEM_PRODUCER_MAX - 1) + " bytes");
	if (config.spill_bytes > (uint64_t{ 1 } << 44))
		return make_error(Errc::invalid_argument, where + ": spill size over 16 TiB");
	if (config.spill_frames > kMaxSpillFrames)
		return make_error(Errc::invalid_argument,
				  where + ": spill frames " + std::to_string(config.spill_frames) +
					  " out of range 0.." + std::to_string(kMaxSpillFrames));
	if (config.spill_frames && !config.spill_bytes)
		return make_error(Errc::invalid_argument, where + ": spill frames without a spill size");
	if (config.trim_idle.count() < 0)
		return make_error(Errc::invalid_argument, where + ": negative trim idle time");
	if (config.trim_idle.count() && !config.memory_cap && !config.device_memory_cap)
		return make_error(Errc::invalid_argument, where + ": a trim idle time without a memory cap");
	uint64_t stride = round_up(config.slot_size, 4096);
	if (stride * config.slot_count / config.slot_count != stride)
		return make_error(Errc::invalid_argument, where + ": slots too large");
	if (config.max_slots && (config.max_slots < config.slot_count || config.max_slots > XMEM_MAX_SLOTS))
		return make_error(Errc::invalid_argument, where + ": max slots " + std::to_string(config.max_slots) +
								  " out of range " + std::to_string(config.slot_count) +
								  ".." + std::to_string(XMEM_MAX_SLOTS));
	return {};
}

uint32_t slot_records(const PoolConfig &config)
{
	if (config.max_slots)
		return config.max_slots;
	return std::min<uint32_t>(config.slot_count + kDefaultSpareSlots, XMEM_MAX_SLOTS);
}

} // namespace xmem::owner
