// publisher.cpp - the owner's side of a pool: creating it, acquire and publish with
// the queue policies, and the thread that attaches and reaps consumers.
#include "publisher.hpp"

#include "owner/config.hpp"
#include "owner/slot_claim.hpp"

#include "frame_check.hpp"
#include "identity.hpp"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstdlib>
#include <system_error>
#include <thread>

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/timerfd.h>
#include <unistd.h>

namespace xmem {

using namespace layout;
using owner::gpu_ordering_wanted;
using owner::kMaxSlotSize;

namespace {

constexpr uint64_t kHelloTimeoutNs = 2'000'000'000;
constexpr uint32_t kDefaultQueueSize = 4;

enum class IoTag : uint32_t {
	listener = 1,
	stop = 2,
	pending = 3,
	consumer = 4,
	quarantine = 5,
	tickets = 6,
	guest = 7, // a guest's connection (fd: the map's key)
	guest_exit = 8, // a dead guest's pidfd or grace timer (fd: the map's key)
	trim = 9, // dynamic slots idle long enough give their memory back
};

// How long an acquire whose time is up still waits, each time, for a spill in flight.
constexpr uint64_t kSpillWaitNs = 50'000'000;
// How long close waits for the GPU writes it queued (ready words, spill copies) before it
// hangs up on its consumers.
constexpr int64_t kCloseDrainTimeoutNs = 10'000'000'000;

// How long a quarantined consumer whose process this owner cannot watch (another PID
// namespace, no pidfd) keeps its record and write-held slots: a grace period, not a
// proof that its GPU work is over.
constexpr int64_t kQuarantineGraceNs = 30'000'000'000;

// Event data: tag, consumer index and fd. The fd lets the loop ignore an event for a
// connection that was already replaced: a registration can outlive close() while a
// child process, between posix_spawn's clone and exec, still holds a copy of the fd.
uint64_t io_data(IoTag tag, uint32_t index, int fd)
{
	return uint64_t(tag) << 56 | uint64_t(index & 0xffffff) << 32 | uint32_t(fd);
}

// What a process's exit is waited for with where it has no pidfd: a timer that polls
// readable once the quarantine's grace period is over; none when it cannot be made.
UniqueFd grace_timer()
{
	UniqueFd timer(::timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
	itimerspec t{};
	t.it_value.tv_sec = time_t(kQuarantineGraceNs / 1'000'000'000);
	if (!timer.valid() || ::timerfd_settime(timer.get(), 0, &t, nullptr) < 0)
		return UniqueFd();
	return timer;
}

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
	auto memory_name = [&] {
		return memory->storage == Storage::cuda ? "memory of CUDA device " + std::to_string(memory->device)
							: std::string("system memory");
	};
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
							      std::to_string(size) + " bytes of " + memory_name() +
							      " under the pool's memory cap (" +
							      growth.full_reason(*memory) + ")");
		}
		if (fitting == 0)
			return make_error(Errc::out_of_range,
					  pool_.where() + ": no size class of " + memory_name() + " holds " +
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

void Publisher::trim_idle()
{
	// Tickets used up give their slots back first (as an acquire has them do), so a
	// redeemed ticket's slot is trimmed at the next tick, not at the ticket's TTL.
	if (tickets.any_live()) {
		std::lock_guard lock(publish_lock);
		tickets.end(false);
	}
	growth.trim_idle();
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
	FrameMeta &m0 = seg.slots[i].meta;
	m0 = FrameMeta{};
	m0.index = i;
	m0.storage_type = uint8_t(cls.arena->storage());
	m0.device_id = uint8_t(cls.arena->device());
	m0.pts = m0.dts = m0.duration = XMEM_NONE;
	seg.slots[i].side_data_size = 0;
	return pool_.make_guard(i, true);
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
		g.pool_.reset();
		drop_lease(index);
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
	g.pool_.reset();
	for (uint32_t i = 0; i < ntargets; i++) {
		uint32_t bit = 1 + targets[i];
		if (taken[bit / 64] & holder_mask(bit)) {
			seg.consumer(targets[i])->dropped.fetch_add(1, std::memory_order_relaxed);
			seg.header->dropped.fetch_add(1, std::memory_order_relaxed);
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
	g.pool_.reset();
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
	if (io_thread.joinable()) {
		uint64_t one = 1;
		[[maybe_unused]] ssize_t n = ::write(io_stop.get(), &one, sizeof(one));
		io_thread.join();
	}
	// Guests hang up, their leased slots go back: the pool closes.
	for (auto &[fd, guest] : guests)
		for (uint32_t lease : guest.leases)
			drop_lease(lease);
	for (auto &[fd, remains] : guest_remains)
		for (uint32_t lease : remains.leases)
			drop_lease(lease);
	guests.clear();
	guest_remains.clear();
	// The name goes first: a consumer woken below that reconnects at once finds no
	// socket (and waits for a new owner) rather than a dying one.
	rendezvous::release(owner_socket);
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

void Publisher::io_loop()
{
	epoll_event events[32];
	for (;;) {
		int timeout_ms = -1;
		uint64_t now = monotonic_ns();
		for (auto &[fd, p] : pending) {
			int ms = p.deadline_ns > now ? int((p.deadline_ns - now) / 1000000 + 1) : 0;
			timeout_ms = timeout_ms < 0 ? ms : std::min(timeout_ms, ms);
		}
		int n = ::epoll_wait(io_epoll.get(), events, 32, timeout_ms);
		if (n < 0 && errno != EINTR)
			return;
		for (int i = 0; i < n; i++) {
			auto tag = IoTag(events[i].data.u64 >> 56);
			uint32_t index = uint32_t(events[i].data.u64 >> 32) & 0xffffff;
			int fd = int(uint32_t(events[i].data.u64));
			switch (tag) {
			case IoTag::stop:
				return;
			case IoTag::listener:
				accept_peers();
				break;
			case IoTag::pending:
				handle_hello(fd);
				break;
			case IoTag::consumer:
				// Consumers send nothing after Hello: any event is a hang-up (exit,
				// crash, SIGKILL) or a protocol violation. Either way, reap.
				if (index < seg.max_consumers && queues.connection_fd(index) == fd)
					reap(index);
				else
					::epoll_ctl(io_epoll.get(), EPOLL_CTL_DEL, fd, nullptr);
				break;
			case IoTag::tickets: {
				// An owner that acquires nothing still ends its tickets on time.
				uint64_t expirations;
				[[maybe_unused]] ssize_t r =
					::read(tickets.timer().get(), &expirations, sizeof(expirations));
				std::lock_guard lock(publish_lock);
				tickets.end(false);
				break;
			}
			case IoTag::guest:
				serve_guest(fd);
				break;
			case IoTag::trim: {
				uint64_t expirations;
				[[maybe_unused]] ssize_t r =
					::read(growth.timer().get(), &expirations, sizeof(expirations));
				trim_idle();
				break;
			}
			case IoTag::guest_exit:
				if (auto node = guest_remains.extract(fd); !node.empty()) {
					::epoll_ctl(io_epoll.get(), EPOLL_CTL_DEL, fd, nullptr);
					// Its process has exited (or its grace ran out): the slots go back.
					for (uint32_t lease : node.mapped().leases)
						drop_lease(lease);
				}
				break;
			case IoTag::quarantine:
				if (index < seg.max_consumers &&
				    (consumer_pidfd[index].get() == fd || consumer_grace[index].get() == fd))
					end_quarantine(index);
				else
					::epoll_ctl(io_epoll.get(), EPOLL_CTL_DEL, fd, nullptr);
				break;
			}
		}
		now = monotonic_ns();
		for (auto it = pending.begin(); it != pending.end();) {
			if (it->second.deadline_ns <= now) {
				// A silent peer. Deregister before closing (see io_data()).
				::epoll_ctl(io_epoll.get(), EPOLL_CTL_DEL, it->first, nullptr);
				it = pending.erase(it);
			} else
				++it;
		}
	}
}

void Publisher::accept_peers()
{
	for (;;) {
		UniqueFd conn(::accept4(owner_socket.listener.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
		if (!conn.valid()) {
			// Out of fds: the listener stays readable; don't spin on it.
			if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
				std::this_thread::sleep_for(std::chrono::milliseconds(10));
			return;
		}
		int fd = conn.get();
		epoll_event ev{};
		ev.events = EPOLLIN | EPOLLRDHUP;
		ev.data.u64 = io_data(IoTag::pending, 0, fd);
		if (::epoll_ctl(io_epoll.get(), EPOLL_CTL_ADD, fd, &ev) < 0)
			continue;
		pending[fd] = Pending{ std::move(conn), monotonic_ns() + kHelloTimeoutNs };
	}
}

namespace {

// The peer's credentials, if a pool of MODE and group GID lets it in: the file mode's
// rule, applied by the owner, since an abstract socket has no file mode and a socket
// file's is only as good as its directory. Root (in this user namespace) always may.
Result<PeerCredentials> allowed_peer(int conn, uint32_t mode, gid_t gid)
{
	auto peer = peer_credentials(conn);
	if (!peer)
		return peer.error();
	bool allowed =
		peer->uid == ::geteuid() || peer->uid == 0 || (mode & 0006) || ((mode & 0060) && peer->in_group(gid));
	if (allowed)
		return peer;
	std::string groups;
	for (gid_t g : peer->groups)
		groups += (groups.empty() ? "" : ",") + std::to_string(g);
	return make_error(Errc::permission_denied,
			  "uid " + std::to_string(peer->uid) + " (gid " + std::to_string(peer->gid) +
				  (groups.empty() ? "" : ", groups " + groups) + ") may not use this pool: mode " +
				  mode_text(mode) + ", owner uid " + std::to_string(::geteuid()) + ", group " +
				  group_text(gid) + ((mode & 0060) ? "" : " (the mode gives the group no access)") +
				  (peer->uid == 65534 ? "; uid 65534 is what a uid the owner's user namespace "
							"does not map reads as"
						      : ""));
}

Result<void> check_eventfd(int fd)
{
	char link[64] = {};
	std::string proc = "/proc/self/fd/" + std::to_string(fd);
	// Without /proc mounted the check cannot be made; the fd is only ever written.
	bool have_proc = ::readlink(proc.c_str(), link, sizeof(link) - 1) >= 0;
	if ((have_proc && std::string_view(link) != "anon_inode:[eventfd]") || (!have_proc && errno != ENOENT))
		return make_error(Errc::invalid_argument, "the file descriptor in hello is not an eventfd");
	::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
	return {};
}

} // namespace

void Publisher::handle_hello(int fd)
{
	auto node = pending.extract(fd);
	if (node.empty())
		return;
	UniqueFd conn = std::move(node.mapped().conn);
	::epoll_ctl(io_epoll.get(), EPOLL_CTL_DEL, fd, nullptr);

	auto reject = [&](const Error &e) {
		protocol::Reject r = protocol::make_reject(xmem_status(e.code), e.message);
		(void)rendezvous::send_message(conn.get(), &r, sizeof(r), nullptr, 0);
	};

	auto msg = rendezvous::receive_message(conn.get(), monotonic_ns(), "peer");
	if (!msg)
		return;
	auto hello = protocol::parse_hello(msg->data);
	if (!hello)
		return reject(hello.error());
	// Credentials are checked after reading the Hello: closing with it unread would
	// reset the connection and lose the Reject on the way.
	auto cred = allowed_peer(conn.get(), config_mode, config_gid);
	if (!cred)
		return reject(cred.error());

	if (hello->role == protocol::PeerRole::classes) {
		if (!msg->fds.empty())
			return reject(
				make_error(Errc::invalid_argument, "a size class's import sends no file descriptors"));
		return send_class(conn.get(), hello->class_index);
	}
	if (hello->role == protocol::PeerRole::slot) {
		if (!msg->fds.empty())
			return reject(make_error(Errc::invalid_argument, "a slot's import sends no file descriptors"));
		return growth.send_slot(conn.get(), hello->class_index);
	}
	if (hello->role == protocol::PeerRole::producer)
		return admit_guest(std::move(conn), *hello, *cred, msg->fds);
	protocol::Welcome w;
	{
		std::lock_guard lock(publish_lock);
		w = protocol::make_welcome(protocol::kNoConsumer, seg.bytes().size(), pool_.arena->size(),
					   pool_.format_seq, *pool_.format.load());
	}
	if (hello->role == protocol::PeerRole::inspector) {
		if (!msg->fds.empty())
			return reject(make_error(Errc::invalid_argument, "an inspector sends no file descriptors"));
		(void)rendezvous::send_welcome(conn.get(), w, seg.fd(), {});
		return;
	}
	if (msg->fds.empty() || msg->fds.size() > 2)
		return reject(make_error(Errc::invalid_argument, "a consumer sends an eventfd and at most a pidfd"));
	UniqueFd event = std::move(msg->fds[0]);
	if (auto ok = check_eventfd(event.get()); !ok)
		return reject(ok.error());
	// Its pidfd: how a device pool's owner knows when a consumer it cannot see (another
	// PID namespace: SO_PEERCRED's pid is 0) has exited. One this owner can make itself
	// from a visible pid is preferred to any a peer sends.
	UniqueFd pidfd;
	if (msg->fds.size() == 2) {
		if (auto ok = check_pidfd(msg->fds[1].get(), cred->pid); !ok)
			return reject(ok.error());
		pidfd = std::move(msg->fds[1]);
	}
	if (cred->pid > 0)
		pidfd = UniqueFd(int(::syscall(SYS_pidfd_open, cred->pid, 0)));
	int cfd = conn.get();
	auto index = admit(*hello, *cred, std::move(event), std::move(pidfd), conn);
	if (!index)
		return index.code() == Errc::closed ? void() : reject(index.error());

	// Admitted, the consumer may be sent frames at once, and a block-policy publish may
	// wait, holding the publish lock, for room in its queue: nothing from here to the
	// Welcome may need that lock, or the wait could only end at its timeout.
	w.consumer_index = *index;
	epoll_event ev{};
	ev.events = EPOLLIN | EPOLLRDHUP;
	ev.data.u64 = io_data(IoTag::consumer, *index, cfd);
	std::vector<int> fds = pool_.arena->fds();
	if (pool_.spill)
		fds.insert(fds.begin(), pool_.spill->fd());
	if (!rendezvous::send_welcome(cfd, w, seg.fd(), fds) ||
	    ::epoll_ctl(io_epoll.get(), EPOLL_CTL_ADD, cfd, &ev) < 0)
		reap(*index);
}

void Publisher::send_class(int conn, uint32_t index)
{
	std::vector<int> fds;
	uint64_t size = 0;
	{
		// The fds stay open while the class lives: its arena is never removed.
		std::lock_guard lock(pool_.classes_lock);
		if (index == 0 || index >= pool_.classes_known.load(std::memory_order_relaxed)) {
			protocol::Reject r =
				protocol::make_reject(XMEM_EINVAL, "no size class " + std::to_string(index) +
									   " to import (the first comes at attach)");
			(void)rendezvous::send_message(conn, &r, sizeof(r), nullptr, 0);
			return;
		}
		const Arena &memory = *pool_.classes[index].arena;
		fds = memory.fds();
		size = memory.size();
	}
	protocol::Welcome w = protocol::make_welcome(protocol::kNoConsumer, seg.bytes().size(), size, 0, "");
	(void)rendezvous::send_welcome(conn, w, -1, fds);
}

void Publisher::admit_guest(UniqueFd conn, const protocol::Hello &hello, const PeerCredentials &cred,
			    std::vector<UniqueFd> &fds)
{
	auto reject = [&](const std::string &message) {
		protocol::Reject r = protocol::make_reject(XMEM_EINVAL, message);
		(void)rendezvous::send_message(conn.get(), &r, sizeof(r), nullptr, 0);
	};
	if (fds.size() > 1)
		return reject("a producer sends at most a pidfd");
	// A guest writes slots through its consumer's mappings: it names that consumer, which
	// must be attached, from the same process where this owner can tell.
	uint32_t c = hello.class_index;
	bool attached = false;
	{
		std::lock_guard lock(publish_lock);
		attached = c < seg.max_consumers && queues.attached(c) &&
			   (cred.pid == 0 || seg.consumer(c)->pid == 0 || seg.consumer(c)->pid == uint32_t(cred.pid));
	}
	if (!attached)
		return reject("a producer names consumer " + std::to_string(c) +
			      ", which is not attached from its process");
	Guest guest;
	guest.consumer = c;
	guest.pid = uint32_t(std::max(cred.pid, pid_t(0)));
	if (fds.size() == 1 && check_pidfd(fds[0].get(), cred.pid))
		guest.pidfd = std::move(fds[0]);
	if (cred.pid > 0)
		guest.pidfd = UniqueFd(int(::syscall(SYS_pidfd_open, cred.pid, 0)));
	protocol::Welcome w = protocol::make_welcome(protocol::kNoConsumer, seg.bytes().size(), 0, 0, "");
	int fd = conn.get();
	epoll_event ev{};
	ev.events = EPOLLIN | EPOLLRDHUP;
	ev.data.u64 = io_data(IoTag::guest, 0, fd);
	if (!rendezvous::send_welcome(fd, w, -1, {}) || ::epoll_ctl(io_epoll.get(), EPOLL_CTL_ADD, fd, &ev) < 0)
		return;
	guest.conn = std::move(conn);
	guests[fd] = std::move(guest);
}

void Publisher::serve_guest(int fd)
{
	auto it = guests.find(fd);
	if (it == guests.end()) {
		::epoll_ctl(io_epoll.get(), EPOLL_CTL_DEL, fd, nullptr);
		return;
	}
	// A hang-up, fds or a malformed request: the guest is gone (or broke the protocol).
	auto msg = rendezvous::receive_message(fd, monotonic_ns(), "producer", 0);
	if (!msg)
		return guest_gone(fd);
	auto request = protocol::parse_request(msg->data);
	if (!request)
		return guest_gone(fd);
	protocol::Answer a = answer(it->second, *request);
	if (!rendezvous::send_message(fd, &a, sizeof(a), nullptr, 0))
		guest_gone(fd);
}

protocol::Answer Publisher::answer(Guest &guest, const protocol::Request &r)
{
	auto refuse = [](const Error &e) {
		return protocol::make_answer(&e);
	};
	auto lease = std::find(guest.leases.begin(), guest.leases.end(), r.slot);
	switch (r.op) {
	case protocol::RequestOp::lease: {
		if (r.storage != uint32_t(Storage::system) && r.storage != uint32_t(Storage::cuda))
			return refuse(make_error(Errc::invalid_argument, pool_.where() + ": unknown storage type " +
										 std::to_string(r.storage)));
		// The owner's own acquire, without waiting: the guest waits, on its side.
		auto g = acquire(r.size,
				 Memory{ Storage(r.storage), r.storage == uint32_t(Storage::cuda) ? r.device : 0 }, 0,
				 nullptr);
		if (!g)
			return refuse(g.error());
		protocol::Answer a = protocol::make_answer(nullptr);
		a.slot = g->index_;
		g->pool_.reset(); // the reference stays, the lease's
		guest.leases.push_back(a.slot);
		return a;
	}
	case protocol::RequestOp::give_back:
		if (lease == guest.leases.end())
			return refuse(make_error(Errc::not_held, pool_.where() + ": slot " + std::to_string(r.slot) +
									 " is not leased to this producer"));
		guest.leases.erase(lease);
		drop_lease(r.slot); // back to free, unpublished
		return protocol::make_answer(nullptr);
	case protocol::RequestOp::publish:
		break;
	}
	if (lease == guest.leases.end())
		return refuse(make_error(Errc::not_held, pool_.where() + ": slot " + std::to_string(r.slot) +
								 " is not leased to this producer"));
	guest.leases.erase(lease);
	BufferGuard g = pool_.make_guard(r.slot, true); // the lease's reference
	// What the guest wrote, checked by put_out() as the owner's own frame is.
	g.meta_ = r.meta;
	if (r.side_data_size)
		g.side_data_ =
			std::make_shared<const std::vector<std::byte>>(r.side_data, r.side_data + r.side_data_size);
	Origin origin{ guest.consumer, true, guest.pid };
	protocol::Answer a = protocol::make_answer(nullptr);
	a.slot = r.slot;
	if (r.redemptions == 0) {
		if (auto published = publish(std::move(g), nullptr, origin); !published)
			return refuse(published.error());
		return a;
	}
	auto ticket = publish_ticket(std::move(g), r.redemptions, r.ttl_ns, nullptr, origin);
	if (!ticket)
		return refuse(ticket.error());
	a.seq = ticket->seq;
	a.check = ticket->check;
	return a;
}

void Publisher::guest_gone(int fd)
{
	auto node = guests.extract(fd);
	if (node.empty())
		return;
	::epoll_ctl(io_epoll.get(), EPOLL_CTL_DEL, fd, nullptr);
	Guest &guest = node.mapped();
	// Its system slots go back now: its CPU writes ended with its threads. GPU writes it
	// queued into device slots may land until its process has exited (its device files
	// closed): those stay held until then, as a quarantined consumer's (reap()).
	GuestRemains remains;
	for (uint32_t i : guest.leases) {
		if (pool_.sync_of(i))
			remains.leases.push_back(i);
		else
			drop_lease(i);
	}
	if (remains.leases.empty())
		return;
	remains.watch = guest.pidfd.valid() ? std::move(guest.pidfd) : grace_timer();
	int watch = remains.watch.get();
	if (watch >= 0 && watch_readable(watch, io_data(IoTag::guest_exit, 0, watch))) {
		guest_remains[watch] = std::move(remains);
		return;
	}
	for (uint32_t i : remains.leases) // nothing to wait on: the slots go back now
		drop_lease(i);
}

void Publisher::drop_lease(uint32_t index)
{
	(void)pool_.release(index, nullptr, false);
}

Result<uint32_t> Publisher::admit(const protocol::Hello &hello, const PeerCredentials &cred, UniqueFd event,
				  UniqueFd pidfd, UniqueFd &conn)
{
	auto asked = protocol::serve_of(hello);
	if (!asked)
		return asked.error();
	owner::Served how;
	how.policy = asked->policy.value_or(config_policy);
	how.fallback = asked->fallback;
	how.block_timeout_ns = asked->block_timeout_ns ? asked->block_timeout_ns : config_block_timeout_ns;
	// A fifo-spill consumer's queue may hold every slot and every spill buffer; the
	// others' at most every slot, a latest one's a single frame.
	uint32_t most = seg.slot_count;
	uint32_t queue = hello.queue_size ? hello.queue_size : kDefaultQueueSize;
	if (how.policy == Policy::fifo_spill) {
		if (seg.constants().spill_frames == 0)
			return make_error(Errc::invalid_argument,
					  pool_.where() + " has no spill tier for a fifo-spill consumer (its owner "
							  "set no spill size)");
		most = seg.ring_capacity - 1;
		if (hello.queue_size == 0)
			queue = most;
	}
	if (how.policy == Policy::latest)
		queue = 1;
	how.queue_size = std::clamp<uint32_t>(queue, 1, most);

	std::lock_guard lock(publish_lock);
	if (shut.load(std::memory_order_acquire))
		return make_error(Errc::closed, pool_.where() + " is closed");
	uint32_t index = UINT32_MAX;
	for (uint32_t i = 0; i < seg.max_consumers && index == UINT32_MAX; i++)
		if (seg.consumer(i)->state.load(std::memory_order_acquire) == kConsumerFree)
			index = i;
	if (index == UINT32_MAX)
		return make_error(Errc::full, "pool has its maximum of " + std::to_string(seg.max_consumers) +
						      " consumers attached");
	ConsumerRecord *rec = seg.consumer(index);
	rec->pid = uint32_t(cred.pid);
	rec->uid = cred.uid;
	rec->gid = cred.gid;
	rec->own_pid = hello.pid;
	rec->pid_ns = hello.pid_ns;
	rec->queue_size = how.queue_size;
	rec->policy = uint32_t(how.policy);
	rec->fallback = uint32_t(how.fallback);
	rec->block_timeout_ns = how.block_timeout_ns;
	rec->spilled.store(0, std::memory_order_relaxed);
	rec->detached.store(0, std::memory_order_relaxed);
	rec->attach_ns = monotonic_ns();
	copy_string(rec->client, sizeof(rec->client), hello.client);
	rec->sync_mode = kSyncNone; // the consumer records its own at attach
	rec->gpu_drained.store(0, std::memory_order_relaxed);
	rec->producing.store(0, std::memory_order_relaxed);
	// Device pools: its process, to know when a quarantine may end (see reap()).
	// Kept in every pool: a class of device memory may come later.
	consumer_pidfd[index] = std::move(pidfd);
	rec->head.store(0, std::memory_order_relaxed);
	rec->tail.store(0, std::memory_order_relaxed);
	rec->received.store(0, std::memory_order_relaxed);
	rec->dropped.store(0, std::memory_order_relaxed);
	rec->queued_total.store(0, std::memory_order_relaxed);
	// Armed from the start: fd() polls readable on the first frame.
	rec->armed.store(1, std::memory_order_relaxed);
	rec->state.store(kConsumerActive, std::memory_order_seq_cst);
	queues.attach(index, how, std::move(event), std::move(conn));
	return index;
}

void Publisher::reap(uint32_t c)
{
	if (c >= seg.max_consumers)
		return;
	ConsumerRecord *rec = seg.consumer(c);
	// DEAD first, and wake: a publish blocked on this consumer gives up at once.
	rec->state.store(kConsumerDead, std::memory_order_seq_cst);
	seg.header->progress.fetch_add(1, std::memory_order_seq_cst);
	futex_wake_all(&seg.header->progress);
	// A guest of its process publishes on: its frames go to a consumer that takes this
	// record next.
	for (auto &[fd, guest] : guests)
		if (guest.consumer == c)
			guest.consumer = protocol::kNoConsumer;
	{
		std::lock_guard lock(publish_lock);
		queues.detach(c);
		// A device pool's consumer that did not say its GPU work was over (killed, or a
		// stream stuck past its close): its queued GPU writes may land until its process
		// has exited. Until then (end_quarantine()) it is quarantined:
		// - its done words are left as they are, so the owner's streams keep waiting
		//   for its queued done writes, which follow its in-place writes: a slot it
		//   released with writes still queued is rewritten only after them;
		// - the slots it held EXCLUSIVE stay held: a write queued there has no done
		//   write after it;
		// - its record (holder index) stays taken: a late done write must not land in
		//   another consumer's words.
		bool quarantine = pool_.has_device_slots() && rec->gpu_drained.load(std::memory_order_seq_cst) == 0 &&
				  start_quarantine(c);
		// Otherwise its GPU work is over: done words first, so an acquire that sees
		// its bits gone finds nothing to wait for, and no stream waits on it forever.
		if (!quarantine)
			pool_.each_sync([&](DeviceSync &sync) { sync.release_dead_holder(1 + c, published_count); });
		// Clearing a bit is idempotent and only this consumer ever set its bit for
		// itself: its references are released exactly once, whatever instruction it
		// died on (docs/design.md, "Invariants").
		uint32_t bit = 1 + c;
		for (uint32_t i = 0; i < seg.slot_count; i++) {
			if (quarantine && seg.slots[i].state.load(std::memory_order_seq_cst) == kSlotExclusive &&
			    (seg.slots[i].holders[bit / 64].load(std::memory_order_seq_cst) & holder_mask(bit)))
				continue; // kept held until end_quarantine()
			uint64_t old =
				seg.slots[i].holders[bit / 64].fetch_and(~holder_mask(bit), std::memory_order_seq_cst);
			if (old & holder_mask(bit))
				owner::try_reclaim(seg.slots[i], kSlotFree);
		}
		spill.forget_consumer(c);
		rec->head.store(0, std::memory_order_relaxed);
		rec->tail.store(0, std::memory_order_relaxed);
		// Deregister explicitly: close() alone leaves the registration while another
		// process holds a copy of the fd.
		if (UniqueFd conn = queues.take_connection(c); conn.valid())
			::epoll_ctl(io_epoll.get(), EPOLL_CTL_DEL, conn.get(), nullptr);
		seg.header->reaped.fetch_add(1, std::memory_order_relaxed);
		if (quarantine) {
			rec->state.store(kConsumerQuarantined, std::memory_order_release);
		} else {
			consumer_pidfd[c].reset();
			rec->state.store(kConsumerFree, std::memory_order_release);
		}
	}
	seg.header->progress.fetch_add(1, std::memory_order_seq_cst);
	futex_wake_all(&seg.header->progress);
}

bool Publisher::start_quarantine(uint32_t c)
{
	// Until its process has exited: the kernel closes a process's files, the GPU
	// driver's among them (which ends its queued work), before it reports the exit.
	int fd = consumer_pidfd[c].get();
	if (fd < 0) {
		// No pidfd (an old kernel, a consumer in a PID namespace this owner cannot see
		// that sent none): a grace period.
		consumer_grace[c] = grace_timer();
		fd = consumer_grace[c].get();
	}
	return fd >= 0 && watch_readable(fd, io_data(IoTag::quarantine, c, fd));
}

bool Publisher::watch_readable(int fd, uint64_t data)
{
	epoll_event ev{};
	ev.events = EPOLLIN;
	ev.data.u64 = data;
	return ::epoll_ctl(io_epoll.get(), EPOLL_CTL_ADD, fd, &ev) == 0;
}

void Publisher::end_quarantine(uint32_t c)
{
	ConsumerRecord *rec = seg.consumer(c);
	{
		std::lock_guard lock(publish_lock);
		if (rec->state.load(std::memory_order_acquire) != kConsumerQuarantined)
			return;
		// Its process is gone, and its GPU work with it: no stream waits on it forever.
		pool_.each_sync([&](DeviceSync &sync) { sync.release_dead_holder(1 + c, published_count); });
		uint32_t bit = 1 + c;
		for (uint32_t i = 0; i < seg.slot_count; i++) {
			uint64_t old =
				seg.slots[i].holders[bit / 64].fetch_and(~holder_mask(bit), std::memory_order_seq_cst);
			if (old & holder_mask(bit))
				owner::try_reclaim(seg.slots[i], kSlotFree);
		}
		for (UniqueFd *fd : { &consumer_pidfd[c], &consumer_grace[c] }) {
			if (fd->valid())
				::epoll_ctl(io_epoll.get(), EPOLL_CTL_DEL, fd->get(), nullptr);
			fd->reset();
		}
		rec->state.store(kConsumerFree, std::memory_order_release);
	}
	seg.header->progress.fetch_add(1, std::memory_order_seq_cst);
	futex_wake_all(&seg.header->progress);
}

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
	impl->publisher->owner_socket = std::move(claimed.value());

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
	bool cuda = config.storage == Storage::cuda;
	if (cuda) {
		params.sync_mode = gpu_ordering_wanted(config.device) ? kSyncStreamMemOps : kSyncCpu;
		auto uuid = device_uuid(config.device, impl->where());
		if (!uuid)
			return uuid.error();
		params.device_uuid = *uuid;
		params.device_is_mig = is_mig_device(*uuid); // device_uuid() noted it
	}
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
	if (cuda) {
		{
			std::lock_guard lock(impl->classes_lock);
			auto made = impl->add_sync(*impl->arena, params.sync_mode == kSyncStreamMemOps);
			if (!made)
				return made.error();
			sync = *made;
		}
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
	config_policy = config.policy;
	config_block_timeout_ns = uint64_t(config.block_timeout.count());
	config_mode = config.mode;
	config_gid = config.group ? gid_t(*config.group) : ::getegid();
	std::memcpy(config_producer, seg.header->producer, sizeof(config_producer));
	owner_pid = seg.constants().owner_pid;
	if (auto grown = growth.start(config); !grown)
		return grown.error();
	queues.start();
	consumer_pidfd.resize(seg.max_consumers);
	consumer_grace.resize(seg.max_consumers);
	pool_.format.store(std::make_shared<const std::string>());
	auto fmt = set_format(config.format);
	if (!fmt)
		return fmt.error();

	io_epoll = UniqueFd(::epoll_create1(EPOLL_CLOEXEC));
	io_stop = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
	if (auto timer = tickets.start(); !timer)
		return timer.error();
	if (!io_epoll.valid() || !io_stop.valid())
		return errno_error(pool_.where() + ": epoll/eventfd/timerfd");
	epoll_event ev{};
	ev.events = EPOLLIN;
	ev.data.u64 = io_data(IoTag::listener, 0, owner_socket.listener.get());
	if (::epoll_ctl(io_epoll.get(), EPOLL_CTL_ADD, owner_socket.listener.get(), &ev) < 0)
		return errno_error(pool_.where() + ": epoll_ctl");
	ev.data.u64 = io_data(IoTag::stop, 0, io_stop.get());
	if (::epoll_ctl(io_epoll.get(), EPOLL_CTL_ADD, io_stop.get(), &ev) < 0)
		return errno_error(pool_.where() + ": epoll_ctl");
	ev.data.u64 = io_data(IoTag::tickets, 0, tickets.timer().get());
	if (::epoll_ctl(io_epoll.get(), EPOLL_CTL_ADD, tickets.timer().get(), &ev) < 0)
		return errno_error(pool_.where() + ": epoll_ctl");
	if (growth.timer().valid()) {
		ev.data.u64 = io_data(IoTag::trim, 0, growth.timer().get());
		if (::epoll_ctl(io_epoll.get(), EPOLL_CTL_ADD, growth.timer().get(), &ev) < 0)
			return errno_error(pool_.where() + ": epoll_ctl");
	}
	// The threads touch only this Publisher, which shutdown() outlives by joining them.
	spill.start();
	try {
		io_thread = std::thread([this] { io_loop(); });
	} catch (const std::system_error &e) {
		return make_error(Errc::system, pool_.where() + ": cannot start the I/O thread: " + e.what());
	}
	return {};
}

} // namespace xmem
