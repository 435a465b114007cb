// owner/spill_mover.cpp - the spill tier as the owner fills it: which slot's frame moves,
// the copy, the fallbacks of a full tier, the buffers' return and the spill thread.
#include "spill_mover.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace xmem::owner {

using namespace layout;

namespace {

// How long the spill tier keeps the pages of freed buffers after its last spill: a
// consumer that stalls again soon finds them mapped (a first touch costs more than
// the copy), an idle tier gives them back.
constexpr uint64_t kSpillTrimNs = 5'000'000'000;

// Free slots the spill thread keeps for the producer's next acquire (system pools with
// fifo-spill consumers): one, the frame the producer is about to write.
constexpr uint32_t kSpillReserve = 1;
constexpr int64_t kSpillAheadTimeoutNs = 1'000'000'000;
// How much of the tier one piece of a trim punches, publish_lock held.
constexpr uint64_t kSpillTrimChunk = 16 << 20;

} // namespace

SpillMover::SpillMover(PoolImpl &pool, ConsumerQueues &queues, std::mutex &publish_lock, const std::atomic<bool> &shut)
	: pool_(pool), seg(pool.seg), queues(queues), publish_lock(publish_lock), shut(shut)
{
}

void SpillMover::start()
{
	if (!pool_.spill)
		return;
	spill_seqs.assign(pool_.spill->frames(), 0);
	// The thread touches only this mover and what it was given, which stop() outlives
	// by joining it.
	thread = std::thread([this] { loop(); });
}

void SpillMover::stop()
{
	// `shut` was set before the lock is taken: the spill thread sees it at its next look,
	// or is waiting and wakes now.
	{
		std::lock_guard lock(publish_lock);
	}
	wanted_cv.notify_all();
	if (thread.joinable())
		thread.join();
}

void SpillMover::after_targets()
{
	if (!spilled_buffers.empty())
		collect(); // buffers of consumers that caught up go back to the tier
	else if (untrimmed && monotonic_ns() - last_spill_ns > kSpillTrimNs && !wanted) {
		// Idle a while: its pages go back to the kernel, on the spill thread (device
		// pools' tiers keep theirs).
		wanted = true;
		wanted_cv.notify_one();
	}
}

void SpillMover::forget_consumer(uint32_t c)
{
	if (!pool_.spill)
		return;
	uint32_t bit = 1 + c;
	for (uint32_t r = 0; r < pool_.spill->frames(); r++)
		pool_.spill->record(r).holders[bit / 64].fetch_and(~holder_mask(bit), std::memory_order_seq_cst);
	collect();
}

void SpillMover::collect()
{
	if (!pool_.spill)
		return;
	for (auto it = spilled_buffers.begin(); it != spilled_buffers.end();) {
		uint32_t r = *it;
		SlotRecord &rec = pool_.spill->record(r);
		// A device pool's buffer goes back once its copy has landed too: nobody may
		// have taken it, and the spill stream may still be writing it.
		if (holders_of(rec) != 0 ||
		    int64_t(rec.spill_ready.load(std::memory_order_acquire) - spill_seqs[r]) < 0) {
			++it;
			continue;
		}
		// No holder is left, and none can come back: spill buffers are only ever
		// held through queue entries, never taken by index.
		rec.state.store(kSlotFree, std::memory_order_seq_cst);
		seg.header->spill_bytes_held.fetch_sub(pool_.spill->bytes_of(r), std::memory_order_relaxed);
		seg.header->spill_frames_held.fetch_sub(1, std::memory_order_relaxed);
		pool_.spill->free(r);
		it = spilled_buffers.erase(it);
	}
}

bool SpillMover::trim(std::unique_lock<std::mutex> &lock)
{
	// A page-locked tier keeps its pages: the driver pinned them, and a hole punched
	// under the pin would leave the GPU writing pages the memfd no longer has.
	if (pool_.device_spill && pool_.device_spill->queued()) {
		untrimmed = false;
		return true;
	}
	// In pieces, publish_lock let go between them: a hole punched in hundreds of MB takes
	// tens of ms, which publish would otherwise wait out.
	uint64_t cursor = 0;
	while (!pool_.spill->trim(&cursor, kSpillTrimChunk)) {
		lock.unlock();
		std::this_thread::yield();
		lock.lock();
		if (monotonic_ns() - last_spill_ns <= kSpillTrimNs)
			return false; // it spilled again meanwhile: its pages are wanted
	}
	untrimmed = false;
	seg.header->spill_resident.store(pool_.spill->resident(), std::memory_order_relaxed);
	return true;
}

