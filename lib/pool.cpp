// pool.cpp - this process's references to slots, whatever its role: get/get_mut with
// copy-on-write, add_ref/release/set_ref_count, BufferGuard and private copies.
#include "frame_check.hpp"
#include "pool_impl.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace xmem {

using namespace layout;

namespace {

// How long get() of a device slot waits on the CPU for the producer's GPU writes.
constexpr int64_t kGetReadyTimeoutNs = 5'000'000'000;

const char *state_name(uint32_t s)
{
	switch (s) {
	case kSlotFree:
		return "free";
	case kSlotWriting:
		return "being written by the owner";
	case kSlotPublished:
		return "published";
	case kSlotExclusive:
		return "held for writing by its sole holder";
	case kSlotReclaiming:
		return "being reclaimed";
	case kSlotUnused:
		return "in no size class yet";
	}
	return "invalid";
}

} // namespace

std::shared_ptr<const std::string> PoolImpl::format_of(const SlotRecord &slot)
{
	uint64_t seq = slot.meta.format_seq;
	std::lock_guard lock(format_lock);
	auto current = format.load();
	if (seq == format_seq || role == Role::owner)
		return current;
	auto f = std::make_shared<const std::string>(slot.format, strnlen(slot.format, sizeof(slot.format)));
	if (seq > format_seq) {
		format.store(f);
		format_seq = seq;
	}
	return f;
}

BufferGuard PoolImpl::make_guard(uint32_t index, bool writable)
{
	const SlotRecord &rec = record(index);
	BufferGuard g;
	g.pool_ = shared_from_this();
	g.index_ = index;
	g.meta_ = rec.meta;
	// Another process wrote these: keep strings within their arrays. The layout's
	// counts and sizes are checked by checked_guard(), on this copy.
	g.meta_.index = index;
	g.meta_.content_type[XMEM_CONTENT_TYPE_MAX - 1] = '\0';
	g.meta_.producer[XMEM_PRODUCER_MAX - 1] = '\0';
	if (is_spill(index)) {
		// A spilled frame, in host memory: the owner's offset, read once and bounded by
		// the tier's payload area (a capacity of 0 refuses any payload).
		uint64_t offset = *static_cast<const volatile uint64_t *>(&rec.offset);
		std::span<std::byte> at = spill->payload(offset);
		g.data_ = at.empty() ? nullptr : at.data();
		g.capacity_ = std::min<uint64_t>(largest_slot(), at.size());
		g.meta_.storage_type = uint8_t(Storage::system);
		g.meta_.device_id = 0;
	} else {
		// Its class is known here: the owner made it, a consumer imported it first
		// (checked_guard).
		const SlotClass &c = classes[*class_of(index)];
		// The owner wrote its ordinal; this process may number the device otherwise.
		g.meta_.storage_type = uint8_t(c.arena->storage());
		g.meta_.device_id = uint8_t(c.arena->device());
		uint64_t offset = uint64_t{ index - c.first_slot } * c.slot_stride;
		g.data_ = c.arena->host(offset);
		g.device_ = c.arena->device_address(offset);
		g.capacity_ = c.slot_size;
		// Another process wrote it: out of range is no meta index.
		uint32_t gen = rec.frame_gen.load(std::memory_order_relaxed);
		g.gen_ = gen <= kMetaGenMax ? gen : 0;
	}
	g.writable_ = writable;
	g.format_ = role == Role::owner ? format.load() : format_of(rec);
	g.side_data_ = side_data_of(rec);
	return g;
}

DeviceSync *PoolImpl::ordering_of(uint32_t index)
{
	if (is_spill(index))
		return nullptr;
	auto c = class_of(index);
	if (!c && owner_link && owner_link->import_classes())
		c = class_of(index);
	return c ? classes[*c].sync : nullptr;
}

