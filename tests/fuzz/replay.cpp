// replay.cpp - main() of a harness in a normal build: runs every file of the given
// corpus directories through LLVMFuzzerTestOneInput (the regression test), or writes
// the harness's seed inputs (--write-seeds DIR).
#include "fuzz.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

int write_seeds(const fs::path &dir)
{
	fs::create_directories(dir);
	auto seeds = fuzz_seeds();
	for (size_t i = 0; i < seeds.size(); i++) {
		char name[32];
		std::snprintf(name, sizeof(name), "seed-%02zu", i);
		std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
		out.write(reinterpret_cast<const char *>(seeds[i].data()), std::streamsize(seeds[i].size()));
		if (!out)
			return std::fprintf(stderr, "cannot write %s\n", (dir / name).c_str()), 1;
	}
	std::printf("%zu seeds written to %s\n", seeds.size(), dir.c_str());
	return 0;
}

} // namespace

int main(int argc, char **argv)
{
	if (argc == 3 && std::string(argv[1]) == "--write-seeds")
		return write_seeds(argv[2]);
	std::vector<fs::path> inputs;
	for (int i = 1; i < argc; i++) {
		fs::path p = argv[i];
		if (fs::is_directory(p)) {
			for (const auto &e : fs::directory_iterator(p))
				if (e.is_regular_file() && e.path().filename().string()[0] != '.')
					inputs.push_back(e.path());
		} else if (fs::exists(p)) {
			inputs.push_back(p);
		} else {
			std::fprintf(stderr, "no such input: %s\n", p.c_str());
			return 1;
		}
	}
	if (inputs.empty()) {
		std::fprintf(stderr, "no inputs to replay: the seed corpus is missing\n");
		return 1;
	}
	std::sort(inputs.begin(), inputs.end());
	for (const fs::path &p : inputs) {
		std::ifstream in(p, std::ios::binary);
		std::vector<uint8_t> data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
		std::printf("%s (%zu bytes)\n", p.c_str(), data.size());
		std::fflush(stdout);
		LLVMFuzzerTestOneInput(data.data(), data.size());
	}
	std::printf("%zu inputs replayed without a crash\n", inputs.size());
	return 0;
}
