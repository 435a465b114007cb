// counters.cpp - the shim's counters and the one JSON line per process that reports them,
// formatted by hand so that a signal handler can write it (no malloc, no stdio).
#include "counters.hpp"

#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <string_view>

#include <fcntl.h>
#include <unistd.h>

namespace xmem::cudacount {

namespace {

// Each counter stands alone (nothing reads two of them as a pair while calls run), so
// relaxed increments; the report reads them after the process's work is done.
struct Tally {
	std::atomic<std::uint64_t> calls{ 0 };
	std::atomic<std::uint64_t> bytes{ 0 };

	void add(std::uint64_t n)
	{
		calls.fetch_add(1, std::memory_order_relaxed);
		bytes.fetch_add(n, std::memory_order_relaxed);
	}
	void reset()
	{
		calls.store(0, std::memory_order_relaxed);
		bytes.store(0, std::memory_order_relaxed);
	}
};

struct Counts {
	std::array<Tally, direction_count> frame; // bytes >= min_bytes
	std::array<Tally, direction_count> small;
	Tally memsets;
	std::atomic<std::uint64_t> failed_copies{ 0 };
	std::atomic<std::uint64_t> failed_memsets{ 0 };
};

Counts counts;
// Written by configure() in the constructor, before any call can be counted.
std::uint64_t min_bytes = default_min_bytes;

// The identity strings, copied once in the constructor; write_report() only reads them.
template<std::size_t Max>
struct Text {
	std::array<char, Max> bytes{};
	bool set = false;
};
using Path = Text<512>;
Path out_path;
Path comm;
Path argv0;
Text<2048> cmdline;
Path driver;

std::atomic<bool> reported{ false };

template<std::size_t Max>
void copy_text(Text<Max> &to, const char *from)
{
	to.set = from != nullptr;
	if (!from)
		return;
	const std::size_t n = ::strnlen(from, Max - 1);
	std::memcpy(to.bytes.data(), from, n);
	to.bytes[n] = '\0';
}

// The report line, built in a stack buffer; a line that would not fit is cut short and
// is no JSON any more, which the reader notices (the strings are cut first, so that it
// does not happen with the fields below but for a command line of control characters).
class Line
{
public:
	void raw(std::string_view s)
	{
		const std::size_t n = s.size() < room() ? s.size() : room();
		std::memcpy(buf_.data() + len_, s.data(), n);
		len_ += n;
	}
	void number(std::uint64_t v)
	{
		std::array<char, 20> digits{};
		std::size_t n = 0;
		do {
			digits[n++] = char('0' + v % 10);
			v /= 10;
		} while (v != 0);
		while (n > 0)
			raw(std::string_view(&digits[--n], 1));
	}
	template<std::size_t Max>
	void string(const Text<Max> &t)
	{
		if (!t.set) {
			raw("null");
			return;
		}
		raw("\"");
		for (const char *p = t.bytes.data(); *p; ++p) {
			const auto c = static_cast<unsigned char>(*p);
			if (c == '"' || c == '\\') {
				const std::array<char, 2> escaped{ '\\', char(c) };
				raw(std::string_view(escaped.data(), escaped.size()));
			} else if (c < 0x20) {
				constexpr std::string_view hex = "0123456789abcdef";
				const std::array<char, 6> escaped{ '\\', 'u', '0', '0', hex[c >> 4], hex[c & 0xf] };
				raw(std::string_view(escaped.data(), escaped.size()));
			} else {
				raw(std::string_view(p, 1));
			}
		}
		raw("\"");
	}
	void tally(std::string_view name, std::uint64_t calls, std::uint64_t bytes)
	{
		raw("\"");
		raw(name);
		raw("\":{\"calls\":");
		number(calls);
		raw(",\"bytes\":");
		number(bytes);
		raw("}");
	}
	[[nodiscard]] const char *data() const { return buf_.data(); }
	[[nodiscard]] std::size_t size() const { return len_; }

private:
	[[nodiscard]] std::size_t room() const { return buf_.size() - len_; }