Result<BufferGuard> PoolImpl::checked_guard(uint32_t index, bool writable)
{
	if (!is_spill(index) && !class_of(index)) {
		// A slot of a class the owner added since this consumer last looked: its
		// memory is imported once, here, for every frame of it to come.
		auto imported = owner_link ? owner_link->import_classes()
					   : Result<void>(make_error(Errc::invalid_argument, "no class"));
		if (!imported || !class_of(index)) {
			frames_refused.fetch_add(1, std::memory_order_relaxed);
			(void)release(index, nullptr, false);
			return make_error(imported ? Errc::bad_frame : imported.code(),
					  where() + ": slot " + std::to_string(index) + " is in no size class" +
						  (imported ? std::string(" the owner has added")
							    : ": " + imported.error().message));
		}
	}
	if (owner_link && !is_spill(index)) {
		owner_link->unmap_trimmed();
		// A dynamic device slot: its memory mapped here before a guard points into it.
		if (classes[*class_of(index)].arena->maps_per_slot())
			if (auto mapped = owner_link->map_slot(index); !mapped) {
				frames_refused.fetch_add(1, std::memory_order_relaxed);
				(void)release(index, nullptr, false);
				return mapped.error();
			}
	}
	BufferGuard g = make_guard(index, writable);
	auto fits = check_frame_layout(g.meta_, g.capacity_);
	if (fits)
		return g;
	// Given back unread: no GPU work of this process touched it.
	frames_refused.fetch_add(1, std::memory_order_relaxed);
	g.detach();
	(void)release(index, nullptr, false);
	return make_error(Errc::bad_frame, where() + ": " + fits.error().message);
}

std::shared_ptr<const std::vector<std::byte>> PoolImpl::side_data_of(const SlotRecord &slot)
{
	// One read of the size, checked before a byte is copied: another process wrote it,
	// and may write it again between a check and a second read.
	uint32_t size = *static_cast<const volatile uint32_t *>(&slot.side_data_size);
	if (size == 0)
		return nullptr;
	if (size > XMEM_SIDE_DATA_MAX) {
		side_data_refused.fetch_add(1, std::memory_order_relaxed);
		return nullptr;
	}
	return std::make_shared<const std::vector<std::byte>>(slot.side_data, slot.side_data + size);
}

void PoolImpl::notify_owner()
{
	// Pairs with the owner's owner_waiting increment before it re-checks (seq_cst on
	// both sides): either it sees our change or we see it waiting. No syscall otherwise.
	if (seg.header->owner_waiting.load(std::memory_order_seq_cst) != 0) {
		seg.header->progress.fetch_add(1, std::memory_order_seq_cst);
		futex_wake_all(&seg.header->progress);
	}
}

void PoolImpl::clear_holder_bit(uint32_t index, uint32_t bit)
{
	SlotRecord &slot = record(index);
	// Only the sole holder can have a slot EXCLUSIVE (get_mut in place): as it lets
	// go, the frame is published again, so get() works on it as before.
	// Only the process that took it EXCLUSIVE gives it back: another holder's release
	// must not undo it between that process's CAS and its sole_holder check.
	if (index < exclusive.size() && exclusive[index]) {
		exclusive[index] = 0;
		uint32_t was = kSlotExclusive;
		slot.state.compare_exchange_strong(was, kSlotPublished, std::memory_order_seq_cst);
	}
	slot.holders[bit / 64].fetch_and(~holder_mask(bit), std::memory_order_seq_cst);
	// An owner's unpublished slot goes straight back to free. Other bits on a
	// WRITING slot can only be get() probes, which back off on seeing it.
	if (role == Role::owner && bit == kOwnerBit && slot.state.load(std::memory_order_acquire) == kSlotWriting)
		slot.state.store(kSlotFree, std::memory_order_seq_cst);
	notify_owner();
}

Result<void> PoolImpl::hold_published(uint32_t index)
{
	SlotRecord &slot = seg.slots[index];
	std::lock_guard lock(refs_lock);
	if (local_refs[index] == 0) {
		uint64_t mask = holder_mask(holder_bit);
		uint64_t old = slot.holders[holder_bit / 64].fetch_or(mask, std::memory_order_seq_cst);
		if (old & mask)
			// The owner set our bit for a frame still in our queue: that reference
			// belongs to the queue until receive() takes it.
			return make_error(Errc::not_held,
					  where() + ": slot " + std::to_string(index) +
						  " is queued for this consumer; take it with receive()");
		// The owner reclaims only after seeing no holder bit (Dekker-style, seq_cst):
		// either it sees ours, or we see that it moved the slot out of PUBLISHED.
		uint32_t s = settled_state(slot);
		if (s != kSlotPublished) {
			slot.holders[holder_bit / 64].fetch_and(~mask, std::memory_order_seq_cst);
			notify_owner(); // an acquire() may have seen only our probe
			return make_error(Errc::not_held, where() + ": slot " + std::to_string(index) + " is " +
								  state_name(s) + ", not published");
		}
	}
	local_refs[index]++;
	return {};
}

