// owner/guests.hpp - guests as the owner serves them: consumers that produce too, the
// slots leased to each, and what a dead guest leaves until its process has exited.
#pragma once

#include "frame_path.hpp"
#include "io_poll.hpp"

#include "../identity.hpp"

#include <map>
#include <vector>

namespace xmem::owner {

// The I/O thread's guests (protocol.hpp, PeerRole::producer). Every call is the I/O
// thread's, but close(), which the owner makes once it has joined that thread.
class Guests
{
public:
	Guests(PoolImpl &pool, FramePath &frames, IoPoll &poll);

	// A guest of consumer record C, from the process CRED names (PIDFD: its pidfd, if it
	// sent one), said Hello on CONN: welcomed and served from here on.
	void admit(UniqueFd conn, uint32_t c, const PeerCredentials &cred, UniqueFd pidfd);
	// Guest connection FD has a Request, or hung up.
	void serve(int fd);
	// A dead guest's process has exited (or its grace ran out), as FD polled: the device
	// slots it leased go back.
	void exited(int fd);
	// Consumer record C is reaped: a guest of its process publishes on, its frames going
	// to a consumer that takes this record next.
	void consumer_reaped(uint32_t c);
	// The pool closes: guests hang up, their leased slots go back.
	void close();

private:
	// A guest, as the owner serves it.
	struct Guest {
		UniqueFd conn;
		uint32_t consumer = protocol::kNoConsumer; // its consumer record
		uint32_t pid = 0; // SO_PEERCRED's: 0 where this owner cannot see its process
		UniqueFd pidfd; // tells when its process has exited; none where it cannot be made
		// The slots it writes: the owner's references (its bit, local_refs 1), held
		// without a guard, since the owner's GPU work never touched them (drop_lease()).
		std::vector<uint32_t> leases;
	};
	// What a dead guest leaves until its process has exited: the device slots it was writing.
	struct Remains {
		UniqueFd watch; // its pidfd, or a grace timer
		std::vector<uint32_t> leases;
	};

	// What the guest asked for: the Answer to send.
	protocol::Answer answer(Guest &guest, const protocol::Request &request);
	// Guest FD hung up (exit, crash, garbage): its leased slots go back; a device slot
	// once its process has exited (its GPU writes into it may still land until then).
	void gone(int fd);
	// The owner's reference on a slot leased to a guest goes: the slot is free, with no
	// wait for this process's streams (its GPU work never touched it).
	void drop_lease(uint32_t index);

	PoolImpl &pool_;
	FramePath &frames;
	IoPoll &poll;
	// Guests, by connection fd, and the slots leased to each (the owner's references,
	// its bit set: WRITING until the guest publishes or gives one back).
	std::map<int, Guest> guests;
	// Device slots a dead guest leased, by the fd that tells its process has exited (a
	// pidfd, or a grace timer): held until then.
	std::map<int, Remains> remains;
};

} // namespace xmem::owner
