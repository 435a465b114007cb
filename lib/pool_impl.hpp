// pool_impl.hpp - the state behind a BufferPool handle that every role shares: the
// control segment, the arena, this process's references and the current format.
#pragma once

#include "arena.hpp"
#include "device_sync.hpp"
#include "holder.hpp"
#include "layout.hpp"
#include "segment.hpp"
#include "spill.hpp"
#include "system.hpp"

#include <xmem/xmem.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace xmem {

// A shared_ptr that threads read and replace concurrently. Not
// std::atomic<std::shared_ptr>: libstdc++ 12's load() drops its internal lock with a
// relaxed store, so a store() in another thread races with the pointer load() just
// read (ThreadSanitizer reports it, test-threads). The lock is a leaf: nothing is
// called under it, and the replaced value is destroyed after it is dropped.
template<typename T>
class SharedPtrCell
{
public:
	std::shared_ptr<T> load() const
	{
		std::lock_guard lock(lock_);
		return value_;
	}

	void store(std::shared_ptr<T> value)
	{
		std::lock_guard lock(lock_);
		value_.swap(value);
	}

private:
	mutable std::mutex lock_;
	std::shared_ptr<T> value_;
};

class Publisher;
class Subscriber;
class GuestProducer;

// The roles' own state lives in Publisher (owner), Subscriber (consumer) and
// GuestProducer (a consumer that also produces).
struct PoolImpl : std::enable_shared_from_this<PoolImpl> {
	PoolImpl();
	~PoolImpl();

	Role role = Role::consumer;
	std::string name;
	std::string path;

	ControlSegment seg;
	std::unique_ptr<Arena> arena; // the first size class's; none for an inspector
	// The memory of the later size classes (BufferPool::preallocate), as this process
	// made or imported them; under classes_lock. Never removed while the pool lives.
	std::vector<std::unique_ptr<Arena>> class_arenas;
	// GPU ordering of the pool's device slots: one DeviceSync per CUDA device of its
	// classes, as this process made them (class 0's first in a device pool); none for
	// system memory. [0, sync_count) are set (under classes_lock) before sync_count
	// counts them (release) and stay while the pool lives, so readers take no lock.
	// Destroyed before the arenas: each synchronizes this process's streams first.
	std::array<std::unique_ptr<DeviceSync>, layout::kMaxClasses> syncs;
	std::atomic<uint32_t> sync_count{ 0 };
	// Makes and adds (classes_lock held) the DeviceSync of the device MEMORY is on:
	// stream memory operations when MEM_OPS allows them and the control segment can be
	// page-locked, else CPU synchronization, which a notice on stderr explains. Every
	// role's each device's first class comes through here.
	Result<DeviceSync *> add_sync(const Arena &memory, bool mem_ops);
	// Calls F on every DeviceSync of this process's.
	template<typename F>
	void each_sync(F f) const
	{
		uint32_t n = sync_count.load(std::memory_order_acquire);
		for (uint32_t i = 0; i < n; i++)
			f(*syncs[i]);
	}
	bool has_device_slots() const { return sync_count.load(std::memory_order_acquire) != 0; }
	// The GPU ordering of class 0's device slots (the spill tier's, a device pool's
	// mode); none when class 0 is system memory.
	DeviceSync *first_sync() const
	{
		return classes_known.load(std::memory_order_acquire) ? classes[0].sync : nullptr;
	}
	// The GPU ordering of reference INDEX: its class's device's; none for a system slot,
	// a spill buffer or a slot of no class known here.
	DeviceSync *sync_of(uint32_t index) const
	{
		if (is_spill(index))
			return nullptr;
		auto c = class_of(index);
		return c ? classes[*c].sync : nullptr;
	}
	// sync_of(INDEX) for a frame this process holds and is about to order: a consumer
	// imports the slot's class first if the owner added it since (one class lookup when
	// it is known). A failed import is reported by checked_guard(), which refuses it.
	DeviceSync *ordering_of(uint32_t index);
	// The spill tier (spill.hpp), when the pool has one: the owner's, and a consumer's
	// mapping of it. Its buffers follow the slots in the index space of references.
	std::unique_ptr<SpillTier> spill;
	// The owner of a device pool with a spill tier: the copies out of the slots (after
	// `spill`, `sync`: destroyed first, once its copies into the tier have landed).
	std::unique_ptr<DeviceSpill> device_spill;
	// A consumer of a device pool's tier that copies spilled frames back to the device:
	// its mapping of the tier page-locked, so those copies are queued, not staged by the
	// CPU (none where the driver would not pin it). Unlocked before the tier is unmapped.
	std::shared_ptr<void> spill_pinned;

	// Holder bit of this process: 0 for the owner, 1 + index for a consumer.
	uint32_t holder_bit = layout::kOwnerBit;
	// Consumers and inspectors: the owner's pid as this process numbers it (SO_PEERCRED
	// at attach); 0 when the owner is in a PID namespace this process cannot see.
	uint32_t owner_pid_here = 0;