uint32_t PoolImpl::slots_end() const
{
	// The class table as the owner wrote it: a class this process has not imported yet
	// counts too. Only ever used as a bound: index() lookups go through class_of().
	uint32_t n = std::min(seg.header->classes.load(std::memory_order_acquire), kMaxClasses);
	if (n == 0)
		return 0;
	ClassRecord last;
	std::memcpy(&last, &seg.classes[n - 1], sizeof(last));
	return uint32_t(std::min<uint64_t>(uint64_t{ last.first_slot } + last.count, seg.slot_count));
}

bool PoolImpl::in_range(uint32_t index) const
{
	if (index >= index_count())
		return false;
	return is_spill(index) || class_of(index) || index < slots_end();
}

Result<BufferGuard> PoolImpl::get(uint32_t index, bool writable, std::optional<uint64_t> seq)
{
	if (role == Role::inspector)
		return make_error(Errc::wrong_role, where() + ": an inspector holds no frames");
	if (index >= seg.slot_count || !in_range(index))
		return make_error(Errc::out_of_range, where() + ": slot " + std::to_string(index) +
							      " out of range (0.." + std::to_string(slots_end() - 1) +
							      ")");
	SlotRecord &slot = seg.slots[index];
	if (auto held = hold_published(index); !held)
		return held.error();
	// Held, the slot keeps its frame (the owner rewrites only a slot nobody holds): the
	// one asked for, or another since.
	if (uint64_t now = slot.meta.seq; seq && now != *seq) {
		(void)release(index, nullptr, false);
		return make_error(Errc::not_held, where() + ": slot " + std::to_string(index) + " holds frame " +
							  std::to_string(now) + " now, not frame " +
							  std::to_string(*seq));
	}
	// Its holders are counted: only its meta index's holds admit one (get_named).
	if (slot.counted.load(std::memory_order_acquire) != 0) {
		uint32_t named = meta_index_of(index, slot.frame_gen.load(std::memory_order_relaxed));
		(void)release(index, nullptr, false);
		return make_error(Errc::not_held, where() + ": slot " + std::to_string(index) +
							  " holds a frame published for a number of holders "
							  "(set_ref_count): get its meta_index " +
							  std::to_string(named) + " to take one of them");
	}
	return finish_get(index, writable);
}

Result<BufferGuard> PoolImpl::finish_get(uint32_t index, bool writable)
{
	SlotRecord &slot = seg.slots[index];
	if (DeviceSync *sync = ordering_of(index)) {
		// A frame taken by index is ready for any stream: the CPU waits for the
		// producer's GPU writes (bounded; they were queued before publish).
		auto ready = sync->wait_ready(index, slot.meta.seq, nullptr, deadline_after(kGetReadyTimeoutNs));
		if (!ready) {
			(void)release(index, nullptr, false);
			return make_error(ready.code(),
					  where() + ": slot " + std::to_string(index) + ": " + ready.error().message);
		}
	}

	auto checked = checked_guard(index, false);
	if (!writable || !checked)
		return checked;
	BufferGuard shared = std::move(checked.value());

	std::unique_lock lock(refs_lock);
	if (take_exclusive(index)) {
		shared.writable_ = true;
		return shared;
	}
	lock.unlock();

	auto copy = private_copy(shared, Memory{ shared.storage(), shared.device() });
	if (copy)
		copy->writable_ = true;
	return copy; // `shared` releases the slot reference: the copy needs it no more
}

void PoolImpl::reach(const BufferGuard &frame, uint32_t device) const
{
	if (frame.data_ || frame.copy_ || frame.meta_.device_id == device || is_spill(frame.index_))
		return;
	auto c = class_of(frame.index_);
	if (!c || !classes[*c].arena)
		return;
	if (auto reached = classes[*c].arena->reach_from(device); !reached)
		// A notice only: the copy goes through host memory, as between devices that
		// are no peers.
		(void)std::fprintf(stderr, "xmem: %s: slot %u copied through host memory: %s\n", where().c_str(),
				   frame.index_, reached.error().message.c_str());
}

