// subscriber.cpp - a consumer's side of a pool: the attach handshake with every check
// on what the owner sent, and receive() with its sleep/wake protocol.
#include "subscriber.hpp"

#include "identity.hpp"
#include "protocol.hpp"
#include "rendezvous.hpp"

#include <algorithm>
#include <cstdio>
#include <system_error>
#include <thread>

#include <fcntl.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/timerfd.h>

#include <sched.h>

namespace xmem {

using namespace layout;

namespace {

// How long a closing consumer waits for its streams to write the done words it queued.
constexpr int64_t kCloseDrainTimeoutNs = 10'000'000'000;
// A parked frame's retry timer: first interval, and the most it grows to.
constexpr int64_t kFirstRetryNs = 20'000;
constexpr int64_t kMaxRetryNs = 1'000'000;

} // namespace

Subscriber::Subscriber(PoolImpl &pool) : pool_(pool), seg(pool.seg)
{
}

Subscriber::~Subscriber()
{
	drop_parked();
	// Before the socket closes (and the owner reaps this consumer): GPU reads of
	// released frames still queued on our streams finish first.
	// Then it says so, and the owner reuses its record at once; otherwise (a stream
	// stuck past the deadline) the owner keeps our GPU writes' targets out of use
	// until this process has exited.
	// (Nothing to drain when this consumer met no device slot: it says so all the same.)
	bool drained = true;
	uint64_t deadline = deadline_after(kCloseDrainTimeoutNs);
	pool_.each_sync([&](DeviceSync &sync) { drained = sync.drain_done(pool_.holder_bit, deadline) && drained; });
	if (drained && self)
		self->gpu_drained.store(1, std::memory_order_seq_cst);
	if (owner_watch.joinable()) {
		uint64_t one = 1;
		[[maybe_unused]] ssize_t n = ::write(watch_stop.get(), &one, sizeof(one));
		owner_watch.join();
	}
}

Result<void> Subscriber::watch_owner()
{
	watch_stop = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
	if (!watch_stop.valid())
		return errno_error(pool_.where() + ": eventfd");
	try {
		owner_watch = std::thread([this] {
			// The owner writes nothing after the Welcome: any event is its hang-up.
			pollfd fds[2] = { { sock.get(), POLLIN | POLLRDHUP, 0 }, { watch_stop.get(), POLLIN, 0 } };
			while (::poll(fds, 2, -1) < 0 && errno == EINTR)
				;
			if (fds[1].revents)
				return;
			owner_gone_.store(true, std::memory_order_release);
			pool_.each_sync([](DeviceSync &sync) { sync.release_dead_owner(); });
		});
	} catch (const std::system_error &e) {
		return make_error(Errc::system, pool_.where() + ": cannot start the owner watch: " + e.what());
	}
	return {};
}

Result<void> Subscriber::attach(const OpenOptions &options, uint64_t deadline_ns)
{
	for (;;) {
		auto conn = rendezvous::connect(pool_.path, deadline_ns);
		if (!conn)
			return conn.error();
		auto attached = handshake(std::move(conn.value()), options, deadline_ns);
		// An owner that dies during the handshake: wait for the next one.
		if (attached.code() == Errc::closed && monotonic_ns() < deadline_ns) {
			std::this_thread::sleep_for(std::chrono::milliseconds(5));
			continue;
		}
		if (attached.code() == Errc::closed)
			return make_error(Errc::not_a_pool,
					  pool_.where() + ": the socket's server hung up without answering");
		return attached;
	}
}

Result<void> Subscriber::handshake(UniqueFd conn, const OpenOptions &options, uint64_t deadline_ns)
{
	bool inspect = options.inspect;
	UniqueFd ev;
	if (!inspect) {
		ev = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
		if (!ev.valid())
			return errno_error(pool_.where() + ": eventfd");
	}
	protocol::Hello hello = protocol::make_hello(
		inspect ? protocol::PeerRole::inspector : protocol::PeerRole::consumer, options.queue_size,
		options.client,
		protocol::Serve{ options.policy, options.fallback, uint64_t(options.block_timeout.count()),
				 options.max_held, options.history });
	// With the eventfd, a pidfd of this process where the kernel makes one: the owner
	// learns from it when this process has exited, also from another PID namespace.
	UniqueFd pidfd = inspect ? UniqueFd() : pidfd_of_self();
	int hello_fds[2] = { ev.get(), pidfd.get() };
	size_t nfds = inspect ? 0 : pidfd.valid() ? 2 : 1;
	auto sent = rendezvous::send_message(conn.get(), &hello, sizeof(hello), hello_fds, nfds);
	if (!sent)
		return sent.error();
	uint64_t reply_deadline = std::max(deadline_ns, monotonic_ns() + kReplyTimeoutNs);
	auto msg = rendezvous::receive_message(conn.get(), reply_deadline, pool_.where(), protocol::kMaxFds);
	if (!msg) {
		if (msg.code() == Errc::timed_out)
			return make_error(Errc::not_a_pool,
					  pool_.where() + ": the socket's server did not answer (not an xmem pool?)");
		return msg.error();
	}
	auto welcome = protocol::parse_reply(msg->data, pool_.where());
	if (!welcome)
		return welcome.error();
	if (msg->fds.empty())
		return make_error(Errc::not_a_pool, pool_.where() + ": owner sent no file descriptors");

	auto adopted = ControlSegment::adopt(std::move(msg->fds[0]), pool_.where());
	if (!adopted)
		return adopted.error();
	seg = std::move(adopted.value());
	const layout::ControlConstants &k = seg.constants();
	Storage storage = Storage(k.storage_type);
	// The control memfd, the spill tier's when the pool has one, then the arena's.
	size_t spill_fds = !inspect && k.spill_frames ? 1 : 0;
	size_t arena_fds = inspect ? 0 : arena_fd_count(storage, k.first_class_slots);
	size_t first_batch = 1 + spill_fds + std::min(arena_fds, protocol::kMaxFds - 1 - spill_fds);
	if (msg->fds.size() != first_batch)
		return make_error(Errc::not_a_pool, pool_.where() + ": owner sent " + std::to_string(msg->fds.size()) +
							    " file descriptors, expected " +
							    std::to_string(first_batch));
	if (!inspect && welcome->consumer_index >= k.max_consumers)
		return make_error(Errc::not_a_pool, pool_.where() + ": consumer index " +
							    std::to_string(welcome->consumer_index) + " out of range");
	pool_.format.store(std::make_shared<const std::string>(welcome->format));
	pool_.format_seq = welcome->format_seq;
	// The owner as this process numbers it: 0 when its PID namespace is not visible here.
	if (auto owner = peer_credentials(conn.get()))
		pool_.owner_pid_here = uint32_t(owner->pid);
	sock = std::move(conn);
	if (inspect) {
		pool_.role = Role::inspector;
		return {};
	}

	if (spill_fds) {
		auto spill = SpillTier::adopt(std::move(msg->fds[1]), k, pool_.where());
		if (!spill)
			return spill.error();
		pool_.spill = std::make_unique<SpillTier>(std::move(spill.value()));
	}
	std::vector<UniqueFd> fds(std::make_move_iterator(msg->fds.begin() + 1 + long(spill_fds)),
				  std::make_move_iterator(msg->fds.end()));
	auto received = rendezvous::receive_arena_fds(sock.get(), fds, arena_fds, reply_deadline, pool_.where());
	if (!received)
		return received.error();
	auto first = class_record(0);
	if (!first)
		return first.error();
	// The device by its UUID: the owner's ordinal may name another device here.
	auto memory = memory_of(*first);
	if (!memory)
		return memory.error();
	ArenaSpec spec{ pool_.name, memory->storage, memory->device, k.first_class_slots, k.slot_size, k.mode };
	auto arena = import_arena(spec, k.slot_stride, std::move(fds), pool_.where());
	if (!arena)
		return arena.error();
	pool_.arena = std::move(arena.value());
	{
		std::lock_guard lock(pool_.classes_lock);
		auto sync = pool_.add_sync(*pool_.arena, k.sync_mode == layout::kSyncStreamMemOps);
		if (!sync)
			return sync.error();
		pool_.add_class(0, *first, pool_.arena.get(), *sync);
	}
	return start_consumer(welcome->consumer_index, std::move(ev), options);
}

Result<void> Subscriber::start_consumer(uint32_t index, UniqueFd ev, const OpenOptions &options)
{
	consumer_index = index;
	pool_.holder_bit = 1 + consumer_index;
	self = seg.consumer(consumer_index);
	DeviceSync *first_sync = pool_.first_sync();
	self->sync_mode = first_sync ? first_sync->mode() : layout::kSyncNone;
	// A fifo-spill consumer of a device pool that takes spilled frames back to the device
	// page-locks its mapping of the tier once, so each copy back is queued on its stream.
	if (first_sync && pool_.spill && options.spill_delivery == SpillDelivery::device &&
	    self->policy == uint32_t(Policy::fifo_spill)) {
		auto pinned = device_pin(pool_.arena->device(), pool_.spill->memory());
		if (pinned)
			pool_.spill_pinned = std::move(pinned.value());
		else
			(void)std::fprintf(stderr,
					   "xmem: %s: spilled frames are copied back to the device from pageable "
					   "memory (the CPU stages each): %s\n",
					   pool_.where().c_str(), pinned.error().message.c_str());
	}
	pool_.local_refs.assign(pool_.index_count(), 0);
	pool_.exclusive.assign(seg.slot_count, 0);
	pool_.writers.assign(seg.slot_count, nullptr);
	mapped_gen.assign(seg.slot_count, 0);
	pool_.leased.assign(pool_.index_count(), 0);
	event = std::move(ev);
	arm_set.store(true, std::memory_order_relaxed); // the owner arms new consumers (see PeerServer::admit)

	epoll = UniqueFd(::epoll_create1(EPOLL_CLOEXEC));
	if (!epoll.valid())
		return errno_error(pool_.where() + ": epoll_create1");
	epoll_event e{};
	e.events = EPOLLIN;
	e.data.fd = event.get();
	if (::epoll_ctl(epoll.get(), EPOLL_CTL_ADD, event.get(), &e) < 0)
		return errno_error(pool_.where() + ": epoll_ctl");
	e.events = EPOLLIN | EPOLLRDHUP;
	e.data.fd = sock.get();
	if (::epoll_ctl(epoll.get(), EPOLL_CTL_ADD, sock.get(), &e) < 0)
		return errno_error(pool_.where() + ": epoll_ctl");
	{
		// A device frame may come in any pool (a class of device memory added later).
		retry_timer = UniqueFd(::timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
		if (!retry_timer.valid())
			return errno_error(pool_.where() + ": timerfd_create");
		e.events = EPOLLIN;
		e.data.fd = retry_timer.get();
		if (::epoll_ctl(epoll.get(), EPOLL_CTL_ADD, retry_timer.get(), &e) < 0)
			return errno_error(pool_.where() + ": epoll_ctl");
	}
	spill_delivery = options.spill_delivery;
	max_age_ns = options.max_age.count() > 0 ? uint64_t(options.max_age.count()) : 0;
	if (options.wake == Wake::spin_before) {
		spin = std::make_unique<SpinWake>(uint64_t(options.spin_budget.count()) * 1000);
		spin_timer = UniqueFd(::timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
		if (!spin_timer.valid())
			return errno_error(pool_.where() + ": timerfd_create");
		e.events = EPOLLIN;
		e.data.fd = spin_timer.get();
		if (::epoll_ctl(epoll.get(), EPOLL_CTL_ADD, spin_timer.get(), &e) < 0)
			return errno_error(pool_.where() + ": epoll_ctl");
	}
	pool_.role = Role::consumer;
	if (pool_.has_device_slots())
		return watch_owner();
	return {};
}

void Subscriber::note_taken(Result<BufferGuard> &frame)
{
	if (spin && frame)
		spin->observe(frame->meta().seq, frame->meta().timestamp, monotonic_ns(), last_look_empty);
	last_look_empty = false;
}

namespace {

inline void cpu_relax()
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	asm volatile("yield");
#endif
}

} // namespace

bool Subscriber::spin_for_frame(uint64_t h, uint64_t now, uint64_t *sleep_until)
{
	spin->woke(now);
	auto window = spin->window(now);
	if (!window)
		return false;
	if (now < window->first) {
		// Not yet: sleep until the window opens; pollers of fd() wake then.
		*sleep_until = window->first;
		spin->sleeping_until(window->first);
		itimerspec t{};
		t.it_value.tv_sec = time_t(window->first / 1'000'000'000);
		t.it_value.tv_nsec = long(window->first % 1'000'000'000);
		(void)::timerfd_settime(spin_timer.get(), TFD_TIMER_ABSTIME, &t, nullptr);
		return false;
	}
	// In the window: poll the queue, no syscall, until the frame comes or it closes.
	// Disarmed first, so the producer's push makes no eventfd write for a consumer that
	// is looking anyway; if the owner took the arm already, its write is owed.
	rearm(false);
	uint64_t start = now;
	bool caught = false;
	uint32_t turns = 0;
	for (;;) {
		if (self->tail.load(std::memory_order_acquire) != h) {
			caught = true;
			break;
		}
		now = monotonic_ns();
		if (now >= window->second)
			break;
		// Polling, yet yielding: a thread of the producer's that is ready to run on
		// this CPU (its publish, on a machine of few cores) runs now, not when the
		// scheduler would preempt us.
		if (++turns % 16 == 0)
			sched_yield();
		else
			cpu_relax();
	}
	spin->spun(window->second);
	spin_ns.fetch_add(now - start, std::memory_order_relaxed);
	spins.fetch_add(1, std::memory_order_relaxed);
	spins_caught.fetch_add(caught, std::memory_order_relaxed);
	return caught;
}

void Subscriber::rearm(bool arm)
{
	uint32_t was = self->armed.exchange(arm ? 1 : 0, std::memory_order_seq_cst);
	if (arm_set.load(std::memory_order_relaxed) && was == 0)
		owed_writes.fetch_add(1, std::memory_order_relaxed);
	arm_set.store(arm, std::memory_order_relaxed);
}

Result<BufferGuard> Subscriber::frame_guard(uint32_t index)
{
	return pool_.checked_guard(index, false);
}

Result<BufferGuard> Subscriber::deliver_parked(void *stream, uint64_t deadline_ns)
{
	uint32_t index = parked;
	if (retry_timer.valid()) {
		uint64_t expirations;
		[[maybe_unused]] ssize_t n = ::read(retry_timer.get(), &expirations, sizeof(expirations));
	}
	bool spilled = pool_.is_spill(index);
	auto ready = spilled ? wait_spilled(index, deadline_ns)
			     : pool_.sync_of(index)->wait_ready(index, parked_seq, stream, deadline_ns);
	if (!ready && ready.code() == Errc::timed_out) {
		// Still this consumer's frame: the next receive() hands it out. fd() polls
		// readable again after RETRY_NS, doubling up to kMaxRetryNs, so a poller
		// neither sleeps past the frame nor spins on it.
		if (retry_timer.valid()) {
			itimerspec t{};
			t.it_value.tv_sec = time_t(retry_ns / 1'000'000'000);
			t.it_value.tv_nsec = long(retry_ns % 1'000'000'000);
			(void)::timerfd_settime(retry_timer.get(), 0, &t, nullptr);
			retry_ns = std::min(retry_ns * 2, kMaxRetryNs);
		}
		if (spilled)
			return make_error(Errc::timed_out,
					  pool_.where() + ": a spilled frame is queued for this consumer, but the "
							  "owner's copy of it into the spill tier is not done yet "
							  "(receive again)");
		return make_error(Errc::timed_out, pool_.where() + ": frame " + std::to_string(parked_seq) +
							   " is queued for this consumer, but the producer's GPU "
							   "writes to it are not done yet (receive again)");
	}
	parked = kNoneParked;
	disarm_retry();
	if (!ready) {
		(void)pool_.release(index, nullptr, false);
		return make_error(ready.code(), pool_.where() + ": " + ready.error().message);
	}
	if (spilled)
		return spilled_frame(index, stream);
	return frame_guard(index);
}

Result<void> Subscriber::wait_spilled(uint32_t index, uint64_t deadline_ns)
{
	const std::atomic<uint64_t> &ready = pool_.record(index).spill_ready;
	while (int64_t(ready.load(std::memory_order_acquire) - parked_seq) < 0) {
		// A dead owner's copy never lands: its context went with it. (One that closed
		// waited for its copies first: look once more, the copy may have landed between.)
		if (owner_gone_.load(std::memory_order_acquire)) {
			if (int64_t(ready.load(std::memory_order_acquire) - parked_seq) >= 0)
				break;
			return make_error(Errc::bad_frame, "the owner died while it copied a frame into the spill "
							   "tier: the frame is lost");
		}
		if (monotonic_ns() >= deadline_ns)
			return make_error(Errc::timed_out, "spilled frame not copied yet");
		std::this_thread::sleep_for(std::chrono::microseconds(20));
	}
	return {};
}

Result<BufferGuard> Subscriber::spilled_frame(uint32_t index, void *stream)
{
	auto frame = frame_guard(index);
	if (!frame || spill_delivery == SpillDelivery::host)
		return frame;
	// Back into device memory, of this consumer's own: the slots are the producer's.
	// Queued on STREAM where this process page-locked the tier (else the CPU stages it
	// before the call returns). The buffer stays held until the copy's memory goes, whose
	// release waits for STREAM first (device_allocate), so the owner never reuses it
	// under the copy.
	auto copy = pool_.private_copy(*frame, Memory{ pool_.arena->storage(), pool_.arena->device() }, stream);
	if (!copy)
		return copy;
	auto held = std::make_shared<BufferGuard>(std::move(frame.value()));
	std::shared_ptr<void> memory = std::move(copy->copy_);
	void *at = memory.get();
	copy->copy_ = std::shared_ptr<void>(at, [memory = std::move(memory), held = std::move(held)](void *) mutable {
		memory.reset();
		held.reset();
	});
	return copy;
}

void Subscriber::disarm_retry()
{
	if (!retry_timer.valid())
		return;
	itimerspec off{};
	(void)::timerfd_settime(retry_timer.get(), 0, &off, nullptr);
	uint64_t expirations;
	[[maybe_unused]] ssize_t n = ::read(retry_timer.get(), &expirations, sizeof(expirations));
}

void Subscriber::drop_parked()
{
	if (parked == kNoneParked)
		return;
	// Never read on the GPU: no done word to write.
	(void)pool_.release(std::exchange(parked, kNoneParked), nullptr, false);
	disarm_retry();
}

Result<BufferGuard> Subscriber::receive(int64_t timeout_ns, void *stream)
{
	// One receiver at a time: the armed/eventfd handshake has a single sleeper, and
	// a second thread draining the eventfd could leave the first asleep unarmed.
	std::lock_guard serial(receive_lock);
	uint64_t deadline = deadline_after(timeout_ns);
	if (spin_timer.valid()) {
		uint64_t expirations;
		[[maybe_unused]] ssize_t n = ::read(spin_timer.get(), &expirations, sizeof(expirations));
	}
	// A frame taken off the queue earlier comes first, in order.
	if (parked != kNoneParked) {
		auto frame = deliver_parked(stream, deadline);
		note_taken(frame);
		return frame;
	}
	for (;;) {
		// The owner takes our arm (exchanges `armed` to 0) and then writes the
		// eventfd once: read it only while such writes are owed, so a consumer
		// checking an empty queue makes no syscall. A write that has not landed yet
		// is read on a later call; one left unread would wake a sleeper, or a poller
		// of fd(), for nothing, again and again until the next frame (the model
		// found that: tests/model/README.md, Finding 6).
		if (arm_set.load(std::memory_order_relaxed) && self->armed.load(std::memory_order_seq_cst) == 0) {
			arm_set.store(false, std::memory_order_relaxed);
			owed_writes.fetch_add(1, std::memory_order_relaxed);
		}
		if (uint32_t owed = owed_writes.load(std::memory_order_relaxed); owed > 0) {
			uint64_t count;
			if (::read(event.get(), &count, sizeof(count)) > 0)
				owed_writes.store(count >= owed ? 0 : owed - uint32_t(count),
						  std::memory_order_relaxed);
		}
		uint64_t h = self->head.load(std::memory_order_acquire);
		uint64_t t = self->tail.load(std::memory_order_seq_cst);
		if (t - h > seg.ring_capacity) {
			// The owner may have dropped and pushed between our two loads.
			if (self->head.load(std::memory_order_acquire) != h)
				continue;
			return segment_error(pool_.where(), "queue indices out of range");
		}
		if (h != t) {
			auto taken = take_entry(h);
			if (!taken)
				return taken.error();
			if (!*taken)
				continue; // the owner took it, or moved it: look again
			uint32_t what = **taken;
			pool_.notify_owner(); // a fifo publish may wait for this room
			if (what == kSkipEntry)
				continue; // dropped in place by the owner (and counted there)
			self->received.fetch_add(1, std::memory_order_relaxed);
			if (what == kEosEntry)
				return make_error(Errc::end_of_stream, pool_.where() + ": end of stream");
			auto named = pool_.entry_index(what);
			if (!named)
				return segment_error(pool_.where(), "queued entry " + std::to_string(what) +
									    " names no slot or spill buffer");
			uint32_t index = *named;
			{
				std::lock_guard lock(pool_.refs_lock);
				pool_.local_refs[index]++; // the queue's holder bit becomes this reference
			}
			if (too_old(index)) {
				// Given back unread (no GPU work of this process touched it), and counted.
				(void)pool_.release(index, nullptr, false);
				expired.fetch_add(1, std::memory_order_relaxed);
				continue;
			}
			if (pool_.is_spill(index) ? pool_.first_sync() != nullptr
						  : pool_.ordering_of(index) != nullptr) {
				// Device slots: parked until the producer's GPU writes are done
				// (STREAM waits for them on the GPU, or the CPU does), or, for a
				// spilled frame, until the owner's copy into the tier is (the CPU
				// waits: host memory). Its spill_seq read once: the owner wrote it
				// before it queued the entry.
				parked = index;
				parked_seq = pool_.is_spill(index) ? *static_cast<const volatile uint64_t *>(
									     &pool_.record(index).spill_seq)
								   : seg.slots[index].meta.seq;
				retry_ns = kFirstRetryNs;
				auto frame = deliver_parked(stream, deadline);
				note_taken(frame);
				return frame;
			}
			auto frame = frame_guard(index);
			note_taken(frame);
			return frame;
		}
		if (owner_gone_.load(std::memory_order_acquire) ||
		    seg.header->state.load(std::memory_order_acquire) == kPoolClosed)
			return make_error(Errc::closed, pool_.where() + ": the owner closed the pool");
		// Only this handle detaches its record, and only the reaper retires it: either
		// seen here means another process wrote it, and the owner queues nothing more
		// to this consumer. An error (the application reattaches), not silence forever.
		if (self->detached.load(std::memory_order_seq_cst) != 0 ||
		    self->state.load(std::memory_order_seq_cst) != kConsumerActive)
			return segment_error(pool_.where(), "this consumer's record was overwritten (detached or "
							    "not active): no frame will be queued to it");
		last_look_empty = true;
		uint64_t now = monotonic_ns();
		// wake=spin-before: near the expected arrival, poll instead of sleeping.
		uint64_t wake_at = deadline;
		if (spin && spin_for_frame(h, now, &wake_at))
			continue;
		// Arm, then look again: the owner stores tail, then reads armed.
		rearm(true);
		if (self->tail.load(std::memory_order_seq_cst) != h)
			continue;
		now = monotonic_ns();
		// Until the deadline, or until a spin window opens (then look again and spin).
		bool none = deadline != UINT64_MAX && now >= deadline;
		if (!none && wake_at != deadline && now >= wake_at)
			continue;
		uint64_t until = std::min(deadline, wake_at);
		bool forever = until == UINT64_MAX;
		uint64_t wait_ns = forever || none ? 0 : until - now;
		// With nothing to wait for, still notice an owner that died (a hang-up on
		// the socket), so a poller does not spin on a readable fd().
		pollfd fds[2] = { { sock.get(), POLLIN | POLLRDHUP, 0 }, { event.get(), POLLIN, 0 } };
		timespec ts{ time_t(wait_ns / 1'000'000'000), long(wait_ns % 1'000'000'000) };
		int r = ::ppoll(fds, none ? 1 : 2, forever ? nullptr : &ts, nullptr);
		if (r < 0 && errno != EINTR)
			return errno_error(pool_.where() + ": poll");
		if (r > 0 && fds[0].revents) {
			owner_gone_.store(true,
					  std::memory_order_release); // the owner never writes after Welcome: hang-up
			pool_.each_sync([](DeviceSync &sync) { sync.release_dead_owner(); });
			continue;
		}
		if (none || (r == 0 && monotonic_ns() >= deadline)) {
			// At its cap the owner queues it nothing: say so, rather than only "none".
			uint32_t cap = self->max_held;
			uint32_t held = held_slots();
			if (cap != 0 && held >= cap)
				return make_error(Errc::timed_out,
						  pool_.where() +
							  ": no frame within the timeout: this consumer holds " +
							  std::to_string(held) + " frames, its cap (max_held " +
							  std::to_string(cap) +
							  "), and is given no more until it lets one go (a copy, "
							  "copy_to_cpu(), keeps a frame without its slot)");
			return make_error(Errc::timed_out, pool_.where() + ": no frame within the timeout");
		}
	}
}

bool Subscriber::too_old(uint32_t index) const
{
	if (max_age_ns == 0)
		return false;
	// The producer's timestamp (CLOCK_MONOTONIC, the owner's at publish when it set none),
	// read once: another process wrote it. One from the future is no age.
	uint64_t stamp = *static_cast<const volatile uint64_t *>(&pool_.record(index).meta.timestamp);
	uint64_t now = monotonic_ns();
	return stamp != 0 && now > stamp && now - stamp > max_age_ns;
}

ConsumerStats Subscriber::stats() const
{
	ConsumerStats s{};
	if (!self)
		return s;
	s.policy = self->policy;
	s.fallback = self->fallback;
	s.queue_size = self->queue_size;
	s.block_timeout_ns = self->block_timeout_ns;
	uint64_t h = self->head.load(std::memory_order_acquire);
	uint64_t t = self->tail.load(std::memory_order_acquire);
	s.queued = t - h <= seg.ring_capacity ? uint32_t(t - h) : 0;
	s.received = self->received.load(std::memory_order_relaxed);
	s.dropped = self->dropped.load(std::memory_order_relaxed);
	s.spilled = self->spilled.load(std::memory_order_relaxed);
	s.spin_ns = spin_ns.load(std::memory_order_relaxed);
	s.spins = spins.load(std::memory_order_relaxed);
	s.spins_caught = spins_caught.load(std::memory_order_relaxed);
	s.expired = expired.load(std::memory_order_relaxed);
	s.held = held_slots();
	s.max_held = self->max_held;
	return s;
}

uint32_t Subscriber::held_slots() const
{
	std::lock_guard lock(pool_.refs_lock);
	uint32_t n = std::min<uint32_t>(uint32_t(pool_.local_refs.size()), seg.slot_count);
	return uint32_t(std::count_if(pool_.local_refs.begin(), pool_.local_refs.begin() + n,
				      [](uint32_t refs) { return refs != 0; }));
}

void Subscriber::detach_queue()
{
	if (!self)
		return;
	{
		std::lock_guard serial(receive_lock);
		drop_parked();
	}
	// No more frames for this handle; frames still held by guards stay held. A
	// block-policy publish waiting for room in our queue stops waiting for us.
	self->detached.store(1, std::memory_order_seq_cst);
	pool_.notify_owner();
	for (;;) {
		uint64_t h = self->head.load(std::memory_order_acquire);
		uint64_t t = self->tail.load(std::memory_order_seq_cst);
		if (h == t || t - h > seg.ring_capacity)
			return;
		auto taken = take_entry(h);
		if (!taken)
			return;
		if (!*taken)
			continue;
		auto index = pool_.entry_index(**taken);
		if (!index)
			continue;
		std::lock_guard lock(pool_.refs_lock);
		if (pool_.local_refs[*index] == 0)
			pool_.clear_holder_bit(*index, pool_.holder_bit);
	}
}

Result<std::optional<uint32_t>> Subscriber::take_entry(uint64_t h)
{
	std::atomic<uint64_t> &cell = ring_of(self)[h % seg.ring_capacity];
	uint64_t e = cell.load(std::memory_order_acquire);
	if (uint32_t(e >> 32) != uint32_t(h)) {
		// Pushed for another position: we read a stale head, or the record was
		// overwritten by another process.
		if (self->head.load(std::memory_order_acquire) != h)
			return std::optional<uint32_t>();
		return segment_error(pool_.where(), "queue entry " + std::to_string(h) + " belongs to position " +
							    std::to_string(uint32_t(e >> 32)));
	}
	uint32_t what = uint32_t(e);
	if (what != kTakenEntry) {
		// Claimed by this CAS: the owner's rewrites (spill, drop in place) and its drops
		// claim the same way, so exactly one of us has the entry. seq_cst: pairs with the
		// owner_waiting load in notify_owner().
		if (!cell.compare_exchange_strong(e, ring_entry(h, kTakenEntry), std::memory_order_seq_cst))
			return std::optional<uint32_t>();
	}
	// The head moves past a claimed entry, whoever claimed it: our own claim, or the
	// owner's drop that has not moved it yet.
	uint64_t expected = h;
	self->head.compare_exchange_strong(expected, h + 1, std::memory_order_seq_cst);
	if (what == kTakenEntry)
		return std::optional<uint32_t>();
	return std::optional<uint32_t>(what);
}

Result<std::shared_ptr<PoolImpl>> Subscriber::open(std::string_view name, std::string path, const OpenOptions &options)
{
	std::string where = "pool '" + std::string(name) + "'";
	if (options.timeout.count() < 0)
		return make_error(Errc::invalid_argument, where + ": negative timeout");
	if (options.policy && !policy_name(*options.policy))
		return make_error(Errc::invalid_argument,
				  where + ": unknown policy " + std::to_string(int(*options.policy)));
	if (options.fallback != Policy::drop_oldest && options.fallback != Policy::drop_new)
		return make_error(Errc::invalid_argument,
				  where + ": a fallback is drop-oldest or drop-new, not " +
					  (policy_name(options.fallback) ? policy_name(options.fallback)
									 : std::to_string(int(options.fallback))));
	if (options.block_timeout.count() < 0)
		return make_error(Errc::invalid_argument, where + ": negative block timeout");
	if (options.wake != Wake::sleep && options.wake != Wake::spin_before)
		return make_error(Errc::invalid_argument,
				  where + ": unknown wake mode " + std::to_string(int(options.wake)));
	if (options.spill_delivery != SpillDelivery::device && options.spill_delivery != SpillDelivery::host)
		return make_error(Errc::invalid_argument, where + ": unknown spill delivery " +
								  std::to_string(uint32_t(options.spill_delivery)));
	if (options.wake == Wake::spin_before &&
	    (options.spin_budget.count() <= 0 || options.spin_budget > std::chrono::seconds(1)))
		return make_error(Errc::invalid_argument, where + ": a spin budget is 1 µs to 1 s, not " +
								  std::to_string(options.spin_budget.count()) + " µs");
	auto impl = std::make_shared<PoolImpl>();
	impl->name = std::string(name);
	impl->path = std::move(path);
	impl->subscriber = std::make_unique<Subscriber>(*impl);
	impl->owner_link = impl->subscriber.get();
	auto attached = impl->subscriber->attach(options, deadline_after(options.timeout.count()));
	if (!attached)
		return attached.error();
	return impl;
}

} // namespace xmem
