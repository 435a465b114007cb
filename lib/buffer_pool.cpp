// buffer_pool.cpp - the BufferPool facade: each call handed to the role this process
// plays (Publisher, Subscriber, GuestProducer) or to its references (pool.cpp, ticket.cpp).
#include "connect.hpp"
#include "guest.hpp"
#include "pool_impl.hpp"
#include "publisher.hpp"
#include "subscriber.hpp"

#include <xmem/snapshot.hpp>

#include <algorithm>
#include <cstring>

namespace xmem {

using namespace layout;

PoolImpl::PoolImpl() = default;

// The role objects go first (members are destroyed in reverse): the owner's I/O
// thread is joined before the segment and arena it reads are unmapped.
PoolImpl::~PoolImpl() = default;

namespace {

Error wrong_role(const PoolImpl &pool, const char *what)
{
	return make_error(Errc::wrong_role, pool.where() + ": only the owner " + what);
}

} // namespace

Result<BufferGuard> PoolImpl::acquire_slot(uint64_t size, std::optional<Memory> memory, int64_t timeout_ns,
					   void *stream)
{
	PoolImpl &pool = *this;
	if (!pool.publisher && !pool.guest)
		return make_error(Errc::wrong_role, pool.where() + ": an inspector acquires no slots");
	if (memory)
		if (auto known = check_memory(pool.where(), memory->storage, memory->device); !known)
			return known.error();
	if (pool.guest)
		return pool.guest->acquire(size, memory, timeout_ns, stream);
	auto g = pool.publisher->acquire(size, memory, timeout_ns, stream);
	if (g)
		g->stream_ = stream;
	return g;
}

Result<BufferGuard> PoolImpl::copy_into(const BufferGuard &frame, Memory memory, int64_t timeout_ns, void *stream)
{
	PoolImpl &pool = *this;
	if (!frame.valid())
		return make_error(Errc::invalid_argument, pool.where() + ": copy of an empty buffer");
	// An acquired frame whose size is not set yet: its whole slot.
	uint64_t bytes = frame.meta_.size ? std::min<uint64_t>(frame.meta_.size, frame.capacity_) : frame.capacity_;
	auto slot = acquire_slot(bytes, memory, timeout_ns, stream);
	if (!slot)
		return slot.error();
	BufferGuard &to = slot.value();
	if (!to.data_) // into device memory
		pool.reach(frame, memory.device);
	Result<void> copied = copy_bytes(PoolImpl::place_of(to), PoolImpl::place_of(frame), bytes, stream);
	if (!copied)
		// The slot goes back unpublished when TO does.
		return make_error(copied.code(), pool.where() + ": copy into slot " + std::to_string(to.index_) + ": " +
							 copied.error().message);
	// The frame's metadata, in the slot's place and memory (publish stamps seq and format).
	FrameMeta m = frame.meta_;
	m.index = to.meta_.index;
	m.storage_type = to.meta_.storage_type;
	m.device_id = to.meta_.device_id;
	m.size = bytes;
	to.meta_ = m;
	to.side_data_ = frame.side_data_;
	return slot;
}

namespace {

// The guards' copy_to_*(): copy_into(), with the class a pool without one needs named.
Result<BufferGuard> seed_copy(const std::shared_ptr<PoolImpl> &pool, const BufferGuard &frame, Memory memory,
			      int64_t timeout_ns, void *stream, const char *call)
{
	if (!pool)
		return make_error(Errc::invalid_argument, std::string(call) + " of an empty buffer");
	auto copy = pool->copy_into(frame, memory, timeout_ns, stream);
	if (copy.code() != Errc::out_of_range)
		return copy;
	uint64_t bytes = frame.meta().size ? std::min(frame.meta().size, frame.capacity()) : frame.capacity();
	std::string add = memory.storage == Storage::cuda ? "preallocate_cuda(" + std::to_string(bytes) + ", COUNT, " +
								    std::to_string(memory.device) + ")"
							  : "preallocate_cpu(" + std::to_string(bytes) + ", COUNT)";
	return make_error(Errc::out_of_range,
			  pool->where() + ": " + call + ": no room for the copy: it needs a slot of " +
				  std::to_string(bytes) + " bytes or more of " + memory_name(memory) +
				  ", which no size class has (" + add +
				  " in the owner adds one; a pool from connect() grows one): " + copy.error().message);
}

} // namespace

BufferPool::BufferPool(std::shared_ptr<PoolImpl> impl) : impl_(std::move(impl)), attached_(impl_ != nullptr)
{
}

Result<std::shared_ptr<PoolImpl>> create_pool(std::string_view name, const PoolConfig &config)
{
	auto path = socket_path(name);
	if (!path)
		return path.error();
	return Publisher::create(name, std::move(path.value()), config);
}

Result<std::shared_ptr<PoolImpl>> open_pool(std::string_view name, const OpenOptions &options)
{
	auto path = socket_path(name);
	if (!path)
		return path.error();
	auto impl = Subscriber::open(name, std::move(path.value()), options);
	if (!impl)
		return impl.error();
	// A consumer's process may produce too (a guest, guest.hpp); an inspector may not.
	if (PoolImpl &pool = *impl.value(); pool.role == Role::consumer) {
		pool.guest = std::make_unique<GuestProducer>(pool);
		pool.guest_leases = pool.guest.get();
	}
	return impl;
}

Result<std::shared_ptr<BufferPool>> BufferPool::create(std::string_view name, const PoolConfig &config)
{
	auto impl = create_pool(name, config);
	if (!impl)
		return impl.error();
	return std::make_shared<BufferPool>(std::move(impl.value()));
}

Result<std::shared_ptr<BufferPool>> BufferPool::open(std::string_view name, const OpenOptions &options)
{
	auto impl = open_pool(name, options);
	if (!impl)
		return impl.error();
	return std::make_shared<BufferPool>(std::move(impl.value()));
}

BufferPool::~BufferPool()
{
	// The owner closes the pool now, even while guards keep the mappings alive (the
	// limbo); a consumer detaches when its last guard is gone, so the owner never
	// reuses a slot this process still reads.
	PoolImpl *p = attached_.load(std::memory_order_acquire) ? impl_.get() : nullptr;
	if (p && p->publisher)
		p->publisher->shutdown();
	else if (p && p->subscriber)
		p->subscriber->detach_queue();
}

void BufferPool::close()
{
	if (PoolImpl *p = attached_.load(std::memory_order_acquire) ? impl_.get() : nullptr; p && p->publisher)
		p->publisher->shutdown();
}

bool BufferPool::owns(const BufferGuard &guard) const
{
	return guard.pool_ && attached_.load(std::memory_order_acquire) && guard.pool_ == impl_;
}

Role BufferPool::role() const
{
	PoolImpl *p = settled();
	return p ? p->role : Role::none;
}
const std::string &BufferPool::name() const
{
	PoolImpl *p = settled();
	return p ? p->name : connecting_->name;
}
const std::string &BufferPool::path() const
{
	PoolImpl *p = settled();
	return p ? p->path : connecting_->path;
}
uint64_t BufferPool::slot_size() const
{
	PoolImpl *p = settled();
	if (!p)
		return 0;
	return p->seg.slot_size;
}
uint32_t BufferPool::slot_records() const
{
	PoolImpl *p = settled();
	if (!p)
		return 0;
	return p->seg.slot_count;
}

uint32_t BufferPool::slot_count() const
{
	uint32_t total = 0;
	for (const SizeClass &c : classes())
		total += c.count;
	return total;
}
Storage BufferPool::storage() const
{
	PoolImpl *p = settled();
	if (!p)
		return Storage::system;
	return Storage(p->seg.constants().storage_type);
}
uint32_t BufferPool::device() const
{
	PoolImpl *p = settled();
	if (!p)
		return 0;
	// This process's ordinal (a consumer finds the device by its UUID); an
	// inspector maps no arena and says the owner's.
	if (p->arena)
		return p->arena->device();
	return p->seg.constants().device_id;
}
uint32_t BufferPool::pitch_alignment() const
{
	PoolImpl *p = settled();
	if (!p)
		return 1;
	return p->arena ? p->arena->pitch_alignment() : 1;
}
const char *BufferPool::gpu_ordering() const
{
	PoolImpl *p = settled();
	if (!p)
		return gpu_ordering_name(kSyncNone);
	DeviceSync *sync = p->first_sync();
	return gpu_ordering_name(sync ? sync->mode() : kSyncNone);
}

Result<BufferGuard> BufferPool::acquire(std::chrono::nanoseconds timeout, CudaStream stream)
{
	return acquire(0, timeout, stream);
}

Result<BufferGuard> BufferPool::acquire(uint64_t size, std::chrono::nanoseconds timeout, CudaStream stream)
{
	// A handle that makes its pool makes it of system memory unless told otherwise.
	FirstClass first{ size, 1, Storage::system, 0 };
	auto p = size ? settle(Settle::make, &first) : attached("acquire of no size");
	if (!p)
		return p.error();
	return (*p)->acquire_slot(size, std::nullopt, timeout.count(), stream);
}

Result<BufferGuard> BufferPool::acquire(uint64_t size, Storage storage, uint32_t device,
					std::chrono::nanoseconds timeout, CudaStream stream)
{
	FirstClass first{ size, 1, storage, device };
	auto p = size ? settle(Settle::make, &first) : attached("acquire of no size");
	if (!p)
		return p.error();
	return (*p)->acquire_slot(size, Memory{ storage, device }, timeout.count(), stream);
}

Result<BufferGuard> BufferPool::copy(const BufferGuard &frame, Storage storage, uint32_t device,
				     std::chrono::nanoseconds timeout, CudaStream stream)
{
	auto p = attached("copy");
	if (!p)
		return p.error();
	return (*p)->copy_into(frame, Memory{ storage, device }, timeout.count(), stream);
}

Result<BufferGuard> BufferGuard::copy_to_cpu(CudaStream stream, std::chrono::nanoseconds timeout) const
{
	return seed_copy(pool_, *this, Memory{ Storage::system, 0 }, timeout.count(), stream, "copy_to_cpu");
}

Result<BufferGuard> BufferGuard::copy_to_cuda(uint32_t device, CudaStream stream,
					      std::chrono::nanoseconds timeout) const
{
	return seed_copy(pool_, *this, Memory{ Storage::cuda, device }, timeout.count(), stream, "copy_to_cuda");
}

Result<BufferGuard> BufferGuard::copy_to_device(uint32_t device, CudaStream stream,
						std::chrono::nanoseconds timeout) const
{
	return seed_copy(pool_, *this, Memory{ Storage::cuda, device }, timeout.count(), stream, "copy_to_device");
}

Result<std::vector<uint32_t>> BufferPool::preallocate_cpu(uint64_t size, uint32_t count)
{
	return preallocate_cuda_or_cpu(size, count, Storage::system, 0);
}

Result<std::vector<uint32_t>> BufferPool::preallocate_cuda(uint64_t size, uint32_t count, uint32_t device)
{
	return preallocate_cuda_or_cpu(size, count, Storage::cuda, device);
}

Result<std::vector<uint32_t>> BufferPool::preallocate_cuda_or_cpu(uint64_t size, uint32_t count, Storage storage,
								  uint32_t device)
{
	auto c = preallocate(size, count, storage, device);
	if (!c)
		return c.error();
	std::vector<uint32_t> slots(count);
	uint32_t first = settled()->classes[*c].first_slot;
	for (uint32_t k = 0; k < count; k++)
		slots[k] = first + k;
	return slots;
}

Result<BufferGuard> BufferPool::acquire_cpu(uint64_t size, std::chrono::nanoseconds timeout)
{
	// The seed's buffer is SIZE bytes: so is the frame, until its metadata says otherwise.
	auto g = acquire(size, Storage::system, 0, timeout);
	if (g)
		g->meta_.size = size;
	return g;
}

Result<BufferGuard> BufferPool::acquire_cuda(uint64_t size, uint32_t device, std::chrono::nanoseconds timeout,
					     CudaStream stream)
{
	auto g = acquire(size, Storage::cuda, device, timeout, stream);
	if (g)
		g->meta_.size = size;
	return g;
}

Result<void> BufferPool::set_ref_count(uint32_t meta_index, int32_t count, std::chrono::nanoseconds lifetime)
{
	auto attached_pool = attached("set_ref_count");
	if (!attached_pool)
		return attached_pool.error();
	PoolImpl &pool = **attached_pool;
	auto refused = [&](Errc code, const std::string &why) {
		return make_error(code, pool.where() + ": set_ref_count(" + std::to_string(meta_index) + ", " +
						std::to_string(count) + "): " + why);
	};
	if (count < 1)
		return refused(Errc::invalid_argument, "a frame is published for 1 holder or more");
	if (uint32_t(count) > pool.seg.max_consumers)
		return refused(Errc::invalid_argument, "more holders than the pool's limit of " +
							       std::to_string(pool.seg.max_consumers) + " consumers");
	if (lifetime.count() <= 0)
		return refused(Errc::invalid_argument, "the holds' lifetime must be positive");
	auto m = pool.decode_meta(meta_index);
	if (!m)
		return m.error();
	if (m->gen == 0)
		return refused(Errc::invalid_argument, "a slot index, not a meta index (BufferGuard::meta_index())");
	BufferGuard *writer = pool.writer_of(m->slot, m->gen);
	if (!writer)
		return refused(Errc::not_held, "no frame of that index is being written in this process "
					       "(acquired here and not yet published)");
	// The guard goes empty, its meta index kept (the seed reads it next).
	BufferGuard frame = std::move(*writer);
	// The seed's buffers have no payload size: a frame whose size was not set is its slot.
	if (frame.meta_.size == 0)
		frame.meta_.size = frame.capacity_;
	writer->index_ = m->slot;
	writer->gen_ = m->gen;
	auto published = publish_ticket(std::move(frame), uint32_t(count), lifetime);
	if (!published)
		return published.error();
	return {};
}

Result<uint32_t> BufferPool::preallocate(uint64_t slot_size, uint32_t count, Storage storage, uint32_t device)
{
	// A handle from connect() with no pool yet makes it with this class, its class 0.
	if (!settled()) {
		FirstClass first{ slot_size, count, storage, device };
		bool made = false;
		auto p = settle(Settle::make, &first, &made);
		if (!p)
			return p.error();
		if (made)
			return uint32_t{ 0 };
	}
	auto p = attached("preallocate");
	if (!p)
		return p.error();
	if (!(*p)->publisher)
		return wrong_role(**p, "adds size classes");
	return (*p)->publisher->preallocate(slot_size, count, storage, device);
}

std::vector<SizeClass> BufferPool::classes() const
{
	PoolImpl *p = settled();
	if (!p)
		return std::vector<SizeClass>();
	// The table as the segment says (an inspector imports no class), read once each.
	const ControlSegment &seg = p->seg;
	std::vector<SizeClass> out;
	uint32_t n = std::min(seg.header->classes.load(std::memory_order_acquire), kMaxClasses);
	uint32_t dynamic = seg.header->dynamic_classes.load(std::memory_order_acquire);
	for (uint32_t c = 0; c < n; c++) {
		ClassRecord r;
		std::memcpy(&r, &seg.classes[c], sizeof(r));
		SizeClass sc{ c, Storage(r.storage), r.device, r.slot_size, r.first_slot, r.count, r.sync_mode };
		sc.dynamic = (dynamic >> c) & 1;
		// Records of a dynamic class whose memory is not committed stay UNUSED. Checked
		// against the segment's records (another process wrote R).
		for (uint32_t i = r.first_slot; i < seg.slot_count && i - r.first_slot < r.count; i++)
			if (seg.slots[i].state.load(std::memory_order_relaxed) != kSlotUnused)
				sc.committed++;
		out.push_back(sc);
	}
	return out;
}
Result<void> BufferPool::publish(BufferGuard &&frame, CudaStream stream)
{
	auto p = attached("publish");
	if (!p) {
		BufferGuard dropped = std::move(frame);
		return p.error();
	}
	if ((*p)->guest)
		return (*p)->guest->publish(std::move(frame), stream);
	if (!(*p)->publisher) {
		BufferGuard dropped = std::move(frame);
		return make_error(Errc::wrong_role, (*p)->where() + ": an inspector publishes nothing");
	}
	return (*p)->publisher->publish(std::move(frame), stream);
}
Result<void> BufferPool::set_format(std::string_view format)
{
	auto p = attached("set_format");
	if (!p)
		return p.error();
	if (!(*p)->publisher)
		return wrong_role(**p, "sets the format");
	return (*p)->publisher->set_format(format);
}
Result<void> BufferPool::end_of_stream()
{
	auto p = attached("end_of_stream");
	if (!p)
		return p.error();
	if (!(*p)->publisher)
		return wrong_role(**p, "ends the stream");
	return (*p)->publisher->end_of_stream();
}
Result<BufferGuard> BufferPool::receive(std::chrono::nanoseconds timeout, CudaStream stream)
{
	auto p = settle(Settle::wait);
	if (!p)
		return p.error();
	if (!(*p)->subscriber || (*p)->role != Role::consumer)
		return make_error(Errc::wrong_role, (*p)->where() + ": only a consumer receives");
	auto g = (*p)->subscriber->receive(timeout.count(), stream);
	if (g)
		g->stream_ = stream;
	return g;
}
int BufferPool::fd() const
{
	PoolImpl *p = settled();
	if (!p)
		return -1;
	return p->subscriber ? p->subscriber->fd() : -1;
}
Result<BufferGuard> BufferPool::get(uint32_t meta_index)
{
	auto p = settle(Settle::wait);
	if (!p)
		return p.error();
	return (*p)->get_named(meta_index, false);
}
Result<BufferGuard> BufferPool::get_mut(uint32_t meta_index)
{
	auto p = settle(Settle::wait);
	if (!p)
		return p.error();
	return (*p)->get_named(meta_index, true);
}
Result<BufferGuard> BufferPool::get(uint32_t index, uint64_t seq)
{
	auto p = settle(Settle::wait);
	if (!p)
		return p.error();
	return (*p)->get(index, false, seq);
}
Result<void> BufferPool::add_ref(uint32_t index)
{
	auto p = attached("add_ref");
	if (!p)
		return p.error();
	auto slot = (*p)->held_slot(index, "add_ref on");
	if (!slot)
		return slot.error();
	return (*p)->add_ref(*slot);
}
Result<void> BufferPool::release(uint32_t index)
{
	auto p = attached("release");
	if (!p)
		return p.error();
	auto slot = (*p)->held_slot(index, "release of");
	if (!slot)
		return slot.error();
	return (*p)->release(*slot);
}
Result<void> BufferPool::set_local_refs(uint32_t index, uint32_t count)
{
	auto p = attached("set_local_refs");
	if (!p)
		return p.error();
	auto slot = (*p)->held_slot(index, "set_local_refs on");
	if (!slot)
		return slot.error();
	return (*p)->set_local_refs(*slot, count);
}

uint32_t BufferPool::ref_count(uint32_t index) const
{
	PoolImpl *p = settled();
	if (!p)
		return 0;
	if (auto m = p->decode_meta(index))
		index = m->slot;
	if (index >= p->index_count() || p->local_refs.size() <= index)
		return 0;
	std::lock_guard lock(p->refs_lock);
	return p->local_refs[index];
}

std::string BufferPool::format() const
{
	PoolImpl *p = settled();
	if (!p)
		return std::string();
	auto f = p->format.load();
	return f ? *f : std::string();
}

uint64_t BufferPool::side_data_refused() const
{
	PoolImpl *p = settled();
	if (!p)
		return 0;
	return p->side_data_refused.load(std::memory_order_relaxed);
}

uint64_t BufferPool::frames_refused() const
{
	PoolImpl *p = settled();
	if (!p)
		return 0;
	return p->frames_refused.load(std::memory_order_relaxed);
}

Result<ConsumerStats> BufferPool::consumer_stats() const
{
	auto p = attached("consumer_stats");
	if (!p)
		return p.error();
	if ((*p)->role != Role::consumer || !(*p)->subscriber)
		return make_error(Errc::wrong_role, (*p)->where() + ": consumer stats are a consumer's");
	return (*p)->subscriber->stats();
}

SpillStats BufferPool::spill_stats() const
{
	PoolImpl *p = settled();
	if (!p)
		return SpillStats{};
	SpillStats s{};
	const ControlSegment &seg = p->seg;
	const ControlHeader *h = seg.header;
	s.cap_bytes = seg.constants().spill_bytes;
	s.cap_frames = seg.constants().spill_frames;
	s.frames = h->spill_frames_held.load(std::memory_order_relaxed);
	s.bytes = h->spill_bytes_held.load(std::memory_order_relaxed);
	s.peak_bytes = h->spill_peak.load(std::memory_order_relaxed);
	s.spilled = h->spilled.load(std::memory_order_relaxed);
	s.full = h->spill_full.load(std::memory_order_relaxed);
	s.resident_bytes = h->spill_resident.load(std::memory_order_relaxed);
	return s;
}

GrowthStats BufferPool::growth_stats() const
{
	PoolImpl *p = settled();
	if (!p)
		return GrowthStats{};
	GrowthStats s{};
	const ControlHeader *h = p->seg.header;
	s.memory_cap = h->memory_cap;
	s.trim_idle_ns = h->trim_idle_ns;
	s.system_bytes = h->system_bytes.load(std::memory_order_relaxed);
	s.dynamic_classes = h->dynamic_classes.load(std::memory_order_relaxed);
	s.dynamic_slots = h->dynamic_slots.load(std::memory_order_relaxed);
	s.dynamic_bytes = h->dynamic_bytes.load(std::memory_order_relaxed);
	s.grown = h->grown.load(std::memory_order_relaxed);
	s.trimmed = h->trimmed.load(std::memory_order_relaxed);
	s.refused = h->growth_refused.load(std::memory_order_relaxed);
	s.device_memory_cap = h->device_memory_cap;
	s.device_bytes = h->device_bytes.load(std::memory_order_relaxed);
	return s;
}

std::span<const std::byte> BufferPool::control_segment() const
{
	PoolImpl *p = settled();
	if (!p)
		return std::span<const std::byte>();
	return p->seg.bytes();
}

uint32_t BufferPool::owner_pid() const
{
	PoolImpl *p = settled();
	if (!p)
		return 0;
	return p->role == Role::owner ? uint32_t(::getpid()) : p->owner_pid_here;
}

PoolStats BufferPool::stats() const
{
	PoolImpl *p = settled();
	if (!p)
		return PoolStats{};
	PoolStats s{};
	const ControlSegment &seg = p->seg;
	const ControlHeader *h = seg.header;
	s.published = h->published.load(std::memory_order_relaxed);
	s.dropped = h->dropped.load(std::memory_order_relaxed);
	s.reaped = h->reaped.load(std::memory_order_relaxed);
	s.closed = h->state.load(std::memory_order_relaxed) == kPoolClosed ||
		   (p->subscriber && p->subscriber->owner_gone());
	// The slots of every class; records no class has taken yet are not slots.
	for (uint32_t i = 0; i < seg.slot_count; i++) {
		if (seg.slots[i].state.load(std::memory_order_relaxed) == kSlotUnused)
			continue;
		s.slots_total++;
		if (slot_is_free(seg.slots[i]))
			s.slots_free++;
	}
	for (uint32_t i = 0; i < seg.max_consumers; i++)
		if (seg.consumer(i)->state.load(std::memory_order_relaxed) == kConsumerActive)
			s.consumers++;
	return s;
}

Result<Ticket> BufferPool::publish_ticket(BufferGuard &&frame, uint32_t redemptions, std::chrono::nanoseconds ttl,
					  CudaStream stream)
{
	auto p = attached("publish_ticket");
	if (!p) {
		BufferGuard dropped = std::move(frame);
		return p.error();
	}
	if ((*p)->guest)
		return (*p)->guest->publish_ticket(std::move(frame), redemptions, ttl.count(), stream);
	if (!(*p)->publisher) {
		BufferGuard dropped = std::move(frame);
		return make_error(Errc::wrong_role, (*p)->where() + ": an inspector publishes no tickets");
	}
	return (*p)->publisher->publish_ticket(std::move(frame), redemptions, ttl.count(), stream);
}

Result<BufferGuard> BufferPool::get(const Ticket &ticket)
{
	auto p = settle(Settle::wait);
	if (!p)
		return p.error();
	return (*p)->redeem(ticket);
}

TicketStats BufferPool::ticket_stats() const
{
	PoolImpl *p = settled();
	if (!p)
		return TicketStats{};
	TicketStats s{};
	const ControlHeader *h = p->seg.header;
	s.issued = h->tickets_issued.load(std::memory_order_relaxed);
	s.redeemed = h->tickets_redeemed.load(std::memory_order_relaxed);
	s.expired = h->tickets_expired.load(std::memory_order_relaxed);
	s.live = h->tickets_live.load(std::memory_order_relaxed);
	return s;
}

} // namespace xmem