Place PoolImpl::place_of(const BufferGuard &frame)
{
	return Place{ Memory{ frame.storage(), frame.meta_.device_id }, frame.data_, frame.device_ };
}

// A private copy of FRAME's payload in memory TO: host memory's complete when this
// returns, device memory's queued on STREAM (complete on return without one). No slot
// reference: the copy lives on its own.
Result<BufferGuard> PoolImpl::private_copy(const BufferGuard &frame, Memory to, void *stream)
{
	uint64_t bytes = std::min<uint64_t>(frame.meta_.size, frame.capacity_);
	// The guard gets its pool only once it owns the copy: a guard with a pool and no
	// copy is a slot reference, and dropping it on a failure would release the
	// caller's reference to the source frame.
	BufferGuard g;
	g.index_ = frame.index_;
	g.meta_ = frame.meta_;
	g.meta_.storage_type = uint8_t(to.storage);
	g.meta_.device_id = uint8_t(to.device);
	g.format_ = frame.format_;
	g.side_data_ = frame.side_data_;
	g.capacity_ = bytes;
	auto failed = [&](const Error &e) {
		return make_error(e.code,
				  where() + ": copy of slot " + std::to_string(frame.index_) + ": " + e.message);
	};
	auto memory = allocate_private(to, bytes, stream);
	if (!memory)
		return failed(memory.error());
	if (!memory->host) // into device memory
		reach(frame, to.device);
	if (auto copied = copy_bytes(Place{ to, memory->host, memory->address }, place_of(frame), bytes, stream);
	    !copied)
		return failed(copied.error());
	g.data_ = memory->host;
	g.device_ = memory->address;
	g.copy_ = std::move(memory->owner);
	g.pool_ = frame.pool_;
	return g;
}

void PoolImpl::track_writer(uint32_t index, BufferGuard *guard)
{
	std::lock_guard lock(refs_lock);
	if (index < writers.size())
		writers[index] = guard;
}

void PoolImpl::untrack_writer(uint32_t index, const BufferGuard *guard)
{
	std::lock_guard lock(refs_lock);
	if (index < writers.size() && writers[index] == guard)
		writers[index] = nullptr;
}

BufferGuard *PoolImpl::writer_of(uint32_t index, uint32_t gen)
{
	std::lock_guard lock(refs_lock);
	BufferGuard *g = index < writers.size() ? writers[index] : nullptr;
	return g && g->gen_ == gen ? g : nullptr;
}

Result<PoolImpl::MetaIndex> PoolImpl::decode_meta(uint32_t meta_index) const
{
	if (meta_index < seg.slot_count)
		return MetaIndex{ meta_index, 0 };
	MetaIndex m{ meta_index & ((1u << kMetaSlotBits) - 1), meta_index >> kMetaSlotBits };
	if (m.gen == 0 || m.gen > kMetaGenMax || m.slot >= seg.slot_count || !in_range(m.slot))
		return make_error(Errc::out_of_range,
				  where() + ": " + std::to_string(meta_index) +
					  " names no frame of this pool (a meta index is a slot below " +
					  std::to_string(slots_end()) + " and a frame generation from 1 to " +
					  std::to_string(kMetaGenMax) + "; BufferGuard::meta_index())");
	return m;
}

Result<uint32_t> PoolImpl::held_slot(uint32_t meta_index, std::string_view call) const
{
	auto m = decode_meta(meta_index);
	if (!m)
		return m.error();
	if (m->gen != 0 && seg.slots[m->slot].frame_gen.load(std::memory_order_relaxed) != m->gen)
		return make_error(Errc::not_held, where() + ": " + std::string(call) + " meta index " +
							  std::to_string(meta_index) + ": slot " +
							  std::to_string(m->slot) + " holds another frame now");
	return m->slot;
}

