// snapshot.hpp - a point-in-time copy of what a pool's control segment says: its
// constants, every slot and who holds it, the consumers' records and the counters.
#pragma once

#include <xmem/xmem.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace xmem {

// The states the segment records. A snapshot keeps the value another process wrote,
// which may be none of these: state_name() calls that "invalid".
// unused: a slot record no size class has taken yet (not shown in a snapshot).
enum class SlotState : uint32_t { free = 0, writing = 1, published = 2, exclusive = 3, reclaiming = 4, unused = 5 };
// quarantined: a device pool's consumer that hung up with GPU writes possibly still
// queued; its record and the slots it held for writing wait for its process to exit.
enum class ConsumerState : uint32_t { free = 0, active = 1, dead = 2, quarantined = 3 };
enum class PoolState : uint32_t { open = 0, closed = 1 };

// The constants the owner wrote at create, as the segment holds them now.
struct HeaderSnapshot {
	uint32_t magic;
	bool magic_valid; // magic is xmem's: this is one of its control segments
	uint32_t abi_version;
	uint32_t header_size;
	uint32_t slot_record_size;
	uint32_t consumer_record_size;
	uint32_t slot_count;
	uint32_t max_consumers;
	uint32_t ring_capacity;
	uint64_t control_size;
	uint64_t slot_size;
	uint64_t slot_stride;
	uint64_t data_size;
	uint32_t storage_type; // an xmem_storage value
	uint32_t device_id; // the owner's ordinal
	std::string device_uuid; // "GPU-…" of a CUDA pool's device; "" for system memory
	uint32_t sync_mode; // how GPU work on slots is ordered; 0 for system memory
	uint32_t sync_record_size;
	uint64_t sync_offset;
	uint32_t policy; // an xmem_policy value
	uint32_t mode;
	uint32_t owner_pid; // as the owner numbers itself, in its PID namespace
	uint32_t owner_uid;
	uint64_t owner_pid_ns; // that namespace (see pid_namespace_here()); 0 when unknown
	uint64_t block_timeout_ns;
	uint64_t created_ns;
	std::string producer;
	uint32_t spill_frames; // the spill tier's buffers; 0: none
	uint64_t spill_bytes; // its cap on payload bytes
};

// One set holder bit of a slot: bit 0 is the owner, bit 1 + i consumer record i.
struct HolderSnapshot {
	uint32_t bit;
	// The owner's or that consumer's pid as the process taking the snapshot numbers it;
	// none for a process in a PID namespace it cannot see, or a bit past the consumer
	// records the mapping holds.
	std::optional<uint32_t> pid;

	bool is_owner() const { return bit == 0; }
	uint32_t consumer_index() const { return bit - 1; } // only when !is_owner()
};

struct SlotSnapshot {
	uint32_t index;
	uint32_t size_class; // the index of its class in PoolSnapshot::classes
	SlotState state;
	std::vector<HolderSnapshot> holders; // by bit, lowest first
	uint64_t seq; // sequence number of the frame last written to it
	// Bytes of side data its record says the frame carries, as written: a value over
	// XMEM_SIDE_DATA_MAX is what a consumer refuses.
	uint32_t side_data_size;
	// Redemptions left of a live frame ticket on it (0: none, or used up and not yet
	// ended by the owner).
	uint32_t ticket_left;
	// Whether the owner's next acquire() could take it: free, or published or
	// exclusive with no holder left (the rule BufferPool::stats() counts by).
	bool free;
};

// One frame queued for a consumer, oldest first.
struct QueueEntrySnapshot {
	bool end_of_stream; // the entry marks end of stream, not a frame
	bool spilled; // the frame waits in spill buffer `slot` of the spill tier, not a slot
	bool taken; // being taken off the queue (or dropped in place): not a frame any more
	uint32_t slot;
	uint64_t seq; // the frame's sequence number, as its record says now (0: unknown)
};

