// publisher.hpp - the owner's role: acquire and publish with the queue policies, the
// format, and the I/O thread that attaches consumers and reaps the dead ones.
#pragma once

#include "identity.hpp"
#include "owner/growth.hpp"
#include "owner/queues.hpp"
#include "owner/spill_mover.hpp"
#include "owner/tickets.hpp"
#include "pool_impl.hpp"
#include "protocol.hpp"
#include "rendezvous.hpp"

#include <condition_variable>
#include <map>
#include <thread>

#include <sys/socket.h>

namespace xmem {

// A guest: an attached consumer that produces too (protocol.hpp, PeerRole::producer), as
// the owner serves it.
struct Guest {
	UniqueFd conn;
	uint32_t consumer = protocol::kNoConsumer; // its consumer record
	uint32_t pid = 0; // SO_PEERCRED's: 0 where this owner cannot see its process
	UniqueFd pidfd; // tells when its process has exited; none where it cannot be made
	// The slots it writes: the owner's references (its bit, local_refs 1), held without
	// a guard, since the owner's GPU work never touched them (see drop_lease()).
	std::vector<uint32_t> leases;
};

// What a dead guest leaves until its process has exited: the device slots it was writing.
struct GuestRemains {
	UniqueFd watch; // its pidfd, or a grace timer
	std::vector<uint32_t> leases;
};

// How a frame is published: the owner's, or a guest's on its behalf.
struct Origin {
	// The consumer record of the guest that wrote it, which is not queued its own frame.
	uint32_t except = protocol::kNoConsumer;
	// Its writes are complete (a guest synchronized its stream): a device slot's ready
	// word is stored at once, no stream of this process involved.
	bool writes_done = false;
	// Its process as this owner sees it (SO_PEERCRED; 0: the owner's own, or not visible).
	uint32_t producer_pid = 0;
};

class Publisher
{
public:
	// Creates pool NAME at PATH: claims the name, lays out the segment and arena,
	// starts the I/O thread.
	static Result<std::shared_ptr<PoolImpl>> create(std::string_view name, std::string path,
							const PoolConfig &config);

	explicit Publisher(PoolImpl &pool);
	~Publisher();
	Publisher(const Publisher &) = delete;
	Publisher &operator=(const Publisher &) = delete;

	using Memory = owner::Memory;
	// A free slot of SIZE bytes or more, of the smallest class of MEMORY (none: the first
	// class's) that has one; SIZE 0: of the first class (BufferPool::acquire).
	Result<BufferGuard> acquire(uint64_t size, std::optional<Memory> memory, int64_t timeout_ns, void *stream);
	// Adds a size class of COUNT slots of SLOT_SIZE bytes (BufferPool::preallocate).
	Result<uint32_t> preallocate(uint64_t slot_size, uint32_t count, Storage storage, uint32_t device);
	Result<void> publish(BufferGuard &&frame, void *stream, const Origin &origin = {});
	// Publishes FRAME to no queue, the owner's reference kept for a ticket of
	// REDEMPTIONS redemptions within TTL_NS (BufferPool::publish_ticket).
	Result<Ticket> publish_ticket(BufferGuard &&frame, uint32_t redemptions, int64_t ttl_ns, void *stream,
				      const Origin &origin = {});
	Result<void> end_of_stream();
	Result<void> set_format(std::string_view format);
	// Closes the pool: the name is freed, consumers see Errc::closed after their
	// queue, waiters here wake. Never waits for consumers. Idempotent.
	void shutdown();

private:
	Result<void> start(const PoolConfig &config);
	// The owner's reference on slot I of class CLS, which acquire() just took (WRITING),
	// its metadata reset: a writable guard once its device slot's GPU reads are done
	// (STREAM waits).
	Result<BufferGuard> claim(uint32_t i, const PoolImpl::SlotClass &cls, void *stream, uint64_t deadline);
	// The I/O thread's trim timer fired: tickets used up end, then idle dynamic slots
	// give their memory back (Growth::trim_idle).
	void trim_idle();
	// What publish() and publish_ticket() share: checks G, stamps its metadata and makes
	// its slot PUBLISHED (ready after STREAM's work, for device slots), with the ticket
	// words TICKET_CHECK and REDEMPTIONS (0, 0: no ticket). Takes LOCK (publish_lock) and
	// returns the frame's sequence number, LOCK held; the owner's reference stays.
	Result<uint64_t> put_out(BufferGuard &g, void *stream, std::unique_lock<std::mutex> &lock,
				 uint64_t ticket_check, uint32_t redemptions, const Origin &origin);

