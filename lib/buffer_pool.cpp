// buffer_pool.cpp - the BufferPool facade: each call handed to the role this process
// plays (Publisher, Subscriber, GuestProducer) or to its references (pool.cpp, ticket.cpp).
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

BufferPool::BufferPool(std::shared_ptr<PoolImpl> impl) : impl_(std::move(impl))
{
}

Result<std::shared_ptr<BufferPool>> BufferPool::create(std::string_view name, const PoolConfig &config)
{
	auto path = socket_path(name);
	if (!path)
		return path.error();
	auto impl = Publisher::create(name, std::move(path.value()), config);
	if (!impl)
		return impl.error();
	return std::make_shared<BufferPool>(std::move(impl.value()));
}

Result<std::shared_ptr<BufferPool>> BufferPool::open(std::string_view name, const OpenOptions &options)
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
	return std::make_shared<BufferPool>(std::move(impl.value()));
}

BufferPool::~BufferPool()
{
	// The owner closes the pool now, even while guards keep the mappings alive (the
	// limbo); a consumer detaches when its last guard is gone, so the owner never
	// reuses a slot this process still reads.
	if (impl_ && impl_->publisher)
		impl_->publisher->shutdown();
	else if (impl_ && impl_->subscriber)
		impl_->subscriber->detach_queue();
}

void BufferPool::close()
{
	if (impl_->publisher)
		impl_->publisher->shutdown();
}

bool BufferPool::owns(const BufferGuard &guard) const
{
	return guard.pool_ == impl_;
}

Role BufferPool::role() const
{
	return impl_->role;
}
const std::string &BufferPool::name() const
{
	return impl_->name;
}
const std::string &BufferPool::path() const
{
	return impl_->path;
}
uint64_t BufferPool::slot_size() const
{
	return impl_->seg.slot_size;
}
uint32_t BufferPool::slot_records() const
{
	return impl_->seg.slot_count;
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
	return Storage(impl_->seg.constants().storage_type);
}
uint32_t BufferPool::device() const
{
	// This process's ordinal (a consumer finds the device by its UUID); an
	// inspector maps no arena and says the owner's.
	if (impl_->arena)
		return impl_->arena->device();
	return impl_->seg.constants().device_id;
}
uint32_t BufferPool::pitch_alignment() const
{
	return impl_->arena ? impl_->arena->pitch_alignment() : 1;
}
const char *BufferPool::gpu_ordering() const
{
	DeviceSync *sync = impl_->first_sync();
	return gpu_ordering_name(sync ? sync->mode() : kSyncNone);
}

Result<BufferGuard> BufferPool::acquire(std::chrono::nanoseconds timeout, CudaStream stream)
{
	return acquire(0, timeout, stream);
}

Result<BufferGuard> BufferPool::acquire(uint64_t size, std::chrono::nanoseconds timeout, CudaStream stream)
{
	if (impl_->guest)
		return impl_->guest->acquire(size, std::nullopt, timeout.count(), stream);
	if (!impl_->publisher)
		return make_error(Errc::wrong_role, impl_->where() + ": an inspector acquires no slots");
	auto g = impl_->publisher->acquire(size, std::nullopt, timeout.count(), stream);
	if (g)
		g->stream_ = stream;
	return g;
}

Result<BufferGuard> BufferPool::acquire(uint64_t size, Storage storage, uint32_t device,
					std::chrono::nanoseconds timeout, CudaStream stream)
{
	if (!impl_->publisher && !impl_->guest)
		return make_error(Errc::wrong_role, impl_->where() + ": an inspector acquires no slots");
	if (auto known = check_memory(impl_->where(), storage, device); !known)
		return known.error();
	if (impl_->guest)
		return impl_->guest->acquire(size, Memory{ storage, device }, timeout.count(), stream);
	auto g = impl_->publisher->acquire(size, Memory{ storage, device }, timeout.count(), stream);
	if (g)
		g->stream_ = stream;
	return g;
}

