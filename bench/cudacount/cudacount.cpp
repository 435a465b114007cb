// cudacount.cpp - the shim's life in a process: loading the real driver behind the
// exports when the shim loads, and appending the process's counts when it ends (normal
// exit, or SIGTERM/SIGINT where the process left those to their default action).
#include "copies.hpp"
#include "counters.hpp"
#include "driver.hpp"

#include <algorithm>
#include <array>
#include <csignal>
#include <cstdlib>
#include <string>

#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

namespace xmem::cudacount {

namespace {

// The start of one of the process's own /proc files (the report keeps 2 KiB at most).
std::string read_proc_self(const char *file)
{
	std::string text;
	const int fd = ::open(file, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return text;
	std::array<char, 4096> buf{};
	const ssize_t n = ::read(fd, buf.data(), buf.size());
	::close(fd);
	if (n > 0)
		text.assign(buf.data(), static_cast<std::size_t>(n));
	return text;
}

Settings read_settings()
{
	Settings settings;
	const char *min = std::getenv("XMEM_CUDACOUNT_MIN_BYTES"); // NOLINT(concurrency-mt-unsafe): constructor
	if (min && *min) {
		char *end = nullptr;
		const unsigned long long bytes = std::strtoull(min, &end, 10);
		if (*end == '\0' && min[0] != '-') {
			settings.min_bytes = bytes;
		} else {
			const std::string why = std::string("cudacount: XMEM_CUDACOUNT_MIN_BYTES=") + min +
						" is not a number of bytes; frame-sized stays " +
						std::to_string(default_min_bytes) + "\n";
			(void)!::write(STDERR_FILENO, why.data(), why.size());
		}
	}
	return settings;
}

// XMEM_CUDACOUNT_OUT made absolute now: the process may change directory before it exits.
std::string out_path()
{
	const char *out = std::getenv("XMEM_CUDACOUNT_OUT"); // NOLINT(concurrency-mt-unsafe): constructor
	if (!out || !*out)
		return {};
	if (out[0] == '/')
		return out;
	std::array<char, 4096> cwd{};
	if (!::getcwd(cwd.data(), cwd.size()))
		return out;
	return std::string(cwd.data()) + "/" + out;
}

constexpr std::array<int, 2> reported_signals = { SIGTERM, SIGINT };

void on_signal(int signal)
{
	write_report(signal == SIGTERM ? "SIGTERM" : "SIGINT");
	// SA_RESETHAND has put the default action back: the signal, blocked until this
	// handler returns, then ends the process as it would have without the shim.
	(void)::raise(signal);
}

// Only where the process has left the signal to its default action (the shim loads long
// after main() has installed its handlers, in the processes it is made for); a handler
// installed later replaces this one, and that process then exits through its own path.
void report_on_signals()
{
	for (const int signal : reported_signals) {
		struct sigaction current = {};
		if (::sigaction(signal, nullptr, &current) != 0 || current.sa_handler != SIG_DFL ||
		    (current.sa_flags & SA_SIGINFO) != 0)
			continue;
		struct sigaction report = {};
		report.sa_handler = &on_signal;
		report.sa_flags = SA_RESETHAND | SA_RESTART;
		sigemptyset(&report.sa_mask);
		::sigaction(signal, &report, nullptr);
	}
}

void in_forked_child()
{
	reset_counts();
}

// Inside the dlopen() that loads the shim, before the caller can look up a name. Other
// files' static constructors may run after it, so nothing it touches may need one: every
// global of the shim is constant-initialized.
__attribute__((constructor)) void on_load()
{
	configure(read_settings());

	static const LoadedDriver driver = load_driver();
	fill_slots(driver);
	install_counters();

	const std::string out = out_path();
	std::string comm = read_proc_self("/proc/self/comm");
	comm = comm.substr(0, comm.find('\n'));
	// The arguments, NUL-terminated each: argv[0] alone, and all of them joined by spaces.
	std::string cmdline = read_proc_self("/proc/self/cmdline");
	const std::string argv0 = cmdline.substr(0, cmdline.find('\0'));
	while (!cmdline.empty() && cmdline.back() == '\0')
		cmdline.pop_back();
	std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
	set_identity({
		.out_path = out.empty() ? nullptr : out.c_str(),
		.comm = comm.c_str(),
		.argv0 = argv0.c_str(),
		.cmdline = cmdline.c_str(),
		.driver = driver.handle ? driver.path.c_str() : nullptr,
	});
	if (!out.empty()) {
		report_on_signals();
		::pthread_atfork(nullptr, nullptr, &in_forked_child);
	}
}

// At exit, or when the process unloads the shim (FFmpeg's loader dlclose()s the driver):
// then the signals go back to their default action, which the handler would have left
// them, as its code is about to be unmapped.
__attribute__((destructor)) void on_unload()
{
	write_report("exit");
	for (const int signal : reported_signals) {
		struct sigaction current = {};
		if (::sigaction(signal, nullptr, &current) == 0 && current.sa_handler == &on_signal)
			(void)::signal(signal, SIG_DFL);
	}
}

} // namespace

} // namespace xmem::cudacount
