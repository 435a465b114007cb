// driver.cpp - where the real driver is looked for, how the shim makes sure it is not
// loading itself (the driver and the shim share the name libcuda.so.1), and the stubs
// that stand in for what the driver lacks.
#include "driver.hpp"
#include "exports.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <vector>

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace xmem::cudacount {

namespace {

constexpr std::string_view driver_soname = "libcuda.so.1";

// Where distributions and NVIDIA's installers put the driver, before the ld.so cache
// (which also lists them, but in an order of its own).
constexpr std::array<const char *, 3> usual_places = {
	"/usr/lib/x86_64-linux-gnu/libcuda.so.1",
	"/usr/lib64/libcuda.so.1",
	"/usr/local/cuda/compat/libcuda.so.1",
};

constexpr int cuda_error_no_device = 100;
constexpr int cuda_error_not_found = 500;

// Set in the constructor when no driver loads; the cuInit stub prints it once. Plain
// bytes: a std::string here could be initialized by this file's static constructor after
// the shim's constructor (in another file) has set it.
std::array<char, 4096> no_driver_message{};
std::size_t no_driver_message_size = 0;
std::atomic<bool> no_driver_said{ false };

struct FileId {
	dev_t device = 0;
	ino_t inode = 0;
	bool known = false;
};

FileId file_id(const char *path)
{
	struct stat st = {};
	if (::stat(path, &st) != 0)
		return {};
	return { st.st_dev, st.st_ino, true };
}

// This shim's own file, as the dynamic loader found it.
std::string own_path()
{
	Dl_info info{};
	if (::dladdr(reinterpret_cast<void *>(&load_driver), &info) == 0 || !info.dli_fname)
		return {};
	return info.dli_fname;
}

// Every libcuda.so.1 the ld.so cache lists (glibc's format "glibc-ld.so.cache1.1", alone
// or after the old "ld.so-1.7.0" table). The cache is not searched through dlopen() by
// name: that would hand back the shim, which already answers to "libcuda.so.1".
std::vector<std::string> cached_paths()
{
	std::vector<std::string> paths;
	const int fd = ::open("/etc/ld.so.cache", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return paths;
	std::vector<char> file;
	std::array<char, 65536> chunk{};
	for (;;) {
		const ssize_t n = ::read(fd, chunk.data(), chunk.size());
		if (n <= 0)
			break;
		file.insert(file.end(), chunk.data(), chunk.data() + n);
	}
	::close(fd);

	auto u32 = [&](std::size_t at) {
		std::uint32_t v = 0;
		std::memcpy(&v, file.data() + at, sizeof v);
		return v;
	};
	constexpr std::string_view old_magic = "ld.so-1.7.0";
	constexpr std::string_view new_magic = "glibc-ld.so.cache1.1";
	constexpr std::size_t old_header = 16; // magic, padding, nlibs
	constexpr std::size_t old_entry = 12; // flags, key, value
	constexpr std::size_t new_header = 48;
	constexpr std::size_t new_entry = 24; // flags, key, value, osversion, hwcap
	const std::string_view whole(file.data(), file.size());

	std::size_t base = 0;
	if (whole.starts_with(old_magic) && file.size() >= old_header) {
		const std::uint64_t old_libs = u32(12);
		base = (old_header + old_libs * old_entry + 7) & ~std::size_t(7);
	}
	if (base + new_header > file.size() || whole.substr(base, new_magic.size()) != new_magic)
		return paths;
	const std::uint64_t libs = u32(base + 20);
	if (libs > (file.size() - base - new_header) / new_entry)
		return paths;
	// String offsets count from the new header.
	auto string_at = [&](std::uint32_t offset) -> std::string_view {
		if (base + offset >= file.size())
			return {};
		const char *s = file.data() + base + offset;
		return { s, ::strnlen(s, file.size() - base - offset) };
	};
	for (std::uint64_t i = 0; i < libs; ++i) {
		const std::size_t entry = base + new_header + i * new_entry;
		if (string_at(u32(entry + 4)) == driver_soname)
			paths.emplace_back(string_at(u32(entry + 8)));
	}
	return paths;
}

// Loads one candidate, or says why it will not do.
void *try_load(const std::string &path, const std::string &self, const FileId &self_id, std::string &why)
{
	if (path.empty() || path[0] != '/') {
		why = "not an absolute path";
		return nullptr;
	}
	const FileId id = file_id(path.c_str());
	if (!id.known) {
		why = std::strerror(errno); // NOLINT(concurrency-mt-unsafe): the constructor, one thread
		return nullptr;
	}
	if (path == self || (self_id.known && id.device == self_id.device && id.inode == self_id.inode)) {
		why = "that is this shim";
		return nullptr;
	}
	void *handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
	if (!handle) {
		const char *error = ::dlerror(); // NOLINT(concurrency-mt-unsafe): per thread in glibc
		why = error ? error : "dlopen failed";
		return nullptr;
	}
	if (!::dlsym(handle, "cuInit")) {
		why = "no cuInit: not a CUDA driver";
		::dlclose(handle);
		return nullptr;
	}
	return handle;
}

int no_driver_init()
{
	if (!no_driver_said.exchange(true)) {
		// Nothing to do when stderr is gone too.
		(void)!::write(STDERR_FILENO, no_driver_message.data(), no_driver_message_size);
	}
	return cuda_error_no_device;
}

} // namespace

int missing_in_driver()
{
	return cuda_error_not_found;
}

int no_driver()
{
	return cuda_error_no_device;
}

LoadedDriver load_driver()
{
	LoadedDriver loaded;
	const std::string self = own_path();
	const FileId self_id = file_id(self.c_str());

	std::vector<std::string> candidates;
	const char *chosen = std::getenv("XMEM_CUDACOUNT_DRIVER"); // NOLINT(concurrency-mt-unsafe): constructor
	if (chosen && *chosen) {
		candidates.emplace_back(chosen);
	} else {
		candidates.assign(usual_places.begin(), usual_places.end());
		for (std::string &path : cached_paths()) {
			if (std::find(candidates.begin(), candidates.end(), path) == candidates.end())
				candidates.push_back(std::move(path));
		}
	}

	for (const std::string &path : candidates) {
		std::string why;
		loaded.handle = try_load(path, self, self_id, why);
		if (loaded.handle) {
			loaded.path = path;
			return loaded;
		}
		loaded.why_none.append("\n  ").append(path).append(": ").append(why);
	}
	if (candidates.size() == 1)
		loaded.why_none =
			"cudacount: no CUDA driver behind the shim: XMEM_CUDACOUNT_DRIVER=" + loaded.why_none.substr(3);
	else
		loaded.why_none = "cudacount: no CUDA driver behind the shim (set XMEM_CUDACOUNT_DRIVER); tried:" +
				  loaded.why_none;
	loaded.why_none += "\n";
	return loaded;
}

void fill_slots(const LoadedDriver &driver)
{
	if (!driver.handle) {
		no_driver_message_size = std::min(driver.why_none.size(), no_driver_message.size());
		std::memcpy(no_driver_message.data(), driver.why_none.data(), no_driver_message_size);
		for (const Export &e : exports())
			*e.slot = std::string_view(e.name) == "cuInit" ? &no_driver_init : &no_driver;
		return;
	}
	for (const Export &e : exports()) {
		void *function = ::dlsym(driver.handle, e.name);
		*e.slot = function ? reinterpret_cast<Entry>(function) : &missing_in_driver;
	}
}

} // namespace xmem::cudacount