Result<BufferGuard> BufferPool::copy(const BufferGuard &frame, Storage storage, uint32_t device,
				     std::chrono::nanoseconds timeout, CudaStream stream)
{
	if (!frame.valid())
		return make_error(Errc::invalid_argument, impl_->where() + ": copy of an empty buffer");
	// An acquired frame whose size is not set yet: its whole slot.
	uint64_t bytes = frame.meta_.size ? std::min<uint64_t>(frame.meta_.size, frame.capacity_) : frame.capacity_;
	auto slot = acquire(bytes, storage, device, timeout, stream);
	if (!slot)
		return slot.error();
	BufferGuard &to = slot.value();
	if (!to.data_) // into device memory
		impl_->reach(frame, device);
	Result<void> copied = copy_bytes(PoolImpl::place_of(to), PoolImpl::place_of(frame), bytes, stream);
	if (!copied)
		// The slot goes back unpublished when TO does.
		return make_error(copied.code(), impl_->where() + ": copy into slot " + std::to_string(to.index_) +
							 ": " + copied.error().message);
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

Result<uint32_t> BufferPool::preallocate(uint64_t slot_size, uint32_t count, Storage storage, uint32_t device)
{
	if (!impl_->publisher)
		return wrong_role(*impl_, "adds size classes");
	return impl_->publisher->preallocate(slot_size, count, storage, device);
}

std::vector<SizeClass> BufferPool::classes() const
{
	// The table as the segment says (an inspector imports no class), read once each.
	const ControlSegment &seg = impl_->seg;
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
	if (impl_->guest)
		return impl_->guest->publish(std::move(frame), stream);
	if (!impl_->publisher) {
		BufferGuard dropped = std::move(frame);
		return make_error(Errc::wrong_role, impl_->where() + ": an inspector publishes nothing");
	}
	return impl_->publisher->publish(std::move(frame), stream);
}
Result<void> BufferPool::set_format(std::string_view format)
{
	if (!impl_->publisher)
		return wrong_role(*impl_, "sets the format");
	return impl_->publisher->set_format(format);
}
Result<void> BufferPool::end_of_stream()
{
	if (!impl_->publisher)
		return wrong_role(*impl_, "ends the stream");
	return impl_->publisher->end_of_stream();
}
Result<BufferGuard> BufferPool::receive(std::chrono::nanoseconds timeout, CudaStream stream)
{
	if (!impl_->subscriber || impl_->role != Role::consumer)
		return make_error(Errc::wrong_role, impl_->where() + ": only a consumer receives");
	auto g = impl_->subscriber->receive(timeout.count(), stream);
	if (g)
		g->stream_ = stream;
	return g;
}
int BufferPool::fd() const
{
	return impl_->subscriber ? impl_->subscriber->fd() : -1;
}
Result<BufferGuard> BufferPool::get(uint32_t index)
{
	return impl_->get(index, false);
}
Result<BufferGuard> BufferPool::get_mut(uint32_t index)
{
	return impl_->get(index, true);
}
Result<BufferGuard> BufferPool::get(uint32_t index, uint64_t seq)
{
	return impl_->get(index, false, seq);
}
Result<void> BufferPool::add_ref(uint32_t index)
{
	return impl_->add_ref(index);
}
Result<void> BufferPool::release(uint32_t index)
{
	return impl_->release(index);
}
Result<void> BufferPool::set_ref_count(uint32_t index, uint32_t count)
{
	return impl_->set_ref_count(index, count);
}

uint32_t BufferPool::ref_count(uint32_t index) const
{
	if (index >= impl_->index_count() || impl_->local_refs.size() <= index)
		return 0;
	std::lock_guard lock(impl_->refs_lock);
	return impl_->local_refs[index];
}

std::string BufferPool::format() const
{
	auto f = impl_->format.load();
	return f ? *f : std::string();
}

uint64_t BufferPool::side_data_refused() const
{
	return impl_->side_data_refused.load(std::memory_order_relaxed);
}

uint64_t BufferPool::frames_refused() const
{
	return impl_->frames_refused.load(std::memory_order_relaxed);
}

Result<ConsumerStats> BufferPool::consumer_stats() const
{
	if (impl_->role != Role::consumer || !impl_->subscriber)
		return make_error(Errc::wrong_role, impl_->where() + ": consumer stats are a consumer's");
	return impl_->subscriber->stats();
}

SpillStats BufferPool::spill_stats() const
{
	SpillStats s{};
	const ControlSegment &seg = impl_->seg;
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
	GrowthStats s{};
	const ControlHeader *h = impl_->seg.header;
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
	return impl_->seg.bytes();
}

uint32_t BufferPool::owner_pid() const
{
	return impl_->role == Role::owner ? uint32_t(::getpid()) : impl_->owner_pid_here;
}

PoolStats BufferPool::stats() const
{
	PoolStats s{};
	const ControlSegment &seg = impl_->seg;
	const ControlHeader *h = seg.header;
	s.published = h->published.load(std::memory_order_relaxed);
	s.dropped = h->dropped.load(std::memory_order_relaxed);
	s.reaped = h->reaped.load(std::memory_order_relaxed);
	s.closed = h->state.load(std::memory_order_relaxed) == kPoolClosed ||
		   (impl_->subscriber && impl_->subscriber->owner_gone());
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
	if (impl_->guest)
		return impl_->guest->publish_ticket(std::move(frame), redemptions, ttl.count(), stream);
	if (!impl_->publisher) {
		BufferGuard dropped = std::move(frame);
		return make_error(Errc::wrong_role, impl_->where() + ": an inspector publishes no tickets");
	}
	return impl_->publisher->publish_ticket(std::move(frame), redemptions, ttl.count(), stream);
}

Result<BufferGuard> BufferPool::get(const Ticket &ticket)
{
	return impl_->redeem(ticket);
}

TicketStats BufferPool::ticket_stats() const
{
	TicketStats s{};
	const ControlHeader *h = impl_->seg.header;
	s.issued = h->tickets_issued.load(std::memory_order_relaxed);
	s.redeemed = h->tickets_redeemed.load(std::memory_order_relaxed);
	s.expired = h->tickets_expired.load(std::memory_order_relaxed);
	s.live = h->tickets_live.load(std::memory_order_relaxed);
	return s;
}

} // namespace xmem