bool SpillMover::spill_one(std::unique_lock<std::mutex> &lock, uint64_t deadline_ns, uint32_t classes, bool ahead)
{
	if (!pool_.spill)
		return false;
	collect();
	// Where each fifo-spill consumer's queue holds each slot, and how far from its head.
	uint32_t best = UINT32_MAX;
	uint64_t best_next_use = 0;
	std::vector<Queued> best_queued;
	std::vector<Queued> queued;
	for (uint32_t i = 0; i < seg.slot_count; i++) {
		SlotRecord &slot = seg.slots[i];
		// EXCLUSIVE too: one left so by a holder killed in take_exclusive() has no
		// writer any more, and a live writer's bit is a reference, not a queued entry,
		// so it rules the slot out below (tests/model, SPILL_TAKES_EXCLUSIVE).
		uint32_t state = slot.state.load(std::memory_order_acquire);
		if ((state != kSlotPublished && state != kSlotExclusive) || !queues.in_classes(i, classes))
			continue;
		uint64_t words[kHolderWords];
		bool any = false;
		for (uint32_t w = 0; w < kHolderWords; w++) {
			words[w] = slot.holders[w].load(std::memory_order_seq_cst);
			any |= words[w] != 0;
		}
		if (!any || (words[0] & holder_mask(kOwnerBit)))
			continue;
		// A candidate when every holder is a fifo-spill consumer that has the frame
		// queued: its next use is the nearest of those queue positions.
		queued.clear();
		uint64_t next_use = UINT64_MAX;
		bool candidate = true;
		for (uint32_t bit = 1; bit < kHolderWords * 64 && candidate; bit++) {
			if (!(words[bit / 64] & holder_mask(bit)))
				continue;
			uint32_t c = bit - 1;
			ConsumerRecord *rec = c < seg.max_consumers ? seg.consumer(c) : nullptr;
			if (!rec || queues.served(c).policy != Policy::fifo_spill ||
			    rec->state.load(std::memory_order_acquire) != kConsumerActive) {
				candidate = false;
				break;
			}
			candidate = queues.ring(c).scan([&](uint64_t k, uint64_t distance, uint32_t what) {
				if (what != i)
					return false;
				queued.push_back(Queued{ c, k });
				next_use = std::min(next_use, distance);
				return true;
			});
		}
		if (candidate && (best == UINT32_MAX || next_use > best_next_use)) {
			best = i;
			best_next_use = next_use;
			best_queued = queued;
		}
	}
	if (best == UINT32_MAX)
		return false;

	SlotRecord &slot = seg.slots[best];
	// The owner holds the slot while it copies it: nobody reclaims it, takes it for
	// writing in place or spills it again meanwhile (a candidate has no owner bit).
	spills_in_flight.fetch_add(1, std::memory_order_seq_cst);
	uint64_t had = slot.holders[0].fetch_or(holder_mask(kOwnerBit), std::memory_order_seq_cst);
	// Since the look its consumers may have let go of the slot and the producer's
	// lock-free try_reclaim() taken it (tests/model, Finding 10). The state after the
	// bit, as get() looks against a reclaim (RECLAIMING: it goes on or backs off), and
	// an entry looked at still queued (publish_lock held since the look: only its
	// consumer's claim moves it, and until then its bit keeps the slot from a reclaim):
	// then it is the frame looked at and the bit ours, and the slot's record stays as
	// it is until the bit goes. Otherwise no spill: WRITING, the producer's now and the
	// bit its write reference (one bit stands for one), left set; another frame
	// published since (maybe held for a ticket, whose hold the bit may be): ours goes.
	uint32_t now_state = settled_state(slot);
	bool ours = !(had & holder_mask(kOwnerBit));
	bool published = now_state == kSlotPublished || now_state == kSlotExclusive;
	bool still_queued = std::any_of(best_queued.begin(), best_queued.end(), [&](const Queued &q) {
		return ring_of(seg.consumer(q.consumer))[q.position % seg.ring_capacity].load(
			       std::memory_order_seq_cst) == ring_entry(q.position, best);
	});
	if (!ours || !published || !still_queued) {
		if (ours && published)
			slot.holders[0].fetch_and(~holder_mask(kOwnerBit), std::memory_order_seq_cst);
		spills_in_flight.fetch_sub(1, std::memory_order_seq_cst);
		pool_.notify_owner(); // an acquire() may wait on the spill in flight
		return false;
	}
	// The owner's own copies of what the slot says: consumers can write the record.
	const PoolImpl::SlotClass &cls = pool_.classes[*pool_.class_of(best)];
	uint64_t size = std::min<uint64_t>(slot.meta.size, cls.slot_size);
	auto r = pool_.spill->allocate(size);
	if (!r) {
		// The tier is full: counted where the fallbacks then apply (an acquire's spill).
		let_go_spilled_slot(best);
		if (ahead)
			return false;
		seg.header->spill_full.fetch_add(1, std::memory_order_relaxed);
		return spill_refused(best, best_queued);
	}
	std::vector<uint64_t> generations;
	generations.reserve(best_queued.size());
	for (const Queued &q : best_queued)
		generations.push_back(queues.generation(q.consumer));
	SlotRecord &to = pool_.spill->record(*r);
	to.meta = slot.meta;
	to.format_seq = slot.format_seq;
	std::memcpy(to.format, slot.format, sizeof(to.format));
	uint32_t side = std::min<uint32_t>(slot.side_data_size, XMEM_SIDE_DATA_MAX);
	std::memcpy(to.side_data, slot.side_data, side);
	to.side_data_size = side;
	to.index = seg.slot_count + *r;
	to.offset = pool_.spill->offset_of(*r);
	to.spill_seq = spill_seqs[*r] = ++spill_count;
	std::byte *payload = pool_.spill->payload(to.offset).data();
	uint64_t offset = uint64_t{ best - cls.first_slot } * cls.slot_stride;
	if (pool_.device_spill) {
		// Queued on the owner's spill stream; the slot's next frame waits for it
		// in acquire() (the owner's done word), a consumer for spill_ready.
		auto copied = pool_.device_spill->spill(best, slot.meta.seq, cls.arena->device_address(offset), payload,
							size, to, deadline_ns);
		if (!copied) {
			// Nothing of the copy is left queued (spill() waited for it on a failure
			// after queueing): the buffer goes back at once.
			(void)std::fprintf(stderr, "xmem: %s: a frame could not be spilled: %s\n",
					   pool_.where().c_str(), copied.error().message.c_str());
			to.spill_ready.store(to.spill_seq, std::memory_order_release);
			pool_.spill->free(*r);
			let_go_spilled_slot(best);
			return !ahead && spill_refused(best, best_queued);
		}
	} else {
		// The copy without publish_lock: publish, attach and reap go on meanwhile. The
		// slot is held (owner bit) and PUBLISHED, so its bytes stay; the buffer is the
		// owner's until its entries are moved below.
		lock.unlock();
		std::memcpy(payload, cls.arena->host(offset), size);
		lock.lock();
		to.spill_ready.store(to.spill_seq, std::memory_order_release);
	}

	// The consumers still the ones queued for above (not reaped, or reaped and
	// replaced, while the lock was out) hold the buffer; each entry then moves by a CAS.
	uint64_t mask[kHolderWords] = {};
	for (size_t n = 0; n < best_queued.size(); n++)
		if (queues.generation(best_queued[n].consumer) == generations[n])
			mask[(1 + best_queued[n].consumer) / 64] |= holder_mask(1 + best_queued[n].consumer);
	for (uint32_t w = 0; w < kHolderWords; w++)
		to.holders[w].store(mask[w], std::memory_order_seq_cst);
	to.state.store(kSlotPublished, std::memory_order_seq_cst);
	spilled_buffers.push_back(*r);
	last_spill_ns = monotonic_ns();
	untrimmed = true;
	seg.header->spill_resident.store(pool_.spill->resident(), std::memory_order_relaxed);
	uint64_t bytes = pool_.spill->bytes_of(*r);
	uint64_t held = seg.header->spill_bytes_held.fetch_add(bytes, std::memory_order_relaxed) + bytes;
	if (held > seg.header->spill_peak.load(std::memory_order_relaxed))
		seg.header->spill_peak.store(held, std::memory_order_relaxed);
	seg.header->spill_frames_held.fetch_add(1, std::memory_order_relaxed);
	seg.header->spilled.fetch_add(1, std::memory_order_relaxed);

	// A consumer that claimed its entry first keeps the slot (its reference), and the
	// buffer loses its bit.
	for (size_t n = 0; n < best_queued.size(); n++) {
		const Queued &q = best_queued[n];
		uint32_t bit = 1 + q.consumer;
		if (queues.generation(q.consumer) != generations[n])
			continue;
		ConsumerRecord *rec = seg.consumer(q.consumer);
		uint64_t e = ring_entry(q.position, best);
		if (ring_of(rec)[q.position % seg.ring_capacity].compare_exchange_strong(
			    e, ring_entry(q.position, kSpillEntry | *r), std::memory_order_seq_cst)) {
			queues.let_go(q.consumer, best);
			rec->spilled.fetch_add(1, std::memory_order_relaxed);
		} else {
			to.holders[bit / 64].fetch_and(~holder_mask(bit), std::memory_order_seq_cst);
		}
	}
	let_go_spilled_slot(best);
	collect(); // a buffer nobody took after all goes back now
	return true;
}

