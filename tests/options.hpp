// options.hpp - the "--key value" options of the helper processes the tests spawn
// (tests/peer.cpp, tests/cuda/cuda_peer.cpp).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>

namespace xmem::test {

using Options = std::map<std::string, std::string>;

// ARGV[FROM..]: "--key value" pairs, and "--flag" alone as "1".
inline Options parse_options(int argc, char **argv, int from)
{
	Options o;
	for (int i = from; i < argc; i++) {
		std::string a = argv[i];
		if (a.rfind("--", 0) != 0)
			continue;
		if (i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0)
			o[a.substr(2)] = argv[++i];
		else
			o[a.substr(2)] = "1";
	}
	return o;
}

inline uint64_t number_option(const Options &o, const char *key, uint64_t fallback)
{
	auto it = o.find(key);
	return it == o.end() ? fallback : std::strtoull(it->second.c_str(), nullptr, 10);
}

} // namespace xmem::test
