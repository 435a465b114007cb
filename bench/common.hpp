// common.hpp - what the benchmark programs share: clocks, CPU time, pipe I/O,
// percentiles, JSON strings and errno texts, so their figures are computed the same way.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <string>
#include <string_view>
#include <vector>

#include <sys/resource.h>
#include <unistd.h>

namespace bench {

inline uint64_t clock_ns(clockid_t clock)
{
	timespec ts;
	clock_gettime(clock, &ts);
	return uint64_t(ts.tv_sec) * 1000000000u + uint64_t(ts.tv_nsec);
}

inline uint64_t monotonic_ns()
{
	return clock_ns(CLOCK_MONOTONIC);
}

// User + system time of the whole process (every thread), in ns.
inline uint64_t process_cpu_ns()
{
	rusage ru{};
	getrusage(RUSAGE_SELF, &ru);
	auto ns = [](const timeval &tv) {
		return uint64_t(tv.tv_sec) * 1000000000u + uint64_t(tv.tv_usec) * 1000u;
	};
	return ns(ru.ru_utime) + ns(ru.ru_stime);
}

inline bool write_all(int fd, const void *buf, size_t len)
{
	auto p = static_cast<const char *>(buf);
	while (len > 0) {
		ssize_t n = ::write(fd, p, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return false;
		p += n;
		len -= size_t(n);
	}
	return true;
}

// Nearest-rank percentile of SORTED, in µs.
inline double percentile_us(const std::vector<uint64_t> &sorted, double q)
{
	if (sorted.empty())
		return 0.0;
	size_t rank = size_t(q * double(sorted.size()) + 0.999999);
	rank = std::clamp<size_t>(rank, 1, sorted.size());
	return double(sorted[rank - 1]) / 1000.0;
}

inline std::string json_string(std::string_view v)
{
	std::string out = "\"";
	for (char c : v) {
		if (c == '"' || c == '\\') {
			out += '\\';
			out += c;
		} else if (static_cast<unsigned char>(c) < 0x20) {
			char buf[8];
			// BUF holds the longest escape: snprintf cannot truncate or fail.
			(void)std::snprintf(buf, sizeof(buf), "\\u%04x", c);
			out += buf;
		} else {
			out += c;
		}
	}
	return out + "\"";
}

// The text of errno value ERR, as xmem's own error_text() (lib/system.hpp), which the
// benchmarks cannot all include: strerror() may share one buffer between threads; the
// GNU strerror_r() writes into ours or returns a static string.
inline std::string error_text(int err)
{
	char buffer[128];
	return ::strerror_r(err, buffer, sizeof(buffer));
}

} // namespace bench
