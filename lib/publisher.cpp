// publisher.cpp - the owner's frame path: creating a pool, acquire and claim, publish
// (to queues, or as a ticket), the end of stream and close; lib/owner/ does the rest.
#include "publisher.hpp"

#include "owner/config.hpp"
#include "owner/slot_claim.hpp"

#include "frame_check.hpp"
#include "identity.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace xmem {

using namespace layout;
using owner::kMaxSlotSize;

namespace {

// How long an acquire whose time is up still waits, each time, for a spill in flight.
constexpr uint64_t kSpillWaitNs = 50'000'000;
// How long close waits for the GPU writes it queued (ready words, spill copies) before it
// hangs up on its consumers.
constexpr int64_t kCloseDrainTimeoutNs = 10'000'000'000;

} // namespace

Result<void> Publisher::set_format(std::string_view f)
{
	if (f.size() >= XMEM_FORMAT_MAX)
		return make_error(Errc::invalid_argument, pool_.where() + ": format is " + std::to_string(f.size()) +
								  " bytes, the limit is " +
								  std::to_string(XMEM_FORMAT_MAX - 1));
	if (f.find('\0') != std::string_view::npos)
		return make_error(Errc::invalid_argument, pool_.where() + ": format contains a NUL byte");
	std::lock_guard lock(publish_lock);
	pool_.format.store(std::make_shared<const std::string>(f));
	pool_.format_seq++;
	seg.header->format_lock.fetch_add(1, std::memory_order_acq_rel); // odd: being written
	copy_string(seg.header->format, sizeof(seg.header->format), f);
	seg.header->format_seq.store(pool_.format_seq, std::memory_order_relaxed);
	seg.header->format_lock.fetch_add(1, std::memory_order_release);
	return {};
}

