// guest.hpp - a producer besides the owner (a guest): an attached consumer's process that
// acquires slots, writes them through its own mappings and publishes them or makes tickets.
#pragma once

#include "pool_impl.hpp"
#include "protocol.hpp"

#include <mutex>
#include <optional>

namespace xmem {

// The owner stays the pool's manager: it leases the slot, and publishes it on the guest's
// behalf (protocol.hpp, PeerRole::producer; docs/design.md).
class GuestProducer final : public GuestLeases
{
public:
	explicit GuestProducer(PoolImpl &pool);
	GuestProducer(const GuestProducer &) = delete;
	GuestProducer &operator=(const GuestProducer &) = delete;

	// As the owner's acquire(): a free slot of SIZE bytes or more of MEMORY (none: the
	// first class's), leased from the owner; waits up to TIMEOUT_NS for one to be freed.
	Result<BufferGuard> acquire(uint64_t size, std::optional<Memory> memory, int64_t timeout_ns, void *stream);
	// The owner publishes FRAME (a leased slot) to its consumers, or, with REDEMPTIONS,
	// as a ticket of that many redemptions within TTL_NS. A device slot's writes are
	// waited for on the CPU first (STREAM, else the guard's, else every stream of this
	// process's): the owner's consumers read it once the answer comes back.
	Result<void> publish(BufferGuard &&frame, void *stream);
	Result<Ticket> publish_ticket(BufferGuard &&frame, uint32_t redemptions, int64_t ttl_ns, void *stream);
	// Leased slot INDEX goes back unpublished (holder.hpp, GuestLeases).
	void give_back(uint32_t index, void *stream, void *also) override;

private:
	// The producer connection, made on first use (lock_ held).
	Result<void> connect(uint64_t deadline_ns);
	// One request and its answer (lock_ held).
	Result<protocol::Answer> ask(const protocol::Request &request);
	// Device slot INDEX: this process's writes on STREAM (and ALSO) are done, waited for
	// on the CPU; nothing for a system slot.
	Result<void> finish_writes(uint32_t index, void *stream, void *also = nullptr);
	// Publishes FRAME as publish() or publish_ticket() say.
	Result<protocol::Answer> put_out(BufferGuard &&frame, void *stream, uint32_t redemptions, int64_t ttl_ns);
	// MEMORY (its device as this process numbers it) as the owner names it: by the class
	// of it the owner made; an error when it made none.
	Result<Memory> owner_memory(Memory memory);

	// This consumer's record says it is in a guest's call while one lives (threads of
	// the process counted: `producing` is not 0 while any is).
	class Producing
	{
	public:
		explicit Producing(PoolImpl &pool);
		~Producing();
		Producing(const Producing &) = delete;
		Producing &operator=(const Producing &) = delete;

	private:
		layout::ConsumerRecord *record_;
		layout::ControlHeader *header_;
	};

	PoolImpl &pool_;
	// One request at a time on the connection. A leaf: nothing is locked under it.
	std::mutex lock_;
	UniqueFd conn_;
	bool gone_ = false; // the owner hung up or broke the protocol: every request is closed
};

} // namespace xmem
