// selftest_driver.hpp - how the simulator's self-tests load it, the way xmem loads a
// driver: dlopen() of the module, then each entry point by its ABI name; and how they run
// one of their tests in a process of its own (settings the simulator reads at start).
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <dlfcn.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

namespace cudasim_selftest {

// meson sets XMEM_CUDA_DRIVER; run by hand, the module sits next to the test binary.
inline std::string driver_path()
{
	if (const char *env = std::getenv("XMEM_CUDA_DRIVER"))
		return env;
	char exe[4096] = {};
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	std::string path(exe, n > 0 ? size_t(n) : 0);
	return path.substr(0, path.rfind('/')) + "/libcuda.so.1";
}

struct Module {
	std::string path;
	void *handle;
};

// The simulator, loaded; a self-test cannot go on without it, so failing aborts.
inline Module open_driver()
{
	Module m{ driver_path(), nullptr };
	m.handle = dlopen(m.path.c_str(), RTLD_NOW | RTLD_LOCAL);
	if (!m.handle) {
		std::fprintf(stderr, "cannot load the simulator: %s\n", dlerror());
		std::abort();
	}
	return m;
}

// The entry point exported as NAME, or an abort naming it.
template<typename Fn>
Fn entry_point(const Module &m, const char *name)
{
	void *fn = dlsym(m.handle, name);
	if (!fn) {
		std::fprintf(stderr, "%s: no %s\n", m.path.c_str(), name);
		std::abort();
	}
	return reinterpret_cast<Fn>(fn);
}

struct ChildResult {
	int status = -1;
	std::string output; // its stdout and stderr
};

inline bool exited_cleanly(const ChildResult &child)
{
	return WIFEXITED(child.status) && WEXITSTATUS(child.status) == 0;
}

// Runs the test SUITE.TEST of this binary (a DISABLED_ one) in a new process. Its
// environment is this one's with MARKER ("NAME=1": the child knows it is one) and
// EXTRA_ENV's entries ("NAME=value"; "NAME" alone removes it); FD, when given, is its
// fd 3.
inline ChildResult run_child(const std::string &suite, const std::string &test, const std::string &marker,
			     const std::vector<std::string> &extra_env, int fd = -1)
{
	ChildResult result;
	int out = memfd_create("cudasim-child-output", MFD_CLOEXEC);
	if (out < 0)
		return result;
	posix_spawn_file_actions_t actions;
	posix_spawn_file_actions_init(&actions);
	posix_spawn_file_actions_adddup2(&actions, out, STDOUT_FILENO);
	posix_spawn_file_actions_adddup2(&actions, out, STDERR_FILENO);
	int passed = -1;
	if (fd >= 0) {
		// dup2 to the same number would keep FD_CLOEXEC.
		passed = fcntl(fd, F_DUPFD_CLOEXEC, 10);
		posix_spawn_file_actions_adddup2(&actions, passed, 3);
	}

	std::string exe = "/proc/self/exe";
	std::string all = "--gtest_also_run_disabled_tests";
	std::string filter = "--gtest_filter=" + suite + "." + test;
	char *argv[] = { exe.data(), all.data(), filter.data(), nullptr };

	std::vector<std::string> set = extra_env;
	set.push_back(marker);
	std::vector<std::string> env;
	for (const std::string &e : set)
		if (e.find('=') != std::string::npos)
			env.push_back(e);
	for (char **e = environ; *e; e++) {
		std::string entry(*e);
		std::string name = entry.substr(0, entry.find('='));
		bool overridden = std::any_of(set.begin(), set.end(), [&](const std::string &x) {
			return x == name || x.compare(0, name.size() + 1, name + "=") == 0;
		});
		if (!overridden)
			env.push_back(entry);
	}
	std::vector<char *> envp;
	for (std::string &entry : env)
		envp.push_back(entry.data());
	envp.push_back(nullptr);

	pid_t pid = -1;
	int err = posix_spawn(&pid, exe.c_str(), &actions, nullptr, argv, envp.data());
	posix_spawn_file_actions_destroy(&actions);
	if (passed >= 0)
		close(passed);
	if (err == 0)
		waitpid(pid, &result.status, 0);
	char buffer[4096];
	off_t offset = 0;
	for (ssize_t n; (n = pread(out, buffer, sizeof(buffer), offset)) > 0; offset += n)
		result.output.append(buffer, size_t(n));
	close(out);
	return result;
}

} // namespace cudasim_selftest
