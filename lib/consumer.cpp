// consumer.cpp - a consumer's side of a pool: the attach handshake with every check
// on what the owner sent, and receive() with its sleep/wake protocol.
#include "pool_impl.hpp"
#include "protocol.hpp"

#include <algorithm>
#include <thread>

#include <fcntl.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>

namespace xmem {

using namespace layout;

namespace {

constexpr uint64_t kReplyTimeoutNs = 2'000'000'000;

Error segment_error(const std::string &where, const std::string &what)
{
	return make_error(Errc::bad_segment, where + ": bad control segment: " + what);
}

Result<Mapping> map_fd(int fd, uint64_t min_size, const std::string &where, const char *what)
{
	struct stat st;
	if (::fstat(fd, &st) < 0)
		return errno_error(where + ": fstat " + what);
	if (!S_ISREG(st.st_mode) || uint64_t(st.st_size) < min_size)
		return segment_error(where, std::string(what) + " is " + std::to_string(st.st_size) +
						    " bytes, expected " + std::to_string(min_size));
	// Sealed against shrinking, or the owner could make our reads SIGBUS.
	int seals = ::fcntl(fd, F_GET_SEALS);
	if (seals < 0 || !(seals & F_SEAL_SHRINK))
		return segment_error(where, std::string(what) + " is not sealed against shrinking");
	void *p = ::mmap(nullptr, size_t(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		return errno_error(where + ": mmap " + what);
	return Mapping(p, size_t(st.st_size));
}

} // namespace

Result<void> PoolImpl::attach(const OpenOptions &options, uint64_t deadline_ns)
{
	bool inspect = options.inspect;
	for (;;) {
		auto conn = rendezvous::connect(path, deadline_ns);
		if (!conn)
			return conn.error();
		UniqueFd ev;
		if (!inspect) {
			ev = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
			if (!ev.valid())
				return errno_error(where() + ": eventfd");
		}
		protocol::Hello hello{};
		hello.header = protocol::make_header(protocol::MessageType::hello, sizeof(hello));
		hello.role = inspect ? protocol::PeerRole::inspector : protocol::PeerRole::consumer;
		hello.queue_size = options.queue_size;
		std::memcpy(hello.client, options.client.data(),
			    std::min(options.client.size(), sizeof(hello.client) - 1));
		int evfd = ev.get();
		auto sent = rendezvous::send_message(conn->get(), &hello, sizeof(hello), &evfd, inspect ? 0 : 1);
		Result<rendezvous::Received> msg =
			sent ? rendezvous::receive_message(
				       conn->get(), std::max(deadline_ns, monotonic_ns() + kReplyTimeoutNs), where())
			     : Result<rendezvous::Received>(sent.error());
		if (!msg) {
			// An owner that dies during the handshake: wait for the next one.
			if (msg.code() == Errc::closed && monotonic_ns() < deadline_ns) {
				std::this_thread::sleep_for(std::chrono::milliseconds(5));
				continue;
			}
			if (msg.code() == Errc::timed_out)
				return make_error(Errc::not_a_pool,
						  where() + ": the socket's server did not answer (not an xmem pool?)");
			if (msg.code() == Errc::closed)
				return make_error(Errc::not_a_pool,
						  where() + ": the socket's server hung up without answering");
			return msg.error();
		}

		const auto &bytes = msg->data;
		protocol::MessageHeader mh{};
		if (bytes.size() < sizeof(mh))
			return make_error(Errc::not_a_pool,
					  where() + ": reply too short for an xmem message (not an xmem pool?)");
		std::memcpy(&mh, bytes.data(), sizeof(mh));
		if (mh.magic != protocol::kWireMagic)
			return make_error(Errc::not_a_pool, where() + ": reply has a bad magic (not an xmem pool)");
		if (mh.version != protocol::kVersion)
			return make_error(Errc::version_mismatch,
					  where() + ": owner speaks protocol version " + std::to_string(mh.version) +
						  ", this library " + std::to_string(protocol::kVersion));
		if (mh.type == protocol::MessageType::reject && bytes.size() == sizeof(protocol::Reject)) {
			protocol::Reject r;
			std::memcpy(&r, bytes.data(), sizeof(r));
			r.message[sizeof(r.message) - 1] = '\0';
			Errc code = r.code < 0 && r.code >= XMEM_ENOMEM ? Errc(r.code) : Errc::not_a_pool;
			return make_error(code, where() + ": refused by the owner: " + r.message);
		}
		if (mh.type != protocol::MessageType::welcome || bytes.size() != sizeof(protocol::Welcome) ||
		    mh.size != bytes.size())
			return make_error(Errc::not_a_pool, where() + ": malformed reply from the owner");
		protocol::Welcome w;
		std::memcpy(&w, bytes.data(), sizeof(w));
		size_t want_fds = inspect ? 1 : 2;
		if (msg->fds.size() != want_fds)
			return make_error(Errc::not_a_pool,
					  where() + ": owner sent " + std::to_string(msg->fds.size()) +
						  " file descriptors, expected " + std::to_string(want_fds));

		// The header first, on its own, before any size from it is trusted.
		auto cmap = map_fd(msg->fds[0].get(), sizeof(ControlHeader), where(), "control segment");
		if (!cmap)
			return cmap.error();
		control = std::move(cmap.value());
		control_fd = std::move(msg->fds[0]);
		ControlConstants k;
		std::memcpy(&k, control.data(), sizeof(k));
		const ControlConstants *h = &k;
		if (h->magic != kMagic)
			return segment_error(where(), "wrong magic");
		if (h->abi_version != kAbiVersion)
			return make_error(Errc::version_mismatch,
					  where() + ": control segment ABI version " + std::to_string(h->abi_version) +
						  ", this library " + std::to_string(kAbiVersion));
		if (h->header_size != sizeof(ControlHeader) || h->slot_record_size != sizeof(SlotRecord))
			return segment_error(where(), "record sizes differ from this library's");
		if (h->slot_count < 1 || h->slot_count > XMEM_MAX_SLOTS)
			return segment_error(where(), "slot count " + std::to_string(h->slot_count) + " out of range");
		if (h->max_consumers < 1 || h->max_consumers > XMEM_MAX_CONSUMERS)
			return segment_error(where(),
					     "max consumers " + std::to_string(h->max_consumers) + " out of range");
		if (h->ring_capacity != h->slot_count + 1 ||
		    h->consumer_record_size != layout::consumer_record_size(h->ring_capacity))
			return segment_error(where(), "ring size inconsistent");
		if (h->control_size != layout::control_size(h->slot_count, h->max_consumers, h->ring_capacity) ||
		    h->control_size > control.size())
			return segment_error(where(),
					     "control size " + std::to_string(h->control_size) + " inconsistent");
		if (h->slot_size == 0 || h->slot_stride < h->slot_size || h->slot_stride % 64 != 0 ||
		    h->slot_stride > (uint64_t{ 1 } << 41) || h->data_size != h->slot_stride * h->slot_count)
			return segment_error(where(), "slot sizes inconsistent");
		if (h->storage_type != XMEM_STORAGE_SYSTEM)
			return make_error(Errc::not_a_pool, where() + ": storage type " +
								    std::to_string(h->storage_type) +
								    " is not supported by this library");
		if (!inspect && w.consumer_index >= h->max_consumers)
			return make_error(Errc::not_a_pool, where() + ": consumer index " +
								    std::to_string(w.consumer_index) + " out of range");

		header = reinterpret_cast<ControlHeader *>(control.data());
		slot_count = k.slot_count;
		max_consumers = k.max_consumers;
		ring_capacity = k.ring_capacity;
		consumer_record_size = k.consumer_record_size;
		slot_size = k.slot_size;
		slot_stride = k.slot_stride;
		slots = reinterpret_cast<SlotRecord *>(control.data() + slots_offset());
		consumers_base = control.data() + consumers_offset(slot_count);
		w.format[sizeof(w.format) - 1] = '\0';
		format = std::make_shared<const std::string>(w.format);
		format_seq = w.format_seq;
		sock = std::move(conn.value());

		if (inspect) {
			role = Role::inspector;
			return {};
		}
		auto dmap = map_fd(msg->fds[1].get(), k.data_size, where(), "data arena");
		if (!dmap)
			return dmap.error();
		data = std::move(dmap.value());
		data_fd = std::move(msg->fds[1]);
		consumer_index = w.consumer_index;
		holder_bit = 1 + consumer_index;
		self = consumer(consumer_index);
		local_refs.assign(slot_count, 0);
		event = std::move(ev);
		armed_once = true; // the owner arms new consumers (see handle_hello)

		epoll = UniqueFd(::epoll_create1(EPOLL_CLOEXEC));
		if (!epoll.valid())
			return errno_error(where() + ": epoll_create1");
		epoll_event e{};
		e.events = EPOLLIN;
		e.data.fd = event.get();
		if (::epoll_ctl(epoll.get(), EPOLL_CTL_ADD, event.get(), &e) < 0)
			return errno_error(where() + ": epoll_ctl");
		e.events = EPOLLIN | EPOLLRDHUP;
		e.data.fd = sock.get();
		if (::epoll_ctl(epoll.get(), EPOLL_CTL_ADD, sock.get(), &e) < 0)
			return errno_error(where() + ": epoll_ctl");
		role = Role::consumer;
		return {};
	}
}

std::shared_ptr<const std::string> PoolImpl::format_of(const SlotRecord &slot)
{
	uint64_t seq = slot.meta.format_seq;
	std::lock_guard lock(format_lock);
	auto current = std::atomic_load(&format);
	if (seq == format_seq || role == Role::owner)
		return current;
	auto f = std::make_shared<const std::string>(slot.format, strnlen(slot.format, sizeof(slot.format)));
	if (seq > format_seq) {
		std::atomic_store(&format, f);
		format_seq = seq;
	}
	return f;
}

Result<BufferGuard> PoolImpl::receive(int64_t timeout_ns)
{
	if (role != Role::consumer)
		return make_error(Errc::wrong_role, where() + ": only a consumer receives");
	// One receiver at a time: the armed/eventfd handshake has a single sleeper, and
	// a second thread draining the eventfd could leave the first asleep unarmed.
	std::lock_guard serial(receive_lock);
	uint64_t deadline = deadline_after(timeout_ns);
	std::atomic<uint64_t> *ring = ring_of(self);
	for (;;) {
		// The owner clears `armed` and then writes the eventfd: read it only then, so
		// a consumer checking an empty queue makes no syscall. If the write has not
		// landed yet, keep trying on later calls, or a poller would spin on it.
		if (drain_pending.load(std::memory_order_relaxed) ||
		    (armed_once.load(std::memory_order_relaxed) && self->armed.load(std::memory_order_seq_cst) == 0)) {
			uint64_t count;
			if (::read(event.get(), &count, sizeof(count)) > 0) {
				drain_pending.store(false, std::memory_order_relaxed);
				armed_once.store(false, std::memory_order_relaxed);
			} else {
				drain_pending.store(self->armed.load(std::memory_order_seq_cst) == 0,
						    std::memory_order_relaxed);
			}
		}
		uint64_t h = self->head.load(std::memory_order_acquire);
		uint64_t t = self->tail.load(std::memory_order_seq_cst);
		if (t - h > ring_capacity) {
			// The owner may have dropped and pushed between our two loads.
			if (self->head.load(std::memory_order_acquire) != h)
				continue;
			return segment_error(where(), "queue indices out of range");
		}
		if (h != t) {
			uint64_t e = ring[h % ring_capacity].load(std::memory_order_acquire);
			// The owner may drop this entry (drop-oldest) at the same time. seq_cst:
			// this store pairs with the owner_waiting load in notify_owner().
			if (!self->head.compare_exchange_strong(h, h + 1, std::memory_order_seq_cst))
				continue;
			self->received.fetch_add(1, std::memory_order_relaxed);
			notify_owner(); // a block-policy publish may wait for this room
			uint32_t index = uint32_t(e);
			if (index == kEosEntry)
				return make_error(Errc::end_of_stream, where() + ": end of stream");
			if (index >= slot_count)
				return segment_error(where(),
						     "queued slot index " + std::to_string(index) + " out of range");
			{
				std::lock_guard lock(refs_lock);
				local_refs[index]++; // the queue's holder bit becomes this reference
			}
			BufferGuard g = make_guard(index, false);
			if (g.meta_.size > slot_size)
				g.meta_.size = slot_size;
			return g;
		}
		if (owner_gone.load() || header->state.load(std::memory_order_acquire) == kPoolClosed)
			return make_error(Errc::closed, where() + ": the owner closed the pool");
		// Arm, then look again: the owner stores tail, then reads armed.
		self->armed.store(1, std::memory_order_seq_cst);
		armed_once.store(true, std::memory_order_relaxed);
		if (self->tail.load(std::memory_order_seq_cst) != h)
			continue;
		uint64_t now = monotonic_ns();
		int ms = 0;
		if (now < deadline)
			ms = deadline == UINT64_MAX
				     ? -1
				     : int(std::min<uint64_t>((deadline - now + 999999) / 1000000, INT32_MAX));
		// With nothing to wait for, still notice an owner that died (a hang-up on
		// the socket), so a poller does not spin on a readable fd().
		pollfd fds[2] = { { sock.get(), POLLIN | POLLRDHUP, 0 }, { event.get(), POLLIN, 0 } };
		int r = ::poll(fds, ms == 0 ? 1 : 2, ms);
		if (r < 0 && errno != EINTR)
			return errno_error(where() + ": poll");
		if (r > 0 && fds[0].revents) {
			owner_gone.store(true); // the owner never writes after Welcome: hang-up
			continue;
		}
		if (ms == 0)
			return make_error(Errc::timed_out, where() + ": no frame within the timeout");
	}
}

void PoolImpl::detach_queue()
{
	if (role != Role::consumer || !self)
		return;
	// No more frames for this handle; frames still held by guards stay held.
	self->detached.store(1, std::memory_order_seq_cst);
	std::atomic<uint64_t> *ring = ring_of(self);
	for (;;) {
		uint64_t h = self->head.load(std::memory_order_acquire);
		uint64_t t = self->tail.load(std::memory_order_seq_cst);
		if (h == t || t - h > ring_capacity)
			return;
		uint64_t e = ring[h % ring_capacity].load(std::memory_order_acquire);
		if (!self->head.compare_exchange_strong(h, h + 1, std::memory_order_seq_cst))
			continue;
		uint32_t index = uint32_t(e);
		if (index >= slot_count)
			continue;
		std::lock_guard lock(refs_lock);
		if (local_refs[index] == 0)
			clear_holder_bit(index, holder_bit);
	}
}

Result<std::shared_ptr<BufferPool>> BufferPool::open(std::string_view name, const OpenOptions &options)
{
	auto path = socket_path(name);
	if (!path)
		return path.error();
	if (options.timeout.count() < 0)
		return make_error(Errc::invalid_argument, "pool '" + std::string(name) + "': negative timeout");
	auto impl = std::make_shared<PoolImpl>();
	impl->name = std::string(name);
	impl->path = path.value();
	auto attached = impl->attach(options, deadline_after(options.timeout.count()));
	if (!attached)
		return attached.error();
	return std::make_shared<BufferPool>(std::move(impl));
}

} // namespace xmem