	// This process's references per slot. The 0 <-> 1 transitions set and clear the
	// holder bit, so they are serialised here. Lock order: the Subscriber's
	// receive_lock or the Publisher's publish_lock, then refs_lock, then format_lock;
	// never held while waiting (a futex wake of the owner may happen under it).
	mutable std::mutex refs_lock;
	std::vector<uint32_t> local_refs;
	// Guards of the frames this process acquired and has not published, by slot, under
	// refs_lock: what set_ref_count(meta_index, n) publishes. A guard keeps its entry
	// as it moves (BufferGuard::acquired_) and clears it as it lets go of the slot.
	// Sized with local_refs.
	std::vector<BufferGuard *> writers;
	void track_writer(uint32_t index, BufferGuard *guard);
	void untrack_writer(uint32_t index, const BufferGuard *guard);
	// The guard writing the frame INDEX of generation GEN names in this process; none.
	BufferGuard *writer_of(uint32_t index, uint32_t gen);
	// Slots this process took EXCLUSIVE (take_exclusive), under refs_lock: only it
	// moves them back to PUBLISHED. Sized with local_refs.
	std::vector<uint8_t> exclusive;
	// Slots the owner leased to this process (a guest, GuestProducer), under refs_lock:
	// being written here, held by the owner's bit, not this process's. Sized with
	// local_refs in a consumer; empty in the owner.
	std::vector<uint8_t> leased;
	bool leased_here(uint32_t index) const
	{
		std::lock_guard lock(refs_lock);
		return index < leased.size() && leased[index];
	}

	// Format: the owner's current one, or the newest a consumer has seen. `format`
	// is read without format_lock (BufferPool::format(), the owner's publish); it is
	// written under format_lock (consumers) or publish_lock (the owner), which also
	// guard format_seq.
	mutable std::mutex format_lock;
	uint64_t format_seq = 0;
	SharedPtrCell<const std::string> format;

	// Size classes as this process uses them (layout::ClassRecord): [0, classes_known)
	// are filled in (under classes_lock) before classes_known counts them (release),
	// and never change afterwards, so a reader needs no lock. A consumer imports a
	// class the owner added since when it first meets one of its slots.
	struct SlotClass {
		uint32_t first_slot = 0;
		uint32_t count = 0;
		uint64_t slot_size = 0;
		uint64_t slot_stride = 0;
		const Arena *arena = nullptr;
		DeviceSync *sync = nullptr; // its device's GPU ordering; none for system memory
	};
	std::array<SlotClass, layout::kMaxClasses> classes{};
	std::atomic<uint32_t> classes_known{ 0 };
	// Serialises adding (owner) and importing (consumer) classes. A leaf with respect
	// to refs_lock and format_lock: neither is taken under it, nor it under them.
	std::mutex classes_lock;
	// The index of slot INDEX's class; none for a slot of no class known here (yet).
	std::optional<uint32_t> class_of(uint32_t index) const
	{
		uint32_t n = classes_known.load(std::memory_order_acquire);
		for (uint32_t c = 0; c < n; c++)
			if (index - classes[c].first_slot < classes[c].count)
				return c;
		return std::nullopt;
	}
	// The largest slot of the classes known here.
	uint64_t largest_slot() const
	{
		uint64_t most = 0;
		uint32_t n = classes_known.load(std::memory_order_acquire);
		for (uint32_t c = 0; c < n; c++)
			most = std::max(most, classes[c].slot_size);
		return most;
	}
	// Where the slots of the classes the owner has added so far end; whether INDEX
	// names one of them or a spill buffer (a reference index in range).
	uint32_t slots_end() const;
	bool in_range(uint32_t index) const;
	// Installs class C, as this process made or imported it, ordered by SYNC for device
	// memory (classes_lock held).
	void add_class(uint32_t c, const layout::ClassRecord &record, const Arena *memory, DeviceSync *sync)
	{
		classes[c] = SlotClass{ record.first_slot,  record.count, record.slot_size,
					record.slot_stride, memory,	  sync };
		classes_known.store(c + 1, std::memory_order_release);
	}

	// The roles as this process's references reach them (holder.hpp), never through
	// their headers: the consumer's link to the owner, set with `subscriber`; a guest's
	// leases, set with `guest`. They live as long as those do.
	OwnerLink *owner_link = nullptr;
	GuestLeases *guest_leases = nullptr;

	// The role's own state, one of them. Declared last: destroyed first, so the
	// owner's I/O thread is joined before the segment and arena go.
	std::unique_ptr<Publisher> publisher;
	std::unique_ptr<Subscriber> subscriber;
	// A consumer's producing side (guest.hpp); none in the owner and an inspector.
	std::unique_ptr<GuestProducer> guest;

	std::string where() const { return "pool '" + name + "'"; }

