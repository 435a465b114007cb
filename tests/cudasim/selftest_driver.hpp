// selftest_driver.hpp - how the simulator's self-tests load it, the way xmem loads a
// driver: dlopen() of the module, then each entry point by its ABI name.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

#include <dlfcn.h>
#include <unistd.h>

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

} // namespace cudasim_selftest