Result<BufferGuard> Publisher::acquire(uint64_t size, std::optional<Memory> memory, int64_t timeout_ns, void *stream)
{
	if (!memory)
		memory = Memory{ pool_.classes[0].arena->storage(), pool_.classes[0].arena->device() };
	if (shut.load(std::memory_order_acquire))
		return make_error(Errc::closed, pool_.where() + " is closed");
	uint64_t deadline = deadline_after(timeout_ns);
	for (;;) {
		if (shut.load(std::memory_order_acquire))
			return make_error(Errc::closed, pool_.where() + " is closed");
		// The classes a slot may come from, smallest first: those that hold SIZE bytes
		// (SIZE 0: the first class). Looked at again each round: preallocate() may
		// have added one while this waited.
		uint32_t n = pool_.classes_known.load(std::memory_order_acquire);
		std::array<uint32_t, kMaxClasses> order;
		uint32_t fitting = 0;
		uint64_t largest = 0;
		for (uint32_t c = 0; c < n; c++) {
			if (!memory->holds(*pool_.classes[c].arena))
				continue;
			largest = std::max(largest, pool_.classes[c].slot_size);
			if (size == 0 ? fitting == 0 : pool_.classes[c].slot_size >= size)
				order[fitting++] = c;
		}
		// A pool that grows makes a slot when no class holds SIZE (size 0 names the first
		// class, which always holds it).
		bool grows = growth.cap_of(*memory) != 0 && size <= kMaxSlotSize;
		if (fitting == 0 && grows && size != 0) {
			if (auto made = growth.grow(size, *memory))
				return claim(*made, pool_.classes[*pool_.class_of(*made)], stream, deadline);
			return make_error(Errc::full, pool_.where() + ": no room for a slot of " +
							      std::to_string(size) + " bytes of " +
							      memory_name(*memory) + " under the pool's memory cap (" +
							      growth.full_reason(*memory) + ")");
		}
		if (fitting == 0)
			return make_error(Errc::out_of_range,
					  pool_.where() + ": no size class of " + memory_name(*memory) + " holds " +
						  std::to_string(size) + " bytes (" +
						  (largest ? "the largest slot is " + std::to_string(largest) + " bytes"
							   : std::string("the pool has no class of that memory")) +
						  "; preallocate() adds a class)");
		std::stable_sort(order.begin(), order.begin() + fitting, [this](uint32_t a, uint32_t b) {
			return pool_.classes[a].slot_size < pool_.classes[b].slot_size;
		});
		uint32_t mask = 0;
		for (uint32_t k = 0; k < fitting; k++)
			mask |= uint32_t{ 1 } << order[k];
		// Tickets used up or expired give their slots back first.
		if (tickets.any_live()) {
			std::lock_guard lock(publish_lock);
			tickets.end(false);
		}
		for (uint32_t k = 0; k < fitting; k++) {
			const PoolImpl::SlotClass &cls = pool_.classes[order[k]];
			std::atomic<uint32_t> &cursor = acquire_cursor[order[k]];
			uint32_t start = cursor.load(std::memory_order_relaxed);
			for (uint32_t m = 0; m < cls.count; m++) {
				uint32_t i = cls.first_slot + (start + m) % cls.count;
				// A dynamic slot whose memory is not committed is UNUSED, unless another
				// process wrote its state: the owner's own count says.
				if (!growth.committed(i) || !owner::try_reclaim(seg.slots[i], kSlotWriting))
					continue;
				cursor.store(i - cls.first_slot + 1, std::memory_order_relaxed);
				return claim(i, cls, stream, deadline);
			}
		}
		// No free slot fits. A pool that grows makes one, within its cap.
		if (grows)
			if (auto made = growth.grow(size ? size : pool_.classes[order[0]].slot_size, *memory))
				return claim(*made, pool_.classes[*pool_.class_of(*made)], stream, deadline);
		// No free slot. Frames queued only for fifo-spill consumers move to the spill
		// tier first (nobody loses a frame); then consumers that chose to lose queued
		// frames lose their oldest: a frame in a slot that fits first (losing another
		// frees nothing for this acquire). Announced as waiting before trying,
		// so that a release or reap that makes a slot free or spillable meanwhile bumps
		// `progress` and the wait below ends at once (tests/model: a slot a co-holder
		// lets go of may become spillable without becoming free).
		ControlHeader *h = seg.header;
		h->owner_waiting.fetch_add(1, std::memory_order_seq_cst);
		uint32_t seen = h->progress.load(std::memory_order_seq_cst);
		bool moved;
		{
			std::unique_lock lock(publish_lock);
			// A queue's frames go oldest first: where no head frame is of a slot
			// that fits, an older one goes, moving that queue towards one that does.
			moved = spill.spill_one(lock, deadline, mask) || queues.drop_globally_oldest(mask) ||
				queues.drop_globally_oldest();
		}
		// A spill in flight (the spill thread copying a slot's frame) frees a slot soon:
		// it is waited for whatever the timeout, as the copy would have been had acquire
		// made it itself, so acquire(0) still finds the slot a spill makes free. Loaded
		// before the look for a free slot: a spill that ends between the two has freed
		// its slot by then (tests/model, Finding 8).
		bool in_flight = spill.in_flight();
		bool free = moved || shut.load(std::memory_order_acquire) ||
			    pool_.classes_known.load(std::memory_order_acquire) != n;
		uint32_t slots = 0;
		for (uint32_t k = 0; k < fitting; k++) {
			const PoolImpl::SlotClass &cls = pool_.classes[order[k]];
			slots += cls.count;
			// A record whose memory is not committed is no slot, whatever its state says
			// (another process may have written it): the scan above skips it too.
			for (uint32_t i = cls.first_slot; i < cls.first_slot + cls.count && !free; i++)
				free = growth.committed(i) && slot_is_free(seg.slots[i]);
		}
		uint64_t now = monotonic_ns();
		bool expired = !free && !in_flight && now >= deadline;
		if (!free && !expired) {
			// A ticket's expiry frees its slot: wake for it (its last redemption bumps
			// `progress`).
			uint64_t until = in_flight ? std::max(deadline, now + kSpillWaitNs) : deadline;
			if (tickets.any_live())
				until = std::min(until, tickets.next_expiry_ns());
			futex_wait(&h->progress, seen, until);
		}
		h->owner_waiting.fetch_sub(1, std::memory_order_seq_cst);
		if (expired)
			return make_error(
				Errc::timed_out,
				pool_.where() + ": no free slot within the timeout (all " + std::to_string(slots) +
					" slots" +
					(size ? " of " + std::to_string(size) + " bytes or more" : std::string()) +
					" are held)");
	}
}

