// owner/peer_server.cpp - the owner's I/O thread: accepting peers and reading their Hello,
// admitting consumers and guests, class imports, reaps and quarantines, the timers.
#include "peer_server.hpp"

#include "slot_claim.hpp"

#include "../identity.hpp"

#include <algorithm>
#include <system_error>

#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace xmem::owner {

using namespace layout;

namespace {

constexpr uint64_t kHelloTimeoutNs = 2'000'000'000;
constexpr uint32_t kDefaultQueueSize = 4;

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

PeerServer::PeerServer(PoolImpl &pool, const OwnerParts &parts)
	: pool_(pool), seg(pool.seg), parts(parts), guests(pool, parts.frames, poll)
{
}

Result<void> PeerServer::start(const PoolConfig &config)
{
	config_policy = config.policy;
	config_block_timeout_ns = uint64_t(config.block_timeout.count());
	config_mode = config.mode;
	config_gid = config.group ? gid_t(*config.group) : ::getegid();
	consumer_pidfd.resize(seg.max_consumers);
	consumer_grace.resize(seg.max_consumers);

	stop_event = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
	if (!poll.open() || !stop_event.valid())
		return errno_error(pool_.where() + ": epoll/eventfd");
	if (!poll.watch(owner_socket.listener.get(), IoTag::listener) || !poll.watch(stop_event.get(), IoTag::stop) ||
	    !poll.watch(parts.tickets.timer().get(), IoTag::tickets) ||
	    (parts.growth.timer().valid() && !poll.watch(parts.growth.timer().get(), IoTag::trim)))
		return errno_error(pool_.where() + ": epoll_ctl");
	// The thread touches only this server and the parts it was given, which stop()
	// outlives by joining it.
	try {
		thread = std::thread([this] { loop(); });
	} catch (const std::system_error &e) {
		return make_error(Errc::system, pool_.where() + ": cannot start the I/O thread: " + e.what());
	}
	return {};
}

void PeerServer::stop()
{
	if (thread.joinable()) {
		uint64_t one = 1;
		[[maybe_unused]] ssize_t n = ::write(stop_event.get(), &one, sizeof(one));
		thread.join();
	}
	// Guests hang up, their leased slots go back: the pool closes.
	guests.close();
	// The name goes first: a consumer woken by the close that reconnects at once finds no
	// socket (and waits for a new owner) rather than a dying one.
	rendezvous::release(owner_socket);
}

void PeerServer::trim_tick()
{
	if (parts.tickets.any_live()) {
		std::lock_guard lock(parts.publish_lock);
		parts.tickets.end(false);
	}
	parts.growth.trim_idle();
}

void PeerServer::loop()
{
	IoEvent events[32];
	for (;;) {
		int timeout_ms = -1;
		uint64_t now = monotonic_ns();
		for (auto &[fd, p] : pending) {
			int ms = p.deadline_ns > now ? int((p.deadline_ns - now) / 1000000 + 1) : 0;
			timeout_ms = timeout_ms < 0 ? ms : std::min(timeout_ms, ms);
		}
		int n = poll.wait(events, 32, timeout_ms);
		if (n < 0)
			return;
		for (int i = 0; i < n; i++) {
			auto [tag, index, fd] = events[i];
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
				if (index < seg.max_consumers && parts.queues.connection_fd(index) == fd)
					reap(index);
				else
					poll.forget(fd);
				break;
			case IoTag::tickets: {
				// An owner that acquires nothing still ends its tickets on time.
				drain_timer(fd);
				std::lock_guard lock(parts.publish_lock);
				parts.tickets.end(false);
				break;
			}
			case IoTag::guest:
				guests.serve(fd);
				break;
			case IoTag::trim:
				drain_timer(fd);
				trim_tick();
				break;
			case IoTag::guest_exit:
				guests.exited(fd);
				break;
			case IoTag::quarantine:
				if (index < seg.max_consumers &&
				    (consumer_pidfd[index].get() == fd || consumer_grace[index].get() == fd))
					end_quarantine(index);
				else
					poll.forget(fd);
				break;
			}
		}
		now = monotonic_ns();
		for (auto it = pending.begin(); it != pending.end();) {
			if (it->second.deadline_ns <= now) {
				// A silent peer. Deregister before closing (see IoPoll).
				poll.forget(it->first);
				it = pending.erase(it);
			} else
				++it;
		}
	}
}

void PeerServer::accept_peers()
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
		if (!poll.watch(fd, IoTag::pending, 0, EPOLLIN | EPOLLRDHUP))
			continue;
		pending[fd] = Pending{ std::move(conn), monotonic_ns() + kHelloTimeoutNs };
	}
}

void PeerServer::handle_hello(int fd)
{
	auto node = pending.extract(fd);
	if (node.empty())
		return;
	UniqueFd conn = std::move(node.mapped().conn);
	poll.forget(fd);

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
		return parts.growth.send_slot(conn.get(), hello->slot_index);
	}
	if (hello->role == protocol::PeerRole::producer)
		return admit_guest(std::move(conn), *hello, *cred, msg->fds);
	protocol::Welcome w;
	{
		std::lock_guard lock(parts.publish_lock);
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
	std::vector<int> fds = pool_.arena->fds();
	if (pool_.spill)
		fds.insert(fds.begin(), pool_.spill->fd());
	if (!rendezvous::send_welcome(cfd, w, seg.fd(), fds) ||
	    !poll.watch(cfd, IoTag::consumer, *index, EPOLLIN | EPOLLRDHUP))
		reap(*index);
}

