// publisher.hpp - the owner's role: creating a pool, acquire, publish and close; it
// composes the parts in lib/owner/ that each own one job and their state.
#pragma once

#include "owner/frame_path.hpp"
#include "owner/growth.hpp"
#include "owner/peer_server.hpp"
#include "owner/queues.hpp"
#include "owner/spill_mover.hpp"
#include "owner/tickets.hpp"
#include "pool_impl.hpp"

#include <span>

namespace xmem {

using owner::Origin;

// The owner of a pool. Its frame path (acquire, claim, publish) runs on the producer's
// threads; its parts own the rest: the consumers' queues, the spill mover and its thread,
// the classes and their growth, the tickets, and the I/O thread that serves peers
// (docs/design.md, "Where to change what"). Data flows one way: Publisher -> parts ->
// the pool's shared state; the I/O thread's guests reach the frame path only through
// FramePath.
class Publisher final : private owner::FramePath
{
public:
	// Creates pool NAME at PATH: claims the name, lays out the segment and arena,
	// starts the I/O thread.
	static Result<std::shared_ptr<PoolImpl>> create(std::string_view name, std::string path,
							const PoolConfig &config);

	explicit Publisher(PoolImpl &pool);
	~Publisher();
	Publisher(const Publisher &) = delete;
	Publisher &operator=(const Publisher &) = delete;

	// A free slot of SIZE bytes or more, of the smallest class of MEMORY (none: the first
	// class's) that has one; SIZE 0: of the first class (BufferPool::acquire).
	Result<BufferGuard> acquire(uint64_t size, std::optional<Memory> memory, int64_t timeout_ns, void *stream);
	// Adds a size class of COUNT slots of SLOT_SIZE bytes (BufferPool::preallocate).
	Result<uint32_t> preallocate(uint64_t slot_size, uint32_t count, Storage storage, uint32_t device);
	Result<void> publish(BufferGuard &&frame, void *stream, const Origin &origin = {});
	// Publishes FRAME to no queue, the owner's reference kept for a ticket of
	// REDEMPTIONS redemptions within TTL_NS (BufferPool::publish_ticket).
	Result<Ticket> publish_ticket(BufferGuard &&frame, uint32_t redemptions, int64_t ttl_ns, void *stream,
				      const Origin &origin = {});
	Result<void> end_of_stream();
	Result<void> set_format(std::string_view format);
	// Closes the pool: the name is freed, consumers see Errc::closed after their
	// queue, waiters here wake. Never waits for consumers. Idempotent.
	void shutdown();

private:
	Result<void> start(const PoolConfig &config);
	// The owner's reference on slot I of class CLS, which acquire() just took (WRITING),
	// its metadata reset: a writable guard once its device slot's GPU reads are done
	// (STREAM waits).
	Result<BufferGuard> claim(uint32_t i, const PoolImpl::SlotClass &cls, void *stream, uint64_t deadline);
	// What publish() and publish_ticket() share: checks G, stamps its metadata and makes
	// its slot PUBLISHED (ready after STREAM's work, for device slots), with the ticket
	// words TICKET_CHECK and REDEMPTIONS (0, 0: no ticket). Takes LOCK (publish_lock) and
	// returns the frame's sequence number, LOCK held; the owner's reference stays.
	Result<uint64_t> put_out(BufferGuard &g, void *stream, std::unique_lock<std::mutex> &lock,
				 uint64_t ticket_check, uint32_t redemptions, const Origin &origin);
	// A frame publish() or publish_ticket() refused goes back: the owner's own as its
	// guard's release does (after its streams' work), a guest's at once.
	void refuse(BufferGuard &&frame, const Origin &origin);
	// FramePath, for guests (the I/O thread).
	Result<uint32_t> lease(uint64_t size, Memory memory) override;
	Result<std::optional<Ticket>> publish_lease(uint32_t slot, const FrameMeta &meta,
						    std::span<const std::byte> side, uint32_t redemptions,
						    int64_t ttl_ns, const Origin &origin) override;

	PoolImpl &pool_;
	ControlSegment &seg;

	// Set once by shutdown() (release), read by acquire's and publish's waits
	// (acquire): they stop waiting. Nothing else is published through it.
	std::atomic<bool> shut{ false };
	// The classes and growth on demand: their own state and lock (growth_lock, taken
	// before the pool's classes_lock, with no lock of this class held).
	owner::Growth growth{ pool_, shut };
	// Guards the consumer set and queues against publish and the drop/EOS paths, the
	// spill mover, the tickets, and the owner's writes of the pool's format. Held during
	// a block-policy wait, which is bounded by block_timeout and cut short when the
	// awaited consumer dies. Lock order: publish_lock, then the pool's refs_lock,
	// then its format_lock.
	std::mutex publish_lock;
	// The consumers and their queues, under publish_lock.
	owner::ConsumerQueues queues{ pool_, shut };
	// The spill tier's mover and its thread, under publish_lock.
	owner::SpillMover spill{ pool_, queues, publish_lock, shut };
	// Frame tickets: their list and timer under publish_lock.
	owner::Tickets tickets{ pool_ };
	uint64_t published_count = 0; // under publish_lock
	// Each slot's frame generation (layout::SlotRecord::frame_gen), the owner's own copy:
	// written by claim() while the slot is WRITING, so slot I's by one thread at a time.
	std::vector<uint32_t> frame_gens;
	// Where acquire() starts looking for a free slot in each class: a hint, any value is
	// correct, so relaxed.
	std::array<std::atomic<uint32_t>, layout::kMaxClasses> acquire_cursor{};
	// Set by start(), then read only: the owner's own copies (consumers can write the
	// shared header's).
	char config_producer[XMEM_PRODUCER_MAX] = {};
	uint32_t owner_pid = 0; // getpid() at create, not a syscall per frame
	// The I/O thread and what only it touches; declared last, so it is destroyed first.
	owner::PeerServer peers{ pool_, owner::OwnerParts{ publish_lock, shut, published_count, queues, spill, tickets,
							   growth, *this } };
};

} // namespace xmem