	void io_loop();
	void accept_peers();
	void handle_hello(int fd);
	// A consumer's request for a size class's memory (PeerRole::classes): its fds.
	void send_class(int conn, uint32_t index);
	// A consumer's PeerRole::slot: dynamic device slot INDEX's memory now (its fd) and
	// its generation, or a Reject.
	void send_slot(int conn, uint32_t index);
	// A guest (PeerRole::producer) says Hello on CONN: it is served from here on.
	void admit_guest(UniqueFd conn, const protocol::Hello &hello, const PeerCredentials &cred,
			 std::vector<UniqueFd> &fds);
	// Guest connection FD has a Request, or hung up.
	void serve_guest(int fd);
	// A frame publish() or publish_ticket() refused goes back: the owner's own as its
	// guard's release does (after its streams' work), a guest's at once.
	void refuse(BufferGuard &&frame, const Origin &origin);
	// What the guest asked for: the Answer to send.
	protocol::Answer answer(Guest &guest, const protocol::Request &request);
	// The owner's reference on a slot leased to a guest goes: the slot is free, with no
	// wait for this process's streams (its GPU work never touched it).
	void drop_lease(uint32_t index);
	// Guest FD hung up (exit, crash, garbage): its leased slots go back; a device slot
	// once its process has exited (its GPU writes into it may still land until then).
	void guest_gone(int fd);
	// Takes a consumer record for an accepted Hello, and CONN with it; an error (CONN
	// left to the caller, for the Reject) when there is none.
	Result<uint32_t> admit(const protocol::Hello &hello, const PeerCredentials &cred, UniqueFd event,
			       UniqueFd pidfd, UniqueFd &conn);
	void reap(uint32_t consumer_index);
	// A quarantined consumer's process has exited (or its grace ran out): its record
	// and the slots it held for writing go back into use.
	void end_quarantine(uint32_t consumer_index);
	// Watches consumer C's pidfd (or starts a grace timer); false when neither works.
	bool start_quarantine(uint32_t c);
	// The I/O thread polls FD for readable, its events tagged DATA (io_data()).
	bool watch_readable(int fd, uint64_t data);

	PoolImpl &pool_;
	ControlSegment &seg;

	rendezvous::OwnerSocket owner_socket;
	std::thread io_thread;
	UniqueFd io_epoll;
	UniqueFd io_stop;
	// Set once by shutdown() (release), read by acquire's and publish's waits
	// (acquire): they stop waiting. Nothing else is published through it.
	std::atomic<bool> shut{ false };
	// The classes and growth on demand: their own state and lock (growth_lock, taken
	// before the pool's classes_lock, with no lock of this class held).
	owner::Growth growth{ pool_, shut };
	// Guards the consumer set (active, connections, eventfds) against publish and
	// the drop/EOS paths, and the owner's writes of the pool's format. Held during a
	// block-policy wait, which is bounded by block_timeout and cut short when the
	// awaited consumer dies. Lock order: publish_lock, then the pool's refs_lock,
	// then its format_lock.
	std::mutex publish_lock;
	// The consumers and their queues, under publish_lock.
	owner::ConsumerQueues queues{ pool_, shut };
	// The spill tier's mover and its thread, under publish_lock.
	owner::SpillMover spill{ pool_, queues, publish_lock, shut };
	// Device pools: a pidfd of each consumer's process (from SO_PEERCRED; none when
	// its pid is not visible here), which polls readable once it has exited; while
	// quarantined without one, a timerfd ends the quarantine after a grace period.
	std::vector<UniqueFd> consumer_pidfd;
	std::vector<UniqueFd> consumer_grace;
	struct Pending {
		UniqueFd conn;
		uint64_t deadline_ns;
	};
	std::map<int, Pending> pending; // I/O thread only
	// Guests, by connection fd, and the slots leased to each (the owner's references,
	// its bit set: WRITING until the guest publishes or gives one back). I/O thread only;
	// cleared by shutdown() once it has joined that thread.
	std::map<int, Guest> guests;
	// Device slots a dead guest leased, by the fd that tells its process has exited
	// (a pidfd, or a grace timer): held until then. I/O thread only.
	std::map<int, GuestRemains> guest_remains;
	// Where acquire() starts looking for a free slot in each class: a hint, any value is
	// correct, so relaxed.
	std::array<std::atomic<uint32_t>, layout::kMaxClasses> acquire_cursor{};
	// Configuration as the owner created it; the shared header copy is for peers.
	Policy config_policy = Policy::drop_oldest;
	uint64_t config_block_timeout_ns = 0;
	uint32_t config_mode = 0600;
	gid_t config_gid = 0; // the group the mode's group bits let in
	char config_producer[XMEM_PRODUCER_MAX] = {};
	uint64_t published_count = 0; // under publish_lock
	// Frame tickets: their list and timer under publish_lock.
	owner::Tickets tickets{ pool_ };
	uint32_t owner_pid = 0; // getpid() at create, not a syscall per frame
};

} // namespace xmem
