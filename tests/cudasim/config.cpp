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

// What CUDA shows of MIG devices (NVIDIA Multi-Instance GPU User Guide, "CUDA Device
// Enumeration"): "CUDA can only enumerate a single compute instance" and "will not enumerate
// non-MIG GPU if any compute instance is enumerated on any other GPU". So where LIST holds a
// MIG device, only the first one stays.
std::vector<int> one_mig_device(const std::vector<MachineDevice> &machine, std::vector<int> list)
{
	for (int device : list) {
		if (machine[size_t(device)].mig >= 0)
			return { device };
	}
	return list;
}

// The device a CUDA_VISIBLE_DEVICES entry names, or -1: an index or a GPU- UUID (a prefix
// naming one GPU is enough) names a GPU, which must not be in MIG mode (the guide does not
// say what CUDA makes of one; strict: nothing); MIG-<uuid> (whole) names a MIG device, and so
// does the older MIG-GPU-<uuid>/<gi>/<ci> (the GPU's whole UUID, its GI and CI ids).
int visible_entry(std::string_view entry, const Config &config)
{
	const std::vector<MachineDevice> &machine = config.machine;
	int device = -1;
	if (!entry.empty() && entry.find_first_not_of("0123456789") == std::string_view::npos) {
		if (entry.size() <= 2 && std::stoi(std::string(entry)) < config.physical)
			device = std::stoi(std::string(entry));
	} else if (entry.size() > 4 && entry.substr(0, 4) == "GPU-") {
		for (int d = 0; d < config.physical; d++) {
			if (machine_uuid_text(machine[size_t(d)]).compare(0, entry.size(), entry) != 0)
				continue;
			if (device >= 0) // ambiguous prefix
				return -1;
			device = d;
		}
	} else if (entry.size() > 8 && entry.substr(0, 8) == "MIG-GPU-") {
		std::string_view rest = entry.substr(4);
		size_t slash = rest.find('/');
		std::string_view gpu_uuid = rest.substr(0, slash);
		unsigned gi = 0, ci = 0;
		char tail = 0;
		if (slash == std::string_view::npos ||
		    std::sscanf(std::string(rest.substr(slash)).c_str(), "/%u/%u%c", &gi, &ci, &tail) != 2)
			return -1;
		for (size_t d = 0; d < machine.size(); d++) {
			const MachineDevice &m = machine[d];
			if (m.mig >= 0 && machine_uuid_text(machine[size_t(m.gpu)]) == gpu_uuid &&
			    unsigned(m.gpu_instance) == gi && unsigned(m.compute_instance) == ci)
				return int(d);
		}
		return -1;
	} else if (entry.size() > 4 && entry.substr(0, 4) == "MIG-") {
		for (size_t d = 0; d < machine.size(); d++) {
			if (machine[d].mig >= 0 && machine_uuid_text(machine[d]) == entry)
				return int(d);
		}
		return -1;
	}
	if (device >= 0 && machine[size_t(device)].mig_devices > 0)
		return -1; // a GPU in MIG mode is not a CUDA device
	return device;
}

// The devices this process sees without CUDA_VISIBLE_DEVICES: every GPU, a GPU in MIG mode
// by its MIG devices; then at most one MIG device and nothing beside it.
std::vector<int> all_visible(const Config &config)
{
	std::vector<int> list;
	for (int g = 0; g < config.physical; g++) {
		if (config.machine[size_t(g)].mig_devices == 0) {
			list.push_back(g);
			continue;
		}
		for (size_t d = size_t(config.physical); d < config.machine.size(); d++) {
			if (config.machine[d].gpu == g)
				list.push_back(int(d));
		}
	}
	return one_mig_device(config.machine, list);
}

// The devices CUDA_VISIBLE_DEVICES lets this process see, as the real driver reads it: a
// comma-separated list of entries (visible_entry); the list ends at the first entry that
// names no device, or one already listed. Then at most one MIG device and nothing beside it.
std::vector<int> read_visible(const char *value, const Config &config)
{
	std::vector<int> visible;
	std::string_view rest(value);
	while (true) {
		size_t comma = rest.find(',');
		int device = visible_entry(rest.substr(0, comma), config);
		if (device < 0 || std::find(visible.begin(), visible.end(), device) != visible.end())
			break;
		visible.push_back(device);
		if (comma == std::string_view::npos)
			break;
		rest.remove_prefix(comma + 1);
	}
	return one_mig_device(config.machine, visible);
}

