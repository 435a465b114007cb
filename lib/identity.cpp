// identity.cpp - who a process is across namespaces: its PID namespace, pidfds that
// outlive namespace boundaries, and a peer's credentials and groups as the kernel
// gives them over a unix socket (docs/containers.md).
#include "identity.hpp"

#include <xmem/snapshot.hpp>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>

#include <grp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace xmem {

uint64_t pid_namespace_here()
{
	struct stat st;
	if (::stat("/proc/self/ns/pid", &st) < 0)
		return 0;
	return st.st_ino;
}

UniqueFd pidfd_of_self()
{
	return UniqueFd(int(::syscall(SYS_pidfd_open, ::getpid(), 0)));
}

Result<void> check_pidfd(int fd, pid_t expected)
{
	char link[64] = {};
	std::string proc = "/proc/self/fd/" + std::to_string(fd);
	if (::readlink(proc.c_str(), link, sizeof(link) - 1) < 0)
		return errno_error("cannot tell what the peer's pidfd is (" + proc + ")");
	if (std::string_view(link) != "anon_inode:[pidfd]")
		return make_error(Errc::invalid_argument,
				  "the second file descriptor in hello is not a pidfd (" + std::string(link) + ")");
	if (expected <= 0)
		return {};
	// The pidfd's process as this process's PID namespace numbers it.
	std::ifstream info("/proc/self/fdinfo/" + std::to_string(fd));
	std::string line;
	while (std::getline(info, line)) {
		if (line.rfind("Pid:", 0) != 0)
			continue;
		long pid = std::strtol(line.c_str() + 4, nullptr, 10);
		if (pid != expected)
			return make_error(Errc::invalid_argument,
					  "the pidfd in hello is of pid " + std::to_string(pid) +
						  ", not of the peer (pid " + std::to_string(expected) + ")");
		return {};
	}
	return make_error(Errc::invalid_argument, "the pidfd in hello names no process");
}

Result<PeerCredentials> peer_credentials(int sock)
{
	PeerCredentials peer;
	ucred cred{};
	socklen_t len = sizeof(cred);
	if (::getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0)
		return errno_error("cannot read the peer's credentials");
	peer.pid = cred.pid;
	peer.uid = cred.uid;
	peer.gid = cred.gid;
	// Supplementary groups (Linux 4.13+), mapped into this user namespace as SO_PEERCRED's
	// ids are (an unmapped one reads as the overflow gid, 65534).
	std::vector<gid_t> groups(64);
	for (;;) {
		len = socklen_t(groups.size() * sizeof(gid_t));
		if (::getsockopt(sock, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &len) == 0) {
			groups.resize(len / sizeof(gid_t));
			break;
		}
		if (errno != ERANGE || len <= groups.size() * sizeof(gid_t)) {
			groups.clear(); // an older kernel: the primary group alone
			break;
		}
		groups.resize(len / sizeof(gid_t));
	}
	peer.groups = std::move(groups);
	return peer;
}

bool PeerCredentials::in_group(gid_t group) const
{
	return gid == group || std::find(groups.begin(), groups.end(), group) != groups.end();
}

std::string mode_text(uint32_t mode)
{
	char text[8];
	(void)std::snprintf(text, sizeof(text), "%04o", mode & 07777);
	return text;
}

std::string group_text(gid_t gid)
{
	std::string text = std::to_string(gid);
	std::vector<char> buf(4096);
	group entry{};
	group *found = nullptr;
	if (::getgrgid_r(gid, &entry, buf.data(), buf.size(), &found) == 0 && found)
		text += " (" + std::string(found->gr_name) + ")";
	return text;
}

std::string process_credentials_text()
{
	std::string text =
		"this process is uid " + std::to_string(::geteuid()) + ", gid " + std::to_string(::getegid());
	int n = ::getgroups(0, nullptr);
	if (n > 0) {
		std::vector<gid_t> groups(size_t(n), 0);
		n = ::getgroups(n, groups.data());
		if (n > 0) {
			text += ", groups";
			for (int i = 0; i < n; i++)
				text += (i ? "," : " ") + std::to_string(groups[size_t(i)]);
		}
	}
	return text;
}

} // namespace xmem
