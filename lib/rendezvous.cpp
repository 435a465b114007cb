// rendezvous.cpp - pool names, the owner's claim on a socket path, and the
// fd-passing messages of the attach handshake.
#include "rendezvous.hpp"

#include "identity.hpp"
#include "protocol.hpp"

#include <algorithm>
#include <cstdlib>
#include <thread>

#include <fcntl.h>
#include <poll.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

namespace xmem {

namespace {

// Room in sun_path for PATH plus the ".lock" and temporary-name suffixes.
constexpr size_t kMaxPath = sizeof(sockaddr_un{}.sun_path) - 24;
constexpr size_t kMaxName = 64;

bool valid_name_char(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
	       c == '.';
}

// A socket address and its length: a path, or for "@NAME" the abstract name NAME
// (sun_path[0] = 0, the length counting exactly the name's bytes).
struct Address {
	sockaddr_un addr{};
	socklen_t len = 0;

	const sockaddr *get() const { return reinterpret_cast<const sockaddr *>(&addr); }
};

Address make_address(const std::string &path)
{
	Address a;
	a.addr.sun_family = AF_UNIX;
	if (is_abstract(path)) {
		std::copy(path.begin() + 1, path.end(), a.addr.sun_path + 1);
		a.len = socklen_t(offsetof(sockaddr_un, sun_path) + path.size());
	} else {
		std::copy(path.begin(), path.end(), a.addr.sun_path);
		a.len = sizeof(a.addr);
	}
	return a;
}

// Creates the default directory for plain names, refusing one that another user
// owns or that is a symlink (it may be under a shared /tmp). With GROUP, it takes that
// group, so that members can reach sockets MODE gives them.
Result<void> ensure_directory(const std::string &dir, uint32_t mode, std::optional<uint32_t> group)
{
	const char *runtime = std::getenv("XDG_RUNTIME_DIR"); // NOLINT(concurrency-mt-unsafe): see system.hpp
	if (runtime && *runtime && ::mkdir(runtime, 0700) < 0 && errno != EEXIST)
		return errno_error("cannot create " + std::string(runtime));
	if (::mkdir(dir.c_str(), 0700) < 0 && errno != EEXIST)
		return errno_error("cannot create pool directory " + dir);
	struct stat st;
	if (::lstat(dir.c_str(), &st) < 0)
		return errno_error("cannot stat pool directory " + dir);
	if (!S_ISDIR(st.st_mode))
		return make_error(Errc::permission_denied, "pool directory " + dir + " is not a directory");
	if (st.st_uid != ::geteuid())
		return make_error(Errc::permission_denied,
				  "pool directory " + dir + " belongs to uid " + std::to_string(st.st_uid));
	// Peers allowed by MODE must be able to reach the socket through the directory.
	mode_t want = st.st_mode & 07777;
	if (mode & 0060)
		want |= 0010;
	if (mode & 0006)
		want |= 0001;
	if (want != (st.st_mode & 07777) && ::chmod(dir.c_str(), want) < 0)
		return errno_error("cannot chmod pool directory " + dir);
	if (group && (mode & 0060) && st.st_gid != *group && ::chown(dir.c_str(), uid_t(-1), gid_t(*group)) < 0)
		return errno_error("cannot give pool directory " + dir + " group " + group_text(*group) +
				   " (the owner must be a member)");
	return {};
}

// The pid of the live owner of PATH, or 0 when it cannot be asked.
pid_t owner_pid(const std::string &path)
{
	UniqueFd sock(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
	Address addr = make_address(path);
	if (!sock.valid() || ::connect(sock.get(), addr.get(), addr.len) < 0)
		return 0;
	ucred cred{};
	socklen_t len = sizeof(cred);
	if (::getsockopt(sock.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0)
		return 0;
	return cred.pid;
}

// Why connect() to the socket file PATH was refused: its owner, group and mode, and
// this process's ids, or the directory on the way that cannot be searched.
std::string access_denied_text(const std::string &path)
{
	std::string text = "pool '" + path + "': permission denied: ";
	struct stat st;
	if (::stat(path.c_str(), &st) < 0) {
		std::string dir = path.substr(0, path.rfind('/'));
		if (::stat(dir.c_str(), &st) == 0)
			text += "directory " + dir + " (uid " + std::to_string(st.st_uid) + ", group " +
				group_text(st.st_gid) + ", mode " + mode_text(st.st_mode) + ") cannot be searched";
		else
			text += "a directory on the way cannot be searched";
	} else {
		text += "the socket is uid " + std::to_string(st.st_uid) + ", group " + group_text(st.st_gid) +
			", mode " + mode_text(st.st_mode) + " (connecting needs write permission)";
	}
	return text + "; " + process_credentials_text() +
	       ". The owner chooses who may attach with its mode (xmemsink perms=0660) and group";
}

} // namespace

bool is_abstract(std::string_view path)
{
	return !path.empty() && path[0] == '@';
}

std::string default_directory()
{
	const char *runtime = std::getenv("XDG_RUNTIME_DIR"); // NOLINT(concurrency-mt-unsafe): see system.hpp
	if (runtime && *runtime)
		return std::string(runtime) + "/xmem";
	return "/tmp/xmem-" + std::to_string(::geteuid());
}

Result<std::string> socket_path(std::string_view name)
{
	if (name.empty())
		return make_error(Errc::bad_name, "pool name is empty");
	if (name.find('\0') != std::string_view::npos)
		return make_error(Errc::bad_name, "pool name contains a NUL byte");
	if (is_abstract(name)) {
		// An abstract socket: no file, one per network namespace, gone with its owner.
		std::string_view rest = name.substr(1);
		if (rest.empty())
			return make_error(Errc::bad_name, "pool name '@' names no abstract socket");
		if (rest.size() > kMaxPath)
			return make_error(Errc::bad_name, "abstract pool name '" + std::string(name) +
								  "' is longer than " + std::to_string(kMaxPath) +
								  " bytes");
		for (char c : rest)
			if (!valid_name_char(c) && c != '/')
				return make_error(Errc::bad_name,
						  "abstract pool name '" + std::string(name) +
							  "' has an illegal character (allowed: A-Z a-z 0-9 _ - . /)");
		return std::string(name);
	}
	std::string path;
	if (name.find('/') != std::string_view::npos) {
		path = std::string(name);
		if (path.back() == '/')
			return make_error(Errc::bad_name, "pool path '" + path + "' names a directory");
	} else {
		if (name.size() > kMaxName)
			return make_error(Errc::bad_name, "pool name '" + std::string(name) + "' is longer than " +
								  std::to_string(kMaxName) + " characters");
		if (name[0] == '.')
			return make_error(Errc::bad_name, "pool name '" + std::string(name) + "' starts with '.'");
		for (char c : name)
			if (!valid_name_char(c))
				return make_error(Errc::bad_name,
						  "pool name '" + std::string(name) +
							  "' has an illegal character (allowed: A-Z a-z 0-9 _ - .)");
		path = default_directory() + "/" + std::string(name);
	}
	if (path.size() > kMaxPath)
		return make_error(Errc::bad_name, "pool socket path '" + path + "' is longer than " +
							  std::to_string(kMaxPath) + " bytes");
	return path;
}

namespace rendezvous {

namespace {

// An abstract name is claimed by binding it: the kernel refuses a second bind while the
// first socket lives and frees the name with it, so there is no lock file and nothing
// stale. Access is the owner's check alone (Publisher's allowed_peer()).
Result<OwnerSocket> claim_abstract(const std::string &path)
{
	OwnerSocket owner;
	owner.path = path;
	owner.listener = UniqueFd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
	if (!owner.listener.valid())
		return errno_error("socket");
	Address addr = make_address(path);
	if (::bind(owner.listener.get(), addr.get(), addr.len) < 0) {
		if (errno != EADDRINUSE)
			return errno_error("cannot bind abstract socket " + path);
		pid_t pid = owner_pid(path);
		return make_error(Errc::owner_alive,
				  "pool '" + path + "' is owned by a live process" +
					  (pid ? " (pid " + std::to_string(pid) + ")"
					       : " (in a PID namespace this process cannot see, or not an xmem pool)"));
	}
	if (::listen(owner.listener.get(), 128) < 0)
		return errno_error("cannot listen on " + path);
	return owner;
}

} // namespace

Result<OwnerSocket> claim(const std::string &path, uint32_t mode, std::optional<uint32_t> group)
{
	if (is_abstract(path))
		return claim_abstract(path);
	std::string dir = path.substr(0, path.rfind('/'));
	if (dir == default_directory()) {
		auto made = ensure_directory(dir, mode, group);
		if (!made)
			return made.error();
	}

	OwnerSocket owner;
	owner.path = path;
	owner.lock_path = path + ".lock";

	// The lock file can be replaced by an exiting owner between our open and flock;
	// holding a lock on an unlinked file proves nothing, so check the inode.
	for (int attempt = 0;; attempt++) {
		UniqueFd lock(::open(owner.lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
		if (!lock.valid())
			return errno_error("cannot open lock file " + owner.lock_path);
		if (::flock(lock.get(), LOCK_EX | LOCK_NB) < 0) {
			if (errno != EWOULDBLOCK)
				return errno_error("cannot lock " + owner.lock_path);
			pid_t pid = owner_pid(path);
			return make_error(Errc::owner_alive,
					  "pool '" + path + "' is owned by a live process" +
						  (pid ? " (pid " + std::to_string(pid) + ")"
						       : " (in a PID namespace this process cannot see)"));
		}
		struct stat held, now;
		if (::fstat(lock.get(), &held) == 0 && ::stat(owner.lock_path.c_str(), &now) == 0 &&
		    held.st_ino == now.st_ino && held.st_dev == now.st_dev) {
			owner.lock = std::move(lock);
			break;
		}
		if (attempt > 100)
			return make_error(Errc::owner_alive, "pool '" + path + "': lock file keeps changing");
	}

	// We own the name. From here on, a failure gives the name back.
	struct Unclaim {
		OwnerSocket *owner;
		~Unclaim()
		{
			if (owner)
				::unlink(owner->lock_path.c_str());
		}
	} unclaim{ &owner };

	// A socket left by a dead owner goes; anything else stays.
	struct stat st;
	if (::lstat(path.c_str(), &st) == 0) {
		if (!S_ISSOCK(st.st_mode))
			return make_error(Errc::not_a_pool, "'" + path + "' exists and is not a socket");
		if (::unlink(path.c_str()) < 0)
			return errno_error("cannot remove stale socket " + path);
	}

	owner.listener = UniqueFd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
	if (!owner.listener.valid())
		return errno_error("socket");
	// Bind under a temporary name, set the mode, then rename: the socket never exists
	// at PATH with a wider mode than asked, and it is listening when it appears.
	std::string tmp = path + "." + std::to_string(::getpid()) + ".tmp";
	::unlink(tmp.c_str());
	Address addr = make_address(tmp);
	if (::bind(owner.listener.get(), addr.get(), addr.len) < 0)
		return errno_error("cannot bind " + tmp);
	if (group && ::chown(tmp.c_str(), uid_t(-1), gid_t(*group)) < 0) {
		Error e = errno_error("cannot give socket " + path + " group " + group_text(*group) +
				      " (the owner must be a member)");
		::unlink(tmp.c_str());
		return e;
	}
	if (::chmod(tmp.c_str(), mode & 0777) < 0 || ::listen(owner.listener.get(), 128) < 0 ||
	    ::rename(tmp.c_str(), path.c_str()) < 0) {
		Error e = errno_error("cannot publish socket " + path);
		::unlink(tmp.c_str());
		return e;
	}
	unclaim.owner = nullptr;
	return owner;
}

void release(OwnerSocket &owner)
{
	if (is_abstract(owner.path)) {
		owner.listener.reset(); // the name is free once the socket is closed
		return;
	}
	if (!owner.lock.valid())
		return;
	::unlink(owner.path.c_str());
	::unlink(owner.lock_path.c_str());
	owner.listener.reset();
	owner.lock.reset();
}

Result<UniqueFd> connect(const std::string &path, uint64_t deadline_ns)
{
	for (;;) {
		UniqueFd sock(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
		if (!sock.valid())
			return errno_error("socket");
		Address addr = make_address(path);
		if (::connect(sock.get(), addr.get(), addr.len) == 0)
			return sock;
		int err = errno;
		if (err == EACCES || err == EPERM)
			return make_error(Errc::permission_denied, access_denied_text(path));
		if (err == EPROTOTYPE)
			return make_error(Errc::not_a_pool,
					  "pool '" + path + "': the socket is not an xmem pool (wrong socket type)");
		bool abstract = is_abstract(path);
		struct stat st;
		bool exists = !abstract && ::lstat(path.c_str(), &st) == 0;
		if (exists && !S_ISSOCK(st.st_mode))
			return make_error(Errc::not_a_pool, "pool '" + path + "': not a socket");
		if (err != ENOENT && err != ECONNREFUSED && err != EAGAIN)
			return errno_error("pool '" + path + "': connect", err);
		if (monotonic_ns() >= deadline_ns)
			return make_error(Errc::not_found,
					  "pool '" + path + "' not found (" +
						  (abstract
							   ? "no abstract socket of that name in this network namespace"
						   : exists ? "nobody listening: its owner is gone"
							    : "no socket") +
						  ")");
		// Waiting for an owner to appear: a short sleep keeps this simple and cheap.
		std::this_thread::sleep_for(std::chrono::milliseconds(5));
	}
}

Result<void> send_message(int sock, const void *data, size_t size, const int *fds, size_t nfds)
{
	if (nfds > protocol::kMaxFds)
		return make_error(Errc::invalid_argument,
				  "more than " + std::to_string(protocol::kMaxFds) + " fds in one message");
	iovec iov{ const_cast<void *>(data), size };
	msghdr msg{};
	msg.msg_iov = &iov;
	msg.msg_iovlen = 1;
	alignas(cmsghdr) char control[CMSG_SPACE(protocol::kMaxFds * sizeof(int))] = {};
	if (nfds > 0) {
		msg.msg_control = control;
		msg.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
		cmsghdr *cmsg = CMSG_FIRSTHDR(&msg);
		cmsg->cmsg_level = SOL_SOCKET;
		cmsg->cmsg_type = SCM_RIGHTS;
		cmsg->cmsg_len = CMSG_LEN(nfds * sizeof(int));
		std::memcpy(CMSG_DATA(cmsg), fds, nfds * sizeof(int));
	}
	ssize_t n;
	do
		n = ::sendmsg(sock, &msg, MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return errno == EPIPE || errno == ECONNRESET ? make_error(Errc::closed, "peer hung up")
							     : errno_error("sendmsg");
	if (size_t(n) != size)
		return make_error(Errc::system, "sendmsg: short write");
	return {};
}

Result<Received> receive_message(int sock, uint64_t deadline_ns, const std::string &what, size_t max_fds)
{
	for (;;) {
		uint64_t now = monotonic_ns();
		int timeout_ms = -1;
		if (deadline_ns != UINT64_MAX)
			timeout_ms =
				deadline_ns > now
					? int(std::min<uint64_t>((deadline_ns - now + 999999) / 1000000, INT32_MAX))
					: 0;
		pollfd pfd{ sock, POLLIN, 0 };
		int r = ::poll(&pfd, 1, timeout_ms);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return errno_error("poll");
		if (r == 0)
			return make_error(Errc::timed_out, what + ": no answer (is it an xmem pool?)");
		break;
	}

	Received out;
	out.data.resize(protocol::kMaxMessage + 1);
	iovec iov{ out.data.data(), out.data.size() };
	msghdr msg{};
	msg.msg_iov = &iov;
	msg.msg_iovlen = 1;
	alignas(cmsghdr) char control[CMSG_SPACE(protocol::kMaxFds * sizeof(int))] = {};
	msg.msg_control = control;
	// Room for MAX_FDS only: more is MSG_CTRUNC, a peer that breaks the protocol.
	msg.msg_controllen = CMSG_SPACE(std::min(max_fds, protocol::kMaxFds) * sizeof(int));
	ssize_t n;
	do
		n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return errno == ECONNRESET ? make_error(Errc::closed, what + ": peer hung up")
					   : errno_error(what + ": recvmsg");
	// Take ownership of every fd first, so none leaks on the error paths below.
	for (cmsghdr *cmsg = CMSG_FIRSTHDR(&msg); cmsg; cmsg = CMSG_NXTHDR(&msg, cmsg)) {
		if (cmsg->cmsg_level != SOL_SOCKET || cmsg->cmsg_type != SCM_RIGHTS)
			continue;
		size_t count = (cmsg->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < count; i++) {
			int fd;
			std::memcpy(&fd, CMSG_DATA(cmsg) + i * sizeof(int), sizeof(int));
			out.fds.emplace_back(fd);
		}
	}
	if (n == 0)
		return make_error(Errc::closed, what + ": peer hung up");
	if (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC))
		return make_error(Errc::not_a_pool, what + ": oversized message or too many fds");
	out.data.resize(size_t(n));
	return out;
}

Result<void> send_welcome(int sock, const protocol::Welcome &welcome, int control_fd, const std::vector<int> &arena_fds)
{
	std::vector<int> fds;
	if (control_fd >= 0)
		fds.push_back(control_fd);
	size_t next = std::min(arena_fds.size(), protocol::kMaxFds - fds.size());
	fds.insert(fds.end(), arena_fds.begin(), arena_fds.begin() + ptrdiff_t(next));
	auto sent = send_message(sock, &welcome, sizeof(welcome), fds.data(), fds.size());
	while (sent && next < arena_fds.size()) {
		size_t n = std::min(arena_fds.size() - next, protocol::kMaxFds);
		protocol::MessageHeader h =
			protocol::make_header(protocol::MessageType::arena_fds, sizeof(protocol::MessageHeader));
		sent = send_message(sock, &h, sizeof(h), arena_fds.data() + next, n);
		next += n;
	}
	return sent;
}

Result<void> receive_arena_fds(int sock, std::vector<UniqueFd> &fds, size_t want, uint64_t deadline_ns,
			       const std::string &where)
{
	while (fds.size() < want) {
		auto msg = receive_message(sock, deadline_ns, where, protocol::kMaxFds);
		if (!msg)
			return msg.error();
		protocol::MessageHeader h{};
		if (msg->data.size() != sizeof(h))
			return make_error(Errc::not_a_pool, where + ": malformed message where arena fds were due");
		std::memcpy(&h, msg->data.data(), sizeof(h));
		if (h.magic != protocol::kWireMagic || h.version != protocol::kVersion ||
		    h.type != protocol::MessageType::arena_fds || h.size != sizeof(h) || msg->fds.empty())
			return make_error(Errc::not_a_pool, where + ": malformed message where arena fds were due");
		for (auto &fd : msg->fds)
			fds.push_back(std::move(fd));
	}
	if (fds.size() != want)
		return make_error(Errc::not_a_pool, where + ": owner sent " + std::to_string(fds.size()) +
							    " arena file descriptors, expected " +
							    std::to_string(want));
	return {};
}

Result<OwnerAnswer> ask_owner(const std::string &path, const protocol::Hello &hello, uint64_t deadline_ns,
			      const std::string &which, size_t max_fds, int send_fd)
{
	auto conn = connect(path, deadline_ns);
	if (!conn)
		return make_error(conn.code(), which + ": " + conn.error().message);
	if (auto sent = send_message(conn->get(), &hello, sizeof(hello), send_fd >= 0 ? &send_fd : nullptr,
				     send_fd >= 0 ? 1 : 0);
	    !sent)
		return make_error(sent.code(), which + ": " + sent.error().message);
	auto msg = receive_message(conn->get(), deadline_ns, which, max_fds);
	if (!msg)
		return msg.error(); // named WHICH already
	auto welcome = protocol::parse_reply(msg->data, which);
	if (!welcome)
		return welcome.error();
	return OwnerAnswer{ std::move(conn.value()), welcome.value(), std::move(msg->fds) };
}

} // namespace rendezvous
} // namespace xmem
