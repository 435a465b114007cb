// config.cpp - the simulator's settings, read once from XMEM_CUDASIM_* at cuInit.
// Anything malformed aborts the process: a typo in a test must not silently test nothing.

#include "cudasim.hpp"

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
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
		else if (word == "no_host_register")
			fail.no_host_register = true;
		else if (word == "alloc")
			fail.alloc = true;
		else if (word == "prohibited")
			fail.prohibited = true;
		else
			bad_setting("XMEM_CUDASIM_FAIL", word,
				    "unknown word (init, no_vmm, no_posix_fd, no_memops, no_host_register, "
				    "alloc, prohibited)");
	}
}

} // namespace

Config read_config()
{
	Config config;

	uint64_t devices = read_number("XMEM_CUDASIM_DEVICES", uint64_t(config.devices), false);
	if (devices > 64)
		bad_setting("XMEM_CUDASIM_DEVICES", std::getenv("XMEM_CUDASIM_DEVICES"), "at most 64 devices");
	config.devices = int(devices);

	config.memory = read_number("XMEM_CUDASIM_MEMORY", config.memory, true);

	config.granularity = read_number("XMEM_CUDASIM_GRANULARITY", config.granularity, true);
	uint64_t g = config.granularity;
	if (g < page_size() || (g & (g - 1)))
		bad_setting("XMEM_CUDASIM_GRANULARITY", std::getenv("XMEM_CUDASIM_GRANULARITY"),
			    "must be a power of two, at least the page size");

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
