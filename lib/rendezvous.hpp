// rendezvous.hpp - how a pool NAME becomes a unix socket: name rules, the directory,
// the owner lock, and messages with file descriptors (SCM_RIGHTS).
#pragma once

#include "protocol.hpp"
#include "system.hpp"

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace xmem::rendezvous {

// The owner's claim on a name: the bound, listening socket and the lock file held
// for the owner's lifetime (the kernel drops the lock when the owner dies).
struct OwnerSocket {
	UniqueFd listener;
	UniqueFd lock;
	std::string path;
	std::string lock_path;
};

// Claims PATH for a new owner: refuses while a live owner holds the lock, replaces
// a dead owner's socket, and binds with MODE and GROUP (atomically, by renaming into
// place). An abstract PATH ("@NAME") is claimed by binding it: no file, no lock.
Result<OwnerSocket> claim(const std::string &path, uint32_t mode, std::optional<uint32_t> group);
// Unlinks the socket and lock file while still holding the lock.
void release(OwnerSocket &owner);

// Connects to PATH, retrying until DEADLINE while nobody listens there.
Result<UniqueFd> connect(const std::string &path, uint64_t deadline_ns);

// One message with up to protocol::kMaxFds fds. Received fds are owned by the caller.
Result<void> send_message(int sock, const void *data, size_t size, const int *fds, size_t nfds);
struct Received {
	std::vector<std::byte> data;
	std::vector<UniqueFd> fds;
};
// Waits until DEADLINE for one message with at most MAX_FDS fds (more is an error);
// Errc::closed when the peer hung up.
Result<Received> receive_message(int sock, uint64_t deadline_ns, const std::string &what, size_t max_fds = 4);

// The owner's answer to a consumer: WELCOME with CONTROL_FD and as many of ARENA_FDS
// as fit, the rest in ArenaFds messages. An inspector gets no arena fds; a size class's
// import (PeerRole::classes) no control fd (CONTROL_FD -1).
Result<void> send_welcome(int sock, const protocol::Welcome &welcome, int control_fd,
			  const std::vector<int> &arena_fds);
// A consumer's side: receives ArenaFds messages until FDS holds WANT fds.
Result<void> receive_arena_fds(int sock, std::vector<UniqueFd> &fds, size_t want, uint64_t deadline_ns,
			       const std::string &where);

// The owner's answer to a question asked on a connection of its own: its Welcome, the
// fds that came with it, and the connection, for any fds or requests that follow.
struct OwnerAnswer {
	UniqueFd conn;
	protocol::Welcome welcome;
	std::vector<UniqueFd> fds;
};
// Asks the owner of the pool at PATH with HELLO (a size class's or a slot's import, a
// guest producer's connection) on a connection of its own, sending SEND_FD with it (-1:
// none): its answer, with up to MAX_FDS fds, by DEADLINE_NS. WHICH says what was asked
// for, and begins every error's message once.
Result<OwnerAnswer> ask_owner(const std::string &path, const protocol::Hello &hello, uint64_t deadline_ns,
			      const std::string &which, size_t max_fds, int send_fd = -1);

} // namespace xmem::rendezvous
