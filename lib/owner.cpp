// owner.cpp - the producer's side of a pool: creating the segments, acquire and
// publish with the queue policies, and the thread that attaches and reaps consumers.
#include "pool_impl.hpp"
#include "protocol.hpp"

#include <algorithm>
#include <thread>

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>

namespace xmem {

using namespace layout;

namespace {

constexpr uint64_t kHelloTimeoutNs = 2'000'000'000;
constexpr uint64_t kMaxSlotSize = uint64_t{ 1 } << 40;
constexpr uint32_t kDefaultQueueSize = 4;

enum class IoTag : uint32_t { listener = 1, stop = 2, pending = 3, consumer = 4 };

// Event data: tag, consumer index and fd. The fd lets the loop ignore an event for a
// connection that was already replaced: a registration can outlive close() while a
// child process, between posix_spawn's clone and exec, still holds a copy of the fd.
uint64_t io_data(IoTag tag, uint32_t index, int fd)
{
	return uint64_t(tag) << 56 | uint64_t(index & 0xffffff) << 32 | uint32_t(fd);
}

uint64_t holders_of(const SlotRecord &slot)
{
	return slot.holders[0].load(std::memory_order_seq_cst) | slot.holders[1].load(std::memory_order_seq_cst);
}

void copy_string(char *dst, size_t cap, std::string_view src)
{
	size_t n = std::min(src.size(), cap - 1);
	std::memcpy(dst, src.data(), n);
	std::memset(dst + n, 0, cap - n);
}

Result<UniqueFd> make_memfd(const std::string &label, uint64_t size, uint32_t mode, bool preallocate)
{
	UniqueFd fd(::memfd_create(label.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
	if (!fd.valid())
		return errno_error("memfd_create " + label);
	if (::ftruncate(fd.get(), off_t(size)) < 0)
		return errno_error("cannot size " + label + " to " + std::to_string(size) + " bytes");
	// Reserve the pages now: a full tmpfs must fail here, not SIGBUS a writer later.
	if (preallocate) {
		int err = ::posix_fallocate(fd.get(), 0, off_t(size));
		if (err != 0)
			return errno_error("cannot preallocate " + std::to_string(size) + " bytes for " + label, err);
	}
	if (::fchmod(fd.get(), mode & 0777) < 0)
		return errno_error("fchmod " + label);
	// Sealed against resizing, so no peer can truncate it under another's mapping.
	if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0)
		return errno_error("cannot seal " + label);
	return fd;
}

Result<Mapping> map_shared(int fd, uint64_t size, bool populate, const std::string &what)
{
	int flags = MAP_SHARED | (populate ? MAP_POPULATE : 0);
	void *p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, flags, fd, 0);
	if (p == MAP_FAILED)
		return errno_error("mmap " + what);
	return Mapping(p, size);
}

} // namespace

Result<void> PoolImpl::create_segments(const PoolConfig &config)
{
	slot_count = config.slot_count;
	max_consumers = config.max_consumers;
	ring_capacity = slot_count + 1; // every slot queued, plus an EOS marker
	consumer_record_size = layout::consumer_record_size(ring_capacity);
	slot_size = config.slot_size;
	slot_stride = round_up(slot_size, 4096);
	uint64_t csize = control_size(slot_count, max_consumers, ring_capacity);
	uint64_t dsize = slot_stride * slot_count;

	auto cfd = make_memfd("xmem-control:" + name, csize, config.mode, false);
	if (!cfd)
		return cfd.error();
	control_fd = std::move(cfd.value());
	auto cmap = map_shared(control_fd.get(), csize, true, "control segment");
	if (!cmap)
		return cmap.error();
	control = std::move(cmap.value());

	auto dfd = make_memfd("xmem-data:" + name, dsize, config.mode, true);
	if (!dfd)
		return dfd.error();
	data_fd = std::move(dfd.value());
	auto dmap = map_shared(data_fd.get(), dsize, true, "data arena");
	if (!dmap)
		return dmap.error();
	data = std::move(dmap.value());

	header = new (control.data()) ControlHeader{};
	header->magic = kMagic;
	header->abi_version = kAbiVersion;
	header->header_size = sizeof(ControlHeader);
	header->slot_record_size = sizeof(SlotRecord);
	header->consumer_record_size = consumer_record_size;
	header->slot_count = slot_count;
	header->max_consumers = max_consumers;
	header->ring_capacity = ring_capacity;
	header->control_size = csize;
	header->slot_size = slot_size;
	header->slot_stride = slot_stride;
	header->data_size = dsize;
	header->storage_type = XMEM_STORAGE_SYSTEM;
	header->device_id = 0;
	header->policy = uint32_t(config.policy);
	header->mode = config.mode;
	owner_pid = uint32_t(::getpid());
	header->owner_pid = owner_pid;
	header->owner_uid = uint32_t(::geteuid());
	header->block_timeout_ns = uint64_t(config.block_timeout.count());
	header->created_ns = monotonic_ns();
	copy_string(header->producer, sizeof(header->producer), config.producer);
	// The owner's own copies: consumers can write to the shared header.
	config_policy = config.policy;
	config_block_timeout_ns = uint64_t(config.block_timeout.count());
	config_mode = config.mode;
	std::memcpy(config_producer, header->producer, sizeof(config_producer));
	consumer_queue_size.assign(max_consumers, 0);

	slots = reinterpret_cast<SlotRecord *>(control.data() + slots_offset());
	for (uint32_t i = 0; i < slot_count; i++) {
		SlotRecord *s = new (&slots[i]) SlotRecord{};
		s->index = i;
		s->offset = uint64_t{ i } * slot_stride;
	}
	consumers_base = control.data() + consumers_offset(slot_count);
	for (uint32_t i = 0; i < max_consumers; i++) {
		ConsumerRecord *c = new (consumer(i)) ConsumerRecord{};
		std::atomic<uint64_t> *ring = ring_of(c);
		for (uint32_t e = 0; e < ring_capacity; e++)
			new (&ring[e]) std::atomic<uint64_t>(0);
	}
	return {};
}

Result<void> PoolImpl::set_format(std::string_view f)
{
	if (role != Role::owner)
		return make_error(Errc::wrong_role, where() + ": only the owner sets the format");
	if (f.size() >= XMEM_FORMAT_MAX)
		return make_error(Errc::invalid_argument, where() + ": format is " + std::to_string(f.size()) +
								  " bytes, the limit is " +
								  std::to_string(XMEM_FORMAT_MAX - 1));
	if (f.find('\0') != std::string_view::npos)
		return make_error(Errc::invalid_argument, where() + ": format contains a NUL byte");
	std::lock_guard lock(publish_lock);
	std::atomic_store(&format, std::make_shared<const std::string>(f));
	format_seq++;
	header->format_lock.fetch_add(1, std::memory_order_acq_rel); // odd: being written
	copy_string(header->format, sizeof(header->format), f);
	header->format_seq.store(format_seq, std::memory_order_relaxed);
	header->format_lock.fetch_add(1, std::memory_order_release);
	return {};
}

bool PoolImpl::try_reclaim(uint32_t index, SlotState to)
{
	SlotRecord &slot = slots[index];
	uint32_t s = slot.state.load(std::memory_order_acquire);
	if (s == kSlotFree)
		return slot.state.compare_exchange_strong(s, to, std::memory_order_seq_cst);
	if ((s != kSlotPublished && s != kSlotExclusive) || holders_of(slot) != 0)
		return false;
	if (!slot.state.compare_exchange_strong(s, kSlotReclaiming, std::memory_order_seq_cst))
		return false;
	// A consumer's get() sets its bit, then reads the state: after our CAS either we
	// see its bit here, or it sees RECLAIMING/`to` and backs off.
	if (holders_of(slot) == 0) {
		slot.state.store(to, std::memory_order_seq_cst);
		return true;
	}
	slot.state.store(s, std::memory_order_seq_cst);
	return false;
}

// Sleeps until DONE() or DEADLINE. Consumers bump `progress` when they release a
// slot or take a frame while the owner waits; the reaper bumps it too.
template<typename Done>
static bool wait_for_progress(ControlHeader *header, Done done, uint64_t deadline_ns)
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

Result<BufferGuard> PoolImpl::acquire(int64_t timeout_ns)
{
	if (role != Role::owner)
		return make_error(Errc::wrong_role, where() + ": only the owner acquires slots");
	if (shut.load())
		return make_error(Errc::closed, where() + " is closed");
	uint64_t deadline = deadline_after(timeout_ns);
	auto reclaimable = [this](uint32_t i) {
		const SlotRecord &s = slots[i];
		uint32_t st = s.state.load(std::memory_order_acquire);
		return st == kSlotFree || ((st == kSlotPublished || st == kSlotExclusive) && holders_of(s) == 0);
	};
	for (;;) {
		if (shut.load())
			return make_error(Errc::closed, where() + " is closed");
		uint32_t start = acquire_cursor.load(std::memory_order_relaxed);
		for (uint32_t n = 0; n < slot_count; n++) {
			uint32_t i = (start + n) % slot_count;
			if (!try_reclaim(i, kSlotWriting))
				continue;
			acquire_cursor.store(i + 1, std::memory_order_relaxed);
			{
				std::lock_guard lock(refs_lock);
				slots[i].holders[0].fetch_or(holder_mask(kOwnerBit), std::memory_order_seq_cst);
				local_refs[i] = 1;
			}
			FrameMeta &m = slots[i].meta;
			m = FrameMeta{};
			m.index = i;
			m.storage_type = XMEM_STORAGE_SYSTEM;
			m.pts = m.dts = m.duration = XMEM_NONE;
			return make_guard(i, true);
		}
		if (config_policy == Policy::drop_oldest) {
			std::lock_guard lock(publish_lock);
			if (drop_globally_oldest())
				continue;
		}
		bool any = wait_for_progress(
			header,
			[&] {
				if (shut.load())
					return true;
				for (uint32_t i = 0; i < slot_count; i++)
					if (reclaimable(i))
						return true;
				return false;
			},
			deadline);
		if (!any)
			return make_error(Errc::timed_out, where() + ": no free slot within the timeout (all " +
								   std::to_string(slot_count) + " slots are held)");
	}
}

bool PoolImpl::drop_oldest(uint32_t c)
{
	ConsumerRecord *rec = consumer(c);
	uint64_t h = rec->head.load(std::memory_order_acquire);
	uint64_t t = rec->tail.load(std::memory_order_relaxed);
	if (h == t)
		return false;
	uint64_t e = ring_of(rec)[h % ring_capacity].load(std::memory_order_relaxed);
	// The consumer may take the same entry: whoever wins the CAS owns it.
	if (!rec->head.compare_exchange_strong(h, h + 1, std::memory_order_acq_rel))
		return true;
	uint32_t index = uint32_t(e);
	if (index == kEosEntry)
		return true;
	if (index < slot_count) {
		uint32_t bit = 1 + c;
		slots[index].holders[bit / 64].fetch_and(~holder_mask(bit), std::memory_order_seq_cst);
	}
	rec->dropped.fetch_add(1, std::memory_order_relaxed);
	header->dropped.fetch_add(1, std::memory_order_relaxed);
	notify_owner(); // another owner thread may be waiting in acquire()
	return true;
}

bool PoolImpl::drop_globally_oldest()
{
	// The oldest queued frame, preferring one whose slot this drop frees outright
	// (no other holder): dropping a frame that is held elsewhere frees nothing yet.
	uint32_t victim = UINT32_MAX, freeing = UINT32_MAX;
	uint64_t oldest = UINT64_MAX, oldest_freeing = UINT64_MAX;
	for (uint32_t c : active) {
		ConsumerRecord *rec = consumer(c);
		uint64_t h = rec->head.load(std::memory_order_acquire);
		if (h == rec->tail.load(std::memory_order_relaxed))
			continue;
		uint32_t index = uint32_t(ring_of(rec)[h % ring_capacity].load(std::memory_order_relaxed));
		if (index >= slot_count)
			continue;
		uint64_t seq = slots[index].meta.seq;
		if (seq < oldest) {
			oldest = seq;
			victim = c;
		}
		uint32_t bit = 1 + c;
		bool only_this = true;
		for (uint32_t w = 0; w < kHolderWords; w++)
			only_this &= slots[index].holders[w].load(std::memory_order_relaxed) ==
				     (w == bit / 64 ? holder_mask(bit) : 0);
		if (only_this && seq < oldest_freeing) {
			oldest_freeing = seq;
			freeing = c;
		}
	}
	if (freeing != UINT32_MAX)
		victim = freeing;
	return victim != UINT32_MAX && drop_oldest(victim);
}

void PoolImpl::push(uint32_t c, uint64_t entry)
{
	ConsumerRecord *rec = consumer(c);
	uint64_t t = rec->tail.load(std::memory_order_relaxed);
	ring_of(rec)[t % ring_capacity].store(entry, std::memory_order_relaxed);
	rec->tail.store(t + 1, std::memory_order_seq_cst);
	rec->queued_total.fetch_add(1, std::memory_order_relaxed);
	// The consumer arms, then re-reads tail; we store tail, then read armed. One of
	// us sees the other, so a sleeping consumer is always woken, and a busy one
	// costs no syscall.
	if (rec->armed.load(std::memory_order_seq_cst) && rec->armed.exchange(0, std::memory_order_seq_cst)) {
		uint64_t one = 1;
		[[maybe_unused]] ssize_t n = ::write(consumer_event[c].get(), &one, sizeof(one));
	}
}

Result<void> PoolImpl::publish(BufferGuard &&frame)
{
	BufferGuard g = std::move(frame);
	if (role != Role::owner)
		return make_error(Errc::wrong_role, where() + ": only the owner publishes");
	if (!g.valid() || g.pool_.get() != this)
		return make_error(Errc::invalid_argument, where() + ": publish of a buffer from another pool");
	if (!g.writable_ || g.copy_)
		return make_error(Errc::read_only, where() + ": publish needs a buffer from acquire()");
	uint32_t index = g.index_;
	SlotRecord &slot = slots[index];
	if (slot.state.load(std::memory_order_acquire) != kSlotWriting)
		return make_error(Errc::invalid_argument, where() + ": slot " + std::to_string(index) +
								  " is not being written (published twice?)");
	if (g.meta_.size > slot_size)
		return make_error(Errc::out_of_range, where() + ": frame size " + std::to_string(g.meta_.size) +
							      " exceeds the slot size " + std::to_string(slot_size));
	if (g.meta_.n_planes > XMEM_MAX_PLANES)
		return make_error(Errc::invalid_argument, where() + ": n_planes " + std::to_string(g.meta_.n_planes) +
								  " > " + std::to_string(XMEM_MAX_PLANES));
	if (g.meta_.ndim > XMEM_MAX_DIMS)
		return make_error(Errc::invalid_argument, where() + ": ndim " + std::to_string(g.meta_.ndim) + " > " +
								  std::to_string(XMEM_MAX_DIMS));
	if (shut.load())
		return make_error(Errc::closed, where() + " is closed");

	std::unique_lock lock(publish_lock);
	// Numbered from the owner's own count: consumers can write the shared one.
	uint64_t seq = ++published_count;
	FrameMeta m = g.meta_;
	m.index = index;
	m.storage_type = XMEM_STORAGE_SYSTEM;
	m.device_id = 0;
	m.seq = seq;
	if (m.timestamp == 0)
		m.timestamp = monotonic_ns();
	m.producer_pid = owner_pid;
	std::memcpy(m.producer, config_producer, sizeof(m.producer));
	m.format_seq = format_seq;
	m.content_type[sizeof(m.content_type) - 1] = '\0';
	if (slot.format_seq != format_seq) {
		auto f = std::atomic_load(&format);
		copy_string(slot.format, sizeof(slot.format), *f);
		slot.format_seq = format_seq;
	}
	slot.meta = m;
	slot.state.store(kSlotPublished, std::memory_order_release);
	header->published.store(seq, std::memory_order_relaxed);

	uint32_t targets[XMEM_MAX_CONSUMERS];
	uint32_t ntargets = 0;
	uint64_t masks[kHolderWords] = {};
	for (uint32_t c : active) {
		ConsumerRecord *rec = consumer(c);
		const uint32_t queue_size = consumer_queue_size[c];
		uint64_t deadline = 0;
		bool take = rec->detached.load(std::memory_order_seq_cst) == 0;
		while (take) {
			uint64_t h = rec->head.load(std::memory_order_acquire);
			uint64_t t = rec->tail.load(std::memory_order_relaxed);
			if (t - h < queue_size)
				break;
			if (t - h > ring_capacity) {
				// Its head is garbage: hang up on it, the I/O thread reaps it.
				::shutdown(consumer_conn[c].get(), SHUT_RDWR);
				take = false;
				break;
			}
			if (config_policy == Policy::drop_new) {
				rec->dropped.fetch_add(1, std::memory_order_relaxed);
				header->dropped.fetch_add(1, std::memory_order_relaxed);
				take = false;
				break;
			}
			if (config_policy == Policy::block) {
				if (deadline == 0)
					deadline = deadline_after(int64_t(config_block_timeout_ns));
				bool moved = wait_for_progress(
					header,
					[&] {
						return shut.load() ||
						       rec->state.load(std::memory_order_seq_cst) != kConsumerActive ||
						       rec->tail.load(std::memory_order_relaxed) -
								       rec->head.load(std::memory_order_seq_cst) <
							       queue_size;
					},
					deadline);
				if (shut.load() || rec->state.load(std::memory_order_seq_cst) != kConsumerActive) {
					take = false;
					break;
				}
				if (moved)
					continue;
			}
			drop_oldest(c); // drop-oldest, or block that timed out
		}
		if (!take)
			continue;
		targets[ntargets++] = c;
		masks[(1 + c) / 64] |= holder_mask(1 + c);
	}
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
	// consumer finds itself the only holder (writable in place) from the start.
	g.reset();
	uint64_t entry = (seq << 32) | index;
	for (uint32_t i = 0; i < ntargets; i++) {
		uint32_t bit = 1 + targets[i];
		if (taken[bit / 64] & holder_mask(bit)) {
			consumer(targets[i])->dropped.fetch_add(1, std::memory_order_relaxed);
			header->dropped.fetch_add(1, std::memory_order_relaxed);
			continue;
		}
		push(targets[i], entry);
		// A consumer that detached after we looked drains its queue, then stops;
		// we stored tail, then read `detached` (it does the reverse): one of us
		// takes this entry back.
		if (consumer(targets[i])->detached.load(std::memory_order_seq_cst))
			for (uint32_t n = 0; n <= ring_capacity && drop_oldest(targets[i]); n++)
				;
	}
	return {};
}

Result<void> PoolImpl::end_of_stream()
{
	if (role != Role::owner)
		return make_error(Errc::wrong_role, where() + ": only the owner ends the stream");
	std::lock_guard lock(publish_lock);
	uint64_t seq = published_count;
	for (uint32_t c : active) {
		ConsumerRecord *rec = consumer(c);
		// EOS may use the ring's spare entry, so a full queue does not hold it back.
		uint64_t queued;
		while ((queued = rec->tail.load(std::memory_order_relaxed) -
				 rec->head.load(std::memory_order_acquire)) >= ring_capacity) {
			if (queued > ring_capacity)
				break; // garbage head: publish() hangs up on this consumer
			drop_oldest(c);
		}
		if (queued > ring_capacity)
			continue;
		push(c, (seq << 32) | kEosEntry);
	}
	return {};
}

void PoolImpl::shutdown()
{
	if (role != Role::owner || shut.exchange(true))
		return;
	// Wake this process's threads waiting in acquire() or a block-policy publish()
	// first: the latter holds publish_lock, which we take below.
	if (header) {
		header->progress.fetch_add(1, std::memory_order_seq_cst);
		futex_wake_all(&header->progress);
	}
	if (io_thread.joinable()) {
		uint64_t one = 1;
		[[maybe_unused]] ssize_t n = ::write(io_stop.get(), &one, sizeof(one));
		io_thread.join();
	}
	// The name goes first: a consumer woken below that reconnects at once finds no
	// socket (and waits for a new owner) rather than a dying one.
	rendezvous::release(owner_socket);
	std::lock_guard lock(publish_lock);
	if (header) {
		header->state.store(kPoolClosed, std::memory_order_seq_cst);
		// Wake this process's own threads waiting in acquire() or publish().
		header->progress.fetch_add(1, std::memory_order_seq_cst);
		futex_wake_all(&header->progress);
		for (uint32_t c : active) {
			consumer(c)->armed.store(0, std::memory_order_relaxed);
			uint64_t one = 1;
			[[maybe_unused]] ssize_t n = ::write(consumer_event[c].get(), &one, sizeof(one));
		}
	}
	// Consumers keep their mappings: the memfds live on until the last one unmaps,
	// so closing never waits for them and never frees memory under them.
	active.clear();
	consumer_conn.clear();
	consumer_event.clear();
}

// I/O thread

void PoolImpl::io_loop()
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
				if (index < max_consumers && consumer_conn[index].get() == fd)
					reap(index);
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

void PoolImpl::accept_peers()
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

void PoolImpl::handle_hello(int fd)
{
	auto node = pending.extract(fd);
	if (node.empty())
		return;
	UniqueFd conn = std::move(node.mapped().conn);
	::epoll_ctl(io_epoll.get(), EPOLL_CTL_DEL, fd, nullptr);

	auto reject = [&](xmem_status code, const std::string &message) {
		protocol::Reject r{};
		r.header = protocol::make_header(protocol::MessageType::reject, sizeof(r));
		r.code = code;
		copy_string(r.message, sizeof(r.message), message);
		(void)rendezvous::send_message(conn.get(), &r, sizeof(r), nullptr, 0);
	};

	auto msg = rendezvous::receive_message(conn.get(), monotonic_ns(), "peer");
	if (!msg)
		return;
	const auto &data = msg->data;
	if (data.size() < sizeof(protocol::MessageHeader))
		return reject(XMEM_ENOTPOOL, "message too short for an xmem hello");
	protocol::MessageHeader mh;
	std::memcpy(&mh, data.data(), sizeof(mh));
	if (mh.magic != protocol::kWireMagic)
		return reject(XMEM_ENOTPOOL, "not an xmem hello (bad magic)");
	if (mh.version != protocol::kVersion)
		return reject(XMEM_EVERSION, "protocol version " + std::to_string(mh.version) +
						     " is not supported (owner speaks " +
						     std::to_string(protocol::kVersion) + ")");
	if (mh.type != protocol::MessageType::hello || data.size() != sizeof(protocol::Hello) || mh.size != data.size())
		return reject(XMEM_ENOTPOOL, "malformed hello");
	protocol::Hello hello;
	std::memcpy(&hello, data.data(), sizeof(hello));

	// Credentials are checked after reading the Hello: closing with it unread would
	// reset the connection and lose the Reject on the way.
	ucred cred{};
	socklen_t len = sizeof(cred);
	if (::getsockopt(conn.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0)
		return reject(XMEM_ESYSTEM, "cannot read the peer's credentials");
	uint32_t mode = config_mode;
	bool allowed =
		cred.uid == ::geteuid() || cred.uid == 0 || (mode & 0006) || ((mode & 0060) && cred.gid == ::getegid());
	if (!allowed)
		return reject(XMEM_EACCES, "uid " + std::to_string(cred.uid) + " is not allowed by the pool's mode " +
						   std::to_string((mode >> 6) & 7) + std::to_string((mode >> 3) & 7) +
						   std::to_string(mode & 7));

	protocol::Welcome w{};
	w.header = protocol::make_header(protocol::MessageType::welcome, sizeof(w));
	w.control_size = control.size();
	w.data_size = this->data.size();
	{
		std::lock_guard lock(publish_lock);
		auto f = std::atomic_load(&format);
		copy_string(w.format, sizeof(w.format), *f);
		w.format_seq = format_seq;
	}

	if (hello.role == protocol::PeerRole::inspector) {
		if (!msg->fds.empty())
			return reject(XMEM_EINVAL, "an inspector sends no file descriptors");
		w.consumer_index = protocol::kNoConsumer;
		int fds[1] = { control_fd.get() };
		(void)rendezvous::send_message(conn.get(), &w, sizeof(w), fds, 1);
		return;
	}
	if (hello.role != protocol::PeerRole::consumer)
		return reject(XMEM_ENOTPOOL, "unknown peer role");
	if (msg->fds.size() != 1)
		return reject(XMEM_EINVAL, "a consumer sends exactly one eventfd");
	UniqueFd event = std::move(msg->fds[0]);
	char link[64] = {};
	std::string proc = "/proc/self/fd/" + std::to_string(event.get());
	// Without /proc mounted the check cannot be made; the fd is only ever written.
	bool have_proc = ::readlink(proc.c_str(), link, sizeof(link) - 1) >= 0;
	if ((have_proc && std::string_view(link) != "anon_inode:[eventfd]") || (!have_proc && errno != ENOENT))
		return reject(XMEM_EINVAL, "the file descriptor in hello is not an eventfd");
	::fcntl(event.get(), F_SETFL, ::fcntl(event.get(), F_GETFL) | O_NONBLOCK);
	uint32_t queue = hello.queue_size ? hello.queue_size : kDefaultQueueSize;
	queue = std::clamp<uint32_t>(queue, 1, slot_count);

	uint32_t index = UINT32_MAX;
	{
		std::lock_guard lock(publish_lock);
		if (shut.load())
			return;
		for (uint32_t i = 0; i < max_consumers; i++) {
			if (consumer(i)->state.load(std::memory_order_acquire) == kConsumerFree) {
				index = i;
				break;
			}
		}
		if (index == UINT32_MAX)
			return reject(XMEM_EFULL, "pool has its maximum of " + std::to_string(max_consumers) +
							  " consumers attached");
		ConsumerRecord *rec = consumer(index);
		rec->pid = uint32_t(cred.pid);
		rec->uid = cred.uid;
		rec->queue_size = queue;
		consumer_queue_size[index] = queue;
		rec->detached.store(0, std::memory_order_relaxed);
		rec->attach_ns = monotonic_ns();
		hello.client[sizeof(hello.client) - 1] = '\0';
		copy_string(rec->client, sizeof(rec->client), hello.client);
		rec->head.store(0, std::memory_order_relaxed);
		rec->tail.store(0, std::memory_order_relaxed);
		rec->received.store(0, std::memory_order_relaxed);
		rec->dropped.store(0, std::memory_order_relaxed);
		rec->queued_total.store(0, std::memory_order_relaxed);
		// Armed from the start: fd() polls readable on the first frame.
		rec->armed.store(1, std::memory_order_relaxed);
		rec->state.store(kConsumerActive, std::memory_order_seq_cst);
		active.push_back(index);
		consumer_event[index] = std::move(event);
	}
	w.consumer_index = index;
	int fds[2] = { control_fd.get(), data_fd.get() };
	epoll_event ev{};
	ev.events = EPOLLIN | EPOLLRDHUP;
	ev.data.u64 = io_data(IoTag::consumer, index, conn.get());
	int cfd = conn.get();
	{
		std::lock_guard lock(publish_lock);
		consumer_conn[index] = std::move(conn);
	}
	if (!rendezvous::send_message(cfd, &w, sizeof(w), fds, 2) ||
	    ::epoll_ctl(io_epoll.get(), EPOLL_CTL_ADD, cfd, &ev) < 0)
		reap(index);
}

void PoolImpl::reap(uint32_t c)
{
	if (c >= max_consumers)
		return;
	ConsumerRecord *rec = consumer(c);
	// DEAD first, and wake: a publish blocked on this consumer gives up at once.
	rec->state.store(kConsumerDead, std::memory_order_seq_cst);
	header->progress.fetch_add(1, std::memory_order_seq_cst);
	futex_wake_all(&header->progress);
	{
		std::lock_guard lock(publish_lock);
		active.erase(std::remove(active.begin(), active.end(), c), active.end());
		// Clearing a bit is idempotent and only this consumer ever set its bit for
		// itself: its references are released exactly once, whatever instruction it
		// died on (docs/design.md, "Invariants").
		uint32_t bit = 1 + c;
		for (uint32_t i = 0; i < slot_count; i++) {
			uint64_t old =
				slots[i].holders[bit / 64].fetch_and(~holder_mask(bit), std::memory_order_seq_cst);
			if (old & holder_mask(bit))
				try_reclaim(i, kSlotFree);
		}
		rec->head.store(0, std::memory_order_relaxed);
		rec->tail.store(0, std::memory_order_relaxed);
		if (consumer_conn.size() > c) {
			// Deregister explicitly: close() alone leaves the registration while
			// another process holds a copy of the fd.
			if (consumer_conn[c].valid())
				::epoll_ctl(io_epoll.get(), EPOLL_CTL_DEL, consumer_conn[c].get(), nullptr);
			consumer_conn[c].reset();
			consumer_event[c].reset();
		}
		header->reaped.fetch_add(1, std::memory_order_relaxed);
		rec->state.store(kConsumerFree, std::memory_order_release);
	}
	header->progress.fetch_add(1, std::memory_order_seq_cst);
	futex_wake_all(&header->progress);
}

Result<std::shared_ptr<BufferPool>> BufferPool::create(std::string_view name, const PoolConfig &config)
{
	auto path = socket_path(name);
	if (!path)
		return path.error();
	std::string where = "pool '" + std::string(name) + "'";
	if (config.slot_count < 1 || config.slot_count > XMEM_MAX_SLOTS)
		return make_error(Errc::invalid_argument, where + ": slot count " + std::to_string(config.slot_count) +
								  " out of range 1.." + std::to_string(XMEM_MAX_SLOTS));
	if (config.slot_size == 0 || config.slot_size > kMaxSlotSize)
		return make_error(Errc::invalid_argument, where + ": slot size " + std::to_string(config.slot_size) +
								  " out of range 1.." + std::to_string(kMaxSlotSize));
	if (config.max_consumers < 1 || config.max_consumers > XMEM_MAX_CONSUMERS)
		return make_error(Errc::invalid_argument,
				  where + ": max consumers " + std::to_string(config.max_consumers) +
					  " out of range 1.." + std::to_string(XMEM_MAX_CONSUMERS));
	if (config.policy != Policy::block && config.policy != Policy::drop_oldest && config.policy != Policy::drop_new)
		return make_error(Errc::invalid_argument, where + ": unknown policy");
	if (config.mode & ~0777u)
		return make_error(Errc::invalid_argument, where + ": mode must be within 0777");
	if ((config.mode & 0600) != 0600)
		return make_error(Errc::invalid_argument, where + ": mode must give the owner read and write (0600)");
	if (config.block_timeout.count() < 0)
		return make_error(Errc::invalid_argument, where + ": negative block timeout");
	if (config.producer.size() >= XMEM_PRODUCER_MAX)
		return make_error(Errc::invalid_argument, where + ": producer name longer than " +
								  std::to_string(XMEM_PRODUCER_MAX - 1) + " bytes");
	uint64_t stride = round_up(config.slot_size, 4096);
	if (stride * config.slot_count / config.slot_count != stride)
		return make_error(Errc::invalid_argument, where + ": slots too large");

	auto impl = std::make_shared<PoolImpl>();
	impl->role = Role::owner;
	impl->name = std::string(name);
	impl->path = path.value();
	auto claimed = rendezvous::claim(impl->path, config.mode);
	if (!claimed)
		return claimed.error();
	impl->owner_socket = std::move(claimed.value());
	auto made = impl->create_segments(config);
	if (!made)
		return made.error();
	impl->local_refs.assign(impl->slot_count, 0);
	impl->consumer_conn.resize(impl->max_consumers);
	impl->consumer_event.resize(impl->max_consumers);
	impl->format = std::make_shared<const std::string>();
	auto fmt = impl->set_format(config.format);
	if (!fmt)
		return fmt.error();

	impl->io_epoll = UniqueFd(::epoll_create1(EPOLL_CLOEXEC));
	impl->io_stop = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
	if (!impl->io_epoll.valid() || !impl->io_stop.valid())
		return errno_error(where + ": epoll/eventfd");
	epoll_event ev{};
	ev.events = EPOLLIN;
	ev.data.u64 = io_data(IoTag::listener, 0, impl->owner_socket.listener.get());
	if (::epoll_ctl(impl->io_epoll.get(), EPOLL_CTL_ADD, impl->owner_socket.listener.get(), &ev) < 0)
		return errno_error(where + ": epoll_ctl");
	ev.data.u64 = io_data(IoTag::stop, 0, impl->io_stop.get());
	if (::epoll_ctl(impl->io_epoll.get(), EPOLL_CTL_ADD, impl->io_stop.get(), &ev) < 0)
		return errno_error(where + ": epoll_ctl");
	// The thread only touches impl through this raw pointer; shutdown() joins it
	// before impl goes away.
	PoolImpl *raw = impl.get();
	impl->io_thread = std::thread([raw] { raw->io_loop(); });
	return std::make_shared<BufferPool>(std::move(impl));
}

} // namespace xmem