void PeerServer::send_class(int conn, uint32_t index)
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

void PeerServer::admit_guest(UniqueFd conn, const protocol::Hello &hello, const PeerCredentials &cred,
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
	uint32_t c = hello.consumer_index;
	bool attached = false;
	{
		std::lock_guard lock(parts.publish_lock);
		attached = c < seg.max_consumers && parts.queues.attached(c) &&
			   (cred.pid == 0 || seg.consumer(c)->pid == 0 || seg.consumer(c)->pid == uint32_t(cred.pid));
	}
	if (!attached)
		return reject("a producer names consumer " + std::to_string(c) +
			      ", which is not attached from its process");
	UniqueFd pidfd;
	if (fds.size() == 1 && check_pidfd(fds[0].get(), cred.pid))
		pidfd = std::move(fds[0]);
	if (cred.pid > 0)
		pidfd = UniqueFd(int(::syscall(SYS_pidfd_open, cred.pid, 0)));
	guests.admit(std::move(conn), c, cred, std::move(pidfd));
}

Result<uint32_t> PeerServer::admit(const protocol::Hello &hello, const PeerCredentials &cred, UniqueFd event,
				   UniqueFd pidfd, UniqueFd &conn)
{
	auto asked = protocol::serve_of(hello);
	if (!asked)
		return asked.error();
	Served how;
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
					  pool_.where() +
						  " has no spill tier for a fifo-spill consumer: its owner "
						  "set no spill size (xmemsink spill-size, PoolConfig::spill_bytes)");
		most = seg.ring_capacity - 1;
		if (hello.queue_size == 0)
			queue = most;
	}
	if (how.policy == Policy::latest)
		queue = 1;
	how.queue_size = std::clamp<uint32_t>(queue, 1, most);
	// By default half the pool's slots, so that the producer's next frame and the other
	// consumers keep the other half whatever this one keeps; but never less than the
	// queue it asked for and one frame in hand (a fifo-spill consumer's queued frames do
	// not count).
	uint32_t slots = pool_.slots_end();
	uint32_t in_queue = how.policy == Policy::fifo_spill ? 0 : how.queue_size;
	how.max_held = hello.max_held ? hello.max_held : std::max({ 1u, slots / 2, in_queue + 1 });
	if (hello.max_held == 0 && how.max_held >= slots)
		how.max_held = UINT32_MAX; // a default of the whole pool is none

	std::lock_guard lock(parts.publish_lock);
	if (parts.shut.load(std::memory_order_acquire))
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
	rec->max_held = how.max_held == UINT32_MAX ? 0 : how.max_held;
	rec->history = hello.history;
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
	parts.queues.attach(index, how, std::move(event), std::move(conn));
	// A late joiner's history: within its queue and its cap, so that none of it is
	// dropped for room as the live stream comes.
	parts.queues.give_history(index, std::min({ hello.history, how.queue_size, how.max_held }));
	return index;
}

void PeerServer::reap(uint32_t c)
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
	guests.consumer_reaped(c);
	{
		std::lock_guard lock(parts.publish_lock);
		parts.queues.detach(c);
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
			pool_.each_sync([&](DeviceSync &sync) { sync.release_dead_holder(1 + c, parts.published); });
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
				try_reclaim(seg.slots[i], kSlotFree);
		}
		parts.spill.forget_consumer(c);
		rec->head.store(0, std::memory_order_relaxed);
		rec->tail.store(0, std::memory_order_relaxed);
		// Deregister explicitly: close() alone leaves the registration while another
		// process holds a copy of the fd.
		if (UniqueFd conn = parts.queues.take_connection(c); conn.valid())
			poll.forget(conn.get());
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

bool PeerServer::start_quarantine(uint32_t c)
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
	return fd >= 0 && poll.watch(fd, IoTag::quarantine, c);
}

void PeerServer::end_quarantine(uint32_t c)
{
	ConsumerRecord *rec = seg.consumer(c);
	{
		std::lock_guard lock(parts.publish_lock);
		if (rec->state.load(std::memory_order_acquire) != kConsumerQuarantined)
			return;
		// Its process is gone, and its GPU work with it: no stream waits on it forever.
		pool_.each_sync([&](DeviceSync &sync) { sync.release_dead_holder(1 + c, parts.published); });
		uint32_t bit = 1 + c;
		for (uint32_t i = 0; i < seg.slot_count; i++) {
			uint64_t old =
				seg.slots[i].holders[bit / 64].fetch_and(~holder_mask(bit), std::memory_order_seq_cst);
			if (old & holder_mask(bit))
				try_reclaim(seg.slots[i], kSlotFree);
		}
		for (UniqueFd *fd : { &consumer_pidfd[c], &consumer_grace[c] }) {
			if (fd->valid())
				poll.forget(fd->get());
			fd->reset();
		}
		rec->state.store(kConsumerFree, std::memory_order_release);
	}
	seg.header->progress.fetch_add(1, std::memory_order_seq_cst);
	futex_wake_all(&seg.header->progress);
}

} // namespace xmem::owner
