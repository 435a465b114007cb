// xmem-bench-core.cpp - publish-to-receive latency, throughput and CPU per frame of
// libxmem alone: one producer process and N consumer processes spawned from itself.
//
// The producer writes only the first cache line of each frame (a stamp the
// consumers check) and the consumers read only that line: what is measured is the
// zero-copy handoff, which should not depend on the frame size. Consumers send
// their latencies and CPU time back over a pipe once the stream has ended.
//
// --pair eventfd-memfd measures the floor the core is built on instead: a stamp in
// a shared memfd and one eventfd write per consumer per frame, the same sleep and
// wake-up path as a sleeping xmem consumer, with no pool at all.
#include "common.hpp"

#include <xmem/xmem.hpp>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

namespace {

using bench::clock_ns;
using bench::error_text;
using bench::json_string;
using bench::monotonic_ns;
using bench::percentile_us;
using bench::process_cpu_ns;
using bench::write_all;

constexpr uint64_t kStampMagic = 0x504d415453484358; // "XCHSTAMP"
constexpr uint64_t kReportMagic = 0x54524f5045524258; // "XBREPORT"
constexpr uint64_t kEndOfStream = UINT64_MAX; // floor pair: the producer is done
// Where a spawned consumer finds what its producer handed it.
constexpr int kReportFd = 3;
constexpr int kStampFd = 4; // floor pair: the shared stamp page
constexpr int kEventFd = 5; // floor pair: this consumer's eventfd
constexpr int kFirstPrivateFd = 10; // the producer's own fds live above these

// What the producer writes into the first cache line of a frame.
struct alignas(64) Stamp {
	uint64_t magic;
	uint64_t seq; // the sequence number the frame is published with
};

// The floor pair's shared page: the stamp, and the metadata xmem would carry.
struct alignas(64) FloorPage {
	std::atomic<uint64_t> timestamp;
	std::atomic<uint64_t> seq;
};

// What a consumer sends back, followed by `samples` latencies in ns.
struct Report {
	uint64_t magic;
	uint64_t samples;
	uint64_t missing; // measured frames never received (gaps in seq)
	uint64_t corrupt; // frames whose stamp did not match their metadata
	uint64_t cpu_ns; // user + system time over the measured frames
	int32_t status; // 0, or the xmem error that ended the stream early
	char error[204];
};

enum class Pair { xmem_core, eventfd_memfd };

struct Options {
	Pair pair = Pair::xmem_core;
	uint32_t width = 640;
	uint32_t height = 480;
	uint32_t fps = 60; // 0: unthrottled
	uint64_t frames = 600;
	uint64_t warmup = 60;
	uint32_t consumers = 1;
	uint32_t slots = 8;
	// Size classes of the pool: the frames' is the last, after K - 1 classes of smaller
	// slots (each half the one after), so acquire() and the slot lookups pass them all.
	uint32_t classes = 1;
	uint32_t queue = 4;
	xmem::Policy policy = xmem::Policy::block;
	bool spin = false; // xmem consumers poll with receive(0) instead of sleeping
	xmem::Wake wake = xmem::Wake::sleep; // xmem consumers: how receive() waits
	uint32_t spin_budget_us = 200;
	std::optional<xmem::Policy> consumer_policy; // none: the pool's
	uint32_t spill_mb = 0; // the pool's spill tier
	// Growth on demand: the pool's memory cap; with one, class 0 is one page and every
	// frame's slot is one made on demand (the pool grows, then reuses them).
	uint32_t memory_cap_mb = 0;
	// One more consumer, fifo-spill, that stops reading for stall_ms every
	// stall_every_ms: its losses and the tier's use are reported, not its latencies.
	uint32_t stall_ms = 0;
	uint32_t stall_every_ms = 10000;
	bool stalling = false; // set in that consumer
	bool json = false;
	std::string mode = "latency"; // a label for the record only
	std::string consumer_of; // set in a spawned consumer: the pool's name
	std::string command; // this run's command line, for the record
};

// Usage text and error messages are best effort: nothing to do if stderr fails.
int usage()
{
	(void)std::fprintf(
		stderr,
		"usage: xmem-bench-core [--pair xmem-core|eventfd-memfd] [--width W] [--height H]\n"
		"                       [--fps F (0 = unthrottled)] [--frames N] [--warmup N] [--consumers N]\n"
		"                       [--slots S] [--classes K] [--queue Q] [--policy block|drop-oldest|drop-new]\n"
		"                       [--spin] [--wake sleep|spin-before] [--spin-budget US]\n"
		"                       [--consumer-policy P] [--spill-mb MB] [--memory-cap-mb MB] [--stall-ms MS]\n"
		"                       [--stall-every-ms MS] [--mode LABEL] [--json]\n");
	return 2;
}

bool parse_policy(std::string_view p, xmem::Policy &policy)
{
	auto named = xmem::policy_from_name(p);
	if (named)
		policy = *named;
	return named.has_value();
}

bool parse(int argc, char **argv, Options &o)
{
	for (int i = 1; i < argc; i++) {
		std::string_view a = argv[i];
		if (a == "--json") {
			o.json = true;
			continue;
		}
		if (a == "--spin") {
			o.spin = true;
			continue;
		}
		if (a == "--stalling") {
			o.stalling = true;
			continue;
		}
		if (i + 1 >= argc)
			return false;
		std::string_view v = argv[++i];
		char *end = nullptr;
		unsigned long long n = std::strtoull(v.data(), &end, 10);
		bool numeric = !v.empty() && end && *end == '\0' && n <= UINT32_MAX;
		if (a == "--mode")
			o.mode = v;
		else if (a == "--consumer")
			o.consumer_of = v;
		else if (a == "--pair") {
			if (v == "xmem-core")
				o.pair = Pair::xmem_core;
			else if (v == "eventfd-memfd")
				o.pair = Pair::eventfd_memfd;
			else
				return false;
		} else if (a == "--policy") {
			if (!parse_policy(v, o.policy))
				return false;
		} else if (a == "--consumer-policy") {
			xmem::Policy p;
			if (!parse_policy(v, p))
				return false;
			o.consumer_policy = p;
		} else if (a == "--wake") {
			if (v == "sleep")
				o.wake = xmem::Wake::sleep;
			else if (v == "spin-before")
				o.wake = xmem::Wake::spin_before;
			else
				return false;
		} else {
			if (!numeric)
				return false;
			if (a == "--width")
				o.width = uint32_t(n);
			else if (a == "--height")
				o.height = uint32_t(n);
			else if (a == "--fps")
				o.fps = uint32_t(n);
			else if (a == "--frames")
				o.frames = n;
			else if (a == "--warmup")
				o.warmup = n;
			else if (a == "--consumers")
				o.consumers = uint32_t(n);
			else if (a == "--classes")
				o.classes = uint32_t(n);
			else if (a == "--slots")
				o.slots = uint32_t(n);
			else if (a == "--queue")
				o.queue = uint32_t(n);
			else if (a == "--spin-budget")
				o.spin_budget_us = uint32_t(n);
			else if (a == "--spill-mb")
				o.spill_mb = uint32_t(n);
			else if (a == "--memory-cap-mb")
				o.memory_cap_mb = uint32_t(n);
			else if (a == "--stall-ms")
				o.stall_ms = uint32_t(n);
			else if (a == "--stall-every-ms")
				o.stall_every_ms = uint32_t(n);
			else
				return false;
		}
	}
	if (o.pair == Pair::eventfd_memfd && o.fps == 0) {
		// One stamp, no queue: an unthrottled producer would overwrite it unread.
		(void)std::fprintf(stderr, "xmem-bench-core: the eventfd-memfd pair needs --fps > 0\n");
		return false;
	}
	return o.width > 0 && o.height > 0 && o.frames > 0 && o.consumers > 0 && o.consumers <= XMEM_MAX_CONSUMERS &&
	       o.slots > 0 && o.fps <= 1000000;
}

// The pool policy as this benchmark's reports have always named it ("block").
const char *bench_policy_name(xmem::Policy p)
{
	return p == xmem::Policy::block ? "block" : xmem::policy_name(p);
}

bool read_all(int fd, void *buf, size_t len)
{
	auto p = static_cast<char *>(buf);
	while (len > 0) {
		ssize_t n = ::read(fd, p, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return false;
		p += n;
		len -= size_t(n);
	}
	return true;
}

// Consumers

// What both consumer kinds share: latencies, gaps and CPU time over the measured
// frames (sequence numbers warmup+1 .. warmup+frames).
class Recorder
{
public:
	explicit Recorder(const Options &o) : first_(o.warmup + 1), last_(o.warmup + o.frames), expected_(first_)
	{
		latencies_.reserve(o.frames);
		report_.magic = kReportMagic;
		if (o.warmup == 0)
			cpu_start_ = process_cpu_ns();
	}

	void frame(uint64_t seq, uint64_t timestamp, uint64_t now, bool stamp_ok)
	{
		if (!stamp_ok)
			report_.corrupt++;
		if (seq >= first_ && seq <= last_) {
			latencies_.push_back(now - timestamp);
			if (seq > expected_)
				report_.missing += seq - expected_;
			expected_ = seq + 1;
		}
	}

	// After a frame is released. CPU is counted from the end of the warmup to the
	// last measured frame: attaching and the first touch of each slot are left out.
	void released(uint64_t seq)
	{
		if (seq + 1 >= first_ && cpu_start_ == 0)
			cpu_start_ = process_cpu_ns();
		if (seq >= last_ && cpu_end_ == 0)
			cpu_end_ = process_cpu_ns();
	}

	void fail(const xmem::Error &e)
	{
		report_.status = int32_t(e.code);
		// Cut to the report's fixed field if longer: what is left says enough.
		(void)std::snprintf(report_.error, sizeof(report_.error), "%s", e.message.c_str());
	}

	int send()
	{
		if (cpu_end_ == 0)
			cpu_end_ = process_cpu_ns();
		if (expected_ <= last_)
			report_.missing += last_ + 1 - expected_;
		report_.cpu_ns = cpu_start_ && cpu_end_ > cpu_start_ ? cpu_end_ - cpu_start_ : 0;
		report_.samples = latencies_.size();
		if (!write_all(kReportFd, &report_, sizeof(report_)) ||
		    !write_all(kReportFd, latencies_.data(), latencies_.size() * sizeof(uint64_t)))
			return 1;
		return report_.status == 0 ? 0 : 1;
	}

private:
	uint64_t first_, last_, expected_;
	uint64_t cpu_start_ = 0, cpu_end_ = 0;
	std::vector<uint64_t> latencies_;
	Report report_{};
};

int run_xmem_consumer(const Options &o)
{
	Recorder rec(o);
	xmem::OpenOptions options;
	options.timeout = std::chrono::seconds(10);
	options.queue_size = o.stalling ? 0 : o.queue;
	options.client = o.stalling ? "xmem-bench-core:stalling" : "xmem-bench-core";
	options.policy = o.stalling ? std::optional(xmem::Policy::fifo_spill) : o.consumer_policy;
	options.wake = o.wake;
	options.spin_budget = std::chrono::microseconds(o.spin_budget_us);
	auto opened = xmem::BufferPool::open(o.consumer_of, options);
	if (!opened) {
		rec.fail(opened.error());
		return rec.send();
	}
	auto pool = std::move(opened.value());

	const auto timeout = o.spin ? std::chrono::nanoseconds(0) : std::chrono::nanoseconds(std::chrono::seconds(10));
	uint64_t idle_since = 0;
	const uint64_t started = monotonic_ns();
	uint64_t stalls = 0;
	for (;;) {
		// The stalling consumer: reads nothing for stall_ms every stall_every_ms.
		if (o.stalling && o.stall_ms &&
		    monotonic_ns() - started >= (stalls + 1) * uint64_t(o.stall_every_ms) * 1'000'000) {
			stalls++;
			std::this_thread::sleep_for(std::chrono::milliseconds(o.stall_ms));
		}
		auto frame = pool->receive(timeout);
		if (!frame) {
			if (frame.code() == xmem::Errc::timed_out && o.spin) {
				uint64_t now = monotonic_ns();
				if (!idle_since)
					idle_since = now;
				if (now - idle_since < 10'000'000'000u)
					continue;
			}
			if (frame.code() != xmem::Errc::end_of_stream)
				rec.fail(frame.error());
			break;
		}
		idle_since = 0;
		uint64_t now = monotonic_ns();
		const xmem::FrameMeta &m = frame->meta();
		Stamp stamp;
		std::memcpy(&stamp, frame->data().data(), sizeof(stamp));
		uint64_t seq = m.seq;
		rec.frame(seq, m.timestamp, now, stamp.magic == kStampMagic && stamp.seq == seq);
		frame->reset();
		rec.released(seq);
	}
	return rec.send();
}

int run_floor_consumer(const Options &o)
{
	Recorder rec(o);
	void *p = ::mmap(nullptr, sizeof(FloorPage), PROT_READ, MAP_SHARED, kStampFd, 0);
	if (p == MAP_FAILED) {
		rec.fail({ xmem::Errc::system, std::string("mmap: ") + error_text(errno) });
		return rec.send();
	}
	auto page = static_cast<const FloorPage *>(p);
	for (;;) {
		pollfd pfd = { kEventFd, POLLIN, 0 };
		int r = ::poll(&pfd, 1, 10000);
		if (r == 0) {
			rec.fail({ xmem::Errc::timed_out, "no frame within 10 s" });
			break;
		}
		if (r < 0) {
			if (errno == EINTR)
				continue;
			rec.fail({ xmem::Errc::system, std::string("poll: ") + error_text(errno) });
			break;
		}
		uint64_t count;
		[[maybe_unused]] ssize_t n = ::read(kEventFd, &count, sizeof(count));
		uint64_t now = monotonic_ns();
		uint64_t seq = page->seq.load(std::memory_order_acquire);
		if (seq == kEndOfStream)
			break;
		rec.frame(seq, page->timestamp.load(std::memory_order_relaxed), now, true);
		rec.released(seq);
	}
	return rec.send();
}

// Producer

struct Child {
	pid_t pid = -1;
	int report = -1; // read end of its report pipe
};

// FD, moved above the fds spawned consumers are handed, close-on-exec.
int private_fd(int fd)
{
	int moved = ::fcntl(fd, F_DUPFD_CLOEXEC, kFirstPrivateFd);
	::close(fd);
	return moved;
}

// Spawns this binary again as a consumer. Never fork(): the pool already runs its
// I/O thread. EXTRA are (fd, target) pairs to hand over besides the report pipe.
bool spawn_consumer(const std::vector<std::string> &args, const std::vector<std::pair<int, int>> &extra, Child &child)
{
	int fds[2];
	if (::pipe2(fds, O_CLOEXEC) < 0)
		return false;
	// Above every target, so that dup2() onto the target always clears close-on-exec.
	int rd = private_fd(fds[0]), wr = private_fd(fds[1]);
	if (rd < 0 || wr < 0)
		return false;

	std::vector<std::string> copy = args;
	std::vector<char *> argv;
	argv.reserve(copy.size() + 1);
	for (auto &a : copy)
		argv.push_back(a.data());
	argv.push_back(nullptr);

	posix_spawn_file_actions_t actions;
	posix_spawn_file_actions_init(&actions);
	posix_spawn_file_actions_adddup2(&actions, wr, kReportFd);
	for (auto [fd, target] : extra)
		posix_spawn_file_actions_adddup2(&actions, fd, target);
	// XMEM_BENCH_EXE: under valgrind, /proc/self/exe is valgrind's own tool binary.
	// getenv() races only with setenv(), which this program never calls.
	const char *exe = std::getenv("XMEM_BENCH_EXE"); // NOLINT(concurrency-mt-unsafe)
	int err =
		posix_spawn(&child.pid, exe && *exe ? exe : "/proc/self/exe", &actions, nullptr, argv.data(), environ);
	posix_spawn_file_actions_destroy(&actions);
	::close(wr);
	if (err != 0) {
		::close(rd);
		errno = err;
		return false;
	}
	child.report = rd;
	return true;
}

std::vector<std::string> consumer_args(const Options &o, const std::string &pool)
{
	std::vector<std::string> args = { "xmem-bench-core", "--consumer", pool };
	args.insert(args.end(), { "--pair", o.pair == Pair::xmem_core ? "xmem-core" : "eventfd-memfd" });
	args.insert(args.end(), { "--frames", std::to_string(o.frames), "--warmup", std::to_string(o.warmup) });
	args.insert(args.end(), { "--queue", std::to_string(o.queue) });
	if (o.spin)
		args.push_back("--spin");
	args.insert(args.end(), { "--wake", o.wake == xmem::Wake::spin_before ? "spin-before" : "sleep" });
	args.insert(args.end(), { "--spin-budget", std::to_string(o.spin_budget_us) });
	if (o.consumer_policy)
		args.insert(args.end(), { "--consumer-policy", xmem::policy_name(*o.consumer_policy) });
	return args;
}

// Median cost of the two clock reads around a measured call, taken off each sample.
uint64_t thread_clock_overhead_ns()
{
	std::vector<uint64_t> d(1001);
	for (auto &v : d) {
		uint64_t a = clock_ns(CLOCK_THREAD_CPUTIME_ID);
		v = clock_ns(CLOCK_THREAD_CPUTIME_ID) - a;
	}
	std::nth_element(d.begin(), d.begin() + 500, d.end());
	return d[500];
}

struct ProducerRun {
	bool ok = true;
	uint64_t published = 0;
	uint64_t wall_ns = 0;
	uint64_t process_cpu_ns = 0; // the whole process, pacing sleeps included
	uint64_t call_cpu_ns = 0; // this thread, inside acquire + stamp + publish only
	uint64_t clock_overhead_ns = 0;
	std::vector<uint64_t> call_ns; // wall time of acquire + stamp + publish
};

// Calls PUBLISH(n) for warmup + frames frames at o.fps (or as fast as it returns),
// measuring the frames after the warmup. PUBLISH returns false to stop.
ProducerRun pace(const Options &o, const std::function<bool(uint64_t)> &publish)
{
	ProducerRun run;
	run.call_ns.reserve(o.frames);
	const uint64_t total = o.warmup + o.frames;
	const uint64_t period = o.fps ? 1000000000u / o.fps : 0;
	// Paced, the process also spends CPU sleeping and waking up between frames, so
	// the calls are timed on their own. Unthrottled, there is nothing else to leave
	// out and the two system calls per frame would slow the producer down.
	const bool time_calls = period != 0;
	if (time_calls)
		run.clock_overhead_ns = thread_clock_overhead_ns();
	uint64_t cpu_start = 0, wall_start = 0;
	timespec next{};
	clock_gettime(CLOCK_MONOTONIC, &next);
	for (uint64_t n = 0; n < total; n++) {
		bool measured = n >= o.warmup;
		if (n == o.warmup) {
			cpu_start = process_cpu_ns();
			wall_start = monotonic_ns();
		}
		uint64_t c0 = time_calls ? clock_ns(CLOCK_THREAD_CPUTIME_ID) : 0;
		uint64_t t0 = monotonic_ns();
		if (!publish(n)) {
			run.ok = false;
			break;
		}
		uint64_t t1 = monotonic_ns();
		uint64_t c1 = time_calls ? clock_ns(CLOCK_THREAD_CPUTIME_ID) : 0;
		run.published++;
		if (measured) {
			run.call_ns.push_back(t1 - t0);
			run.call_cpu_ns += c1 - c0 > run.clock_overhead_ns ? c1 - c0 - run.clock_overhead_ns : 0;
		}
		if (period) {
			next.tv_nsec += long(period);
			while (next.tv_nsec >= 1000000000) {
				next.tv_nsec -= 1000000000;
				next.tv_sec++;
			}
			while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, nullptr) == EINTR) {
			}
		}
	}
	run.process_cpu_ns = process_cpu_ns() - cpu_start;
	run.wall_ns = monotonic_ns() - wall_start;
	if (!time_calls)
		run.call_cpu_ns = run.process_cpu_ns;
	return run;
}

struct Gathered {
	bool ok = true;
	std::vector<uint64_t> latencies; // every consumer's, sorted
	uint64_t cpu_ns = 0;
	uint64_t missing = 0;
	uint64_t corrupt = 0;
};

// Reads every consumer's report and reaps it. Blocks until each has sent it.
Gathered gather(const Options &o, std::vector<Child> &children)
{
	Gathered g;
	g.latencies.reserve(o.frames * o.consumers);
	for (auto &c : children) {
		Report rep{};
		bool ok = read_all(c.report, &rep, sizeof(rep)) && rep.magic == kReportMagic && rep.samples <= o.frames;
		if (ok) {
			size_t at = g.latencies.size();
			g.latencies.resize(at + rep.samples);
			ok = read_all(c.report, g.latencies.data() + at, rep.samples * sizeof(uint64_t));
		}
		::close(c.report);
		int ws = 0;
		::waitpid(c.pid, &ws, 0);
		if (!ok) {
			(void)std::fprintf(stderr, "xmem-bench-core: consumer %d sent no report\n", int(c.pid));
			g.ok = false;
			g.missing += o.frames;
			continue;
		}
		if (rep.status != 0) {
			rep.error[sizeof(rep.error) - 1] = '\0';
			(void)std::fprintf(stderr, "xmem-bench-core: consumer %d: %s\n", int(c.pid), rep.error);
			g.ok = false;
		}
		g.cpu_ns += rep.cpu_ns;
		g.missing += rep.missing;
		g.corrupt += rep.corrupt;
	}
	std::sort(g.latencies.begin(), g.latencies.end());
	return g;
}

void wait_children(std::vector<Child> &children)
{
	for (auto &c : children) {
		if (c.report >= 0)
			::close(c.report);
		if (c.pid > 0)
			::waitpid(c.pid, nullptr, 0);
	}
}

// The stalling fifo-spill consumer's outcome, and the spill tier's use.
struct Stalled {
	bool present = false;
	bool ok = true;
	uint64_t received = 0;
	uint64_t lost = 0;
	uint64_t corrupt = 0;
	xmem::SpillStats spill{};
};

int report(const Options &o, ProducerRun &run, Gathered &g, uint64_t pool_dropped, const Stalled &stalled = {})
{
	const char *pair = o.pair == Pair::xmem_core ? "xmem-core" : "eventfd-memfd";
	const uint64_t frame_bytes = uint64_t(o.width) * o.height * 3 / 2;
	const double frames = double(o.frames);
	const double producer_cpu = double(run.call_cpu_ns) / 1000.0 / frames;
	const double producer_process_cpu = double(run.process_cpu_ns) / 1000.0 / frames;
	const double consumers_cpu = double(g.cpu_ns) / 1000.0 / frames;
	const double fps = run.wall_ns ? frames * 1e9 / double(run.wall_ns) : 0.0;
	const double p50 = percentile_us(g.latencies, 0.50), p99 = percentile_us(g.latencies, 0.99);
	const double max = percentile_us(g.latencies, 1.0);
	std::sort(run.call_ns.begin(), run.call_ns.end());
	const double call_p50 = percentile_us(run.call_ns, 0.50), call_p99 = percentile_us(run.call_ns, 0.99);
	// A latest consumer loses frames by design; a stalled fifo-spill one must not.
	const bool lossy = o.consumer_policy && (*o.consumer_policy == xmem::Policy::latest ||
						 *o.consumer_policy == xmem::Policy::drop_oldest ||
						 *o.consumer_policy == xmem::Policy::drop_new);
	const bool ok = run.ok && g.ok && (lossy || g.missing == 0) && g.corrupt == 0 &&
			(!stalled.present || (stalled.ok && stalled.lost == 0 && stalled.corrupt == 0));
	const char *wait = o.spin ? "spin" : o.wake == xmem::Wake::spin_before ? "spin-before" : "sleep";

	if (o.json) {
		std::string j = "{";
		auto str = [&](const char *key, std::string_view v) {
			j += std::string(j.size() > 1 ? ", " : "") + "\"" + key + "\": " + json_string(v);
		};
		auto num = [&](const char *key, double v, int decimals) {
			char buf[64];
			// No figure here comes near the 60 digits BUF holds: never cut.
			(void)std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
			j += std::string(j.size() > 1 ? ", " : "") + "\"" + key + "\": " + buf;
		};
		str("pair", pair);
		str("mode", o.mode);
		str("size", std::to_string(o.width) + "x" + std::to_string(o.height));
		num("width", o.width, 0);
		num("height", o.height, 0);
		num("frame_bytes", double(frame_bytes), 0);
		num("touched_bytes", sizeof(Stamp), 0);
		num("fps_target", o.fps, 0);
		num("frames", double(o.frames), 0);
		num("warmup", double(o.warmup), 0);
		num("consumers", o.consumers, 0);
		num("slots", o.slots, 0);
		num("classes", o.classes, 0);
		num("queue_size", o.queue, 0);
		str("policy", bench_policy_name(o.policy));
		str("consumer_wait", wait);
		if (o.wake == xmem::Wake::spin_before)
			num("spin_budget_us", o.spin_budget_us, 0);
		str("consumer_policy", o.consumer_policy ? xmem::policy_name(*o.consumer_policy) : "pool");
		if (stalled.present) {
			num("stall_ms", o.stall_ms, 0);
			num("stall_every_ms", o.stall_every_ms, 0);
			num("stalled_received", double(stalled.received), 0);
			num("stalled_lost", double(stalled.lost), 0);
			num("spill_cap_bytes", double(stalled.spill.cap_bytes), 0);
			num("spill_peak_bytes", double(stalled.spill.peak_bytes), 0);
			num("spilled", double(stalled.spill.spilled), 0);
			num("spill_full", double(stalled.spill.full), 0);
		}
		num("p50_us", p50, 1);
		num("p99_us", p99, 1);
		num("max_us", max, 1);
		num("fps", fps, 1);
		num("producer_cpu_us_per_frame", producer_cpu, 2);
		num("consumers_cpu_us_per_frame", consumers_cpu, 2);
		num("cpu_us_per_frame", producer_cpu + consumers_cpu, 2);
		num("producer_process_cpu_us_per_frame", producer_process_cpu, 2);
		num("producer_call_p50_us", call_p50, 2);
		num("producer_call_p99_us", call_p99, 2);
		num("clock_overhead_us", double(run.clock_overhead_ns) / 1000.0, 2);
		num("dropped", double(g.missing), 0);
		num("pool_dropped", double(pool_dropped), 0);
		num("corrupt", double(g.corrupt), 0);
		str("command", o.command);
		j += std::string(", \"ok\": ") + (ok ? "true" : "false") + "}";
		std::printf("%s\n", j.c_str());
	} else {
		std::printf("%s %s: %ux%u NV12 (%" PRIu64 " bytes; the producer writes and the consumers read only the "
			    "first %zu: the zero-copy handoff), %u consumer(s) %s, %s fps, %s policy, queue %u\n",
			    pair, o.mode.c_str(), o.width, o.height, frame_bytes, sizeof(Stamp), o.consumers,
			    o.spin ? "spinning" : "sleeping", o.fps ? std::to_string(o.fps).c_str() : "unthrottled",
			    bench_policy_name(o.policy), o.queue);
		std::printf("  publish->receive latency: p50 %.1f us, p99 %.1f us, max %.1f us (%zu samples)\n", p50,
			    p99, max, g.latencies.size());
		std::printf("  acquire+stamp+publish:    p50 %.2f us, p99 %.2f us (wall time in the producer)\n",
			    call_p50, call_p99);
		std::printf("  frames/s %.1f, dropped %" PRIu64 " (pool counted %" PRIu64 "), corrupt %" PRIu64 "\n",
			    fps, g.missing, pool_dropped, g.corrupt);
		std::printf("  CPU us/frame: producer %.2f, consumers %.2f, together %.2f\n", producer_cpu,
			    consumers_cpu, producer_cpu + consumers_cpu);
		if (stalled.present)
			std::printf("  stalled fifo-spill consumer (%u ms every %u ms): received %" PRIu64
				    ", lost %" PRIu64 "; spill tier peak %.1f MB of %.1f MB, %" PRIu64
				    " frames spilled, full %" PRIu64 " times\n",
				    o.stall_ms, o.stall_every_ms, stalled.received, stalled.lost,
				    double(stalled.spill.peak_bytes) / 1e6, double(stalled.spill.cap_bytes) / 1e6,
				    stalled.spill.spilled, stalled.spill.full);
		if (o.fps)
			std::printf("  (producer: in acquire+stamp+publish; %.2f with its pacing sleeps)\n",
				    producer_process_cpu);
	}
	return ok ? 0 : 1;
}

int run_xmem_producer(const Options &o)
{
	const uint64_t frame_bytes = uint64_t(o.width) * o.height * 3 / 2;
	const std::string name = "xmem-bench-" + std::to_string(::getpid());

	if (o.classes < 1 || o.classes > 32 || (frame_bytes >> (o.classes - 1)) == 0) {
		(void)std::fprintf(stderr, "xmem-bench-core: --classes must be 1..32 and leave slots of a byte\n");
		return 2;
	}
	xmem::PoolConfig config;
	config.slot_count = o.classes == 1 ? o.slots : 2;
	config.slot_size = frame_bytes >> (o.classes - 1);
	config.max_slots = 2 * (o.classes - 1) + o.slots;
	config.policy = o.policy;
	config.block_timeout = std::chrono::seconds(1);
	config.spill_bytes = uint64_t(o.spill_mb) << 20;
	config.memory_cap = uint64_t(o.memory_cap_mb) << 20;
	if (config.memory_cap && o.classes == 1) {
		config.slot_count = 1;
		config.slot_size = 4096;
		config.max_slots = 0;
	}
	config.producer = "xmem-bench-core";
	config.format =
		"video/x-raw,format=NV12,width=" + std::to_string(o.width) + ",height=" + std::to_string(o.height);
	auto created = xmem::BufferPool::create(name, config);
	if (!created) {
		(void)std::fprintf(stderr, "xmem-bench-core: %s\n", created.error().message.c_str());
		return 1;
	}
	auto pool = std::move(created.value());
	for (uint32_t k = 1; k < o.classes; k++) {
		bool frames = k == o.classes - 1;
		auto added = pool->preallocate(frame_bytes >> (o.classes - 1 - k), frames ? o.slots : 2,
					       xmem::Storage::system);
		if (!added) {
			(void)std::fprintf(stderr, "xmem-bench-core: %s\n", added.error().message.c_str());
			return 1;
		}
	}

	std::vector<Child> children(o.consumers);
	for (auto &c : children) {
		if (!spawn_consumer(consumer_args(o, name), {}, c)) {
			(void)std::fprintf(stderr, "xmem-bench-core: cannot spawn a consumer: %s\n",
					   error_text(errno).c_str());
			pool.reset();
			wait_children(children);
			return 1;
		}
	}
	std::vector<Child> stalling(o.stall_ms ? 1 : 0);
	for (auto &c : stalling) {
		std::vector<std::string> args = consumer_args(o, name);
		args.insert(args.end(), { "--stalling", "--stall-ms", std::to_string(o.stall_ms), "--stall-every-ms",
					  std::to_string(o.stall_every_ms) });
		if (!spawn_consumer(args, {}, c)) {
			(void)std::fprintf(stderr, "xmem-bench-core: cannot spawn a consumer: %s\n",
					   error_text(errno).c_str());
			pool.reset();
			wait_children(children);
			return 1;
		}
	}
	const uint32_t attached = o.consumers + uint32_t(stalling.size());
	auto attach_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
	while (pool->stats().consumers < attached) {
		if (std::chrono::steady_clock::now() > attach_deadline) {
			(void)std::fprintf(stderr, "xmem-bench-core: only %u of %u consumers attached\n",
					   pool->stats().consumers, attached);
			pool.reset();
			wait_children(children);
			wait_children(stalling);
			return 1;
		}
		std::this_thread::sleep_for(std::chrono::milliseconds(1));
	}

	ProducerRun run = pace(o, [&](uint64_t n) {
		auto frame = pool->acquire(frame_bytes, std::chrono::seconds(5));
		if (!frame) {
			(void)std::fprintf(stderr, "xmem-bench-core: %s\n", frame.error().message.c_str());
			return false;
		}
		Stamp stamp{ kStampMagic, n + 1 };
		std::memcpy(frame->data_mut().value().data(), &stamp, sizeof(stamp));
		xmem::FrameMeta *m = frame->meta_mut().value();
		m->size = frame_bytes;
		std::strcpy(m->content_type, "video/raw");
		m->timestamp = monotonic_ns(); // publish-to-receive: the publish call is included
		auto r = pool->publish(std::move(frame.value()));
		if (!r)
			(void)std::fprintf(stderr, "xmem-bench-core: %s\n", r.error().message.c_str());
		return r.ok();
	});
	(void)pool->end_of_stream();
	uint64_t pool_dropped = pool->stats().dropped;
	if (config.memory_cap) {
		xmem::GrowthStats grown = pool->growth_stats();
		(void)std::fprintf(stderr,
				   "xmem-bench-core: growth: %u slots made on demand (%llu bytes of %llu in slots), "
				   "%llu made, %llu "
				   "trimmed, %llu refused at the cap\n",
				   grown.dynamic_slots, (unsigned long long)grown.dynamic_bytes,
				   (unsigned long long)grown.system_bytes, (unsigned long long)grown.grown,
				   (unsigned long long)grown.trimmed, (unsigned long long)grown.refused);
	}
	// The pool stays open until every consumer has reported: they hold its frames.
	Gathered g = gather(o, children);
	Stalled stalled;
	if (!stalling.empty()) {
		// Its frames queue behind its stalls: it may end long after the producer.
		Gathered sg = gather(o, stalling);
		stalled.present = true;
		stalled.ok = sg.ok;
		stalled.received = sg.latencies.size();
		stalled.lost = sg.missing;
		stalled.corrupt = sg.corrupt;
		stalled.spill = pool->spill_stats();
	}
	return report(o, run, g, pool_dropped, stalled);
}

int run_floor_producer(const Options &o)
{
	int memfd = ::memfd_create("xmem-bench-floor", MFD_CLOEXEC);
	if (memfd < 0 || ::ftruncate(memfd, sizeof(FloorPage)) < 0) {
		(void)std::fprintf(stderr, "xmem-bench-core: memfd: %s\n", error_text(errno).c_str());
		return 1;
	}
	memfd = private_fd(memfd);
	void *p = ::mmap(nullptr, sizeof(FloorPage), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, memfd, 0);
	if (p == MAP_FAILED) {
		(void)std::fprintf(stderr, "xmem-bench-core: mmap: %s\n", error_text(errno).c_str());
		return 1;
	}
	auto page = new (p) FloorPage{};

	std::vector<Child> children(o.consumers);
	std::vector<int> events;
	for (auto &c : children) {
		int ev = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
		if (ev >= 0)
			ev = private_fd(ev);
		if (ev < 0 || !spawn_consumer(consumer_args(o, "-"), { { memfd, kStampFd }, { ev, kEventFd } }, c)) {
			(void)std::fprintf(stderr, "xmem-bench-core: cannot spawn a consumer: %s\n",
					   error_text(errno).c_str());
			wait_children(children);
			return 1;
		}
		events.push_back(ev);
	}
	// Nothing tells the producer when a consumer sleeps in poll() for the first
	// time; give them ample time, the warmup covers the rest.
	std::this_thread::sleep_for(std::chrono::milliseconds(200));

	auto signal = [&] {
		uint64_t one = 1;
		for (int ev : events)
			[[maybe_unused]] ssize_t n = ::write(ev, &one, sizeof(one));
	};
	ProducerRun run = pace(o, [&](uint64_t n) {
		page->timestamp.store(monotonic_ns(), std::memory_order_relaxed);
		page->seq.store(n + 1, std::memory_order_release);
		signal();
		return true;
	});
	// Past the last frame's period, so the last stamp has been read.
	std::this_thread::sleep_for(std::chrono::milliseconds(100));
	page->seq.store(kEndOfStream, std::memory_order_release);
	signal();
	Gathered g = gather(o, children);
	for (int ev : events)
		::close(ev);
	return report(o, run, g, 0);
}

int run(int argc, char **argv)
{
	Options o;
	if (!parse(argc, argv, o))
		return usage();
	o.command = "xmem-bench-core";
	for (int i = 1; i < argc; i++)
		o.command += std::string(" ") + argv[i];
	if (!o.consumer_of.empty())
		return o.pair == Pair::xmem_core ? run_xmem_consumer(o) : run_floor_consumer(o);
	return o.pair == Pair::xmem_core ? run_xmem_producer(o) : run_floor_producer(o);
}

} // namespace

// Out of memory, or a bug (a Result's value() taken from an error), is all that can
// throw: a message and status 1 rather than std::terminate().
int main(int argc, char **argv)
{
	try {
		return run(argc, argv);
	} catch (const std::exception &e) {
		(void)std::fprintf(stderr, "xmem-bench-core: %s\n", e.what());
		return 1;
	}
}