void SpillMover::let_go_spilled_slot(uint32_t index)
{
	seg.slots[index].holders[0].fetch_and(~holder_mask(kOwnerBit), std::memory_order_seq_cst);
	spills_in_flight.fetch_sub(1, std::memory_order_seq_cst);
	pool_.notify_owner(); // an acquire() may wait for this slot
}

bool SpillMover::spill_refused(uint32_t best, const std::vector<Queued> &best_queued)
{
	// The tier is shared. Each buffer counts for the consumer that will read it last (the
	// furthest from its queue's head: it keeps the buffer in use after the others), and the
	// fifo-spill consumer it counts the most for loses a frame that it alone holds, the
	// oldest or the newest as its fallback says, which frees that frame's buffer or slot.
	// So one that stopped reading costs the others nothing while it holds a frame they do
	// not need. The acquire that called looks again.
	std::vector<uint64_t> last_reader(pool_.spill->frames(), UINT64_MAX); // c << 32 | distance
	for (uint32_t c : queues.active()) {
		if (queues.served(c).policy != Policy::fifo_spill)
			continue;
		queues.ring(c).scan([&](uint64_t, uint64_t distance, uint32_t what) {
			auto index = pool_.entry_index(what);
			if (!index || !pool_.is_spill(*index))
				return false;
			uint64_t &reader = last_reader[*index - seg.slot_count];
			if (reader == UINT64_MAX || uint32_t(reader) < distance)
				reader = uint64_t{ c } << 32 | uint32_t(distance);
			return false;
		});
	}
	std::vector<uint64_t> counted(seg.max_consumers, 0);
	uint32_t hog = UINT32_MAX;
	for (uint32_t r = 0; r < last_reader.size(); r++) {
		if (last_reader[r] == UINT64_MAX)
			continue;
		uint32_t c = uint32_t(last_reader[r] >> 32);
		counted[c] += pool_.spill->bytes_of(r);
		if (hog == UINT32_MAX || counted[c] > counted[hog])
			hog = c;
	}
	bool moved = false;
	if (hog != UINT32_MAX) {
		bool newest = queues.served(hog).fallback == Policy::drop_new;
		moved = queues.ring(hog).scan(
			[&](uint64_t k, uint64_t, uint32_t what) {
				auto index = pool_.entry_index(what);
				return index && sole_holder(pool_.record(*index), 1 + hog) &&
				       queues.drop_in_place(hog, k, what);
			},
			newest);
		collect(); // its buffer goes back now
	}
	if (moved)
		return true;
	// It alone holds nothing (every consumer needs every spilled frame it holds, or the
	// tier's pages could not be had): the frame's consumers lose it, each by its fallback.
	for (const Queued &q : best_queued)
		moved |= queues.served(q.consumer).fallback == Policy::drop_oldest
				 ? queues.drop_oldest_frame(q.consumer)
				 : queues.drop_in_place(q.consumer, q.position, best);
	return moved;
}

