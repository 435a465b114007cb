// identity.hpp - who a process is across namespaces (its PID namespace is
// pid_namespace_here() in <xmem/snapshot.hpp>): pidfds that
// outlive namespace boundaries, and a peer's credentials and groups over a unix socket.
#pragma once

#include "system.hpp"

#include <string>
#include <vector>

#include <sys/types.h>

namespace xmem {

// A pidfd of this process (invalid where pidfd_open(2) is missing or refused). Passed
// to another process, it polls readable there once this process has exited, whatever
// PID namespaces lie between the two.
UniqueFd pidfd_of_self();

// Checks that FD, received from a peer, is a pidfd, and when EXPECTED > 0 that it is of
// process EXPECTED as this process numbers it.
Result<void> check_pidfd(int fd, pid_t expected);

// A unix socket peer's credentials as the kernel reports them, mapped into this
// process's namespaces: pid 0 for a process in a PID namespace this one cannot see,
// uid and gid 65534 (the overflow ids) for ones its user namespace does not map.
struct PeerCredentials {
	pid_t pid = 0;
	uid_t uid = 0;
	gid_t gid = 0;
	std::vector<gid_t> groups; // supplementary groups (SO_PEERGROUPS)

	// Whether GROUP is the peer's primary group or one of its supplementary groups.
	bool in_group(gid_t group) const;
};
Result<PeerCredentials> peer_credentials(int sock);

// "0660"
std::string mode_text(uint32_t mode);
// "44 (video)", or "44" when the group has no name here.
std::string group_text(gid_t gid);
// "this process is uid 1000, gid 1000, groups 1000,44": for errors about access.
std::string process_credentials_text();

} // namespace xmem
