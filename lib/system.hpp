// system.hpp - owned OS handles (fds, mappings), errno-to-Error helpers, the
// monotonic clock and futex calls used by the pool.
#pragma once

#include <xmem/xmem.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <string>
#include <string_view>
#include <utility>

#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace xmem {

// A GPU as every process names it: its UUID (cuDeviceGetUuid). Ordinals are not:
// they depend on each process's CUDA_VISIBLE_DEVICES.
using DeviceUuid = std::array<uint8_t, 16>;

class UniqueFd
{
public:
	UniqueFd() = default;
	explicit UniqueFd(int fd) : fd_(fd) {}
	UniqueFd(UniqueFd &&other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
	UniqueFd &operator=(UniqueFd &&other) noexcept
	{
		if (this != &other)
			reset(std::exchange(other.fd_, -1));
		return *this;
	}
	~UniqueFd() { reset(); }

	int get() const { return fd_; }
	bool valid() const { return fd_ >= 0; }
	int release() { return std::exchange(fd_, -1); }
	void reset(int fd = -1)
	{
		if (fd_ >= 0)
			::close(fd_);
		fd_ = fd;
	}

private:
	int fd_ = -1;
};

class Mapping
{
public:
	Mapping() = default;
	Mapping(void *addr, size_t size) : addr_(addr), size_(size) {}
	Mapping(Mapping &&other) noexcept
		: addr_(std::exchange(other.addr_, nullptr)), size_(std::exchange(other.size_, 0))
	{
	}
	Mapping &operator=(Mapping &&other) noexcept
	{
		if (this != &other) {
			reset();
			addr_ = std::exchange(other.addr_, nullptr);
			size_ = std::exchange(other.size_, 0);
		}
		return *this;
	}
	~Mapping() { reset(); }

	std::byte *data() const { return static_cast<std::byte *>(addr_); }
	size_t size() const { return size_; }
	void reset()
	{
		if (addr_)
			::munmap(addr_, size_);
		addr_ = nullptr;
		size_ = 0;
	}

private:
	void *addr_ = nullptr;
	size_t size_ = 0;
};

inline Error make_error(Errc code, std::string message)
{
	return Error{ code, std::move(message) };
}

// The text of errno value ERR. strerror() may share one buffer between threads;
// the GNU strerror_r() writes into ours or returns a static string.
inline std::string error_text(int err)
{
	char buffer[128];
	return ::strerror_r(err, buffer, sizeof(buffer));
}

// getenv() is flagged by clang-tidy (concurrency-mt-unsafe) because a concurrent setenv()
// may free what it returns. xmem reads its few variables (XDG_RUNTIME_DIR, XMEM_CUDA_*) and
// never changes the environment; an application that calls setenv() while other threads
// run has that race with every library, as POSIX says. Hence the NOLINTs on those calls.

// "WHAT: <errno's text>" as Errc::system, or a more precise code for common errnos.
inline Error errno_error(std::string what, int err = errno)
{
	Errc code = Errc::system;
	if (err == EACCES || err == EPERM)
		code = Errc::permission_denied;
	else if (err == ENOMEM)
		code = Errc::no_memory;
	what += ": ";
	what += error_text(err);
	return make_error(code, std::move(what));
}

// Errc::bad_segment for something wrong in a control segment another process wrote.
inline Error segment_error(const std::string &where, const std::string &what)
{
	return make_error(Errc::bad_segment, where + ": bad control segment: " + what);
}

// SRC into the fixed-size field DST of CAP bytes: cut to fit, NUL-terminated, and
// zero-padded (the field is shared memory or a wire message: no stale bytes).
inline void copy_string(char *dst, size_t cap, std::string_view src)
{
	size_t n = std::min(src.size(), cap - 1);
	std::memcpy(dst, src.data(), n);
	std::memset(dst + n, 0, cap - n);
}

inline uint64_t monotonic_ns()
{
	timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return uint64_t(ts.tv_sec) * 1000000000u + uint64_t(ts.tv_nsec);
}

// Deadline arithmetic that saturates instead of overflowing for "forever".
inline uint64_t deadline_after(int64_t timeout_ns)
{
	if (timeout_ns <= 0)
		return monotonic_ns();
	uint64_t now = monotonic_ns();
	if (uint64_t(timeout_ns) > UINT64_MAX - now)
		return UINT64_MAX;
	return now + uint64_t(timeout_ns);
}

// Shared (not private) futex: waiters and wakers are in different processes.
inline void futex_wait(std::atomic<uint32_t> *word, uint32_t expected, uint64_t deadline_ns)
{
	timespec ts{};
	timespec *tsp = nullptr;
	if (deadline_ns != UINT64_MAX) {
		uint64_t now = monotonic_ns();
		uint64_t rel = deadline_ns > now ? deadline_ns - now : 0;
		ts.tv_sec = time_t(rel / 1000000000u);
		ts.tv_nsec = long(rel % 1000000000u);
		tsp = &ts;
	}
	::syscall(SYS_futex, reinterpret_cast<uint32_t *>(word), FUTEX_WAIT, expected, tsp, nullptr, 0);
}

// A memfd of SIZE bytes with MODE, sealed against resizing; PREALLOCATE reserves
// its pages now, so a full tmpfs fails here rather than SIGBUS a writer later.
Result<UniqueFd> make_sealed_memfd(const std::string &label, uint64_t size, uint32_t mode, bool preallocate);
// A read-write shared mapping of FD's first SIZE bytes.
Result<Mapping> map_shared(int fd, uint64_t size, bool populate, const std::string &what);
// Maps a memfd another process sent, whole, after checking it is a regular file of
// at least MIN_SIZE bytes sealed against shrinking (Errc::bad_segment otherwise).
Result<Mapping> map_peer_memfd(int fd, uint64_t min_size, const std::string &where, const char *what);

inline void futex_wake_all(std::atomic<uint32_t> *word)
{
	::syscall(SYS_futex, reinterpret_cast<uint32_t *>(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

} // namespace xmem