// A consumer record that is not free. An active one is attached: its owner holds its
// connection and reaps it when the connection ends, whatever PID namespace it is in
// (its pid is not asked: a pid seen from another namespace can name another process).
struct ConsumerSnapshot {
	uint32_t index;
	ConsumerState state;
	uint32_t pid; // as the owner saw it (SO_PEERCRED): 0 from a PID namespace it cannot see
	uint32_t uid; // as the owner saw them: 65534 when its user namespace does not map them
	uint32_t gid;
	// As the consumer reported itself: its pid in its own PID namespace, and that
	// namespace; 0 when unknown (from consumers older than the fields).
	uint32_t own_pid;
	uint64_t pid_ns;
	// Its pid as the process taking the snapshot numbers it; none when that process
	// cannot see the consumer's PID namespace (then own_pid is what the consumer's
	// namespace calls it).
	std::optional<uint32_t> pid_here;
	std::string client;
	uint64_t head; // ring entries [head, tail) are queued
	uint64_t tail;
	std::optional<uint64_t> queued; // tail - head; none when they make no sense
	std::vector<QueueEntrySnapshot> queue; // empty when queued is none
	uint64_t received;
	uint64_t dropped;
	uint64_t queued_total;
	uint32_t queue_size;
	uint32_t sync_mode; // the GPU ordering this consumer uses (see gpu_ordering_name)
	uint32_t policy; // the xmem_policy it is served with (policy_name())
	uint32_t fallback; // of fifo and fifo-spill
	uint64_t block_timeout_ns; // of fifo
	uint64_t spilled; // its frames moved into the spill tier
	// The slots whose holder bit it has: frames queued for it, and those it took and has
	// not let go of; its cap on them (OpenOptions::max_held as the owner applies it, 0:
	// none, or an owner older than the cap), and the history it asked for.
	uint32_t held;
	uint32_t max_held;
	uint32_t history;
};

// "none", "stream-memops" or "cpu" (the CPU-synchronizing fallback) for a sync mode.
inline const char *gpu_ordering_name(uint32_t sync_mode)
{
	switch (sync_mode) {
	case 0:
		return "none";
	case 1:
		return "stream-memops";
	case 2:
		return "cpu";
	}
	return "invalid";
}

struct FormatSnapshot {
	std::string text;
	uint64_t seq;
};

struct PoolSnapshot {
	std::string name;
	std::string path;
	HeaderSnapshot header;
	// The owner's pid as the process taking the snapshot numbers it; none when the
	// owner is in a PID namespace that process cannot see.
	std::optional<uint32_t> owner_pid_here;
	uint64_t pid_ns_here; // that process's PID namespace (pid_namespace_here())
	PoolState state;
	std::optional<FormatSnapshot> format; // none while the owner is stuck rewriting it
	uint64_t published;
	uint64_t dropped;
	uint64_t reaped;
	// The size classes, as the class table says (BufferPool::classes()).
	std::vector<SizeClass> classes;
	std::vector<SlotSnapshot> slots; // the slots of every class the mapping holds
	uint32_t slots_free = 0;
	std::vector<ConsumerSnapshot> consumers; // the consumer records that are not free
	uint32_t consumers_attached = 0; // those that are active
	// The spill tier's use (zero without one): see xmem_spill_stats.
	SpillStats spill{};
	// Frame tickets: see xmem_ticket_stats.
	TicketStats tickets{};
	// Growth on demand (zero for a pool that does not grow): see xmem_growth_stats.
	GrowthStats growth{};
	// What did not add up, in words: the snapshot leaves out what it cannot read
	// safely instead of failing.
	std::vector<std::string> warnings;
};

// Reads POOL's control segment (BufferPool::control_segment()) into a snapshot; any
// handle works: owner, consumer or inspector. Other processes write the segment while
// it is read, so fields read at slightly different moments may disagree (a holder bit
// set on a slot that is already free, a queue one frame off), and the constants are
// shown as the segment holds them now, not as validated at attach. Whatever the owner
// wrote, every index is bounded by the mapping and by the slot count validated at
// attach; what does not fit is left out and named in warnings.
// Costs: no lock, but for the format's seqlock: while the owner is rewriting the format
// the read is retried, yielding the CPU, for up to 200 ms. Syscalls: one stat of
// /proc/self/ns/pid, and for each consumer in a PID namespace other than this process's
// and the owner's, a walk of /proc looking for it (found when its namespace is a
// descendant of this one: the host sees its containers' processes).
// Errors: Errc::bad_segment when the mapping is too small to hold the header.
Result<PoolSnapshot> snapshot(const BufferPool &pool);

// This process's PID namespace: the inode number of /proc/self/ns/pid, 0 when /proc
// cannot tell. Processes with equal values number processes alike.
uint64_t pid_namespace_here();

inline const char *state_name(SlotState state)
{
	switch (state) {
	case SlotState::free:
		return "free";
	case SlotState::writing:
		return "writing";
	case SlotState::published:
		return "published";
	case SlotState::exclusive:
		return "exclusive";
	case SlotState::reclaiming:
		return "reclaiming";
	case SlotState::unused:
		return "unused";
	}
	return "invalid";
}

inline const char *state_name(ConsumerState state)
{
	switch (state) {
	case ConsumerState::free:
		return "free";
	case ConsumerState::active:
		return "active";
	case ConsumerState::dead:
		return "dead";
	case ConsumerState::quarantined:
		return "quarantined";
	}
	return "invalid";
}

inline const char *state_name(PoolState state)
{
	switch (state) {
	case PoolState::open:
		return "open";
	case PoolState::closed:
		return "closed";
	}
	return "invalid";
}

} // namespace xmem
