// owner/frame_path.hpp - the owner's frame path as the parts that serve peers see it: a
// frame's origin, and the lease and publish of a slot on a guest's behalf.
#pragma once

#include "../arena.hpp"

#include "../protocol.hpp"

#include <optional>
#include <span>

namespace xmem::owner {

// How a frame is published: the owner's, or a guest's on its behalf.
struct Origin {
	// The consumer record of the guest that wrote it, which is not queued its own frame.
	uint32_t except = protocol::kNoConsumer;
	// Its writes are complete (a guest synchronized its stream): a device slot's ready
	// word is stored at once, no stream of this process involved.
	bool writes_done = false;
	// Its process as this owner sees it (SO_PEERCRED; 0: the owner's own, or not visible).
	uint32_t producer_pid = 0;
};

// What the I/O thread's guests call on the owner (Publisher implements it): the owner's
// acquire and publish, for a slot a guest writes through its own mappings.
class FramePath
{
public:
	// A free slot of SIZE bytes or more of MEMORY, without waiting (the guest waits, on
	// its side), held by the owner's reference for the lease.
	virtual Result<uint32_t> lease(uint64_t size, Memory memory) = 0;
	// Leased slot SLOT, which a guest wrote as META and SIDE say, is published with the
	// lease's reference: to the consumers (REDEMPTIONS 0: no ticket), or as a ticket of
	// REDEMPTIONS within TTL_NS. Refused, the slot goes back.
	virtual Result<std::optional<Ticket>> publish_lease(uint32_t slot, const FrameMeta &meta,
							    std::span<const std::byte> side, uint32_t redemptions,
							    int64_t ttl_ns, const Origin &origin) = 0;

protected:
	~FramePath() = default;
};

} // namespace xmem::owner
