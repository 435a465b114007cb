// owner/queues.hpp - the consumers' queues as the owner serves them: each consumer's
// policy and connection, its ring, and the frames pushed to it or dropped from it.
#pragma once

#include "../pool_impl.hpp"

#include <vector>

namespace xmem::owner {

// How a consumer is served: the owner's own copy of what it admitted (the shared record's
// copy is for xmem-inspect; a consumer could rewrite that one).
struct Served {
	Policy policy = Policy::drop_oldest;
	Policy fallback = Policy::drop_oldest; // fifo, fifo-spill
	uint32_t queue_size = 0;
	uint64_t block_timeout_ns = 0; // fifo
	// The most slots it may hold, queued or taken (a fifo-spill consumer's queued frames
	// do not count); UINT32_MAX: no cap.
	uint32_t max_held = UINT32_MAX;
};

// One consumer's ring as the owner reads it. Its head and tail are in shared memory, so
// the consumer may have written anything there: every scan is bounded by the capacity,
// and an entry counts only when it carries its own position's tag (ring_entry()).
class Ring
{
public:
	Ring(layout::ConsumerRecord *rec, uint32_t capacity) : rec_(rec), capacity_(capacity) {}
	std::atomic<uint64_t> &cell(uint64_t position) const { return layout::ring_of(rec_)[position % capacity_]; }
	// VISIT(position, what) for each entry between head and tail that is what the owner
	// pushed there, head first (NEWEST_FIRST: tail first); stops at the first that returns
	// true, and says whether one did. Nothing when head and tail are garbage.
	template<typename Visit>
	bool scan(Visit visit, bool newest_first = false) const
	{
		uint64_t h = rec_->head.load(std::memory_order_acquire);
		uint64_t t = rec_->tail.load(std::memory_order_relaxed);
		if (t - h > capacity_)
			return false;
		for (uint64_t n = 0; n < t - h; n++) {
			uint64_t k = newest_first ? t - 1 - n : h + n;
			uint64_t e = cell(k).load(std::memory_order_acquire);
			if (uint32_t(e >> 32) == uint32_t(k) && visit(k, k - h, uint32_t(e)))
				return true;
		}
		return false;
	}

private:
	layout::ConsumerRecord *rec_;
	uint32_t capacity_;
};

// The attached consumers, how each is served, and their queues. Every field and call is
// under the owner's publish_lock unless it says otherwise (the owner's frame path holds it
// across choose_targets() and the pushes; the I/O thread while it admits or reaps).
class ConsumerQueues
{
public:
	// SHUT: the owner's closing flag (set once, read here).
	ConsumerQueues(PoolImpl &pool, const std::atomic<bool> &shut);

	// Room for the segment's max_consumers: before any other call.
	void start();

	const std::vector<uint32_t> &active() const { return active_; }
	bool attached(uint32_t c) const;
	const Served &served(uint32_t c) const { return served_[c]; }
	// Bumped at attach and detach: a spill that let the lock go knows whether a consumer
	// it queued for is still the same one.
	uint64_t generation(uint32_t c) const { return generation_[c]; }
	// Record C, reset by its admission, is served as HOW from now on: frames reach it
	// through its ring and EVENT; CONN is its connection (the I/O thread's to poll).
	void attach(uint32_t c, const Served &how, UniqueFd event, UniqueFd conn);
	// C gets no more frames (its record is reaped).
	void detach(uint32_t c);
	// Its connection and eventfd go; the connection is handed back so that the I/O thread
	// deregisters it before it closes.
	UniqueFd take_connection(uint32_t c);
	// The fd of C's connection (-1: none). The I/O thread's, without the lock: only it
	// and the owner's close (after joining it) change the connections.
	int connection_fd(uint32_t c) const { return c < conn_.size() ? conn_[c].get() : -1; }
	Ring ring(uint32_t c) const { return Ring(seg.consumer(c), seg.ring_capacity); }

	// Publish's policy step: the consumers that get the new frame, with their holder bits
	// in MASKS. Each consumer's own policy decides what its full queue, or its cap on
	// slots held, does; never EXCEPT.
	uint32_t choose_targets(uint32_t *targets, uint64_t *masks, uint32_t except);
	// The slots consumer C holds of those queued for it: still queued, or taken and not
	// let go (a fifo-spill consumer's still queued excepted: the spill tier takes them).
	// Forgets those it let go of.
	uint32_t held(uint32_t c);
	// Consumer C, just attached, is given the newest N frames still published in the
	// pool's slots (queue frames, not a ticket's), oldest first: those no acquire
	// reclaimed yet, held by the protocol of a get() probe. How many it was given.
	uint32_t give_history(uint32_t c, uint32_t n);
	// Queues WHAT (a slot, a spill buffer or a marker) for consumer C and wakes it.
	void push(uint32_t c, uint32_t what);
	// Consumer C's head entry is dropped (counted when a frame). False when it has none.
	bool drop_oldest(uint32_t c);
	// Under slot pressure: the oldest frame queued for a consumer whose policy lets its
	// queued frames go (drop-oldest, latest) is dropped. False when there is none. Only
	// frames in slots of the classes in mask CLASSES count (bit c: class c).
	bool drop_globally_oldest(uint32_t classes = kAllClasses);
	// Consumer C's entry at POSITION, naming WHAT, becomes `skipped` (CAS: false when C
	// claimed it first); its bit goes, counted as dropped.
	bool drop_in_place(uint32_t c, uint64_t position, uint32_t what);
	// Consumer C's oldest queued frame (never a marker: an end of stream stays) is
	// dropped in place; false when it has none queued (tests/model Finding 9).
	bool drop_oldest_frame(uint32_t c);
	// A frame consumer C lost, counted (its record's and the pool's).
	void count_dropped(uint32_t c);
	// Clears consumer C's holder bit for the frame WHAT names (slot or spill buffer).
	void let_go(uint32_t c, uint32_t what);
	// An end of stream for every consumer, after its queued frames.
	void end_of_stream();
	// The pool closes: every consumer is woken (its queue ends with the hang-up) and
	// forgotten.
	void close();
	// Whether slot INDEX is of a class in mask CLASSES.
	bool in_classes(uint32_t index, uint32_t classes) const;

	static constexpr uint32_t kAllClasses = UINT32_MAX;
	static_assert(layout::kMaxClasses <= 32);

private:
	// Claims the entry at consumer C's head as its consumer's take_entry() does: what it
	// held; none when the queue is empty (or garbage: then C is hung up on).
	std::optional<uint32_t> take_head(uint32_t c);
	// Hangs up on consumer C, whose record is garbage: the I/O thread reaps it.
	void hang_up(uint32_t c);
	// Consumer C's oldest queued frame in a slot is dropped in place (its cap: a spilled
	// frame frees no slot); false when it has none queued.
	bool drop_oldest_slot_frame(uint32_t c);

	PoolImpl &pool_;
	ControlSegment &seg;
	const std::atomic<bool> &shut;
	std::vector<uint32_t> active_;
	std::vector<Served> served_;
	std::vector<uint64_t> generation_;
	std::vector<UniqueFd> conn_;
	std::vector<UniqueFd> event_;
	// The slots queued for each consumer that it may still hold (held() forgets those
	// whose holder bit is clear): each slot once, so never more than the pool has.
	std::vector<std::vector<uint32_t>> delivered_;
};

} // namespace xmem::owner
