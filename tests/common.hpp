// common.hpp - what the tests share: a private runtime directory per test, spawning
// real helper processes (posix_spawn, never fork after threads), and waiting on them.
#pragma once

#include <xmem/xmem.hpp>

#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

namespace xmem::test {

// Whether this run is against the CUDA driver simulator (XMEM_CUDA_DRIVER names it).
inline bool on_cuda_simulator()
{
	const char *d = std::getenv("XMEM_CUDA_DRIVER");
	return d && std::string(d).find("cudasim") != std::string::npos;
}

// For a CUDA test program that also runs against the real driver: without a usable
// GPU there, the whole program exits 77 (skipped). Register it with
// ::testing::AddGlobalTestEnvironment(new xmem::test::RealGpuOrSkip).
class RealGpuOrSkip : public ::testing::Environment
{
public:
	void SetUp() override
	{
		if (on_cuda_simulator())
			return;
		if (auto device = xmem::cuda_check_device(0); !device) {
			std::printf("skipped: no usable GPU: %s\n", device.error().message.c_str());
			std::fflush(stdout);
			std::_Exit(77);
		}
	}
};

// Every test gets its own XDG_RUNTIME_DIR, so pools never collide across tests
// run in parallel, and the test can assert the directory is empty afterwards.
class RuntimeDir
{
public:
	RuntimeDir()
	{
		char tmpl[] = "/tmp/xmem-test-XXXXXX";
		// Never a fallback: the destructor removes this directory and all it holds.
		if (!::mkdtemp(tmpl))
			throw std::runtime_error(std::string("mkdtemp /tmp/xmem-test-XXXXXX: ") + std::strerror(errno));
		path_ = tmpl;
		::setenv("XDG_RUNTIME_DIR", path_.c_str(), 1);
	}
	~RuntimeDir()
	{
		std::error_code ignored;
		std::filesystem::remove_all(path_, ignored);
	}
	const std::string &path() const { return path_; }
	std::string pool_dir() const { return path_ + "/xmem"; }
	// Names in the pool directory (sockets and lock files).
	std::vector<std::string> entries() const
	{
		std::vector<std::string> out;
		if (DIR *d = ::opendir(pool_dir().c_str())) {
			while (dirent *e = ::readdir(d))
				if (e->d_name[0] != '.')
					out.push_back(e->d_name);
			::closedir(d);
		}
		return out;
	}

private:
	std::string path_;
};

// The helper program built next to the tests (tests/peer.cpp).
inline std::string peer_path()
{
	const char *p = std::getenv("XMEM_TEST_PEER");
	return p ? p : "tests/xmem-test-peer";
}

class Process
{
public:
	Process() = default;
	explicit Process(std::vector<std::string> args) { start(std::move(args)); }
	Process(Process &&o) noexcept
		: pid_(std::exchange(o.pid_, -1)), status_(o.status_), out_path_(std::move(o.out_path_)),
		  stdin_(std::exchange(o.stdin_, -1))
	{
	}
	Process &operator=(Process &&o) noexcept
	{
		close_stdin();
		kill_wait();
		stdin_ = std::exchange(o.stdin_, -1);
		pid_ = std::exchange(o.pid_, -1);
		status_ = o.status_;
		out_path_ = std::move(o.out_path_);
		return *this;
	}
	~Process()
	{
		close_stdin();
		kill_wait();
		if (!out_path_.empty())
			::unlink(out_path_.c_str());
	}