Result<uint32_t> Publisher::preallocate(uint64_t slot_size, uint32_t count, Storage storage, uint32_t device)
{
	return growth.preallocate(slot_size, count, storage, device);
}

Result<BufferGuard> Publisher::claim(uint32_t i, const PoolImpl::SlotClass &cls, void *stream, uint64_t deadline)
{
	// Device slots: no holder is left, but their GPU reads of the last frame may still be
	// queued. STREAM (or the CPU) waits for them.
	if (DeviceSync *sync = cls.sync) {
		auto done = sync->wait_done(i, seg.slots[i].meta.seq, stream, deadline);
		if (!done) {
			seg.slots[i].state.store(kSlotFree, std::memory_order_seq_cst);
			return make_error(done.code(), pool_.where() + ": " + done.error().message);
		}
	}
	{
		std::lock_guard lock(pool_.refs_lock);
		seg.slots[i].holders[0].fetch_or(holder_mask(kOwnerBit), std::memory_order_seq_cst);
		pool_.local_refs[i] = 1;
	}
	growth.used(i);
	// A new frame of the slot: its meta index differs from every earlier one's (until
	// the generation wraps, after kMetaGenMax frames of this slot).
	uint32_t gen = frame_gens[i] % kMetaGenMax + 1;
	frame_gens[i] = gen;
	seg.slots[i].frame_gen.store(gen, std::memory_order_seq_cst);
	seg.slots[i].counted.store(0, std::memory_order_relaxed);
	FrameMeta &m0 = seg.slots[i].meta;
	m0 = FrameMeta{};
	m0.index = i;
	m0.storage_type = uint8_t(cls.arena->storage());
	m0.device_id = uint8_t(cls.arena->device());
	m0.pts = m0.dts = m0.duration = XMEM_NONE;
	seg.slots[i].side_data_size = 0;
	BufferGuard g = pool_.make_guard(i, true);
	g.acquired_ = true;
	pool_.track_writer(i, &g);
	return g;
}

Result<uint64_t> Publisher::put_out(BufferGuard &g, void *stream, std::unique_lock<std::mutex> &lock,
				    uint64_t ticket_check, uint32_t redemptions, const Origin &origin)
{
	if (!g.valid() || g.pool_.get() != &pool_)
		return make_error(Errc::invalid_argument, pool_.where() + ": publish of a buffer from another pool");
	if (!g.writable_ || g.copy_)
		return make_error(Errc::read_only, pool_.where() + ": publish needs a buffer from acquire()");
	uint32_t index = g.index_;
	SlotRecord &slot = seg.slots[index];
	if (slot.state.load(std::memory_order_acquire) != kSlotWriting)
		return make_error(Errc::invalid_argument, pool_.where() + ": slot " + std::to_string(index) +
								  " is not being written (published twice?)");
	if (g.meta_.size > g.capacity_)
		return make_error(Errc::out_of_range, pool_.where() + ": frame size " + std::to_string(g.meta_.size) +
							      " exceeds the slot size " + std::to_string(g.capacity_));
	// Consumers would refuse it: say so here, where the mistake is.
	if (auto fits = check_frame_layout(g.meta_, g.capacity_); !fits)
		return make_error(Errc::invalid_argument, pool_.where() + ": publish: " + fits.error().message);
	std::span<const std::byte> side = g.side_data();
	if (side.size() > kSideDataMax) // set_side_data() refuses it: never truncate here either
		return make_error(Errc::out_of_range, pool_.where() + ": side data of " + std::to_string(side.size()) +
							      " bytes exceeds the budget");
	if (shut.load(std::memory_order_acquire))
		return make_error(Errc::closed, pool_.where() + " is closed");

	lock.lock();
	// Numbered from the owner's own count: consumers can write the shared one.
	uint64_t seq = ++published_count;
	FrameMeta m = g.meta_;
	m.index = index;
	const Arena &memory = *pool_.classes[*pool_.class_of(index)].arena;
	m.storage_type = uint8_t(memory.storage());
	m.device_id = uint8_t(memory.device());
	m.seq = seq;
	if (m.timestamp == 0)
		m.timestamp = monotonic_ns();
	m.producer_pid = origin.producer_pid ? origin.producer_pid : owner_pid;
	std::memcpy(m.producer, config_producer, sizeof(m.producer));
	m.format_seq = pool_.format_seq;
	m.content_type[sizeof(m.content_type) - 1] = '\0';
	if (slot.format_seq != pool_.format_seq) {
		auto f = pool_.format.load();
		copy_string(slot.format, sizeof(slot.format), *f);
		slot.format_seq = pool_.format_seq;
	}
	slot.meta = m;
	if (!side.empty())
		std::memcpy(slot.side_data, side.data(), side.size());
	slot.side_data_size = uint32_t(side.size());
	// Device slots: ready once the producer's queued writes are (no wait here); a guest's
	// are over already.
	if (origin.writes_done && pool_.sync_of(index)) {
		seg.ready(index).store(seq, std::memory_order_release);
	} else if (DeviceSync *sync = pool_.sync_of(index)) {
		if (auto ready = sync->mark_ready(index, seq, stream, g.stream_); !ready)
			return make_error(ready.code(), pool_.where() + ": " + ready.error().message);
	}
	// A ticket's words before the frame is PUBLISHED: a redeemer that sees the slot
	// published sees them.
	slot.ticket_left.store(redemptions, std::memory_order_relaxed);
	slot.ticket_check.store(ticket_check, std::memory_order_relaxed);
	slot.counted.store(redemptions != 0, std::memory_order_relaxed);
	slot.state.store(kSlotPublished, std::memory_order_release);
	seg.header->published.store(seq, std::memory_order_relaxed);
	return seq;
}