// Copy-on-write's fast path: in place only when this process is the sole holder and
// holds it once; EXCLUSIVE then keeps get() of other processes out until released.
bool PoolImpl::take_exclusive(uint32_t index)
{
	// A spilled frame is never written in place: get_mut() copies it.
	if (is_spill(index))
		return false;
	SlotRecord &slot = seg.slots[index];
	if (local_refs[index] != 1)
		return false;
	uint32_t expected = kSlotPublished;
	if (!slot.state.compare_exchange_strong(expected, kSlotExclusive, std::memory_order_seq_cst))
		return exclusive[index] != 0; // someone else's EXCLUSIVE is not ours
	if (sole_holder(slot, holder_bit)) {
		exclusive[index] = 1;
		return true;
	}
	slot.state.store(kSlotPublished, std::memory_order_seq_cst);
	return false;
}

Result<DeviceSync *> PoolImpl::add_sync(const Arena &memory, bool mem_ops)
{
	std::string fallback;
	auto made = make_ordering(seg, memory, mem_ops, &fallback);
	if (!made)
		return made.error();
	if (!*made)
		return nullptr; // memory the CPU orders: system memory
	if (!fallback.empty())
		// A notice only: a failed write to stderr changes nothing.
		(void)std::fprintf(stderr, "xmem: %s: GPU ordering falls back to CPU synchronization: %s\n",
				   where().c_str(), fallback.c_str());
	uint32_t n = sync_count.load(std::memory_order_relaxed);
	syncs[n] = std::move(made.value());
	sync_count.store(n + 1, std::memory_order_release);
	return syncs[n].get();
}

namespace {

// The checks add_ref, release and set_ref_count share (CALL names the call in their
// messages): a role that holds frames and INDEX in range, then, LOCK taken on
// refs_lock, a reference of this process's to INDEX. A slot leased to this process
// (being written here, not held) is refused unless LEASED_OK: release gives it back.
Result<void> lock_held(PoolImpl &pool, uint32_t index, std::string_view call, std::unique_lock<std::mutex> &lock,
		       bool leased_ok, std::string_view not_held_hint = {})
{
	if (pool.role == Role::inspector)
		return make_error(Errc::wrong_role, pool.where() + ": an inspector holds no frames");
	if (!pool.in_range(index))
		return make_error(Errc::out_of_range,
				  pool.where() + ": slot " + std::to_string(index) + " out of range");
	lock = std::unique_lock(pool.refs_lock);
	auto refused = [&](Errc code, std::string_view why) {
		return make_error(code, pool.where() + ": " + std::string(call) + " slot " + std::to_string(index) +
						", which this process " + std::string(why));
	};
	if (pool.local_refs[index] == 0)
		return refused(Errc::not_held, "does not hold" + std::string(not_held_hint));
	if (!leased_ok && index < pool.leased.size() && pool.leased[index])
		return refused(Errc::invalid_argument, "is writing (publish it first)");
	return {};
}

} // namespace

Result<void> PoolImpl::add_ref(uint32_t index)
{
	std::unique_lock<std::mutex> lock;
	if (auto held = lock_held(*this, index, "add_ref on", lock, false, " (use get())"); !held)
		return held;
	if (local_refs[index] == UINT32_MAX)
		return make_error(Errc::out_of_range, where() + ": reference count overflow");
	local_refs[index]++;
	return {};
}

Result<void> PoolImpl::release(uint32_t index, void *stream, bool gpu_reads, void *also)
{
	std::unique_lock<std::mutex> lock;
	if (auto held = lock_held(*this, index, "release of", lock, true); !held)
		return held;
	if (index < leased.size() && leased[index]) {
		// A slot leased to this process, dropped unpublished: it goes back to the owner,
		// which holds it (no bit of this process's to clear).
		local_refs[index] = 0;
		leased[index] = 0;
		lock.unlock();
		guest_leases->give_back(index, stream, also);
		return {};
	}
	Result<void> done;
	if (--local_refs[index] == 0) {
		// Done before the bit goes: the owner reuses the slot once it sees no bit,
		// and must find this holder's done word written or pending by then.
		if (DeviceSync *sync = sync_of(index); sync && gpu_reads)
			done = sync->mark_done(index, holder_bit, seg.slots[index].meta.seq, stream, also);
		clear_holder_bit(index, holder_bit);
	}
	return done;
}

