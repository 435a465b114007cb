// config.cpp - the simulator's settings, read once from XMEM_CUDASIM_* at cuInit.
// Anything malformed aborts the process: a typo in a test must not silently test nothing.

#include "cudasim.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include <unistd.h>

namespace cudasim {

namespace {

[[noreturn]] void bad_setting(const char *name, std::string_view value, const char *why)
{
	std::fprintf(stderr, "cudasim: %s=\"%.*s\": %s\n", name, int(value.size()), value.data(), why);
	std::abort();
}

// A decimal or 0x number, optionally followed by k, M or G (binary multiples) when
// with_suffix is set.
uint64_t read_number(const char *name, uint64_t fallback, bool with_suffix)
{
	const char *value = std::getenv(name);
	if (!value || !*value)
		return fallback;
	if (*value == '-')
		bad_setting(name, value, "not a non-negative number");

	errno = 0;
	char *end = nullptr;
	unsigned long long number = std::strtoull(value, &end, 0);
	if (end == value || errno)
		bad_setting(name, value, "not a number");

	uint64_t scale = 1;
	if (with_suffix && *end) {
		switch (*end) {
		case 'k':
		case 'K':
			scale = uint64_t(1) << 10;
			break;
		case 'm':
		case 'M':
			scale = uint64_t(1) << 20;
			break;
		case 'g':
		case 'G':
			scale = uint64_t(1) << 30;
			break;
		default:
			bad_setting(name, value, "unknown suffix (k, M or G)");
		}
		end++;
	}
	if (*end)
		bad_setting(name, value, "trailing characters");

	uint64_t result;
	if (__builtin_mul_overflow(uint64_t(number), scale, &result))
		bad_setting(name, value, "too large");
	return result;
}

void read_fail_words(Config &config)
{
	const char *value = std::getenv("XMEM_CUDASIM_FAIL");
	if (!value)
		return;

	std::string_view rest(value);
	while (!rest.empty()) {
		size_t comma = rest.find(',');
		std::string_view word = rest.substr(0, comma);
		rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);

		while (!word.empty() && word.front() == ' ')
			word.remove_prefix(1);
		while (!word.empty() && word.back() == ' ')
			word.remove_suffix(1);

		FailSwitches &fail = config.fail;
		if (word.empty())
			continue;
		else if (word == "init")
			fail.init = true;
		else if (word == "no_vmm")
			fail.no_vmm = true;
		else if (word == "no_posix_fd")
			fail.no_posix_fd = true;
		else if (word == "no_memops")
			fail.no_memops = true;
		else if (word == "no_flush")
			fail.no_flush = true;
		else if (word == "no_wait_nor")
			fail.no_wait_nor = true;
		else if (word == "no_host_register")
			fail.no_host_register = true;
		else if (word == "alloc")
			fail.alloc = true;
		else if (word == "prohibited")
			fail.prohibited = true;
		else
			bad_setting("XMEM_CUDASIM_FAIL", word,
				    "unknown word (init, no_vmm, no_posix_fd, no_memops, no_flush, no_wait_nor, "
				    "no_host_register, alloc, prohibited)");
	}
}

// The devices CUDA_VISIBLE_DEVICES lets this process see, as the real driver reads
// it: a comma-separated list of indices or GPU- UUIDs (a prefix naming one device
// is enough); the list ends at the first entry that names no device, or one already
// listed.
std::vector<int> read_visible(const char *value, int physical)
{
	std::vector<int> visible;
	std::string_view rest(value);
	while (true) {
		size_t comma = rest.find(',');
		std::string_view entry = rest.substr(0, comma);
		int device = -1;
		if (!entry.empty() && entry.find_first_not_of("0123456789") == std::string_view::npos) {
			if (entry.size() <= 2 && std::stoi(std::string(entry)) < physical)
				device = std::stoi(std::string(entry));
		} else if (entry.size() > 4 && entry.substr(0, 4) == "GPU-") {
			for (int d = 0; d < physical; d++) {
				if (format_uuid(physical_uuid(d)).compare(0, entry.size(), entry) != 0)
					continue;
				if (device >= 0) { // ambiguous prefix
					device = -1;
					break;
				}
				device = d;
			}
		}
		if (device < 0 || std::find(visible.begin(), visible.end(), device) != visible.end())
			break;
		visible.push_back(device);
		if (comma == std::string_view::npos)
			break;
		rest.remove_prefix(comma + 1);
	}
	return visible;
}

// XMEM_CUDASIM_DEVICES: a number of GPUs in the default compute mode, or a comma list with
// one entry per GPU: its compute mode, default, exclusive_process or prohibited.
std::vector<MachineDevice> read_machine()
{
	const char *name = "XMEM_CUDASIM_DEVICES";
	const char *value = std::getenv(name);
	std::vector<MachineDevice> machine;
	if (!value || !*value || std::isdigit(static_cast<unsigned char>(*value))) {
		uint64_t count = read_number(name, 1, false);
		if (count > 64)
			bad_setting(name, value, "at most 64 devices");
		machine.resize(count);
		return machine;
	}
	std::string_view rest(value);
	while (!rest.empty() || machine.empty()) {
		size_t comma = rest.find(',');
		std::string_view entry = rest.substr(0, comma);
		rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
		MachineDevice device;
		if (entry == "default")
			device.compute_mode = CU_COMPUTEMODE_DEFAULT;
		else if (entry == "exclusive_process")
			device.compute_mode = CU_COMPUTEMODE_EXCLUSIVE_PROCESS;
		else if (entry == "prohibited")
			device.compute_mode = CU_COMPUTEMODE_PROHIBITED;
		else
			bad_setting(name, entry,
				    "a number of devices, or one entry per device: default, "
				    "exclusive_process or prohibited");
		machine.push_back(device);
		if (machine.size() > 64)
			bad_setting(name, value, "at most 64 devices");
	}
	return machine;
}

// Where the simulated machine's processes meet: XMEM_CUDASIM_STATE_DIR, else cudasim in
// XDG_RUNTIME_DIR, else /tmp/cudasim-<uid>.
std::string read_state_dir()
{
	if (const char *dir = std::getenv("XMEM_CUDASIM_STATE_DIR"); dir && *dir)
		return dir;
	if (const char *runtime = std::getenv("XDG_RUNTIME_DIR"); runtime && *runtime)
		return std::string(runtime) + "/cudasim";
	return "/tmp/cudasim-" + std::to_string(getuid());
}

} // namespace

