// guest.cpp - a producer besides the owner: leases, publishes and give-backs over a
// connection of its own to the owner's I/O thread.
#include "guest.hpp"

#include "identity.hpp"
#include "rendezvous.hpp"

#include <algorithm>
#include <cstring>

namespace xmem {

using namespace layout;

namespace {

// How long a guest waiting for a free slot sleeps at most between leases: a slot freed
// without a wake (a release that missed its wait announcement) is found by then.
constexpr uint64_t kLeaseRetryNs = 10'000'000;
// How long a request waits for the owner's answer (and the connection, made on first
// use, for its Welcome).
constexpr int64_t kAnswerTimeoutNs = 30'000'000'000;

} // namespace

GuestProducer::GuestProducer(PoolImpl &pool) : pool_(pool)
{
}

GuestProducer::Producing::Producing(PoolImpl &pool)
	: record_(pool.seg.consumer(pool.holder_bit - 1)), header_(pool.seg.header)
{
	// A fifo publish of the owner's that waits for room in this consumer's queue holds
	// the lock the owner's I/O thread needs to serve this call: it stops waiting once it
	// sees this (a wake, as the queue's room would be).
	if (record_->producing.fetch_add(1, std::memory_order_seq_cst) == 0) {
		header_->progress.fetch_add(1, std::memory_order_seq_cst);
		futex_wake_all(&header_->progress);
	}
}

GuestProducer::Producing::~Producing()
{
	record_->producing.fetch_sub(1, std::memory_order_seq_cst);
}

Result<void> GuestProducer::connect(uint64_t deadline_ns)
{
	if (conn_.valid())
		return {};
	protocol::Hello hello = protocol::make_hello(protocol::PeerRole::producer, 0, "producer");
	hello.consumer_index = pool_.holder_bit - 1; // its consumer record
	UniqueFd self = pidfd_of_self();
	auto answer = rendezvous::ask_owner(pool_.path, hello, deadline_ns, pool_.where(), 0, self.get());
	if (!answer)
		return answer.error();
	conn_ = std::move(answer->conn);
	return {};
}

Result<protocol::Answer> GuestProducer::ask(const protocol::Request &request)
{
	// The owner answers at once (its I/O thread), but may be in a fifo consumer's wait,
	// publishing on a guest's behalf.
	uint64_t deadline_ns = deadline_after(kAnswerTimeoutNs);
	// This handle's owner is gone for good (a new owner of the name is another pool).
	if (gone_ || pool_.seg.header->state.load(std::memory_order_acquire) == kPoolClosed ||
	    pool_.owner_link->owner_gone())
		return make_error(Errc::closed, pool_.where() + " is closed");
	if (auto connected = connect(deadline_ns); !connected) {
		gone_ = connected.code() != Errc::timed_out;
		return make_error(gone_ ? Errc::closed : connected.code(), connected.error().message);
	}
	auto fail = [&](const Error &e) -> Result<protocol::Answer> {
		// The owner hung up (closed, died) or broke the protocol: no more requests.
		conn_.reset();
		gone_ = true;
		return make_error(e.code == Errc::timed_out ? Errc::timed_out : Errc::closed,
				  pool_.where() + ": the owner did not answer: " + e.message);
	};
	if (auto sent = rendezvous::send_message(conn_.get(), &request, sizeof(request), nullptr, 0); !sent)
		return fail(sent.error());
	auto msg = rendezvous::receive_message(conn_.get(), deadline_ns, pool_.where(), 0);
	if (!msg)
		return fail(msg.error());
	auto a = protocol::parse_answer(msg->data, pool_.where());
	if (!a && a.code() == Errc::not_a_pool)
		return fail(a.error());
	if (!a)
		return make_error(a.code(), a.error().message);
	return a;
}

Result<Memory> GuestProducer::owner_memory(Memory memory)
{
	// System memory is the same in every process: the owner may have no class of it yet
	// (a pool that grows makes one for the lease).
	if (!on_device(memory.storage))
		return memory;
	uint32_t n = pool_.classes_known.load(std::memory_order_acquire);
	for (uint32_t c = 0; c < n; c++) {
		if (!memory.holds(*pool_.classes[c].arena))
			continue;
		ClassRecord record;
		std::memcpy(&record, &pool_.seg.classes[c], sizeof(record));
		return Memory{ memory.storage, record.device };
	}
	// The owner numbers its devices otherwise: only a class of this device tells its ordinal.
	return make_error(Errc::out_of_range,
			  pool_.where() + ": no size class of " + memory_name(memory) +
				  " (the owner's preallocate() or acquire() of that device adds one)");
}

Result<BufferGuard> GuestProducer::acquire(uint64_t size, std::optional<Memory> memory, int64_t timeout_ns,
					   void *stream)
{
	uint64_t deadline = deadline_after(timeout_ns);
	Producing producing(pool_);
	// Every class the owner has added so far, imported: the lease may be of any.
	if (auto imported = pool_.owner_link->import_classes(); !imported)
		return imported.error();
	protocol::Request request = protocol::make_request(protocol::RequestOp::lease);
	request.size = size;
	if (!memory)
		memory = Memory{ pool_.classes[0].arena->storage(), pool_.classes[0].arena->device() };
	auto owners = owner_memory(*memory);
	if (!owners)
		return owners.error();
	request.storage = uint32_t(owners->storage);
	request.device = owners->device;
	ControlHeader *h = pool_.seg.header;
	Result<protocol::Answer> leased = make_error(Errc::timed_out, "");
	for (;;) {
		// Announced as waiting before asking, as the owner's acquire() does: a release
		// after the owner looked bumps `progress`, and the wait below ends at once.
		uint32_t seen = h->progress.load(std::memory_order_seq_cst);
		h->owner_waiting.fetch_add(1, std::memory_order_seq_cst);
		{
			std::lock_guard lock(lock_);
			leased = ask(request);
		}
		uint64_t now = monotonic_ns();
		bool wait = !leased && leased.code() == Errc::timed_out && now < deadline;
		if (wait)
			futex_wait(&h->progress, seen, std::min(deadline, now + kLeaseRetryNs));
		h->owner_waiting.fetch_sub(1, std::memory_order_seq_cst);
		if (!wait)
			break;
	}
	if (!leased)
		return make_error(leased.code(), leased.code() == Errc::timed_out
							 ? pool_.where() + ": no free slot within the timeout"
							 : leased.error().message);
	uint32_t i = leased->slot;
	auto refuse = [&](const std::string &why) -> Result<BufferGuard> {
		give_back(i, nullptr, nullptr);
		return make_error(Errc::not_a_pool,
				  pool_.where() + ": the owner leased slot " + std::to_string(i) + ", " + why);
	};
	if (pool_.is_spill(i) || !pool_.in_range(i))
		return refuse("which is out of range");
	if (!pool_.class_of(i) && (!pool_.owner_link->import_classes() || !pool_.class_of(i)))
		return refuse("which is in no size class");
	if (pool_.classes[*pool_.class_of(i)].arena->maps_per_slot())
		if (auto mapped = pool_.owner_link->map_slot(i); !mapped) {
			give_back(i, nullptr, nullptr);
			return make_error(mapped.code(), mapped.error().message);
		}
	bool held = false;
	{
		std::lock_guard lock(pool_.refs_lock);
		held = pool_.local_refs[i] != 0;
		if (!held) {
			pool_.local_refs[i] = 1;
			pool_.leased[i] = 1;
		}
	}
	if (held)
		return refuse("which this process holds");
	BufferGuard g = pool_.make_guard(i, true);
	// A fresh frame's metadata, as the owner's acquire() starts it.
	FrameMeta m{};
	m.index = i;
	m.storage_type = g.meta_.storage_type;
	m.device_id = g.meta_.device_id;
	m.pts = m.dts = m.duration = XMEM_NONE;
	g.meta_ = m;
	g.side_data_.reset();
	g.stream_ = stream;
	g.acquired_ = true;
	pool_.track_writer(i, &g);
	return g;
}

Result<void> GuestProducer::finish_writes(uint32_t index, void *stream, void *also)
{
	if (!pool_.sync_of(index))
		return {};
	// The owner's consumers read the frame (or the owner hands the slot on) once the
	// answer comes: this process's writes first, on its own ordinal of the slot's device.
	uint32_t device = pool_.classes[*pool_.class_of(index)].arena->device();
	auto done = device_synchronize(device, stream);
	if (done && also && also != stream)
		done = device_synchronize(device, also);
	return done;
}

Result<protocol::Answer> GuestProducer::put_out(BufferGuard &&frame, void *stream, uint32_t redemptions, int64_t ttl_ns)
{
	BufferGuard g = std::move(frame);
	if (!g.valid() || g.pool_.get() != &pool_)
		return make_error(Errc::invalid_argument, pool_.where() + ": publish of a buffer from another pool");
	uint32_t i = g.index_;
	{
		std::lock_guard lock(pool_.refs_lock);
		if (!g.writable_ || g.copy_ || i >= pool_.leased.size() || !pool_.leased[i])
			return make_error(Errc::read_only, pool_.where() + ": publish needs a buffer from acquire()");
	}
	if (auto done = finish_writes(i, stream ? stream : g.stream_); !done)
		return make_error(done.code(), pool_.where() + ": publish: " + done.error().message);
	protocol::Request request = protocol::make_request(protocol::RequestOp::publish);
	request.slot = i;
	request.meta = g.meta_;
	std::span<const std::byte> side = g.side_data();
	request.side_data_size = uint32_t(std::min(side.size(), sizeof(request.side_data)));
	if (request.side_data_size)
		std::memcpy(request.side_data, side.data(), request.side_data_size);
	request.redemptions = redemptions;
	request.ttl_ns = ttl_ns;
	// The slot is the owner's from here on, whatever it answers (an error gives it back).
	{
		std::lock_guard lock(pool_.refs_lock);
		pool_.local_refs[i] = 0;
		pool_.leased[i] = 0;
	}
	g.detach();
	Producing producing(pool_);
	std::lock_guard lock(lock_);
	return ask(request);
}

Result<void> GuestProducer::publish(BufferGuard &&frame, void *stream)
{
	auto a = put_out(std::move(frame), stream, 0, 0);
	if (!a)
		return a.error();
	return {};
}

Result<Ticket> GuestProducer::publish_ticket(BufferGuard &&frame, uint32_t redemptions, int64_t ttl_ns, void *stream)
{
	if (redemptions == 0) {
		BufferGuard dropped = std::move(frame);
		return make_error(Errc::invalid_argument, pool_.where() + ": a ticket for 0 redemptions");
	}
	if (ttl_ns <= 0) {
		BufferGuard dropped = std::move(frame);
		return make_error(Errc::invalid_argument, pool_.where() + ": a ticket's time to live must be positive");
	}
	auto a = put_out(std::move(frame), stream, redemptions, ttl_ns);
	if (!a)
		return a.error();
	return Ticket{ a->slot, a->seq, a->check };
}

void GuestProducer::give_back(uint32_t index, void *stream, void *also)
{
	// Its writes land before the owner hands the slot to anyone else. A release cannot
	// fail: a failed wait (a broken context) still gives the slot back.
	(void)finish_writes(index, stream, also);
	protocol::Request request = protocol::make_request(protocol::RequestOp::give_back);
	request.slot = index;
	Producing producing(pool_);
	std::lock_guard lock(lock_);
	(void)ask(request);
}

} // namespace xmem
