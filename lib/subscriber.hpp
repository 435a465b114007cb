// subscriber.hpp - a consumer's role (or an inspector's): the attach handshake with
// every check on what the owner sent, receive() and its sleep/wake protocol.
#pragma once

#include "pool_impl.hpp"
#include "spin_wake.hpp"

#include <optional>
#include <thread>

namespace xmem {

class Subscriber final : public OwnerLink
{
public:
	// Attaches to pool NAME at PATH, waiting up to options.timeout for it.
	static Result<std::shared_ptr<PoolImpl>> open(std::string_view name, std::string path,
						      const OpenOptions &options);

	explicit Subscriber(PoolImpl &pool);
	~Subscriber();
	Subscriber(const Subscriber &) = delete;
	Subscriber &operator=(const Subscriber &) = delete;

	Result<BufferGuard> receive(int64_t timeout_ns, void *stream);
	// No more frames for this handle; frames still held by guards stay held.
	void detach_queue();
	// Polls readable when receive() may return without waiting (-1 for an inspector).
	int fd() const { return epoll.valid() ? epoll.get() : -1; }
	bool owner_gone() const override { return owner_gone_.load(); }
	// How the owner serves this consumer, from its record (the owner wrote it at attach).
	ConsumerStats stats() const;
	// The slots this handle holds now (frames taken and not let go, of any guard).
	uint32_t held_slots() const;
	// The owner's memory made since attach, imported (holder.hpp, OwnerLink).
	Result<void> import_classes() override;
	Result<void> map_slot(uint32_t index) override;
	void unmap_trimmed() override;

private:
	// How long the owner has to answer a hello: the attach's, or an import's.
	static constexpr uint64_t kReplyTimeoutNs = 2'000'000'000;

	Result<void> attach(const OpenOptions &options, uint64_t deadline_ns);
	// One handshake on a connected socket; Errc::closed when the owner died in it.
	Result<void> handshake(UniqueFd conn, const OpenOptions &options, uint64_t deadline_ns);
	Result<void> start_consumer(uint32_t index, UniqueFd event, const OpenOptions &options);
	// Dynamic device slots: the memory generation mapped here, by slot (0: none), and the
	// owner's trim count when they were last looked at; under slot_maps_lock, which is
	// taken before refs_lock.
	std::mutex slot_maps_lock;
	std::vector<uint32_t> mapped_gen; // sized at attach
	std::atomic<uint64_t> trims_seen{ 0 }; // also read without the lock, first
	// The memory of class record C, its device as this process numbers it (by its UUID).
	Result<Memory> memory_of(const layout::ClassRecord &c) const;
	// Size class C's record, copied out and checked against the previous class's.
	Result<layout::ClassRecord> class_record(uint32_t c) const;
	// The GPU ordering of class RECORD's memory, MEMORY its arena here: an earlier class's
	// of that device, or one made now; the first one starts the owner watch; nullptr for
	// memory the CPU orders (classes_lock held).
	Result<DeviceSync *> device_ordering(const layout::ClassRecord &record, const Arena &memory);
	// wake=spin-before: notes a frame taken (for the period it learns), and polls the
	// queue at H while NOW_NS is in the window near the expected arrival; true when a
	// frame came. Before the window, sets *SLEEP_UNTIL to its start and arms the timer.
	void note_taken(Result<BufferGuard> &frame);
	bool spin_for_frame(uint64_t h, uint64_t now_ns, uint64_t *sleep_until);
	// Replaces this consumer's arm with ARM (armed.exchange): an arm of ours the
	// owner had taken is a write owed.
	void rearm(bool arm);
	// Device pools: a thread blocked on the socket that, when the owner dies,
	// releases the ready words its GPU writes would have set (see DeviceSync).
	Result<void> watch_owner();
	// Device pools, a receive without a stream: hands out the parked frame once the
	// producer's GPU writes are done, or keeps it parked at DEADLINE_NS.
	Result<BufferGuard> deliver_parked(void *stream, uint64_t deadline_ns);
	// A parked spilled frame: the CPU waits, until DEADLINE_NS, for the owner's copy of
	// it into the tier (its spill_ready reaching parked_seq).
	Result<void> wait_spilled(uint32_t index, uint64_t deadline_ns);
	// A spilled frame of a device pool, copied: its guard as spill_delivery says.
	Result<BufferGuard> spilled_frame(uint32_t index, void *stream);
	// The parked frame goes back unread (detach, close).
	void drop_parked();
	void disarm_retry();
	// Takes the entry at ring position H (the head this caller read): what it held (a
	// slot, kSpillEntry | a spill buffer, kEosEntry, kSkipEntry), claimed and passed by
	// the head; none when another taker had it or the head had moved (read again).
	Result<std::optional<uint32_t>> take_entry(uint64_t h);
	// The received frame in slot INDEX, its layout checked (Errc::bad_frame: refused).
	Result<BufferGuard> frame_guard(uint32_t index);