	// The index space of references: slots, then spill buffers.
	uint32_t index_count() const { return seg.slot_count + (spill ? spill->frames() : 0); }
	bool is_spill(uint32_t index) const { return index >= seg.slot_count; }
	// The reference index a ring entry's WHAT names: its slot, or its spill buffer after
	// the slots; none for a marker (EOS, taken, skipped) or an index out of range.
	std::optional<uint32_t> entry_index(uint32_t what) const
	{
		if (what == layout::kEosEntry || what == layout::kTakenEntry || what == layout::kSkipEntry)
			return std::nullopt;
		if (what & layout::kSpillEntry) {
			uint32_t r = what & ~layout::kSpillEntry;
			if (!spill || r >= spill->frames())
				return std::nullopt;
			return seg.slot_count + r;
		}
		return what < seg.slot_count ? std::optional<uint32_t>(what) : std::nullopt;
	}
	layout::SlotRecord &record(uint32_t index) const
	{
		return is_spill(index) ? spill->record(index - seg.slot_count) : seg.slots[index];
	}

	// References (all roles).
	// What a meta index names (BufferGuard::meta_index()): a slot and a frame
	// generation; generation 0 for a plain slot index. Errc::out_of_range for a value that
	// names no slot of this pool.
	struct MetaIndex {
		uint32_t slot = 0;
		uint32_t gen = 0;
	};
	Result<MetaIndex> decode_meta(uint32_t meta_index) const;
	// The slot META_INDEX names, for a call on a reference this process holds: a plain
	// index, or a meta index of the frame the slot holds (Errc::not_held otherwise).
	Result<uint32_t> held_slot(uint32_t meta_index, std::string_view call) const;
	// SEQ: only while the slot holds that frame (Errc::not_held once it changed). A
	// frame published for a number of holders is refused: its meta index takes a hold.
	Result<BufferGuard> get(uint32_t index, bool writable, std::optional<uint64_t> seq = std::nullopt);
	// The frame META_INDEX names (BufferPool::get(meta_index)): a plain slot index as
	// get(); a meta index only while the slot holds that frame, by one of its holds
	// when it was published for a number of them (ticket.cpp).
	Result<BufferGuard> get_named(uint32_t meta_index, bool writable);
	// get()'s last steps on a slot this process now holds: a device frame's writes
	// waited for, its layout checked, and for WRITABLE the copy-on-write.
	Result<BufferGuard> finish_get(uint32_t index, bool writable);
	// One more reference of this process's on published slot INDEX (in range): its holder
	// bit set first when it held none, against the owner's reclaim (get's first step).
	Result<void> hold_published(uint32_t index);
	// The frame TICKET names, with a reference of this process's own: one of its
	// redemptions (BufferPool::get(const Ticket &)).
	Result<BufferGuard> redeem(const Ticket &ticket);
	Result<void> add_ref(uint32_t index);
	// Drops one reference. For device slots the last one marks this holder done
	// after STREAM's work (nullptr: once the CPU waited for it, ALSO included); GPU_READS
	// false when the holder never read it on the GPU (the owner handing it over).
	Result<void> release(uint32_t index, void *stream = nullptr, bool gpu_reads = true, void *also = nullptr);
	Result<void> set_local_refs(uint32_t index, uint32_t count);
	BufferGuard make_guard(uint32_t index, bool writable);
	// A guard on a slot this process holds, for a reader: its metadata copied and its
	// layout checked (frame_check.hpp). A layout that does not fit is Errc::bad_frame,
	// the reference given back and counted in frames_refused.
	Result<BufferGuard> checked_guard(uint32_t index, bool writable);
	Result<BufferGuard> private_copy(const BufferGuard &frame, Memory to, void *stream = nullptr);
	// A writable slot of MEMORY (none: the first class's) of SIZE bytes or more, for the
	// role this process plays: the owner's, or one the owner leases a guest
	// (BufferPool::acquire). buffer_pool.cpp, the facade, which reaches the roles.
	Result<BufferGuard> acquire_slot(uint64_t size, std::optional<Memory> memory, int64_t timeout_ns, void *stream);
	// A copy of FRAME in a slot of MEMORY acquired so (BufferPool::copy).
	Result<BufferGuard> copy_into(const BufferGuard &frame, Memory memory, int64_t timeout_ns, void *stream);
	// Where FRAME's bytes are, for copy_bytes().
	static Place place_of(const BufferGuard &frame);
	// Before a copy of FRAME's device memory by CUDA device DEVICE: lets DEVICE read the
	// frame's slot in place where its device is a peer (the class's arena grants it once),
	// so the copy is one device-to-device copy; elsewhere (no peers, a private copy, the
	// driver refusing: a notice) device_copy stages it through host memory.
	void reach(const BufferGuard &frame, uint32_t device) const;
	bool take_exclusive(uint32_t index); // refs_lock held
	void clear_holder_bit(uint32_t index, uint32_t bit);
	void notify_owner();
	// The format a frame in SLOT is in (a consumer learns new ones from slots).
	std::shared_ptr<const std::string> format_of(const layout::SlotRecord &slot);
	// A copy of SLOT's side data; none when empty or refused (its size out of range).
	std::shared_ptr<const std::vector<std::byte>> side_data_of(const layout::SlotRecord &slot);
	// Frames taken without their side data, its size out of range (any thread).
	std::atomic<uint64_t> side_data_refused{ 0 };
	// Frames refused for their layout (checked_guard; any thread).
	std::atomic<uint64_t> frames_refused{ 0 };
};

} // namespace xmem