// XMEM_CUDASIM_DEVICES: a number of GPUs in the default compute mode, or a comma list with
// one entry per GPU: its compute mode (default, exclusive_process or prohibited), or mig:N
// for a GPU in MIG mode split into N MIG devices (GPU instances 1..N, compute instance 0 each).
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
		for (size_t g = 0; g < machine.size(); g++)
			machine[g].gpu = int(g);
		return machine;
	}
	std::vector<MachineDevice> migs;
	std::string_view rest(value);
	while (!rest.empty() || machine.empty()) {
		size_t comma = rest.find(',');
		std::string_view entry = rest.substr(0, comma);
		rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
		MachineDevice device;
		device.gpu = int(machine.size());
		if (entry == "default")
			device.compute_mode = CU_COMPUTEMODE_DEFAULT;
		else if (entry == "exclusive_process")
			device.compute_mode = CU_COMPUTEMODE_EXCLUSIVE_PROCESS;
		else if (entry == "prohibited")
			device.compute_mode = CU_COMPUTEMODE_PROHIBITED;
		else if (entry.size() == 5 && entry.substr(0, 4) == "mig:" && entry[4] >= '1' && entry[4] <= '7')
			device.mig_devices = entry[4] - '0';
		else
			bad_setting(name, entry,
				    "a number of devices, or one entry per device: default, exclusive_process, "
				    "prohibited or mig:N (N from 1 to 7)");
		for (int k = 0; k < device.mig_devices; k++) {
			MachineDevice mig;
			mig.gpu = device.gpu;
			mig.mig = k;
			mig.gpu_instance = k + 1;
			mig.compute_instance = 0;
			migs.push_back(mig);
		}
		machine.push_back(device);
		if (machine.size() > 64)
			bad_setting(name, value, "at most 64 devices");
	}
	machine.insert(machine.end(), migs.begin(), migs.end());
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

// XMEM_CUDASIM_PEER: none (the default), or all for a machine whose GPUs are each other's
// peers.
bool read_peer()
{
	const char *name = "XMEM_CUDASIM_PEER";
	const char *value = std::getenv(name);
	if (!value || !*value || std::string_view(value) == "none")
		return false;
	if (std::string_view(value) != "all")
		bad_setting(name, value, "none or all");
	return true;
}

} // namespace

bool can_access_peer(const Config &config, int dev, int peer)
{
	const MachineDevice &a = config.machine[size_t(config.visible[size_t(dev)])];
	const MachineDevice &b = config.machine[size_t(config.visible[size_t(peer)])];
	return config.peer && dev != peer && a.mig < 0 && b.mig < 0;
}

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

CUuuid machine_uuid(const MachineDevice &device)
{
	CUuuid uuid = physical_uuid(device.gpu);
	if (device.mig >= 0) {
		// Another variant byte, then the GPU's and the MIG device's numbers: never a GPU's.
		uuid.bytes[8] = char(0x90);
		uuid.bytes[14] = char(device.gpu);
		uuid.bytes[15] = char(device.mig);
	}
	return uuid;
}

std::string machine_uuid_text(const MachineDevice &device)
{
	return format_uuid(machine_uuid(device), device.mig >= 0 ? "MIG-" : "GPU-");
}

std::string format_uuid(const CUuuid &uuid, const char *prefix)
{
	static constexpr char hex[] = "0123456789abcdef";
	std::string s = prefix;
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
	config.visible = all_visible(config);
	// Only for a machine a test describes: a CUDA_VISIBLE_DEVICES set for the real
	// GPUs of the machine running the tests must not hide the simulated ones.
	const char *described = std::getenv("XMEM_CUDASIM_DEVICES");
	const char *visible = std::getenv("CUDA_VISIBLE_DEVICES");
	if (described && *described && visible)
		config.visible = read_visible(visible, config);
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
	config.peer = read_peer();

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