	PoolImpl &pool_;
	ControlSegment &seg;

	uint32_t consumer_index = 0;
	layout::ConsumerRecord *self = nullptr;
	UniqueFd sock;
	UniqueFd event;
	UniqueFd epoll; // event + sock, the pollable fd handed to applications
	// Eventfd bookkeeping of receive(): ARM_SET, this consumer stored armed = 1 and
	// has not seen it taken since; OWED_WRITES, eventfd writes the owner owes (one per
	// arm it took, exchanging armed to 0), read off the eventfd as they land, so none
	// is left to wake a sleeper, or a poller of fd(), for nothing. Accessed under
	// receive_lock only (attach excepted, before any receive), which orders them:
	// relaxed.
	std::atomic<bool> arm_set{ false };
	std::atomic<uint32_t> owed_writes{ 0 };
	// The owner hung up: set (release) by the owner watch or a receive that saw the
	// hang-up, read (acquire) by receive, which then reports Closed.
	std::atomic<bool> owner_gone_{ false };
	// One receiver at a time. Lock order: receive_lock, then the pool's refs_lock,
	// then its format_lock.
	std::mutex receive_lock;
	std::thread owner_watch;
	UniqueFd watch_stop;
	// Device pools: a frame taken off the queue whose GPU writes were not done when a
	// stream-less receive() ran out of time. It stays this consumer's (its queue
	// reference, in local_refs) and is the next frame receive() hands out: a caller's
	// timeout bounds the wait for a frame, never whether a queued frame survives.
	// Guarded by receive_lock. While one is parked, the retry timer (in the epoll
	// set) makes fd() readable after a growing interval, so a poller comes back.
	static constexpr uint32_t kNoneParked = UINT32_MAX;
	uint32_t parked = kNoneParked;
	uint64_t parked_seq = 0; // its frame's seq; a spilled frame's spill_seq
	// Whether the frame of reference INDEX is older than max_age_ns.
	bool too_old(uint32_t index) const;
	SpillDelivery spill_delivery = SpillDelivery::device;
	// OpenOptions::max_age in ns (0: none): older frames are given back unread.
	uint64_t max_age_ns = 0;
	int64_t retry_ns = 0;
	UniqueFd retry_timer;
	// wake=spin-before (none: sleep). Under receive_lock. The timer, in the epoll set,
	// makes fd() readable when a spin should start, so a poller comes to spin.
	std::unique_ptr<SpinWake> spin;
	UniqueFd spin_timer;
	bool last_look_empty = false; // the last look at the queue found it empty
	// Its counters, for stats() from any thread.
	std::atomic<uint64_t> spin_ns{ 0 };
	std::atomic<uint64_t> spins{ 0 };
	std::atomic<uint64_t> spins_caught{ 0 };
	std::atomic<uint64_t> expired{ 0 };
};

} // namespace xmem