void Publisher::refuse(BufferGuard &&frame, const Origin &origin)
{
	BufferGuard g = std::move(frame);
	if (origin.writes_done && g.valid() && g.pool_.get() == &pool_) {
		// A guest's frame: its slot goes back without waiting for this process's streams.
		uint32_t index = g.index_;
		g.detach();
		(void)pool_.release(index, nullptr, false);
	}
}

Result<void> Publisher::publish(BufferGuard &&frame, void *stream, const Origin &origin)
{
	BufferGuard g = std::move(frame);
	std::unique_lock lock(publish_lock, std::defer_lock);
	if (auto seq = put_out(g, stream, lock, 0, 0, origin); !seq) {
		refuse(std::move(g), origin);
		return seq.error();
	}
	uint32_t index = g.index_;
	SlotRecord &slot = seg.slots[index];

	uint32_t targets[XMEM_MAX_CONSUMERS];
	uint64_t masks[kHolderWords] = {};
	uint32_t ntargets = queues.choose_targets(targets, masks, origin.except);
	spill.after_targets();
	// Holder bits before the entries become visible, and before the owner's own bit
	// goes: the slot never looks free while a frame of it is queued.
	// A consumer's get() probe may have set its bit first (the slot is PUBLISHED
	// already): one bit cannot stand for two references, so that consumer does not
	// get this frame queued; its get() holds it instead.
	uint64_t taken[kHolderWords] = {};
	for (uint32_t w = 0; w < kHolderWords; w++)
		if (masks[w])
			taken[w] = slot.holders[w].fetch_or(masks[w], std::memory_order_seq_cst) & masks[w];
	// The owner's reference goes before any consumer sees the frame, so a sole
	// consumer finds itself the only holder (writable in place) from the start. Its
	// writes are covered by `ready`: no done word of its own.
	(void)pool_.release(index, nullptr, false);
	g.detach();
	for (uint32_t i = 0; i < ntargets; i++) {
		uint32_t bit = 1 + targets[i];
		if (taken[bit / 64] & holder_mask(bit)) {
			queues.count_dropped(targets[i]);
			continue;
		}
		queues.push(targets[i], index);
		// A consumer that detached after we looked drains its queue, then stops;
		// we stored tail, then read `detached` (it does the reverse): one of us
		// takes this entry back.
		if (seg.consumer(targets[i])->detached.load(std::memory_order_seq_cst))
			for (uint32_t n = 0; n <= seg.ring_capacity && queues.drop_oldest(targets[i]); n++)
				;
	}
	spill.after_push();
	return {};
}