void SpillMover::loop()
{
	std::unique_lock lock(publish_lock);
	for (;;) {
		wanted_cv.wait(lock, [this] { return wanted || shut.load(std::memory_order_acquire); });
		if (shut.load(std::memory_order_acquire))
			return;
		wanted = false;
		if (spilled_buffers.empty() && untrimmed && monotonic_ns() - last_spill_ns > kSpillTrimNs)
			(void)trim(lock);
		for (;;) {
			uint32_t free = 0;
			for (uint32_t i = 0; i < seg.slot_count; i++)
				free += slot_is_free(seg.slots[i]) ? 1 : 0;
			if (free >= kSpillReserve || shut.load(std::memory_order_acquire) ||
			    !spill_one(lock, deadline_after(kSpillAheadTimeoutNs), ConsumerQueues::kAllClasses, true))
				break;
		}
	}
}

void SpillMover::after_push()
{
	if (thread.joinable() && !wanted) {
		bool spilling = std::any_of(queues.active().begin(), queues.active().end(), [this](uint32_t c) {
			return queues.served(c).policy == Policy::fifo_spill;
		});
		uint32_t free = 0;
		for (uint32_t i = 0; spilling && i < seg.slot_count && free < kSpillReserve; i++)
			free += slot_is_free(seg.slots[i]) ? 1 : 0;
		if (spilling && free < kSpillReserve) {
			wanted = true;
			wanted_cv.notify_one();
		}
	}
}

} // namespace xmem::owner
