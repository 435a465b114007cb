// owner/peer_server.hpp - the owner's I/O thread: it accepts peers, reads their Hello,
// admits consumers and guests, serves class imports, reaps and quarantines the dead.
#pragma once

#include "growth.hpp"
#include "guests.hpp"
#include "queues.hpp"
#include "spill_mover.hpp"
#include "tickets.hpp"

#include "../rendezvous.hpp"

#include <map>
#include <thread>

namespace xmem::owner {

// The parts of the owner the I/O thread serves peers with, and the lock they are under.
struct OwnerParts {
	std::mutex &publish_lock;
	const std::atomic<bool> &shut;
	// Frames published so far, under publish_lock (a reaped consumer's done words are
	// released up to it).
	const uint64_t &published;
	ConsumerQueues &queues;
	SpillMover &spill;
	Tickets &tickets;
	Growth &growth;
	FramePath &frames;
};

// The I/O thread and what only it touches (pending connections, the consumers' pidfds
// and grace timers, the guests), but where a field says otherwise.
class PeerServer
{
public:
	PeerServer(PoolImpl &pool, const OwnerParts &parts);

	// The socket the owner claimed: its listener is what peers connect to.
	void adopt(rendezvous::OwnerSocket socket) { owner_socket = std::move(socket); }
	// The owner's own copies of what CONFIG says peers get; then the poll set and the
	// thread. The tickets' and growth's timers are polled too.
	Result<void> start(const PoolConfig &config);
	// The thread ends, guests hang up, and the pool's name is released (a consumer that
	// reconnects finds no socket rather than a dying one). The owner's close, shut set.
	void stop();

private:
	void loop();
	void accept_peers();
	void handle_hello(int fd);
	// A consumer's request for a size class's memory (PeerRole::classes): its fds.
	void send_class(int conn, uint32_t index);
	// A guest (PeerRole::producer) says Hello on CONN, naming an attached consumer.
	void admit_guest(UniqueFd conn, const protocol::Hello &hello, const PeerCredentials &cred,
			 std::vector<UniqueFd> &fds);
	// Takes a consumer record for an accepted Hello, and CONN with it; an error (CONN
	// left to the caller, for the Reject) when there is none.
	Result<uint32_t> admit(const protocol::Hello &hello, const PeerCredentials &cred, UniqueFd event,
			       UniqueFd pidfd, UniqueFd &conn);
	void reap(uint32_t c);
	// Watches consumer C's pidfd (or starts a grace timer); false when neither works.
	bool start_quarantine(uint32_t c);
	// A quarantined consumer's process has exited (or its grace ran out): its record
	// and the slots it held for writing go back into use.
	void end_quarantine(uint32_t c);
	// The trim timer fired: used-up tickets end first (as an acquire has them do, so a
	// redeemed ticket's slot is trimmed at this tick, not at its TTL), then idle slots.
	void trim_tick();

	PoolImpl &pool_;
	ControlSegment &seg;
	OwnerParts parts;
	rendezvous::OwnerSocket owner_socket;
	std::thread thread;
	IoPoll poll;
	UniqueFd stop_event;
	Guests guests;
	struct Pending {
		UniqueFd conn;
		uint64_t deadline_ns;
	};
	std::map<int, Pending> pending;
	// A pidfd of each consumer's process (from SO_PEERCRED; none when its pid is not
	// visible here), which polls readable once it has exited; while quarantined without
	// one, a timerfd ends the quarantine after a grace period.
	std::vector<UniqueFd> consumer_pidfd;
	std::vector<UniqueFd> consumer_grace;
	// Set by start(), then read only: the owner's own copies (consumers can write the
	// shared header's).
	Policy config_policy = Policy::drop_oldest;
	uint64_t config_block_timeout_ns = 0;
	uint32_t config_mode = 0600;
	gid_t config_gid = 0; // the group the mode's group bits let in
};

} // namespace xmem::owner
