// owner/growth.hpp - the owner's size classes and growth on demand: classes added by
// preallocate(), slots made within the memory caps, and trims that give memory back.
#pragma once

#include "../pool_impl.hpp"

#include <map>
#include <optional>
#include <string>

namespace xmem::owner {

// The pool's classes as the owner adds them, and growth on demand (PoolConfig::memory_cap,
// device_memory_cap; docs/design.md, "Growth on demand"). Its state is its own, under
// growth_lock unless a field says otherwise; acquire() reads committed() and stamps
// used() without it. Lock order: growth_lock, then the pool's classes_lock.
class Growth
{
public:
	// SHUT: the owner's closing flag (set once, read here).
	Growth(PoolImpl &pool, const std::atomic<bool> &shut);

	// The caps and trim time of CONFIG, and the first class's bytes counted: before any
	// other call, the segment and class 0 made.
	Result<void> start(const PoolConfig &config);
	// Whether any memory grows (then timer() polls readable when a trim is due).
	bool grows() const { return memory_cap != 0 || device_memory_cap != 0; }
	const UniqueFd &timer() const { return trim_timer; }
	// The cap of MEMORY (0: it does not grow). Set at start, read without a lock.
	uint64_t cap_of(Memory memory) const { return on_device(memory.storage) ? device_memory_cap : memory_cap; }
	// Adds a size class of COUNT slots of SLOT_SIZE bytes (BufferPool::preallocate).
	Result<uint32_t> preallocate(uint64_t slot_size, uint32_t count, Storage storage, uint32_t device);
	// A slot of SIZE bytes or more of MEMORY, a dynamic class's whose memory was not
	// committed (a new dynamic class's first), committed within that memory's cap once
	// free dynamic slots of it made room, least recently used first. WRITING, not yet held
	// (the owner's claim); none when the cap, the pool's records or the system leave no room.
	std::optional<uint32_t> grow(uint64_t size, Memory memory);
	// Why grow() made no slot of MEMORY: its bytes in use against the cap.
	std::string full_reason(Memory memory);
	// Whether slot record I has memory (any state a peer wrote aside): every record of
	// a pool that does not grow. Lock-free, for acquire's scans.
	bool committed(uint32_t i) const { return !committed_ || committed_[i].load(std::memory_order_acquire); }
	// Slot I was acquired now: the trims count its idle time from here. Lock-free.
	void used(uint32_t i)
	{
		if (last_used)
			last_used[i].store(monotonic_ns(), std::memory_order_relaxed);
	}
	// The trim timer fired: free dynamic slots not acquired for trim_idle_ns give their
	// memory back; the timer is armed for the next that may. I/O thread.
	void trim_idle();
	// A consumer's PeerRole::slot on CONN: dynamic device slot INDEX's memory now (its fd)
	// and its generation, or a Reject. I/O thread.
	void send_slot(int conn, uint32_t index);

private:
	// Adds a size class (DYNAMIC: grow()'s, its memory sparse and its records UNUSED).
	// growth_lock held.
	Result<uint32_t> add_class(uint64_t slot_size, uint32_t count, Storage storage, uint32_t device, bool dynamic);
	uint64_t committed_bytes(Memory memory) const; // growth_lock held
	// growth_lock held: VISIT(slot, last used) for each dynamic slot whose memory is
	// committed.
	template<typename Visit>
	void for_each_dynamic_slot(Visit visit);
	// growth_lock held: the free dynamic slot used least recently (and before USED_BEFORE;
	// of MEMORY when given) gives its memory back, its record UNUSED again; false when
	// there is none. A device slot's GPU work must be over (its done words): one whose
	// consumers' reads are still queued stays.
	bool trim_one(uint64_t used_before, std::optional<Memory> memory = std::nullopt);
	void arm_trim_timer(uint64_t at_ns); // growth_lock held
	void count_bytes(const PoolImpl::SlotClass &cls, int64_t bytes); // growth_lock held

	PoolImpl &pool_;
	ControlSegment &seg;
	const std::atomic<bool> &shut;

	// Serialises adding classes, committing and trimming slots' memory and its count.
	// acquire() takes it with no other lock held.
	std::mutex growth_lock;
	// Set by start(), then read only. The owner's own copies; the header's are for peers.
	uint64_t memory_cap = 0; // 0: system memory does not grow
	uint64_t device_memory_cap = 0; // of each device; 0: device memory does not grow
	uint64_t trim_idle_ns = 0;
	uint64_t system_committed = 0; // the system memory of every class's committed slots
	std::map<uint32_t, uint64_t> device_committed; // by device: its memory's, likewise
	// Pools that grow only, by slot record: when it was last acquired (monotonic ns), for
	// the trims; whether its memory is committed (a preallocated class's always). The
	// owner's own account: the segment's states and dynamic_classes are for peers, which
	// could write them (a slot made FREE without memory, a preallocated class trimmed).
	std::unique_ptr<std::atomic<uint64_t>[]> last_used;
	std::unique_ptr<std::atomic<bool>[]> committed_;
	// Dynamic device slots: the generation of the memory committed now (the record's
	// memory_gen is a copy), counted by memory_gens.
	std::unique_ptr<uint32_t[]> memory_gen;
	uint32_t memory_gens = 0;
	uint32_t dynamic_mask = 0; // the classes grow() made (bit c: class c)
	UniqueFd trim_timer; // polled by the I/O thread
	uint64_t trim_timer_ns = UINT64_MAX; // what it is armed for
};

} // namespace xmem::owner
