// rendezvous.hpp - how a pool NAME becomes a unix socket: name rules, the directory,
// the owner lock, and messages with file descriptors (SCM_RIGHTS).
#pragma once

#include "system.hpp"

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
// a dead owner's socket, and binds with MODE (atomically, by renaming into place).
Result<OwnerSocket> claim(const std::string &path, uint32_t mode);
// Unlinks the socket and lock file while still holding the lock.
void release(OwnerSocket &owner);

// Connects to PATH, retrying until DEADLINE while nobody listens there.
Result<UniqueFd> connect(const std::string &path, uint64_t deadline_ns);

// One message with up to 4 fds. Received fds are owned by the caller.
Result<void> send_message(int sock, const void *data, size_t size, const int *fds, size_t nfds);
struct Received {
	std::vector<std::byte> data;
	std::vector<UniqueFd> fds;
};
// Waits until DEADLINE for one message; Errc::closed when the peer hung up.
Result<Received> receive_message(int sock, uint64_t deadline_ns, const std::string &what);

} // namespace xmem::rendezvous