CUuuid physical_uuid(int physical)
{
	// Fixed bytes that say "cudasim", then the device's number.
	CUuuid uuid;
	const unsigned char bytes[16] = {
		0xc5, 0xda, 0x51, 0x30, 0x78, 0x6d, 0x4e, 0x6d,
		0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, static_cast<unsigned char>(physical)
	};
	std::memcpy(uuid.bytes, bytes, sizeof(bytes));
	return uuid;
}

std::string format_uuid(const CUuuid &uuid)
{
	static constexpr char hex[] = "0123456789abcdef";
	std::string s = "GPU-";
	for (int i = 0; i < 16; i++) {
		if (i == 4 || i == 6 || i == 8 || i == 10)
			s += '-';
		auto byte = static_cast<unsigned char>(uuid.bytes[i]);
		s += hex[byte >> 4];
		s += hex[byte & 0xf];
	}
	return s;
}

Config read_config()
{
	Config config;

	config.machine = read_machine();
	config.physical = int(config.machine.size());
	config.state_dir = read_state_dir();
	config.visible.clear();
	for (int d = 0; d < config.physical; d++)
		config.visible.push_back(d);
	// Only for a machine a test describes: a CUDA_VISIBLE_DEVICES set for the real
	// GPUs of the machine running the tests must not hide the simulated ones.
	const char *described = std::getenv("XMEM_CUDASIM_DEVICES");
	const char *visible = std::getenv("CUDA_VISIBLE_DEVICES");
	if (described && *described && visible)
		config.visible = read_visible(visible, config.physical);
	config.devices = int(config.visible.size());

	config.memory = read_number("XMEM_CUDASIM_MEMORY", config.memory, true);

	config.granularity = read_number("XMEM_CUDASIM_GRANULARITY", config.granularity, true);
	uint64_t g = config.granularity;
	if (g < page_size() || (g & (g - 1)))
		bad_setting("XMEM_CUDASIM_GRANULARITY", std::getenv("XMEM_CUDASIM_GRANULARITY"),
			    "must be a power of two, at least the page size");
	config.recommended_granularity = read_number("XMEM_CUDASIM_RECOMMENDED_GRANULARITY", g, true);
	uint64_t r = config.recommended_granularity;
	if (r < g || (r & (r - 1)))
		bad_setting("XMEM_CUDASIM_RECOMMENDED_GRANULARITY", std::getenv("XMEM_CUDASIM_RECOMMENDED_GRANULARITY"),
			    "must be a power of two, at least XMEM_CUDASIM_GRANULARITY");

	config.pin_limit = read_number("XMEM_CUDASIM_HOST_PIN_LIMIT", config.pin_limit, true);

	config.delay_us = read_number("XMEM_CUDASIM_DELAY_US", config.delay_us, false);
	if (config.delay_us > 10000000)
		bad_setting("XMEM_CUDASIM_DELAY_US", std::getenv("XMEM_CUDASIM_DELAY_US"), "at most 10 s");

	uint64_t clock = uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
	config.seed = read_number("XMEM_CUDASIM_SEED", clock ^ (uint64_t(getpid()) << 32), false);

	const char *verbose = std::getenv("XMEM_CUDASIM_VERBOSE");
	if (verbose && *verbose && std::string_view(verbose) != "0") {
		if (std::string_view(verbose) != "1")
			bad_setting("XMEM_CUDASIM_VERBOSE", verbose, "must be 0 or 1");
		config.verbose = true;
	}

	read_fail_words(config);
	return config;
}

} // namespace cudasim
