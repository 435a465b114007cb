// layout.hpp - the control segment: fixed-layout, pointer-free structs shared by the
// owner and every consumer of a pool. docs/design.md explains each field's writer.
#pragma once

#include <xmem/xmem.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace xmem::layout {

inline constexpr uint32_t kMagic = 0x4d454d58; // "XMEM"
inline constexpr uint32_t kAbiVersion = 1;
inline constexpr uint32_t kHolderWords = 2; // 128 holder bits: owner + 127 consumers
inline constexpr uint32_t kOwnerBit = 0;
inline constexpr uint32_t kEosEntry = 0xffffffffu; // ring entry meaning end of stream

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
};

enum PoolState : uint32_t { kPoolOpen = 0, kPoolClosed = 1 };

enum ConsumerState : uint32_t {
	kConsumerFree = 0,
	kConsumerActive = 1,
	kConsumerDead = 2, // hung up; the owner is releasing what it held
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
};

static_assert(sizeof(ControlConstants) == 136);
static_assert(std::is_trivially_copyable_v<ControlConstants>);

struct alignas(64) ControlHeader : ControlConstants {
	// Shared, changing. Writer in brackets.
	alignas(64) std::atomic<uint32_t> state; // PoolState [owner]
	std::atomic<uint32_t> progress; // futex word: a slot freed or a queue moved [all]
	std::atomic<uint32_t> owner_waiting; // owner sleeps on progress [owner]
	std::atomic<uint32_t> reserved0;
	std::atomic<uint64_t> published; // [owner]
	std::atomic<uint64_t> dropped; // [owner]
	std::atomic<uint64_t> reaped; // [owner]
	std::atomic<uint64_t> format_seq; // [owner]
	// Seqlock around format: odd while the owner rewrites it. [owner]
	std::atomic<uint64_t> format_lock;
	char format[XMEM_FORMAT_MAX];
};

// The shared copy of a frame's metadata lives in xmem_frame_meta, which is already
// fixed-layout and pointer-free.
static_assert(sizeof(xmem_frame_meta) == 320);
static_assert(offsetof(xmem_frame_meta, content_type) == 256);

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
};

struct alignas(64) ConsumerRecord {
	std::atomic<uint32_t> state; // ConsumerState [owner]
	uint32_t pid; // [owner, at attach, from SO_PEERCRED]
	uint32_t uid;
	uint32_t queue_size; // <= ring_capacity [owner, at attach]
	uint64_t attach_ns;
	char client[32];
	// The ring: entries [head, tail). The consumer takes the head by CAS; the owner
	// may also take it (drop-oldest), so a queued frame has exactly one taker.
	alignas(64) std::atomic<uint64_t> head; // [consumer, owner]
	std::atomic<uint64_t> received; // [consumer]
	std::atomic<uint32_t> armed; // consumer sleeps; owner must signal [both]
	std::atomic<uint32_t> detached; // handle closed, guards live: queue nothing [consumer]
	alignas(64) std::atomic<uint64_t> tail; // [owner]
	std::atomic<uint64_t> dropped; // [owner]
	std::atomic<uint64_t> queued_total; // [owner]
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

inline constexpr uint64_t slots_offset()
{
	return round_up(sizeof(ControlHeader), 64);
}

inline constexpr uint64_t consumers_offset(uint32_t slot_count)
{
	return slots_offset() + uint64_t{ slot_count } * sizeof(SlotRecord);
}

inline constexpr uint64_t control_size(uint32_t slot_count, uint32_t max_consumers, uint32_t ring_capacity)
{
	return round_up(consumers_offset(slot_count) + uint64_t{ max_consumers } * consumer_record_size(ring_capacity),
			4096);
}

inline std::atomic<uint64_t> *ring_of(ConsumerRecord *c)
{
	return reinterpret_cast<std::atomic<uint64_t> *>(reinterpret_cast<std::byte *>(c) + sizeof(ConsumerRecord));
}

inline uint64_t holder_mask(uint32_t bit)
{
	return uint64_t{ 1 } << (bit % 64);
}

static_assert(sizeof(ControlHeader) % 64 == 0);
static_assert(sizeof(SlotRecord) % 64 == 0);
static_assert(sizeof(ConsumerRecord) % 64 == 0);
static_assert(offsetof(SlotRecord, meta) == 40);

} // namespace xmem::layout