Result<void> PoolImpl::set_local_refs(uint32_t index, uint32_t count)
{
	std::unique_lock<std::mutex> lock;
	if (auto held = lock_held(*this, index, "set_local_refs on", lock, false); !held)
		return held;
	local_refs[index] = count;
	if (count == 0) {
		if (DeviceSync *sync = sync_of(index))
			(void)sync->mark_done(index, holder_bit, seg.slots[index].meta.seq, nullptr, nullptr);
		clear_holder_bit(index, holder_bit);
	}
	return {};
}

// BufferGuard

BufferGuard::BufferGuard(BufferGuard &&other) noexcept
{
	*this = std::move(other);
}

BufferGuard &BufferGuard::operator=(BufferGuard &&other) noexcept
{
	if (this != &other) {
		reset();
		pool_ = std::move(other.pool_);
		index_ = other.index_;
		gen_ = std::exchange(other.gen_, 0);
		acquired_ = std::exchange(other.acquired_, false);
		meta_ = other.meta_;
		data_ = std::exchange(other.data_, nullptr);
		device_ = std::exchange(other.device_, 0);
		capacity_ = std::exchange(other.capacity_, 0);
		writable_ = std::exchange(other.writable_, false);
		copy_ = std::move(other.copy_);
		format_ = std::move(other.format_);
		side_data_ = std::move(other.side_data_);
		stream_ = std::exchange(other.stream_, nullptr);
		if (acquired_ && pool_)
			pool_->track_writer(index_, this);
	}
	return *this;
}

BufferGuard::~BufferGuard()
{
	reset();
}

void BufferGuard::reset()
{
	(void)release(nullptr);
}

void BufferGuard::detach()
{
	if (acquired_ && pool_)
		pool_->untrack_writer(index_, this);
	acquired_ = false;
	pool_.reset();
}

Result<void> BufferGuard::release(CudaStream stream)
{
	if (acquired_ && pool_)
		pool_->untrack_writer(index_, this);
	acquired_ = false;
	gen_ = 0;
	std::shared_ptr<PoolImpl> pool = std::move(pool_);
	Result<void> r;
	if (pool && !copy_)
		r = pool->release(index_, stream, true, stream_);
	stream_ = nullptr;
	copy_.reset();
	format_.reset();
	side_data_.reset();
	data_ = nullptr;
	device_ = 0;
	capacity_ = 0;
	writable_ = false;
	return r;
}

bool BufferGuard::spilled() const
{
	return pool_ && pool_->is_spill(index_);
}

bool BufferGuard::incomplete() const
{
	DeviceSync *sync = pool_ && !copy_ ? pool_->sync_of(index_) : nullptr;
	return sync && sync->died_unready(index_, meta_.seq);
}

Result<BufferGuard> BufferGuard::private_copy_to_cpu(CudaStream stream) const
{
	if (!valid())
		return make_error(Errc::invalid_argument, "copy of an empty buffer");
	return pool_->private_copy(*this, Memory{ Storage::system, 0 }, stream);
}

Result<BufferGuard> BufferGuard::private_copy_to_cuda(uint32_t device, CudaStream stream) const
{
	if (!valid())
		return make_error(Errc::invalid_argument, "copy of an empty buffer");
	return pool_->private_copy(*this, Memory{ Storage::cuda, device }, stream);
}

uint32_t BufferGuard::meta_index() const
{
	if (copy_ || (pool_ && pool_->is_spill(index_)))
		return kNoMetaIndex;
	return meta_index_of(index_, gen_);
}

Result<std::span<const std::byte>> BufferGuard::as_cpu_slice() const
{
	if (!valid())
		return make_error(Errc::invalid_argument, "as_cpu_slice of an empty buffer");
	if (!data_)
		return make_error(Errc::invalid_argument, "as_cpu_slice: the frame is in CUDA device memory "
							  "(as_cuda_ptr() gives its address)");
	return data();
}

Result<std::span<std::byte>> BufferGuard::as_cpu_slice_mut()
{
	if (valid() && !data_)
		return make_error(Errc::invalid_argument, "as_cpu_slice_mut: the frame is in CUDA device memory "
							  "(as_cuda_ptr_mut() gives its address)");
	return data_mut();
}