Result<uint32_t> Publisher::lease(uint64_t size, Memory memory)
{
	auto g = acquire(size, memory, 0, nullptr);
	if (!g)
		return g.error();
	uint32_t slot = g->index_;
	g->detach(); // the reference stays, the lease's
	return slot;
}

Result<std::optional<Ticket>> Publisher::publish_lease(uint32_t slot, const FrameMeta &meta,
						       std::span<const std::byte> side, uint32_t redemptions,
						       int64_t ttl_ns, const Origin &origin)
{
	BufferGuard g = pool_.make_guard(slot, true); // the lease's reference
	g.meta_ = meta;
	if (!side.empty())
		g.side_data_ = std::make_shared<const std::vector<std::byte>>(side.begin(), side.end());
	if (redemptions == 0) {
		if (auto published = publish(std::move(g), nullptr, origin); !published)
			return published.error();
		return std::optional<Ticket>();
	}
	auto ticket = publish_ticket(std::move(g), redemptions, ttl_ns, nullptr, origin);
	if (!ticket)
		return ticket.error();
	return std::optional<Ticket>(*ticket);
}

Result<Ticket> Publisher::publish_ticket(BufferGuard &&frame, uint32_t redemptions, int64_t ttl_ns, void *stream,
					 const Origin &origin)
{
	BufferGuard g = std::move(frame);
	if (redemptions == 0)
		return make_error(Errc::invalid_argument, pool_.where() + ": a ticket for 0 redemptions");
	if (ttl_ns <= 0)
		return make_error(Errc::invalid_argument, pool_.where() + ": a ticket's time to live must be positive");
	uint64_t check = tickets.draw_check();
	std::unique_lock lock(publish_lock, std::defer_lock);
	auto seq = put_out(g, stream, lock, check, redemptions, origin);
	if (!seq) {
		refuse(std::move(g), origin);
		return seq.error();
	}
	// The owner's reference stays, for the ticket: the guard lets go of the slot without
	// releasing it.
	uint32_t index = g.index_;
	g.detach();
	tickets.add(index, deadline_after(ttl_ns));
	return Ticket{ index, *seq, check };
}

Result<void> Publisher::end_of_stream()
{
	std::lock_guard lock(publish_lock);
	queues.end_of_stream();
	return {};
}

void Publisher::shutdown()
{
	if (shut.exchange(true, std::memory_order_acq_rel))
		return;
	// Wake this process's threads waiting in acquire() or a block-policy publish()
	// first: the latter holds publish_lock, which we take below.
	if (seg.header) {
		seg.header->progress.fetch_add(1, std::memory_order_seq_cst);
		futex_wake_all(&seg.header->progress);
	}
	// The I/O thread ends, guests hang up, the name is released.
	peers.stop();
	spill.stop();
	// Consumers take a hang-up for the owner's death and stop waiting for its queued GPU
	// writes: those land first (ready words, spill copies), within a deadline, so a
	// close loses no frame still being written (tests/model, Finding 7).
	uint64_t drain_deadline = deadline_after(kCloseDrainTimeoutNs);
	pool_.each_sync([&](DeviceSync &sync) { (void)sync.drain_ready(drain_deadline); });
	if (pool_.device_spill)
		(void)pool_.device_spill->drain(deadline_after(kCloseDrainTimeoutNs));
	{
		std::lock_guard lock(publish_lock);
		// Tickets end with the pool: redemptions from here on are refused.
		if (seg.header)
			tickets.end(true);
		if (seg.header) {
			seg.header->state.store(kPoolClosed, std::memory_order_seq_cst);
			// Wake this process's own threads waiting in acquire() or publish().
			seg.header->progress.fetch_add(1, std::memory_order_seq_cst);
			futex_wake_all(&seg.header->progress);
		}
		queues.close();
	}
}

// I/O thread

Publisher::Publisher(PoolImpl &pool) : pool_(pool), seg(pool.seg)
{
}

Publisher::~Publisher()
{
	shutdown();
}

