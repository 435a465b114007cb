// owner/io_poll.hpp - what the owner's I/O thread polls: one epoll set whose events carry
// a tag, an index and the fd, and the timers (expiries, trims, grace periods) in it.
#pragma once

#include "../system.hpp"

#include <cstdint>
#include <ctime>

#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <unistd.h>

namespace xmem::owner {

// What an event is about.
enum class IoTag : uint32_t {
	listener = 1,
	stop = 2,
	pending = 3, // a connection whose Hello has not come yet
	consumer = 4, // a consumer's connection (index: its record)
	quarantine = 5, // a quarantined consumer's pidfd or grace timer (index: its record)
	tickets = 6,
	guest = 7, // a guest's connection (fd: the map's key)
	guest_exit = 8, // a dead guest's pidfd or grace timer (fd: the map's key)
	trim = 9, // dynamic slots idle long enough give their memory back
};

// What happened: the registration's tag, index and fd.
struct IoEvent {
	IoTag tag;
	uint32_t index;
	int fd;
};

// The I/O thread's epoll set. Registrations name the fd as well as the tag: the loop then
// ignores an event for a connection that was already replaced, since a registration can
// outlive close() while a child process, between posix_spawn's clone and exec, still
// holds a copy of the fd. So every fd is deregistered (forget()) before it is closed.
class IoPoll
{
public:
	// Makes the set; false (errno set) when the system has none to give.
	bool open()
	{
		epoll_ = UniqueFd(::epoll_create1(EPOLL_CLOEXEC));
		return epoll_.valid();
	}
	// Polls FD for EVENTS, tagged TAG and INDEX; false when it cannot be.
	bool watch(int fd, IoTag tag, uint32_t index = 0, uint32_t events = EPOLLIN)
	{
		epoll_event ev{};
		ev.events = events;
		ev.data.u64 = uint64_t(tag) << 56 | uint64_t(index & 0xffffff) << 32 | uint32_t(fd);
		return ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) == 0;
	}
	// FD is polled no more.
	void forget(int fd) { ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr); }
	// Up to MAX events into EVENTS within TIMEOUT_MS (-1: none); their count, or -1 on an
	// error other than EINTR.
	int wait(IoEvent *events, int max, int timeout_ms)
	{
		epoll_event raw[32];
		int n = ::epoll_wait(epoll_.get(), raw, std::min(max, 32), timeout_ms);
		if (n < 0)
			return errno == EINTR ? 0 : -1;
		for (int i = 0; i < n; i++)
			events[i] = IoEvent{ IoTag(raw[i].data.u64 >> 56), uint32_t(raw[i].data.u64 >> 32) & 0xffffff,
					     int(uint32_t(raw[i].data.u64)) };
		return n;
	}

private:
	UniqueFd epoll_;
};

// How long a process this owner cannot watch (another PID namespace, no pidfd) is taken
// to need to exit: a grace period, not a proof that its GPU work is over.
constexpr int64_t kGraceNs = 30'000'000'000;

// Arms TIMER (a timerfd, if any) for monotonic AT_NS (UINT64_MAX: disarms it); ARMED
// says for when it is armed once it is.
inline void arm_timer(const UniqueFd &timer, uint64_t at_ns, uint64_t &armed)
{
	if (!timer.valid())
		return;
	itimerspec t{};
	if (at_ns != UINT64_MAX) {
		t.it_value.tv_sec = time_t(at_ns / 1'000'000'000);
		t.it_value.tv_nsec = long(at_ns % 1'000'000'000);
	}
	if (::timerfd_settime(timer.get(), TFD_TIMER_ABSTIME, &t, nullptr) == 0)
		armed = at_ns;
}

// A timerfd of the monotonic clock for the I/O thread to poll; invalid when none can be made.
inline UniqueFd monotonic_timer()
{
	return UniqueFd(::timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
}

// What a process's exit is waited for where it has no pidfd: a timer that polls readable
// once the grace period is over; none when it cannot be made.
inline UniqueFd grace_timer()
{
	UniqueFd timer = monotonic_timer();
	itimerspec t{};
	t.it_value.tv_sec = time_t(kGraceNs / 1'000'000'000);
	if (!timer.valid() || ::timerfd_settime(timer.get(), 0, &t, nullptr) < 0)
		return UniqueFd();
	return timer;
}

// A timer FD polled readable: its expirations read, so that it polls quiet until it fires
// again.
inline void drain_timer(int fd)
{
	uint64_t expirations;
	[[maybe_unused]] ssize_t n = ::read(fd, &expirations, sizeof(expirations));
}

} // namespace xmem::owner