	std::array<char, 8192> buf_{};
	std::size_t len_ = 0;
};

constexpr std::array<std::string_view, direction_count> direction_names = { "HtoD", "DtoH", "DtoD", "HtoH" };

void say(std::string_view what)
{
	// Nothing to do when stderr is gone too.
	(void)!::write(STDERR_FILENO, what.data(), what.size());
}

} // namespace

void configure(const Settings &settings)
{
	min_bytes = settings.min_bytes;
}

void count_copy(Direction direction, std::uint64_t bytes)
{
	auto &tallies = bytes >= min_bytes ? counts.frame : counts.small;
	tallies[static_cast<std::size_t>(direction)].add(bytes);
}

void count_memset(std::uint64_t bytes)
{
	counts.memsets.add(bytes);
}

void count_failed_copy()
{
	counts.failed_copies.fetch_add(1, std::memory_order_relaxed);
}

void count_failed_memset()
{
	counts.failed_memsets.fetch_add(1, std::memory_order_relaxed);
}

void reset_counts()
{
	for (std::size_t d = 0; d < direction_count; ++d) {
		counts.frame[d].reset();
		counts.small[d].reset();
	}
	counts.memsets.reset();
	counts.failed_copies.store(0, std::memory_order_relaxed);
	counts.failed_memsets.store(0, std::memory_order_relaxed);
	reported.store(false, std::memory_order_relaxed);
}

void set_identity(const Identity &identity)
{
	copy_text(out_path, identity.out_path);
	copy_text(comm, identity.comm);
	copy_text(argv0, identity.argv0);
	copy_text(cmdline, identity.cmdline);
	copy_text(driver, identity.driver);
}

void write_report(const char *at)
{
	if (!out_path.set || reported.exchange(true))
		return;
	const int saved_errno = errno;
	Line line;
	line.raw("{\"pid\":");
	line.number(static_cast<std::uint64_t>(::getpid()));
	line.raw(",\"comm\":");
	line.string(comm);
	line.raw(",\"argv0\":");
	line.string(argv0);
	line.raw(",\"cmdline\":");
	line.string(cmdline);
	line.raw(",\"at\":");
	Path at_text;
	copy_text(at_text, at);
	line.string(at_text);
	line.raw(",\"driver\":");
	line.string(driver);
	line.raw(",\"min_bytes\":");
	line.number(min_bytes);
	line.raw(",\"copies\":{");
	std::uint64_t frame_calls = 0;
	std::uint64_t frame_bytes = 0;
	for (std::size_t d = 0; d < direction_count; ++d) {
		const Tally &frame = counts.frame[d];
		const Tally &small = counts.small[d];
		const std::uint64_t calls = frame.calls.load(std::memory_order_relaxed);
		const std::uint64_t bytes = frame.bytes.load(std::memory_order_relaxed);
		frame_calls += calls;
		frame_bytes += bytes;
		line.raw(d == 0 ? "\"" : ",\"");
		line.raw(direction_names[d]);
		line.raw("\":{");
		line.tally("frame", calls, bytes);
		line.raw(",");
		line.tally("small", small.calls.load(std::memory_order_relaxed),
			   small.bytes.load(std::memory_order_relaxed));
		line.raw("}");
	}
	line.raw("},\"frame_calls_total\":");
	line.number(frame_calls);
	line.raw(",\"frame_bytes_total\":");
	line.number(frame_bytes);
	line.raw(",");
	line.tally("memsets", counts.memsets.calls.load(std::memory_order_relaxed),
		   counts.memsets.bytes.load(std::memory_order_relaxed));
	line.raw(",\"failed\":{\"copies\":");
	line.number(counts.failed_copies.load(std::memory_order_relaxed));
	line.raw(",\"memsets\":");
	line.number(counts.failed_memsets.load(std::memory_order_relaxed));
	line.raw("}}\n");

	const int fd = ::open(out_path.bytes.data(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
	if (fd < 0) {
		say("cudacount: cannot open XMEM_CUDACOUNT_OUT (");
		say(out_path.bytes.data());
		say("); the counts are lost\n");
	} else {
		const ssize_t written = ::write(fd, line.data(), line.size());
		if (written != static_cast<ssize_t>(line.size())) {
			say("cudacount: the counts could not be written whole to ");
			say(out_path.bytes.data());
			say("\n");
		}
		::close(fd);
	}
	errno = saved_errno;
}

} // namespace xmem::cudacount