Result<std::shared_ptr<PoolImpl>> Publisher::create(std::string_view name, std::string path, const PoolConfig &config)
{
	auto impl = std::make_shared<PoolImpl>();
	impl->role = Role::owner;
	impl->name = std::string(name);
	impl->path = std::move(path);
	auto valid = owner::validate_config(impl->where(), config);
	if (!valid)
		return valid.error();
	auto claimed = rendezvous::claim(impl->path, config.mode, config.group);
	if (!claimed)
		return claimed.error();
	// From here on, a failure releases the name again (~Publisher shuts down).
	impl->publisher = std::make_unique<Publisher>(*impl);
	impl->publisher->peers.adopt(std::move(claimed.value()));

	ArenaSpec spec{ impl->name, config.storage, config.device, config.slot_count, config.slot_size, config.mode };
	auto arena = create_arena(spec);
	if (!arena)
		return arena.error();
	impl->arena = std::move(arena.value());

	SegmentParams params;
	params.slot_count = owner::slot_records(config);
	params.first_class_slots = config.slot_count;
	params.max_consumers = config.max_consumers;
	params.slot_size = config.slot_size;
	params.slot_stride = impl->arena->slot_stride();
	params.storage = config.storage;
	params.device = config.device;
	params.policy = config.policy;
	params.mode = config.mode;
	params.block_timeout_ns = uint64_t(config.block_timeout.count());
	params.producer = config.producer;
	if (config.spill_bytes) {
		params.spill_bytes = config.spill_bytes;
		params.spill_frames = config.spill_frames
					      ? config.spill_frames
					      : uint32_t(std::clamp<uint64_t>(config.spill_bytes / config.slot_size, 1,
									      kMaxSpillFrames));
	}
	const Memory memory{ config.storage, config.device };
	params.sync_mode = ordering_wanted(memory);
	auto identity = memory_identity(memory, impl->where());
	if (!identity)
		return identity.error();
	params.device_uuid = identity->uuid;
	params.device_is_mig = identity->mig;
	auto seg = ControlSegment::create(impl->name, params);
	if (!seg)
		return seg.error();
	impl->seg = std::move(seg.value());
	if (params.spill_frames) {
		auto tier = SpillTier::create(impl->name, params.spill_frames, impl->seg.constants().spill_bytes,
					      config.mode);
		if (!tier)
			return make_error(tier.code(), impl->where() + ": spill tier: " + tier.error().message);
		impl->spill = std::make_unique<SpillTier>(std::move(tier.value()));
	}
	DeviceSync *sync = nullptr;
	{
		std::lock_guard lock(impl->classes_lock);
		auto made = impl->add_sync(*impl->arena, params.sync_mode == kSyncStreamMemOps);
		if (!made)
			return made.error();
		sync = *made;
	}
	if (sync) {
		// No consumer has seen the segment yet: record what this owner really does.
		impl->seg.set_sync_mode(sync->mode());
		if (impl->spill) {
			std::string notice;
			auto copier = make_device_spill(*sync, impl->spill->memory(), &notice);
			if (!copier)
				return make_error(copier.code(), impl->where() + ": " + copier.error().message);
			impl->device_spill = std::move(copier.value());
			if (!notice.empty())
				(void)std::fprintf(stderr, "xmem: %s: %s\n", impl->where().c_str(), notice.c_str());
		}
	}
	impl->local_refs.assign(impl->index_count(), 0);
	impl->exclusive.assign(impl->seg.slot_count, 0);
	impl->writers.assign(impl->seg.slot_count, nullptr);
	impl->publisher->frame_gens.assign(impl->seg.slot_count, 0);
	{
		std::lock_guard lock(impl->classes_lock);
		impl->add_class(0, impl->seg.classes[0], impl->arena.get(), sync);
	}

	auto started = impl->publisher->start(config);
	if (!started)
		return started.error();
	return impl;
}

Result<void> Publisher::start(const PoolConfig &config)
{
	// The owner's own copies: consumers can write to the shared header.
	std::memcpy(config_producer, seg.header->producer, sizeof(config_producer));
	owner_pid = seg.constants().owner_pid;
	if (auto grown = growth.start(config); !grown)
		return grown.error();
	queues.start();
	pool_.format.store(std::make_shared<const std::string>());
	auto fmt = set_format(config.format);
	if (!fmt)
		return fmt.error();
	if (auto timer = tickets.start(); !timer)
		return timer.error();
	spill.start();
	return peers.start(config);
}

} // namespace xmem
