// test_scribble.cpp - a same-user peer scribbling on a pool's control segment must not
// crash or hang the owner and the well-behaved consumers (README, "Limits").
#include "../common.hpp"

#include <algorithm>
#include <cinttypes>
#include <map>
#include <random>
#include <sstream>

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

// How long a process may go without a sign of life (a heartbeat line, or the exit
// the test asked for) before it counts as hung. Generous: a sanitizer build on two
// busy cores. Every helper prints at least every 200 ms while it works.
constexpr auto kHangBound = 20s;
// Frames the owner must publish after the scribbler died for a consumer's silence to be
// starvation: a scribbled pool may hold every slot forever and publish nothing.
constexpr long long kCarryOnFrames = 100;

uint64_t env_number(const char *name, uint64_t fallback)
{
	const char *e = std::getenv(name);
	return e && *e ? std::strtoull(e, nullptr, 10) : fallback;
}

std::string env_string(const char *name, const char *fallback)
{
	const char *e = std::getenv(name);
	return e && *e ? e : fallback;
}

std::string read_file(const std::string &path)
{
	std::ifstream in(path);
	return std::string(std::istreambuf_iterator<char>(in), {});
}

// A child with stdout and stderr in files of its own, whose wait status is kept: the
// test must tell a signal it sent from one it did not.
class Child
{
public:
	Child(std::string label, std::vector<std::string> args, const std::string &dir) : label_(std::move(label))
	{
		out_ = dir + "/" + label_ + ".out";
		err_ = dir + "/" + label_ + ".err";
		std::vector<char *> argv;
		for (auto &a : args)
			argv.push_back(a.data());
		argv.push_back(nullptr);
		posix_spawn_file_actions_t actions;
		posix_spawn_file_actions_init(&actions);
		posix_spawn_file_actions_addopen(&actions, 1, out_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
		posix_spawn_file_actions_addopen(&actions, 2, err_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
		int r = ::posix_spawnp(&pid_, argv[0], &actions, nullptr, argv.data(), environ);
		posix_spawn_file_actions_destroy(&actions);
		if (r != 0) {
			ADD_FAILURE() << "posix_spawn " << args[0] << ": " << std::strerror(r);
			pid_ = -1;
		}
		last_size_ = 0;
		last_change_ = Clock::now();
	}
	Child(const Child &) = delete;
	Child &operator=(const Child &) = delete;
	~Child()
	{
		if (pid_ > 0) {
			::kill(pid_, SIGKILL);
			::waitpid(pid_, nullptr, 0);
		}
	}

	const std::string &label() const { return label_; }
	bool running() const { return pid_ > 0; }
	bool ended() const { return ended_; }
	int status() const { return status_; }
	std::string out() const { return read_file(out_); }
	std::string err() const { return read_file(err_); }
	void signal(int sig)
	{
		if (pid_ > 0) {
			::kill(pid_, sig);
			sent_.push_back(sig);
		}
	}
	// Collects the exit if there is one; true once the child ended.
	bool poll()
	{
		if (pid_ <= 0)
			return ended_;
		int st;
		if (::waitpid(pid_, &st, WNOHANG) == pid_) {
			pid_ = -1;
			ended_ = true;
			status_ = st;
			ended_at_ = Clock::now();
		}
		return ended_;
	}
	bool wait_end(std::chrono::milliseconds bound)
	{
		auto deadline = Clock::now() + bound;
		while (!poll() && Clock::now() < deadline)
			std::this_thread::sleep_for(5ms);
		return ended_;
	}
	// Whether stdout grew since the last call; the time it last did.
	Clock::time_point last_sign_of_life()
	{
		struct stat st;
		if (::stat(out_.c_str(), &st) == 0 && st.st_size != last_size_) {
			last_size_ = st.st_size;
			last_change_ = Clock::now();
		}
		return last_change_;
	}
	bool wait_output(const std::string &text, std::chrono::milliseconds bound)
	{
		auto deadline = Clock::now() + bound;
		while (out().find(text) == std::string::npos) {
			if (poll() || Clock::now() >= deadline)
				return out().find(text) != std::string::npos;
			std::this_thread::sleep_for(5ms);
		}
		return true;
	}
	// Died of a signal the test did not send.
	bool died_unasked() const
	{
		return ended_ && WIFSIGNALED(status_) &&
		       std::find(sent_.begin(), sent_.end(), WTERMSIG(status_)) == sent_.end();
	}
	std::string describe() const
	{
		std::ostringstream s;
		s << label_ << ": ";
		if (!ended_)
			s << "running";
		else if (WIFSIGNALED(status_))
			s << "killed by signal " << WTERMSIG(status_) << " (" << strsignal(WTERMSIG(status_)) << ")";
		else
			s << "exit " << WEXITSTATUS(status_);
		return s.str();
	}
	// The last lines of stdout and stderr, for failure messages.
	std::string tail() const
	{
		auto last = [](const std::string &text, size_t n) {
			size_t at = text.size();
			for (size_t i = 0; i < n && at > 0; i++)
				at = text.rfind('\n', at - 1) == std::string::npos ? 0 : text.rfind('\n', at - 1);
			return text.substr(at);
		};
		return "--- " + label_ + " stdout:" + last(out(), 8) + "\n--- " + label_ + " stderr:" + last(err(), 12);
	}
	// A sanitizer report, or a failed assertion of the runtime.
	bool sanitizer_report() const
	{
		std::string e = err();
		return e.find("Sanitizer") != std::string::npos || e.find("runtime error:") != std::string::npos;
	}

private:
	std::string label_;
	pid_t pid_ = -1;
	bool ended_ = false;
	int status_ = 0;
	Clock::time_point ended_at_{};
	std::vector<int> sent_;
	std::string out_, err_;
	off_t last_size_ = 0;
	Clock::time_point last_change_;
};

std::string hostile_peer()
{
	return env_string("XMEM_HOSTILE_PEER", "tests/hostile/xmem-hostile-peer");
}

// The last "KEY=number" in TEXT, or -1.
long long last_field(const std::string &text, const std::string &key)
{
	size_t at = text.rfind(" " + key + "=");
	return at == std::string::npos ? -1 : std::atoll(text.c_str() + at + key.size() + 2);
}

} // namespace

// A scribbler (a same-user consumer writing on its writable mapping of the control
// segment) runs for XMEM_SCRIBBLE_SECONDS (default 20) beside an owner, three library
// consumers, an xmemsrc consumer (when the plugin is built) and xmem-inspect, all
// separate processes. Seeded: XMEM_SCRIBBLE_SEED reproduces a run, and
// XMEM_SCRIBBLE_TARGETS (comma-separated, see hostile_peer.cpp) narrows what it hits.
//
// Asserted: no process dies of a signal the test did not send or reports a sanitizer
// error; every process shows a sign of life at least every kHangBound while it runs;
// after the scribbler is killed every consumer still answers, carries on or reports an
// error while the owner publishes (it may not: stray holder bits can keep every slot),
// and exits when asked; the owner closes cleanly when asked (end of stream, close,
// exit 0) and leaves no file behind; the xmemsrc consumer ends (end of stream or an
// error message).
TEST(Hostile, ScribblerCannotCrashOrHangPeers)
{
	xmem::test::RuntimeDir dir;
	const uint64_t seed = env_number("XMEM_SCRIBBLE_SEED", std::random_device{}());
	const auto duration = std::chrono::seconds(env_number("XMEM_SCRIBBLE_SECONDS", 20));
	const std::string targets = env_string("XMEM_SCRIBBLE_TARGETS", "all");
	std::printf("seed=%" PRIu64 " seconds=%lld targets=%s (XMEM_SCRIBBLE_SEED, XMEM_SCRIBBLE_SECONDS, "
		    "XMEM_SCRIBBLE_TARGETS reproduce it)\n",
		    seed, (long long)duration.count(), targets.c_str());
	std::fflush(stdout);
	RecordProperty("seed", std::to_string(seed));
	SCOPED_TRACE("XMEM_SCRIBBLE_SEED=" + std::to_string(seed) + " XMEM_SCRIBBLE_TARGETS=" + targets);

	const std::string logs = dir.path() + "/logs";
	ASSERT_EQ(::mkdir(logs.c_str(), 0700), 0);
	const std::string peer = hostile_peer();
	const std::string pool = "scribble";
	const std::string caps = "video/x-raw, format=(string)GRAY8, width=(int)64, height=(int)64, "
				 "framerate=(fraction)30/1";

	// XMEM_SCRIBBLE_GROW=1: the owner's pool grows on demand (4 MiB cap), its slots made,
	// reused and trimmed while the scribbler writes.
	std::vector<std::string> produce{ peer,	  "produce", pool,  "--slots",	"8", "--size",
					  "4096", "--fps",   "300", "--format", caps };
	if (env_number("XMEM_SCRIBBLE_GROW", 0))
		produce.insert(produce.end(), { "--memory-cap-mb", "4" });
	Child owner("owner", produce, logs);
	ASSERT_TRUE(owner.wait_output("ready", 30s)) << owner.tail();

	std::vector<std::unique_ptr<Child>> consumers;
	consumers.push_back(std::make_unique<Child>(
		"consumer0", std::vector<std::string>{ peer, "consume", pool, "--queue", "4", "--hold", "0" }, logs));
	consumers.push_back(std::make_unique<Child>(
		"consumer1", std::vector<std::string>{ peer, "consume", pool, "--queue", "2", "--hold", "3" }, logs));
	consumers.push_back(std::make_unique<Child>(
		"consumer2", std::vector<std::string>{ peer, "consume", pool, "--queue", "8", "--hold", "1" }, logs));
	for (auto &c : consumers)
		ASSERT_TRUE(c->wait_output("attached", 30s)) << c->tail();

	// xmemsrc in gst-launch-1.0: reconnects after errors, and gives up with an error
	// message when no frame comes for 5 s (a scribbled pool may never publish again).
	std::unique_ptr<Child> gst;
	const std::string launch = env_string("XMEM_GST_LAUNCH", "");
	if (!launch.empty()) {
		// Under AddressSanitizer the plugin needs the runtime preloaded (meson says which).
		std::vector<std::string> args{ "env",
					       "LD_PRELOAD=" + env_string("XMEM_GST_PRELOAD", ""),
					       launch,
					       "-e",
					       "xmemsrc",
					       "pool-name=" + pool,
					       "timeout=5000000000",
					       "reconnect=true",
					       "!",
					       "fakesink",
					       "silent=false",
					       "-v" };
		gst = std::make_unique<Child>("xmemsrc", args, logs);
		ASSERT_TRUE(gst->wait_output("last-message = chain", 60s)) << gst->tail();
	} else {
		std::printf("no gst-launch-1.0 consumer: the plugin is not built\n");
	}

	std::vector<Child *> peers{ &owner };
	for (auto &c : consumers)
		peers.push_back(c.get());
	if (gst)
		peers.push_back(gst.get());

	// Every failure names the process and shows its output.
	auto check_alive = [&](Child &c, bool must_run) {
		c.poll();
		EXPECT_FALSE(c.died_unasked()) << c.describe() << "\n" << c.tail();
		EXPECT_FALSE(c.sanitizer_report()) << c.label() << " reported a sanitizer error\n" << c.tail();
		if (must_run && !c.ended()) {
			EXPECT_LT(Clock::now() - c.last_sign_of_life(), kHangBound)
				<< c.label() << " printed nothing for " << kHangBound.count() << " s: hung\n"
				<< c.tail();
		}
	};

	auto scribbler = std::make_unique<Child>("scribbler",
						 std::vector<std::string>{ peer, "scribble", pool, "--seed",
									   std::to_string(seed), "--targets", targets },
						 logs);
	ASSERT_TRUE(scribbler->wait_output("scribbling", 30s)) << scribbler->tail();

	// Inspections run one after the other, each bounded.
	const std::string inspect = env_string("XMEM_INSPECT", "");
	std::unique_ptr<Child> inspector;
	int inspections = 0, inspection = 0;
	Clock::time_point inspector_started{};
	auto step_inspector = [&] {
		if (inspect.empty())
			return;
		if (inspector && inspector->poll()) {
			EXPECT_FALSE(inspector->died_unasked()) << inspector->describe() << "\n" << inspector->tail();
			EXPECT_FALSE(inspector->sanitizer_report()) << inspector->tail();
			inspections++;
			inspector.reset();
		}
		if (inspector) {
			EXPECT_LT(Clock::now() - inspector_started, kHangBound) << "xmem-inspect hung\n"
										<< inspector->tail();
			return;
		}
		inspector = std::make_unique<Child>("inspect" + std::to_string(inspection++ % 2),
						    std::vector<std::string>{ inspect, "--json", pool }, logs);
		inspector_started = Clock::now();
	};

	auto until = Clock::now() + duration;
	while (Clock::now() < until && !HasFailure()) {
		for (Child *c : peers)
			check_alive(*c, true);
		scribbler->poll();
		ASSERT_FALSE(scribbler->ended()) << scribbler->describe() << "\n" << scribbler->tail();
		step_inspector();
		std::this_thread::sleep_for(100ms);
	}
	scribbler->signal(SIGKILL);
	ASSERT_TRUE(scribbler->wait_end(10s));
	std::string writes = scribbler->out();
	writes = writes.substr(writes.rfind("writes"));
	std::printf("scribbler: %s", writes.c_str());
	if (HasFailure())
		return;

	// After the scribbler: everything keeps answering for a while. What was queued
	// before it died is taken in the first second; progress is counted from then.
	auto drain = Clock::now() + 1s;
	while (Clock::now() < drain && !HasFailure()) {
		for (Child *c : peers)
			check_alive(*c, true);
		std::this_thread::sleep_for(100ms);
	}
	std::map<std::string, long long> received_before, errors_before;
	for (auto &c : consumers) {
		received_before[c->label()] = last_field(c->out(), "received");
		errors_before[c->label()] = last_field(c->out(), "errors");
	}
	long long published_before = last_field(owner.out(), "published");
	auto settle = Clock::now() + 5s;
	while (Clock::now() < settle && !HasFailure()) {
		for (Child *c : peers)
			check_alive(*c, true);
		step_inspector();
		std::this_thread::sleep_for(100ms);
	}
	if (inspector) {
		EXPECT_TRUE(inspector->wait_end(kHangBound)) << "xmem-inspect hung\n" << inspector->tail();
	}
	step_inspector();
	long long published_after = last_field(owner.out(), "published");
	std::printf("owner: published %lld up to 1 s after the scribbler died, %lld 5 s later; %d inspections\n",
		    published_before, published_after, inspections);
	// Carry on or report an error: a consumer that the owner keeps publishing to must not
	// go on getting nothing but timeouts (its queue silently cut off).
	if (published_after - published_before >= kCarryOnFrames) {
		for (auto &c : consumers) {
			std::string out = c->out();
			EXPECT_TRUE(c->ended() || last_field(out, "received") > received_before[c->label()] ||
				    last_field(out, "errors") > errors_before[c->label()])
				<< c->label() << " neither received a frame nor reported an error in the 5 s "
				<< "since, while the owner published " << published_after - published_before
				<< " frames\n"
				<< c->tail();
		}
	}

	// Consumers end when asked, within the bound.
	for (auto &c : consumers) {
		c->signal(SIGTERM);
		EXPECT_TRUE(c->wait_end(kHangBound))
			<< c->label() << " did not end within " << kHangBound.count() << " s of SIGTERM\n"
			<< c->tail();
		check_alive(*c, false);
		EXPECT_TRUE(c->ended() && WIFEXITED(c->status()) && WEXITSTATUS(c->status()) == 0)
			<< c->describe() << "\n"
			<< c->tail();
		std::string out = c->out();
		long long after = last_field(out, "received");
		std::printf("%s: received %lld up to 1 s after the scribbler died, %lld in all; %lld errors, %lld "
			    "attaches\n",
			    c->label().c_str(), received_before[c->label()], after, last_field(out, "errors"),
			    last_field(out, "attaches"));
	}

	// The owner closes cleanly: end of stream, close, exit 0, nothing left behind.
	owner.signal(SIGTERM);
	EXPECT_TRUE(owner.wait_end(kHangBound))
		<< "the owner did not close within " << kHangBound.count() << " s of SIGTERM\n"
		<< owner.tail();
	check_alive(owner, false);
	EXPECT_TRUE(owner.ended() && WIFEXITED(owner.status()) && WEXITSTATUS(owner.status()) == 0)
		<< owner.describe() << "\n"
		<< owner.tail();
	EXPECT_NE(owner.out().find("closed published="), std::string::npos) << owner.tail();
	std::string closed = owner.out();
	if (size_t at = closed.rfind("closed "); at != std::string::npos)
		std::printf("owner: %s", closed.substr(at).c_str());

	// xmemsrc ends by itself: end of stream, or (reconnecting after a scribbled
	// queue, or a pool that never came back) an error message.
	if (gst) {
		EXPECT_TRUE(gst->wait_end(kHangBound + 10s)) << "xmemsrc did not end after the owner closed\n"
							     << gst->tail();
		check_alive(*gst, false);
		bool clean = gst->ended() && WIFEXITED(gst->status()) && WEXITSTATUS(gst->status()) == 0;
		bool error = gst->ended() && WIFEXITED(gst->status()) &&
			     (gst->out() + gst->err()).find("ERROR") != std::string::npos;
		EXPECT_TRUE(clean || error) << gst->describe() << "\n" << gst->tail();
		std::string out = gst->out();
		size_t frames = 0;
		for (size_t at = 0; (at = out.find("last-message = chain", at)) != std::string::npos; at++)
			frames++;
		std::printf("xmemsrc: %s, %zu frames\n", clean ? "ended cleanly" : "ended with an error", frames);
	}
	if (inspector) {
		EXPECT_TRUE(inspector->wait_end(kHangBound)) << "xmem-inspect hung\n" << inspector->tail();
	}
	EXPECT_TRUE(dir.entries().empty()) << "left in the pool directory: " << dir.entries().size() << " entries";
}
