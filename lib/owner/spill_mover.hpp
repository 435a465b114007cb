// owner/spill_mover.hpp - the spill tier as the owner fills it: frames queued only for
// fifo-spill consumers move out of their slots, and the thread that does so ahead of need.
#pragma once

#include "queues.hpp"

#include <condition_variable>
#include <thread>
#include <vector>

namespace xmem::owner {

// The owner's mover into the spill tier (docs/design.md, "The spill tier"). Its fields are
// under the owner's publish_lock (LOCK below), which every call but in_flight() and stop()
// is made with; the spill thread takes it too. A pool without a spill tier moves nothing.
class SpillMover
{
public:
	// SHUT: the owner's closing flag (set once, read here).
	SpillMover(PoolImpl &pool, ConsumerQueues &queues, std::mutex &publish_lock, const std::atomic<bool> &shut);

	// Room for the tier's buffers, and the spill thread (a pool with a tier).
	void start();
	// The spill thread ends (shut set before): no spill from here on. Without the lock.
	void stop();
	// Under slot pressure, LOCK held: the slot whose frame is queued only for fifo-spill
	// consumers and will be used last moves into the spill tier (or, the tier being
	// full, their fallbacks apply). False when no slot qualifies.
	// DEADLINE_NS bounds a CPU wait for the frame's GPU writes (device pools whose GPU
	// work is ordered on the CPU). LOCK is let go during a system pool's copy, the slot
	// held by the owner's bit meanwhile. Only slots of the classes in mask CLASSES are
	// spilled. AHEAD (the spill thread's): a full tier (or a failed copy) then moves
	// nothing, since no acquire waits yet and a consumer catching up may empty the tier
	// meanwhile; the producer's next acquire applies the fallbacks if it still needs a slot.
	bool spill_one(std::unique_lock<std::mutex> &lock, uint64_t deadline_ns,
		       uint32_t classes = ConsumerQueues::kAllClasses, bool ahead = false);
	// A publish chose its targets: buffers of consumers that caught up go back to the
	// tier, or an idle tier is trimmed on the spill thread.
	void after_targets();
	// A publish queued its frame: the spill thread spills ahead when fewer than
	// kSpillReserve slots are left free and a fifo-spill consumer is attached.
	void after_push();
	// Consumer C is reaped: its holds on spilled frames go, and buffers nobody holds
	// go back to the tier.
	void forget_consumer(uint32_t c);
	// Whether a spill is copying now (its slot held by the owner's bit, LOCK let go): an
	// acquire waits for it even when its time is up. Without the lock.
	bool in_flight() const { return spills_in_flight.load(std::memory_order_seq_cst) != 0; }

private:
	// Where a fifo-spill consumer's queue holds a slot's frame (spill_one's candidates).
	struct Queued {
		uint32_t consumer;
		uint64_t position;
	};
	// The tier is full (or the copy failed) for the frame in slot BEST, queued for
	// BEST_QUEUED: the fifo-spill consumer that will read the most of the tier last loses
	// a frame it alone holds, by its fallback; where it alone holds none, BEST's consumers
	// lose that frame, each by its fallback. False when nothing moved.
	bool spill_refused(uint32_t best, const std::vector<Queued> &best_queued);
	// The owner's hold on a slot it spilled (or failed to) goes.
	void let_go_spilled_slot(uint32_t index);
	// Spill buffers no consumer holds any more go back to the tier.
	void collect();
	// The tier's free pages go back to the kernel (it has been idle kSpillTrimNs), in
	// pieces with LOCK let go between them. False when it spilled again meanwhile and
	// the trim stopped.
	bool trim(std::unique_lock<std::mutex> &lock);
	// The spill thread: spills ahead, after each publish that left fewer than
	// kSpillReserve slots free, so that the producer's next acquire finds one at once
	// rather than copying a frame itself; and trims the tier once it is idle.
	void loop();

	PoolImpl &pool_;
	ControlSegment &seg;
	ConsumerQueues &queues;
	std::mutex &publish_lock;
	const std::atomic<bool> &shut;
	std::thread thread;
	std::condition_variable wanted_cv; // with publish_lock
	bool wanted = false;
	std::vector<uint32_t> spilled_buffers; // spill buffers in use
	// Spills so far, and each buffer's spill_seq (the owner's own copy): a buffer goes
	// back only once its spill_ready reached it.
	uint64_t spill_count = 0;
	std::vector<uint64_t> spill_seqs;
	// Spills between their owner bit's set and clear (their copy in flight, the lock let
	// go). Any thread reads it.
	std::atomic<uint32_t> spills_in_flight{ 0 };
	uint64_t last_spill_ns = 0;
	bool untrimmed = false; // freed buffers' pages are kept
};

} // namespace xmem::owner