	// Starts ARGS with its stdout going to a private file (see output()); with
	// PIPED_STDIN, its stdin is a pipe the test writes (write_stdin, close_stdin).
	void start(std::vector<std::string> args, bool piped_stdin = false)
	{
		std::vector<char *> argv;
		for (auto &a : args)
			argv.push_back(a.data());
		argv.push_back(nullptr);
		char tmpl[] = "/tmp/xmem-test-out-XXXXXX";
		int fd = ::mkstemp(tmpl);
		EXPECT_GE(fd, 0);
		::close(fd);
		out_path_ = tmpl;
		posix_spawn_file_actions_t actions;
		posix_spawn_file_actions_init(&actions);
		posix_spawn_file_actions_addopen(&actions, 1, out_path_.c_str(), O_WRONLY | O_TRUNC, 0600);
		int in[2] = { -1, -1 };
		if (piped_stdin) {
			EXPECT_EQ(::pipe2(in, O_CLOEXEC), 0);
			posix_spawn_file_actions_adddup2(&actions, in[0], 0);
		}
		int r = ::posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ);
		posix_spawn_file_actions_destroy(&actions);
		if (piped_stdin) {
			::close(in[0]);
			stdin_ = in[1];
		}
		EXPECT_EQ(r, 0) << "posix_spawn " << args[0];
		if (r != 0)
			pid_ = -1;
	}
	pid_t pid() const { return pid_; }
	// Writes TEXT to the process's stdin (started with PIPED_STDIN).
	bool write_stdin(const std::string &text) const
	{
		return stdin_ >= 0 && ::write(stdin_, text.data(), text.size()) == ssize_t(text.size());
	}
	void close_stdin()
	{
		if (stdin_ >= 0)
			::close(std::exchange(stdin_, -1));
	}
	// Everything the process printed on stdout so far.
	std::string output() const
	{
		std::ifstream in(out_path_);
		return std::string(std::istreambuf_iterator<char>(in), {});
	}
	// Waits until the output contains TEXT.
	bool wait_output(const std::string &text, std::chrono::milliseconds timeout = std::chrono::seconds(10)) const
	{
		auto deadline = std::chrono::steady_clock::now() + timeout;
		while (output().find(text) == std::string::npos) {
			if (std::chrono::steady_clock::now() >= deadline)
				return false;
			std::this_thread::sleep_for(std::chrono::milliseconds(2));
		}
		return true;
	}
	// The number after "KEY=" in the output, or -1.
	long long field(const std::string &key) const
	{
		std::string out = output();
		size_t at = out.rfind(key + "=");
		return at == std::string::npos ? -1 : std::atoll(out.c_str() + at + key.size() + 1);
	}
	bool running() const { return pid_ > 0; }
	void signal(int sig) const
	{
		if (pid_ > 0)
			::kill(pid_, sig);
	}
	// Exit status (or 128 + signal), or -1 if it did not end in time.
	int wait(std::chrono::milliseconds timeout = std::chrono::seconds(30))
	{
		if (pid_ <= 0)
			return status_;
		auto deadline = std::chrono::steady_clock::now() + timeout;
		for (;;) {
			int st;
			pid_t r = ::waitpid(pid_, &st, WNOHANG);
			if (r == pid_) {
				pid_ = -1;
				status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
				return status_;
			}
			if (std::chrono::steady_clock::now() >= deadline)
				return -1;
			std::this_thread::sleep_for(std::chrono::milliseconds(2));
		}
	}
	void kill_wait()
	{
		if (pid_ > 0) {
			::kill(pid_, SIGKILL);
			int st;
			::waitpid(pid_, &st, 0);
			pid_ = -1;
		}
	}

private:
	pid_t pid_ = -1;
	int status_ = -1;
	std::string out_path_;
	int stdin_ = -1; // the write end of its stdin, with PIPED_STDIN
};

// Polls COND until it holds or TIMEOUT passes.
template<typename Cond>
bool eventually(Cond cond, std::chrono::milliseconds timeout = std::chrono::seconds(10))
{
	auto deadline = std::chrono::steady_clock::now() + timeout;
	while (std::chrono::steady_clock::now() < deadline) {
		if (cond())
			return true;
		std::this_thread::sleep_for(std::chrono::milliseconds(2));
	}
	return cond();
}

// A pool of SLOTS slots of SLOT_SIZE bytes of system memory, NAME's owner (nullptr, and a
// test failure, when it cannot be made).
inline std::shared_ptr<xmem::BufferPool> make_pool(const std::string &name, uint32_t slots, uint64_t slot_size = 4096)
{
	xmem::PoolConfig config;
	config.slot_count = slots;
	config.slot_size = slot_size;
	auto pool = xmem::BufferPool::create(name, config);
	EXPECT_TRUE(pool.ok()) << pool.error().message;
	return pool.ok() ? pool.value() : nullptr;
}

// A consumer of pool NAME (nullptr, and a test failure, when it cannot attach).
inline std::shared_ptr<xmem::BufferPool> attach(const std::string &name)
{
	auto pool = xmem::BufferPool::open(name);
	EXPECT_TRUE(pool.ok()) << pool.error().message;
	return pool.ok() ? pool.value() : nullptr;
}

// The message of a failed result, for assertion output.
template<typename T>
std::string why(const xmem::Result<T> &r)
{
	return r.ok() ? std::string("(ok)") : r.error().message;
}

// Assertion results that evaluate the call once and show the error's message.
template<typename T>
::testing::AssertionResult is_ok(const xmem::Result<T> &r)
{
	if (r.ok())
		return ::testing::AssertionSuccess();
	return ::testing::AssertionFailure() << xmem_status_name(int(r.code())) << ": " << r.error().message;
}

// The code is WANT, and an error says something.
template<typename T>
::testing::AssertionResult has_code(const xmem::Result<T> &r, xmem::Errc want)
{
	if (r.code() != want)
		return ::testing::AssertionFailure() << "got " << xmem_status_name(int(r.code())) << " (" << why(r)
						     << "), expected " << xmem_status_name(int(want));
	if (!r.ok() && r.error().message.empty())
		return ::testing::AssertionFailure() << xmem_status_name(int(want)) << " without a message";
	return ::testing::AssertionSuccess();
}

} // namespace xmem::test

// Assertions on a Result that show the error's code and message.
#define ASSERT_OK(r) ASSERT_TRUE(xmem::test::is_ok(r))
#define EXPECT_OK(r) EXPECT_TRUE(xmem::test::is_ok(r))
#define EXPECT_ERRC(r, c) EXPECT_TRUE(xmem::test::has_code((r), (c)))
