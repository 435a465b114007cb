// owner/queues.cpp - the consumers' queues as the owner serves them: admission to and
// removal from the set, publish's policy step, pushes, drops and the end of stream.
#include "queues.hpp"

#include <algorithm>

#include <sys/socket.h>
#include <unistd.h>

namespace xmem::owner {

using namespace layout;

namespace {

// Sleeps until DONE() or DEADLINE. Consumers bump `progress` when they release a
// slot or take a frame while the owner waits; the reaper bumps it too.
template<typename Done>
bool wait_for_progress(ControlHeader *header, Done done, uint64_t deadline_ns)
{
	for (;;) {
		if (done())
			return true;
		if (monotonic_ns() >= deadline_ns)
			return false;
		header->owner_waiting.fetch_add(1, std::memory_order_seq_cst);
		uint32_t seen = header->progress.load(std::memory_order_seq_cst);
		if (done()) {
			header->owner_waiting.fetch_sub(1, std::memory_order_seq_cst);
			return true;
		}
		futex_wait(&header->progress, seen, deadline_ns);
		header->owner_waiting.fetch_sub(1, std::memory_order_seq_cst);
	}
}

} // namespace

ConsumerQueues::ConsumerQueues(PoolImpl &pool, const std::atomic<bool> &shut) : pool_(pool), seg(pool.seg), shut(shut)
{
}

void ConsumerQueues::start()
{
	served_.assign(seg.max_consumers, Served{});
	generation_.assign(seg.max_consumers, 0);
	conn_.resize(seg.max_consumers);
	event_.resize(seg.max_consumers);
	delivered_.resize(seg.max_consumers);
}

bool ConsumerQueues::attached(uint32_t c) const
{
	return std::find(active_.begin(), active_.end(), c) != active_.end();
}

void ConsumerQueues::attach(uint32_t c, const Served &how, UniqueFd event, UniqueFd conn)
{
	served_[c] = how;
	generation_[c]++;
	delivered_[c].clear();
	active_.push_back(c);
	event_[c] = std::move(event);
	conn_[c] = std::move(conn);
}

void ConsumerQueues::detach(uint32_t c)
{
	active_.erase(std::remove(active_.begin(), active_.end(), c), active_.end());
	generation_[c]++; // a spill copying meanwhile moves none of its entries
	delivered_[c].clear();
}

UniqueFd ConsumerQueues::take_connection(uint32_t c)
{
	if (c >= conn_.size())
		return UniqueFd();
	event_[c].reset();
	return std::move(conn_[c]);
}

void ConsumerQueues::hang_up(uint32_t c)
{
	::shutdown(conn_[c].get(), SHUT_RDWR);
}

void ConsumerQueues::close()
{
	for (uint32_t c : active_) {
		seg.consumer(c)->armed.store(0, std::memory_order_relaxed);
		uint64_t one = 1;
		[[maybe_unused]] ssize_t n = ::write(event_[c].get(), &one, sizeof(one));
	}
	// Consumers keep their mappings: the memfds live on until the last one unmaps,
	// so closing never waits for them and never frees memory under them.
	active_.clear();
	conn_.clear();
	event_.clear();
}

std::optional<uint32_t> ConsumerQueues::take_head(uint32_t c)
{
	ConsumerRecord *rec = seg.consumer(c);
	for (;;) {
		uint64_t h = rec->head.load(std::memory_order_acquire);
		uint64_t t = rec->tail.load(std::memory_order_relaxed);
		if (h == t || t - h > seg.ring_capacity)
			return std::nullopt;
		std::atomic<uint64_t> &cell = ring_of(rec)[h % seg.ring_capacity];
		uint64_t e = cell.load(std::memory_order_acquire);
		if (uint32_t(e >> 32) != uint32_t(h)) {
			if (rec->head.load(std::memory_order_acquire) != h)
				continue; // the consumer moved on
			// Not what this owner pushed there: the consumer wrote its ring. Hang up
			// on it; the I/O thread reaps it.
			hang_up(c);
			return std::nullopt;
		}
		uint32_t what = uint32_t(e);
		// The consumer's take_entry() claims entries the same way: one claimer each.
		if (what != kTakenEntry &&
		    !cell.compare_exchange_strong(e, ring_entry(h, kTakenEntry), std::memory_order_seq_cst))
			continue;
		uint64_t expected = h;
		rec->head.compare_exchange_strong(expected, h + 1, std::memory_order_seq_cst);
		if (what != kTakenEntry)
			return what;
	}
}

void ConsumerQueues::let_go(uint32_t c, uint32_t what)
{
	uint32_t bit = 1 + c;
	if (auto index = pool_.entry_index(what))
		pool_.record(*index).holders[bit / 64].fetch_and(~holder_mask(bit), std::memory_order_seq_cst);
}

bool ConsumerQueues::drop_oldest(uint32_t c)
{
	auto what = take_head(c);
	if (!what)
		return false;
	if (*what == kEosEntry || *what == kSkipEntry)
		return true; // no frame: nothing to count
	let_go(c, *what);
	count_dropped(c);
	pool_.notify_owner(); // another owner thread may be waiting in acquire()
	return true;
}

void ConsumerQueues::count_dropped(uint32_t c)
{
	seg.consumer(c)->dropped.fetch_add(1, std::memory_order_relaxed);
	seg.header->dropped.fetch_add(1, std::memory_order_relaxed);
}

uint32_t ConsumerQueues::held(uint32_t c)
{
	uint32_t bit = 1 + c;
	uint64_t mask = holder_mask(bit);
	std::vector<uint32_t> &slots = delivered_[c];
	std::erase_if(slots, [&](uint32_t i) {
		return (seg.slots[i].holders[bit / 64].load(std::memory_order_seq_cst) & mask) == 0;
	});
	uint32_t n = uint32_t(slots.size());
	if (served_[c].policy == Policy::fifo_spill)
		ring(c).scan([&](uint64_t, uint64_t, uint32_t what) {
			if (what < seg.slot_count && n > 0)
				n--;
			return false;
		});
	return n;
}

uint32_t ConsumerQueues::give_history(uint32_t c, uint32_t n)
{
	if (n == 0)
		return 0;
	uint32_t bit = 1 + c;
	uint64_t mask = holder_mask(bit);
	auto let_go_of = [&](SlotRecord &slot) {
		slot.holders[bit / 64].fetch_and(~mask, std::memory_order_seq_cst);
		pool_.notify_owner(); // an acquire may have passed it over meanwhile
	};
	// Every published frame of the queues (a ticket's or a counted frame's are for their
	// own holders), held as a get() probe holds one: the bit, then the state. An acquire
	// reclaiming the slot CASes the state, then reads the bits: it sees ours and backs
	// off, or we see its state and let go. Held and PUBLISHED, its metadata stays put.
	std::vector<std::pair<uint64_t, uint32_t>> held;
	uint32_t end = pool_.slots_end();
	for (uint32_t i = 0; i < end; i++) {
		SlotRecord &slot = seg.slots[i];
		if (slot.state.load(std::memory_order_acquire) != kSlotPublished ||
		    slot.counted.load(std::memory_order_relaxed) != 0)
			continue;
		if (slot.holders[bit / 64].fetch_or(mask, std::memory_order_seq_cst) & mask)
			continue; // not ours to take: a fresh record has no bit anywhere
		if (slot.state.load(std::memory_order_seq_cst) != kSlotPublished ||
		    slot.counted.load(std::memory_order_relaxed) != 0 || slot.meta.seq == 0) {
			let_go_of(slot);
			continue;
		}
		held.emplace_back(slot.meta.seq, i);
	}
	// The newest N, oldest first; the others go back.
	std::sort(held.begin(), held.end(), std::greater<>());
	for (size_t k = n; k < held.size(); k++)
		let_go_of(seg.slots[held[k].second]);
	held.resize(std::min<size_t>(held.size(), n));
	std::reverse(held.begin(), held.end());
	for (auto [seq, i] : held)
		push(c, i);
	return uint32_t(held.size());
}

bool ConsumerQueues::drop_globally_oldest(uint32_t classes)
{
	// The oldest queued frame, preferring one whose slot this drop frees outright
	// (no other holder): dropping a frame that is held elsewhere frees nothing yet.
	uint32_t victim = UINT32_MAX, freeing = UINT32_MAX;
	uint64_t oldest = UINT64_MAX, oldest_freeing = UINT64_MAX;
	for (uint32_t c : active_) {
		// Only consumers that chose to lose queued frames lose them to slot pressure.
		if (served_[c].policy != Policy::drop_oldest && served_[c].policy != Policy::latest)
			continue;
		ConsumerRecord *rec = seg.consumer(c);
		uint64_t h = rec->head.load(std::memory_order_acquire);
		if (h == rec->tail.load(std::memory_order_relaxed))
			continue;
		// A hint only: drop_oldest() takes whatever is at the head by then.
		uint32_t index = uint32_t(ring_of(rec)[h % seg.ring_capacity].load(std::memory_order_relaxed));
		if (index >= seg.slot_count || !in_classes(index, classes))
			continue;
		uint64_t seq = seg.slots[index].meta.seq;
		if (seq < oldest) {
			oldest = seq;
			victim = c;
		}
		if (sole_holder(seg.slots[index], 1 + c) && seq < oldest_freeing) {
			oldest_freeing = seq;
			freeing = c;
		}
	}
	if (freeing != UINT32_MAX)
		victim = freeing;
	return victim != UINT32_MAX && drop_oldest(victim);
}

bool ConsumerQueues::in_classes(uint32_t index, uint32_t classes) const
{
	if (classes == kAllClasses)
		return true;
	auto c = pool_.class_of(index);
	return c && (classes & (uint32_t{ 1 } << *c));
}

void ConsumerQueues::push(uint32_t c, uint32_t what)
{
	ConsumerRecord *rec = seg.consumer(c);
	if (what < seg.slot_count && std::find(delivered_[c].begin(), delivered_[c].end(), what) == delivered_[c].end())
		delivered_[c].push_back(what);
	uint64_t t = rec->tail.load(std::memory_order_relaxed);
	ring_of(rec)[t % seg.ring_capacity].store(ring_entry(t, what), std::memory_order_relaxed);
	rec->tail.store(t + 1, std::memory_order_seq_cst);
	rec->queued_total.fetch_add(1, std::memory_order_relaxed);
	// The consumer arms, then re-reads tail; we store tail, then read armed. One of
	// us sees the other, so a sleeping consumer is always woken, and a busy one
	// costs no syscall.
	if (rec->armed.load(std::memory_order_seq_cst) && rec->armed.exchange(0, std::memory_order_seq_cst)) {
		uint64_t one = 1;
		[[maybe_unused]] ssize_t n = ::write(event_[c].get(), &one, sizeof(one));
	}
}

// Publish's policy step, publish_lock held. Each consumer's own policy decides what its
// full queue, or its cap on slots held, does: drop its oldest frame (drop-oldest, latest),
// skip this one for it (drop-new), or wait for it (fifo), then fall back to what it
// chose; fifo-spill never waits here (its queue is as deep as the pool's ring). At its
// cap only a queued frame in a slot makes room: with none, the frame is lost to it. The
// waits of one publish share its start, so consumers stuck together cost one block
// timeout, not one each.
uint32_t ConsumerQueues::choose_targets(uint32_t *targets, uint64_t *masks, uint32_t except)
{
	uint32_t ntargets = 0;
	uint64_t start = 0;
	for (uint32_t c : active_) {
		if (c == except)
			continue;
		ConsumerRecord *rec = seg.consumer(c);
		const Served &how = served_[c];
		bool take = rec->detached.load(std::memory_order_seq_cst) == 0;
		// Room in its queue, and under its cap (counted only when the queue has room).
		auto room = [&] {
			return rec->tail.load(std::memory_order_relaxed) - rec->head.load(std::memory_order_seq_cst) <
				       how.queue_size &&
			       (how.max_held == UINT32_MAX || held(c) < how.max_held);
		};
		while (take) {
			uint64_t h = rec->head.load(std::memory_order_acquire);
			uint64_t t = rec->tail.load(std::memory_order_relaxed);
			if (t - h > seg.ring_capacity) {
				// Its head is garbage: hang up on it, the I/O thread reaps it.
				hang_up(c);
				take = false;
				break;
			}
			bool capped = false;
			if (t - h < how.queue_size) {
				if (how.max_held == UINT32_MAX || held(c) < how.max_held)
					break;
				capped = true;
			}
			Policy act = how.policy;
			if (act == Policy::fifo) {
				if (start == 0)
					start = monotonic_ns();
				uint64_t deadline = start + how.block_timeout_ns;
				// A consumer that closes its handle (detached) takes no more frames: the
				// wait ends there, not when the I/O thread reaps it, which needs the
				// publish lock this wait holds. Nor is one waited for while its process
				// is in a guest's call, which this lock holds up on the I/O thread.
				bool moved = wait_for_progress(
					seg.header,
					[&] {
						return shut.load(std::memory_order_acquire) ||
						       rec->state.load(std::memory_order_seq_cst) != kConsumerActive ||
						       rec->detached.load(std::memory_order_seq_cst) != 0 ||
						       rec->producing.load(std::memory_order_seq_cst) != 0 || room();
					},
					deadline);
				if (shut.load(std::memory_order_acquire) ||
				    rec->state.load(std::memory_order_seq_cst) != kConsumerActive ||
				    rec->detached.load(std::memory_order_seq_cst) != 0) {
					take = false;
					break;
				}
				// Room came, or it was waited for until its process went into a guest's
				// call: then its fallback applies now rather than at the block timeout.
				if (moved && (room() || rec->producing.load(std::memory_order_seq_cst) == 0))
					continue;
			}
			if (act == Policy::fifo || act == Policy::fifo_spill)
				act = how.fallback;
			if (act == Policy::drop_new) {
				count_dropped(c);
				take = false;
				break;
			}
			if (capped) {
				// Drop-oldest, latest, or a fallback to drop-oldest, at its cap: its
				// oldest queued frame in a slot goes (a fifo-spill consumer's queued ones
				// are not counted: dropping one frees nothing of its cap). None: it
				// holds every slot of its cap, and loses this frame.
				if (how.policy != Policy::fifo_spill && drop_oldest_slot_frame(c))
					continue;
				count_dropped(c);
				take = false;
				break;
			}
			// drop-oldest, latest, or a fallback to drop-oldest. Nothing to drop in a
			// full queue: its record was written by another process (take_head hung
			// up on it): no frame for it, and no endless loop under publish_lock.
			if (!drop_oldest(c)) {
				take = false;
				break;
			}
		}
		if (!take)
			continue;
		targets[ntargets++] = c;
		masks[(1 + c) / 64] |= holder_mask(1 + c);
	}
	return ntargets;
}

bool ConsumerQueues::drop_in_place(uint32_t c, uint64_t position, uint32_t what)
{
	ConsumerRecord *rec = seg.consumer(c);
	uint64_t e = ring_entry(position, what);
	if (!ring_of(rec)[position % seg.ring_capacity].compare_exchange_strong(e, ring_entry(position, kSkipEntry),
										std::memory_order_seq_cst))
		return false; // the consumer took it meanwhile
	let_go(c, what);
	count_dropped(c);
	return true;
}

bool ConsumerQueues::drop_oldest_frame(uint32_t c)
{
	return ring(c).scan([&](uint64_t k, uint64_t, uint32_t what) {
		return pool_.entry_index(what) && drop_in_place(c, k, what);
	});
}

bool ConsumerQueues::drop_oldest_slot_frame(uint32_t c)
{
	return ring(c).scan([&](uint64_t k, uint64_t, uint32_t what) {
		return what < seg.slot_count && drop_in_place(c, k, what);
	});
}

void ConsumerQueues::end_of_stream()
{
	for (uint32_t c : active_) {
		ConsumerRecord *rec = seg.consumer(c);
		// EOS may use the ring's spare entry, so a full queue does not hold it back.
		uint64_t queued;
		while ((queued = rec->tail.load(std::memory_order_relaxed) -
				 rec->head.load(std::memory_order_acquire)) >= seg.ring_capacity) {
			if (queued > seg.ring_capacity || !drop_oldest(c))
				break; // garbage head or ring: this consumer is hung up on
		}
		if (queued >= seg.ring_capacity)
			continue;
		push(c, kEosEntry);
	}
}

} // namespace xmem::owner