Result<uint64_t> BufferGuard::as_cuda_ptr() const
{
	if (!valid())
		return make_error(Errc::invalid_argument, "as_cuda_ptr of an empty buffer");
	if (!device_)
		return make_error(Errc::invalid_argument, "as_cuda_ptr: the frame is in system memory "
							  "(as_cpu_slice() gives its bytes)");
	return device_;
}

Result<uint64_t> BufferGuard::as_cuda_ptr_mut()
{
	auto address = as_cuda_ptr();
	if (address && !writable_)
		return make_error(Errc::read_only,
				  "as_cuda_ptr_mut: a read-only frame (received, or taken with get()); "
				  "get_mut() gives a writable one");
	return address;
}

Result<void> BufferGuard::forget()
{
	if (acquired_ && pool_)
		return make_error(Errc::invalid_argument,
				  pool_->where() + ": forget of frame " + std::to_string(meta_index()) +
					  ", acquired and not published: its slot would be lost to the pool "
					  "(publish() or set_ref_count() it, or drop it)");
	// The slot reference stays this process's (release(meta_index) or its exit gives it
	// back): that is what forget means. A private copy holds no slot: its memory goes.
	pool_.reset();
	(void)release(nullptr); // the rest of the guard, with no reference to release
	return {};
}

Result<FrameMeta *> BufferGuard::meta_mut()
{
	if (!valid() || !writable_)
		return make_error(Errc::read_only, "metadata of a read-only buffer");
	return &meta_;
}

std::span<const std::byte> BufferGuard::data() const
{
	if (!valid() || !data_)
		return {}; // device memory: the CPU cannot touch it (device_ptr())
	uint64_t n = writable_ && !copy_ ? capacity_ : std::min(meta_.size, capacity_);
	return { data_, size_t(n) };
}

Result<std::span<std::byte>> BufferGuard::data_mut()
{
	if (!valid() || !writable_)
		return make_error(Errc::read_only, "write access through a read-only buffer");
	if (!data_)
		return make_error(Errc::invalid_argument,
				  "a device frame has no CPU bytes: write through device_ptr() on a stream");
	return std::span<std::byte>{ data_, size_t(capacity_) };
}

std::span<const std::byte> BufferGuard::side_data() const
{
	if (!side_data_)
		return {};
	return { side_data_->data(), side_data_->size() };
}

Result<void> BufferGuard::set_side_data(std::span<const std::byte> bytes)
{
	// Only a frame on its way to publish() has side data to set: the record of a
	// published frame is read-only, and a private copy is never published.
	if (!valid() || !writable_ || copy_ || (pool_->role != Role::owner && !pool_->leased_here(index_)))
		return make_error(Errc::read_only, "side data of a buffer not from acquire()");
	if (bytes.size() > kSideDataMax)
		return make_error(Errc::out_of_range, pool_->where() + ": side data of " +
							      std::to_string(bytes.size()) + " bytes exceeds the " +
							      std::to_string(kSideDataMax) + "-byte budget of a frame");
	if (bytes.empty())
		side_data_.reset();
	else
		side_data_ = std::make_shared<const std::vector<std::byte>>(bytes.begin(), bytes.end());
	return {};
}

const std::string &BufferGuard::format() const
{
	static const std::string empty;
	return format_ ? *format_ : empty;
}

bool BufferGuard::try_make_writable()
{
	if (!valid() || writable_)
		return writable_;
	if (copy_)
		return false;
	std::lock_guard lock(pool_->refs_lock);
	writable_ = pool_->take_exclusive(index_);
	return writable_;
}

Result<BufferGuard> BufferGuard::clone_ref() const
{
	if (!valid())
		return make_error(Errc::invalid_argument, "clone of an empty buffer");
	BufferGuard g;
	if (!copy_) {
		auto r = pool_->add_ref(index_);
		if (!r)
			return r.error();
	}
	g.pool_ = pool_;
	g.index_ = index_;
	g.meta_ = meta_;
	g.data_ = data_;
	g.device_ = device_;
	g.capacity_ = capacity_;
	g.copy_ = copy_;
	g.stream_ = stream_;
	g.format_ = format_;
	g.side_data_ = side_data_;
	return g;
}

} // namespace xmem
