// layout.hpp - the control segment: fixed-layout, pointer-free structs shared by the
// owner and every consumer of a pool. docs/design.md explains each field's writer.
#pragma once

#include <xmem/xmem.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <thread>
#include <type_traits>

namespace xmem::layout {

inline constexpr uint32_t kMagic = 0x4d454d58; // "XMEM"
// 4: per-consumer policies, the spill tier; 5: the spill tier of device pools (a spill
// buffer's spill_seq and spill_ready, which a consumer of a version 4 would not wait for);
// 6: frame tickets (a slot's ticket words, the header's ticket counters); 7: size classes
// (the class table, slot records reserved for classes added later, kSlotUnused); 8: pools
// of mixed memories (sync records in every pool, a class's own sync_mode); 9: growth on
// demand (the header's growth line: dynamic classes, whose records stay kSlotUnused
// until the owner commits a slot's memory); 10: growth of device memory (the header's
// device cap and bytes, a slot's memory_gen, on which a consumer maps its memory again);
// 11: meta indices (a slot's frame_gen and counted: get(meta_index) takes a hold of that
// frame only, and of a counted one only by its redemptions).
inline constexpr uint32_t kAbiVersion = 11;
// A meta index (xmem.h, XMEM_META_SLOT_BITS): the slot below kMetaSlotBits, the frame's
// generation, 1 .. kMetaGenMax, above (all ones is XMEM_NO_META_INDEX).
inline constexpr uint32_t kMetaSlotBits = XMEM_META_SLOT_BITS;
inline constexpr uint32_t kMetaGenMax = (1u << (32 - kMetaSlotBits)) - 2;
static_assert(XMEM_MAX_SLOTS <= (1u << kMetaSlotBits), "a meta index has room for every slot");
inline constexpr uint32_t meta_index_of(uint32_t slot, uint32_t gen)
{
	return gen == 0 || gen > kMetaGenMax ? XMEM_NO_META_INDEX : slot | gen << kMetaSlotBits;
}
inline constexpr uint32_t kHolderWords = 2; // 128 holder bits: owner + 127 consumers
inline constexpr uint32_t kOwnerBit = 0;
// A ring entry is (position << 32) | what: POSITION, the low 32 bits of the ring index
// the owner pushed it at, tells which use of the ring cell it is (a taker compares it
// with the head it read); WHAT is a slot index, kSpillEntry | a spill buffer's index,
// or one of the markers below (docs/design.md, "Queues").
inline constexpr uint32_t kEosEntry = 0xffffffffu; // end of stream
inline constexpr uint32_t kTakenEntry = 0xfffffffeu; // claimed by its taker (consumer or owner)
inline constexpr uint32_t kSkipEntry = 0xfffffffdu; // a frame dropped in place: skipped
inline constexpr uint32_t kSpillEntry = 0x80000000u; // | the spill buffer's index

inline constexpr uint64_t ring_entry(uint64_t position, uint32_t what)
{
	return (position << 32) | what;
}

static_assert(XMEM_MAX_CONSUMERS + 1 <= kHolderWords * 64);
static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(std::atomic<uint32_t>::is_always_lock_free);

// Slot life cycle. Only the owner moves a slot out of PUBLISHED/EXCLUSIVE, and only
// when no holder bit is set (see docs/design.md, "Reclaim").
enum SlotState : uint32_t {
	kSlotFree = 0,
	kSlotWriting = 1, // acquired by the owner, being filled
	kSlotPublished = 2, // readable; holders are in the holder bits
	kSlotExclusive = 3, // a sole holder took it for in-place writing (get_mut)
	kSlotReclaiming = 4, // the owner is checking that no holder is left
	// A record no class has taken yet (BufferPool::preallocate), or a slot of a dynamic
	// class whose memory is not committed (PoolConfig::memory_cap).
	kSlotUnused = 5,
};

enum PoolState : uint32_t { kPoolOpen = 0, kPoolClosed = 1 };

// How GPU work on device slots is ordered (docs/design.md, "Ordering on the GPU").
// SYSTEM pools have none; a CUDA pool records the owner's choice, and each consumer
// its own in its record (a consumer may fall back to CPU synchronization alone).
enum SyncMode : uint32_t {
	kSyncNone = 0,
	kSyncStreamMemOps = 1, // ready/done words waited on and written by GPU streams
	kSyncCpu = 2, // streams synchronized on the CPU before publish and release
};

// What a CUDA pool's device UUID names: a GPU, or a MIG device (a compute instance of a GPU
// in MIG mode), whose UUID nvidia-smi and CUDA_VISIBLE_DEVICES write "MIG-…", not "GPU-…".
enum DeviceKind : uint32_t {
	kDeviceGpu = 0,
	kDeviceMig = 1,
};

enum ConsumerState : uint32_t {
	kConsumerFree = 0,
	kConsumerActive = 1,
	kConsumerDead = 2, // hung up; the owner is releasing what it held
	// Device pools: hung up without saying its GPU work was over. Its GPU writes (done
	// words, in-place writes) may still land until its process has exited (its device
	// files closed), so its holder index and the slots it held for writing stay out of
	// use until then (docs/design.md, "Process death").
	kConsumerQuarantined = 3,
};

// Written by the owner at create; read-only afterwards. Consumers copy it out of
// the segment once and check the copy field by field before anything else in the
// segment is touched (another process could change it after a check).
struct ControlConstants {
	uint32_t magic;
	uint32_t abi_version;
	uint32_t header_size;
	uint32_t slot_record_size;
	uint32_t consumer_record_size; // fixed part plus ring, rounded to 64
	uint32_t slot_count;
	uint32_t max_consumers;
	uint32_t ring_capacity;
	uint64_t control_size;
	uint64_t slot_size;
	uint64_t slot_stride;
	uint64_t data_size;
	uint32_t storage_type; // xmem_storage of the data arena
	uint32_t device_id;
	uint32_t policy;
	uint32_t mode;
	uint32_t owner_pid;
	uint32_t owner_uid;
	uint64_t block_timeout_ns;
	uint64_t created_ns;
	char producer[XMEM_PRODUCER_MAX];
	// GPU ordering: a SyncRecord per slot at sync_offset (0 and none for system
	// memory), each sync_record_size bytes.
	uint32_t sync_mode; // SyncMode
	uint32_t sync_record_size;
	uint64_t sync_offset;
	// The CUDA device's UUID (cuDeviceGetUuid): what a consumer finds the device by,
	// since ordinals depend on each process's CUDA_VISIBLE_DEVICES. All zero for
	// system memory, and from producers older than the field (then device_id is used).
	uint8_t device_uuid[16];
	uint32_t device_kind; // DeviceKind of device_uuid; 0 from producers older than the field
	// The spill tier (0: none): host buffers for frames of fifo-spill consumers, in a
	// memfd of spill_size bytes, its SlotRecords first (spill.hpp).
	uint32_t spill_frames;
	// The owner's PID namespace (identity.hpp: the inode of /proc/self/ns/pid), which
	// owner_pid is numbered in; 0 when unknown or from producers older than the field.
	uint64_t owner_pid_ns;
	uint64_t spill_bytes; // the tier's cap on payload bytes (whole pages)
	uint64_t spill_size; // its memfd's size
	// Size classes: slot_count is the number of slot records, the first class (the
	// pool's creation one, whose size and stride slot_size and slot_stride are, in
	// data_size bytes) has first_class_slots of them, and later classes take the rest
	// (ClassRecord).
	uint32_t first_class_slots;
	uint32_t reserved32; // zero
	uint64_t reserved; // zero
};

static_assert(sizeof(ControlConstants) == 216);
static_assert(offsetof(ControlConstants, owner_pid_ns) == 176);
static_assert(offsetof(ControlConstants, first_class_slots) == 200);
static_assert(offsetof(ControlConstants, device_kind) == offsetof(ControlConstants, device_uuid) + 16);
static_assert(std::is_trivially_copyable_v<ControlConstants>);

struct alignas(64) ControlHeader : ControlConstants {
	// Shared, changing. Writer in brackets.
	alignas(64) std::atomic<uint32_t> state; // PoolState [owner]
	std::atomic<uint32_t> progress; // futex word: a slot freed or a queue moved [all]
	std::atomic<uint32_t> owner_waiting; // owner sleeps on progress [owner]
	// Size classes in the class table: stored (release) once a class's record, its
	// slots' records and its memory are ready; only ever grows. [owner]
	std::atomic<uint32_t> classes;
	std::atomic<uint64_t> published; // [owner]
	std::atomic<uint64_t> dropped; // [owner]
	std::atomic<uint64_t> reaped; // [owner]
	std::atomic<uint64_t> format_seq; // [owner]
	// Seqlock around format: odd while the owner rewrites it. [owner]
	std::atomic<uint64_t> format_lock;
	char format[XMEM_FORMAT_MAX];
	// The spill tier's use [owner]: bytes and buffers held now, the most bytes held
	// at once, frames spilled, spills refused because the tier was full, and the
	// memory its memfd holds (freed buffers' pages stay until the tier is idle).
	alignas(64) std::atomic<uint64_t> spill_bytes_held;
	std::atomic<uint64_t> spill_peak;
	std::atomic<uint64_t> spilled;
	std::atomic<uint64_t> spill_full;
	std::atomic<uint32_t> spill_frames_held;
	std::atomic<uint32_t> reserved_spill;
	std::atomic<uint64_t> spill_resident; // the tier's memfd's memory, as of the last change
	// Frame tickets [owner, except redeemed: the redeemer]: issued, redeemed, expired
	// with redemptions left unused, and live now (the owner still holds their slots).
	alignas(64) std::atomic<uint64_t> tickets_issued;
	std::atomic<uint64_t> tickets_redeemed;
	std::atomic<uint64_t> tickets_expired;
	std::atomic<uint32_t> tickets_live;
	std::atomic<uint32_t> reserved_tickets;
	// Growth on demand (docs/design.md, "Growth on demand"). [owner, at create] The cap on
	// the system memory of the pool's slots (0: no growth) and how long a free dynamic
	// slot keeps its memory. [owner] The classes acquire() made (bit c: class c, set
	// before `classes` counts it; a dynamic class's records are kSlotUnused until their
	// slot's memory is committed), its slots committed now and their bytes, the system
	// memory of every class's committed slots, slots committed and trimmed so far, and
	// acquires that found no room under the cap.
	alignas(64) uint64_t memory_cap;
	uint64_t trim_idle_ns;
	std::atomic<uint32_t> dynamic_classes;
	std::atomic<uint32_t> dynamic_slots;
	std::atomic<uint64_t> dynamic_bytes;
	std::atomic<uint64_t> system_bytes;
	std::atomic<uint64_t> grown;
	std::atomic<uint64_t> trimmed;
	std::atomic<uint64_t> growth_refused;
	// [owner, at create] The cap on each CUDA device's memory of the pool's slots (0: device
	// memory does not grow). [owner] The device memory of every class's committed slots,
	// all devices together.
	alignas(64) uint64_t device_memory_cap;
	std::atomic<uint64_t> device_bytes;
};

// A size class: COUNT slots of SLOT_SIZE bytes (SLOT_STRIDE apart in their own arena, of
// DATA_SIZE bytes) of one memory, the slot records [first_slot, first_slot + count).
// Written once by the owner before `classes` counts it; read-only afterwards. Class 0 is
// the pool's creation class (ControlConstants' slot_size, slot_stride, data_size).
// Consumers copy a record out and check it (segment.hpp) before using it; the memory's
// file descriptors come over the pool's socket, once per class (protocol.hpp).
inline constexpr uint32_t kMaxClasses = 32;
struct ClassRecord {
	uint32_t storage; // xmem_storage
	uint32_t device; // the owner's ordinal of device_uuid
	uint8_t device_uuid[16];
	uint32_t device_kind;
	uint32_t first_slot;
	uint32_t count;
	// SyncMode of its GPU ordering: kSyncNone for system memory; for CUDA memory the
	// owner's, as for its device's first class (class 0's: ControlConstants::sync_mode).
	uint32_t sync_mode;
	uint64_t slot_size;
	uint64_t slot_stride;
	uint64_t data_size;
};
static_assert(sizeof(ClassRecord) == 64);
static_assert(std::is_trivially_copyable_v<ClassRecord>);

// The shared copy of a frame's metadata lives in xmem_frame_meta, which is already
// fixed-layout and pointer-free.
static_assert(sizeof(xmem_frame_meta) == 384);
static_assert(offsetof(xmem_frame_meta, content_type) == 256);
static_assert(offsetof(xmem_frame_meta, capture_time) == 320); // was reserved[0]: zero from older peers
static_assert(offsetof(xmem_frame_meta, reserved) == 328);

struct alignas(64) SlotRecord {
	std::atomic<uint32_t> state; // SlotState [owner; EXCLUSIVE by the sole holder]
	uint32_t index; // [owner, at create]
	// Bit h set: holder h holds this slot. Bit 0 the owner, bit 1+i consumer i.
	// Set by the owner for queued frames and its own use, and by a consumer for
	// itself in get(); cleared by the holder on release or by the owner on reap.
	std::atomic<uint64_t> holders[kHolderWords];
	uint64_t offset; // into the data arena [owner, at create]
	uint64_t format_seq; // format of format[] below [owner, WRITING only]
	xmem_frame_meta meta; // [owner while WRITING; read-only once PUBLISHED]
	char format[XMEM_FORMAT_MAX];
	// The frame's side data (the elements put GstMetas there): side_data_size bytes of
	// side_data. Here, not in the slot, so device pools carry it in system memory.
	// [owner while WRITING; read-only once PUBLISHED] A consumer reads the size once
	// and refuses one over XMEM_SIDE_DATA_MAX: another process wrote it.
	uint32_t side_data_size;
	uint32_t reserved_side; // zero
	std::byte side_data[XMEM_SIDE_DATA_MAX];
	// Spill buffers of device pools (zero in slots): the frame was copied out of its slot
	// by the owner's spill stream, which writes spill_ready = spill_seq once the copy is
	// done. spill_seq counts the owner's spills, so a buffer's word only ever grows.
	uint64_t spill_seq; // [owner, at the spill, before PUBLISHED]
	std::atomic<uint64_t> spill_ready; // [the owner's spill stream, or its CPU]
	// A frame ticket on this slot's frame (docs/design.md, "Frame tickets"; zero in spill
	// buffers): its check word (0: no ticket), and the redemptions left. [owner: both
	// before PUBLISHED, left to 0 at expiry, then check to 0 before its hold goes;
	// a redeemer: left down by one, by CAS, while it holds the slot]
	std::atomic<uint64_t> ticket_check;
	std::atomic<uint32_t> ticket_left;
	// A dynamic class's device slot (docs/design.md, "Growth on demand"): which of the
	// allocations its memory has been, counted from 1 by the owner's commits, 0 for every
	// other slot. [owner, before the slot leaves UNUSED] A hint only: a consumer whose
	// mapping of the slot is of another generation asks the owner for the slot's memory,
	// and maps the generation the owner's answer names.
	std::atomic<uint32_t> memory_gen;
	// Which of the slot's frames this is (docs/design.md, "Meta indices"): its generation,
	// counted from 1 by the owner each time it hands the slot out to be written (1 ..
	// kMetaGenMax, then 1 again), in the high bits of the frame's meta_index. [owner, while
	// WRITING, before the writer's guard exists]
	std::atomic<uint32_t> frame_gen;
	// 1: the frame was published for a number of holders (set_ref_count, a ticket), whom
	// only its redemptions (ticket_left) admit; 0: published to queues. [owner, while
	// WRITING]
	std::atomic<uint32_t> counted;
};

struct alignas(64) ConsumerRecord {
	std::atomic<uint32_t> state; // ConsumerState [owner]
	// [owner, at attach, from SO_PEERCRED] The consumer's pid in the owner's PID
	// namespace: 0 when the owner cannot see the consumer's (a sibling container's).
	uint32_t pid;
	uint32_t uid;
	uint32_t queue_size; // <= ring_capacity [owner, at attach]
	uint64_t attach_ns;
	char client[32];
	uint32_t sync_mode; // SyncMode this consumer uses [consumer, at attach]
	// 1: at close, every GPU write this consumer queued on the pool had landed, so
	// nothing of its can land after its hang-up [consumer, before closing its socket;
	// owner: 0 at attach]. 0 (a kill, an older consumer) means "maybe".
	std::atomic<uint32_t> gpu_drained;
	// The ring: entries [head, tail). The consumer takes the head by CAS; the owner
	// may also take it (drop-oldest), so a queued frame has exactly one taker.
	alignas(64) std::atomic<uint64_t> head; // [consumer, owner]
	std::atomic<uint64_t> received; // [consumer]
	std::atomic<uint32_t> armed; // consumer sleeps; owner must signal [both]
	std::atomic<uint32_t> detached; // handle closed, guards live: queue nothing [consumer]
	// [owner, at attach, before the record is active; in this line's spare room, so the
	// ABI is unchanged: zero from owners older than the fields] The consumer as it
	// reported itself (its Hello): its pid in its own PID namespace, and that namespace
	// (0: unknown). Informative: what a process sharing that namespace calls it.
	uint32_t own_pid;
	uint32_t gid; // from SO_PEERCRED, as uid
	uint64_t pid_ns;
	// How the owner serves it [owner, at attach; the owner's own copy decides]: an
	// xmem_policy, the fallback of fifo and fifo-spill, fifo's wait.
	uint32_t policy;
	uint32_t fallback;
	uint64_t block_timeout_ns;
	// Not 0 while this consumer's process is in a guest's acquire or publish (it
	// produces too: guest.hpp), which the owner's I/O thread serves: a fifo publish does
	// not wait for room in its queue meanwhile, since it receives nothing until the
	// owner answers [consumer; owner: 0 at attach; in this line's spare room, so the ABI
	// is unchanged: zero from consumers older than the field].
	std::atomic<uint32_t> producing;
	uint32_t reserved_producing; // zero
	alignas(64) std::atomic<uint64_t> tail; // [owner]
	std::atomic<uint64_t> dropped; // [owner]
	std::atomic<uint64_t> queued_total; // [owner]
	std::atomic<uint64_t> spilled; // its frames moved into the spill tier [owner]
	// [owner, at attach, before the record is active; in this line's spare room, so the
	// ABI is unchanged: zero from owners older than the fields] The most slots it may
	// hold, queued or taken (OpenOptions::max_held, as the owner applies it), and the
	// frames of history it asked for.
	uint32_t max_held;
	uint32_t history;
	// Followed by ring_capacity std::atomic<uint64_t> entries: (seq32 << 32) | slot.
};

inline constexpr uint64_t round_up(uint64_t v, uint64_t a)
{
	return (v + a - 1) / a * a;
}

inline constexpr uint32_t consumer_record_size(uint32_t ring_capacity)
{
	return static_cast<uint32_t>(round_up(sizeof(ConsumerRecord) + uint64_t{ ring_capacity } * 8, 64));
}

inline constexpr uint64_t classes_offset()
{
	return round_up(sizeof(ControlHeader), 64);
}

inline constexpr uint64_t slots_offset()
{
	return classes_offset() + uint64_t{ kMaxClasses } * sizeof(ClassRecord);
}

inline constexpr uint64_t consumers_offset(uint32_t slot_count)
{
	return slots_offset() + uint64_t{ slot_count } * sizeof(SlotRecord);
}

inline constexpr uint64_t consumers_end(uint32_t slot_count, uint32_t max_consumers, uint32_t ring_capacity)
{
	return consumers_offset(slot_count) + uint64_t{ max_consumers } * consumer_record_size(ring_capacity);
}

// GPU ordering words of a slot (CUDA pools only), 64-bit sequence numbers compared
// with wrap-around. Word 0, `ready`: the last publish of this slot whose GPU writes
// are complete [owner's stream]. Words 1-2, `pending`: holder bit h set when holder h
// released the frame with a GPU write of its done word still queued [holder; cleared
// by the owner when it reuses the slot]. Words 3 + h, `done[h]`: the last frame of
// this slot holder h finished reading on the GPU [holder's stream; the owner for a
// dead holder].
inline constexpr uint32_t kSyncReadyWord = 0;
inline constexpr uint32_t kSyncPendingWord = 1;
inline constexpr uint32_t kSyncDoneWord = 1 + kHolderWords;

inline constexpr uint32_t sync_record_size(uint32_t max_consumers)
{
	return static_cast<uint32_t>(round_up((uint64_t{ kSyncDoneWord } + max_consumers + 1) * 8, 64));
}

// Total control size. A SyncRecord per slot record follows the consumer records in
// every pool: a class of CUDA memory may come at any time (those of system memory
// are never used).
inline constexpr uint64_t control_size(uint32_t slot_count, uint32_t max_consumers, uint32_t ring_capacity)
{
	uint64_t end = round_up(consumers_end(slot_count, max_consumers, ring_capacity), 64);
	end += uint64_t{ slot_count } * sync_record_size(max_consumers);
	return round_up(end, 4096);
}

inline constexpr uint64_t sync_offset(uint32_t slot_count, uint32_t max_consumers, uint32_t ring_capacity)
{
	return round_up(consumers_end(slot_count, max_consumers, ring_capacity), 64);
}

// The spill tier's memfd: spill_frames SlotRecords (each a host buffer's record, as a
// slot's), then the payload area of spill_bytes, page-aligned.
inline constexpr uint32_t kMaxSpillFrames = 4096;
inline constexpr uint64_t spill_payload_offset(uint32_t spill_frames)
{
	return round_up(uint64_t{ spill_frames } * sizeof(SlotRecord), 4096);
}
inline constexpr uint64_t spill_size(uint32_t spill_frames, uint64_t spill_bytes)
{
	return spill_frames ? spill_payload_offset(spill_frames) + round_up(spill_bytes, 4096) : 0;
}

inline std::atomic<uint64_t> *ring_of(ConsumerRecord *c)
{
	return reinterpret_cast<std::atomic<uint64_t> *>(reinterpret_cast<std::byte *>(c) + sizeof(ConsumerRecord));
}

inline uint64_t holder_mask(uint32_t bit)
{
	return uint64_t{ 1 } << (bit % 64);
}

// The holder-bit and free-slot rules, in one place for the owner, consumers and the
// snapshot xmem-inspect reads. seq_cst: these loads take part in the Dekker-style
// handshakes between get() and reclaim (docs/design.md, "Reclaim").
inline uint64_t holders_of(const SlotRecord &slot)
{
	uint64_t any = 0;
	for (uint32_t w = 0; w < kHolderWords; w++)
		any |= slot.holders[w].load(std::memory_order_seq_cst);
	return any;
}

// Whether holder BIT is the only holder of SLOT.
inline bool sole_holder(const SlotRecord &slot, uint32_t bit)
{
	for (uint32_t w = 0; w < kHolderWords; w++) {
		uint64_t want = w == bit / 64 ? holder_mask(bit) : 0;
		if (slot.holders[w].load(std::memory_order_seq_cst) != want)
			return false;
	}
	return true;
}

// A slot in STATE with no holder left can be taken by the owner's next acquire().
inline bool slot_is_free(uint32_t state, uint64_t holders)
{
	return state == kSlotFree || ((state == kSlotPublished || state == kSlotExclusive) && holders == 0);
}

inline bool slot_is_free(const SlotRecord &slot)
{
	return slot_is_free(slot.state.load(std::memory_order_acquire), holders_of(slot));
}

// SLOT's state as a process that just set its holder bit sees it once the owner's
// reclaim is settled: RECLAIMING only while try_reclaim looks at the holders, after
// which it takes the slot (it missed the bit) or backs off (it saw it). The other half
// of the Dekker-style handshake with try_reclaim (get(), the spill's hold); a bounded
// spin, as a dead owner never settles it.
inline uint32_t settled_state(const SlotRecord &slot)
{
	uint32_t s;
	for (int spin = 0;; spin++) {
		s = slot.state.load(std::memory_order_seq_cst);
		if (s != kSlotReclaiming || spin > 1000)
			return s;
		std::this_thread::yield();
	}
}

// The layout is an ABI between processes built from different versions: pin every
// field another process reads or writes atomically. (ControlHeader derives from
// ControlConstants, so it is not standard-layout; GCC and Clang lay it out as one
// struct all the same.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Winvalid-offsetof"
static_assert(sizeof(ControlHeader) % 64 == 0);
static_assert(offsetof(ControlHeader, state) == 256);
static_assert(offsetof(ControlHeader, progress) == 260);
static_assert(offsetof(ControlHeader, owner_waiting) == 264);
static_assert(offsetof(ControlHeader, classes) == 268);
static_assert(offsetof(ControlHeader, published) == 272);
static_assert(offsetof(ControlHeader, dropped) == 280);
static_assert(offsetof(ControlHeader, reaped) == 288);
static_assert(offsetof(ControlHeader, format_seq) == 296);
static_assert(offsetof(ControlHeader, format_lock) == 304);
static_assert(offsetof(ControlHeader, memory_cap) == 2496);
static_assert(offsetof(ControlHeader, growth_refused) == 2552);
static_assert(offsetof(ControlHeader, device_memory_cap) == 2560);
static_assert(offsetof(ControlHeader, device_bytes) == 2568);
static_assert(sizeof(ControlHeader) == 2624);
static_assert(offsetof(ControlHeader, format) == 312);
static_assert(offsetof(ControlHeader, spill_bytes_held) % 64 == 0);
static_assert(offsetof(ControlHeader, tickets_issued) % 64 == 0);
#pragma GCC diagnostic pop
static_assert(sizeof(SlotRecord) % 64 == 0);
static_assert(offsetof(SlotRecord, state) == 0);
static_assert(offsetof(SlotRecord, holders) == 8);
static_assert(offsetof(SlotRecord, meta) == 40);
static_assert(offsetof(SlotRecord, format) == 424);
static_assert(offsetof(SlotRecord, side_data_size) == 2472);
static_assert(offsetof(SlotRecord, side_data) == 2480);
static_assert(offsetof(SlotRecord, spill_seq) == 6576);
static_assert(offsetof(SlotRecord, spill_ready) == 6584);
static_assert(offsetof(SlotRecord, ticket_check) == 6592);
static_assert(offsetof(SlotRecord, ticket_left) == 6600);
static_assert(offsetof(SlotRecord, memory_gen) == 6604);
static_assert(offsetof(SlotRecord, frame_gen) == 6608);
static_assert(sizeof(SlotRecord) == 6656);
static_assert(sizeof(ConsumerRecord) % 64 == 0);
static_assert(offsetof(ConsumerRecord, state) == 0);
static_assert(offsetof(ConsumerRecord, sync_mode) == 56);
static_assert(offsetof(ConsumerRecord, gpu_drained) == 60);
static_assert(offsetof(ConsumerRecord, head) == 64);
static_assert(offsetof(ConsumerRecord, received) == 72);
static_assert(offsetof(ConsumerRecord, armed) == 80);
static_assert(offsetof(ConsumerRecord, detached) == 84);
static_assert(offsetof(ConsumerRecord, own_pid) == 88);
static_assert(offsetof(ConsumerRecord, pid_ns) == 96);
static_assert(offsetof(ConsumerRecord, tail) == 128);
static_assert(offsetof(ConsumerRecord, dropped) == 136);
static_assert(offsetof(ConsumerRecord, queued_total) == 144);
static_assert(offsetof(ConsumerRecord, policy) == 104);
static_assert(offsetof(ConsumerRecord, block_timeout_ns) == 112);
static_assert(offsetof(ConsumerRecord, spilled) == 152);
static_assert(offsetof(ConsumerRecord, producing) == 120);
static_assert(offsetof(ConsumerRecord, max_held) == 160);
static_assert(offsetof(ConsumerRecord, history) == 164);
static_assert(sizeof(ConsumerRecord) == 192);

} // namespace xmem::layout
