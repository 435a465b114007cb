// counters.hpp - what the shim counts (copies by direction and size, memsets, calls
// that failed) and the JSON line it appends to XMEM_CUDACOUNT_OUT for the process.
#pragma once

#include <cstddef>
#include <cstdint>

namespace xmem::cudacount {

enum class Direction : std::uint8_t { HtoD, DtoH, DtoD, HtoH };
inline constexpr std::size_t direction_count = 4;

inline constexpr std::uint64_t default_min_bytes = 65536;

// Read from the environment once, in the shim's constructor, before any call is counted.
struct Settings {
	std::uint64_t min_bytes = default_min_bytes; // XMEM_CUDACOUNT_MIN_BYTES: a copy this large is frame-sized
};
void configure(const Settings &settings);

// Any thread, any time: one copy the driver accepted (a successful return: for an async
// copy, queued).
void count_copy(Direction direction, std::uint64_t bytes);
void count_memset(std::uint64_t bytes);
// A copy or memset call that returned an error: no bytes moved, so not in the above.
void count_failed_copy();
void count_failed_memset();

// In a child after fork(): its line counts its own calls only.
void reset_counts();

// What the line says about the process besides the counts, set once in the constructor.
// The strings are copied (and cut: 2 KiB for the command line, 512 bytes for the others).
struct Identity {
	const char *out_path = nullptr; // XMEM_CUDACOUNT_OUT, absolute; nullptr: write nothing
	const char *comm = "";
	const char *argv0 = "";
	const char *cmdline = ""; // the arguments, joined by spaces
	const char *driver = nullptr; // the driver the calls go to; nullptr: none found
};
void set_identity(const Identity &identity);

// Appends the line (one write() on an O_APPEND file) the first time it is called and
// does nothing after. `at` says what ended the process ("exit", "SIGTERM"). Only
// async-signal-safe calls: a signal handler may call it.
void write_report(const char *at);

} // namespace xmem::cudacount
