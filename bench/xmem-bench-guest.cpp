// xmem-bench-guest.cpp - what a producer besides the owner (a guest) pays per frame
// against the owner: acquire + publish of the same frames into the same pool, read by one
// consumer, timed per call. The guest is a handle of this process attached as a consumer;
// its requests cross the pool's socket to the owner's I/O thread as another process's do.
//
//   xmem-bench-guest [--frames N] [--size BYTES] [--slots S] [--json]
#include <xmem/xmem.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

namespace {

using Clock = std::chrono::steady_clock;

struct Figures {
	double p50_us = 0, p99_us = 0, mean_us = 0;
};

Figures figures(std::vector<double> us)
{
	Figures f;
	if (us.empty())
		return f;
	std::sort(us.begin(), us.end());
	f.p50_us = us[us.size() / 2];
	f.p99_us = us[std::min(us.size() - 1, us.size() * 99 / 100)];
	double sum = 0;
	for (double v : us)
		sum += v;
	f.mean_us = sum / double(us.size());
	return f;
}

// N frames of SIZE bytes from PRODUCER (the owner's handle or a guest's), each received by
// READER before the next: the acquire + fill + publish call's time, per frame, in µs,
// appended to US. An error says what failed.
xmem::Result<void> run(xmem::BufferPool &producer, xmem::BufferPool &reader, uint64_t n, uint64_t size,
		       std::vector<double> &us)
{
	for (uint64_t i = 0; i < n; i++) {
		auto start = Clock::now();
		auto frame = producer.acquire(size, std::chrono::seconds(5));
		if (!frame)
			return frame.error();
		std::memset(frame->data_mut().value().data(), int(i & 0xff), 64);
		frame->meta_mut().value()->size = size;
		if (auto p = producer.publish(std::move(*frame)); !p)
			return p.error();
		us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
		if (auto got = reader.receive(std::chrono::seconds(5)); !got)
			return got.error();
	}
	return {};
}

int bench(int argc, char **argv)
{
	uint64_t frames = 5000, size = 1920 * 1080 * 3 / 2;
	uint32_t slots = 8;
	bool json = false;
	for (int i = 1; i < argc; i++) {
		std::string a = argv[i];
		if (a == "--json") {
			json = true;
			continue;
		}
		if (i + 1 >= argc) {
			(void)std::fprintf(
				stderr, "usage: xmem-bench-guest [--frames N] [--size BYTES] [--slots S] [--json]\n");
			return 2;
		}
		uint64_t v = std::strtoull(argv[++i], nullptr, 10);
		if (a == "--frames")
			frames = v;
		else if (a == "--size")
			size = v;
		else if (a == "--slots")
			slots = uint32_t(v);
		else {
			(void)std::fprintf(stderr, "xmem-bench-guest: unknown option %s\n", a.c_str());
			return 2;
		}
	}
	std::string name = "bench-guest-" + std::to_string(::getpid());
	xmem::PoolConfig config;
	config.slot_count = slots;
	config.slot_size = size;
	auto owner = xmem::BufferPool::create(name, config);
	if (!owner) {
		(void)std::fprintf(stderr, "xmem-bench-guest: %s\n", owner.error().message.c_str());
		return 1;
	}
	auto reader = xmem::BufferPool::open(name);
	auto guest = xmem::BufferPool::open(name);
	if (!reader || !guest) {
		(void)std::fprintf(stderr, "xmem-bench-guest: open failed\n");
		return 1;
	}
	// Warm up both paths (page faults, the guest's connection), then alternate rounds.
	std::vector<double> warm, own, guests;
	xmem::Result<void> ran = run(**owner, **reader, 200, size, warm);
	for (int round = 0; ran && round < 4; round++) {
		ran = run(**guest, **reader, round == 0 ? 200 : 0, size, warm);
		if (ran)
			ran = run(**owner, **reader, frames / 4, size, own);
		if (ran)
			ran = run(**guest, **reader, frames / 4, size, guests);
	}
	if (!ran) {
		(void)std::fprintf(stderr, "xmem-bench-guest: %s\n", ran.error().message.c_str());
		return 1;
	}
	Figures o = figures(own), g = figures(guests);
	if (json) {
		(void)std::printf(
			"{\"frames\": %llu, \"size\": %llu, \"owner\": {\"p50_us\": %.2f, \"p99_us\": %.2f, "
			"\"mean_us\": %.2f}, \"guest\": {\"p50_us\": %.2f, \"p99_us\": %.2f, \"mean_us\": %.2f}}\n",
			(unsigned long long)frames, (unsigned long long)size, o.p50_us, o.p99_us, o.mean_us, g.p50_us,
			g.p99_us, g.mean_us);
		return 0;
	}
	(void)std::printf("acquire + publish of %llu frames of %llu bytes, per call:\n", (unsigned long long)frames,
			  (unsigned long long)size);
	(void)std::printf("  owner: p50 %8.2f us  p99 %8.2f us  mean %8.2f us\n", o.p50_us, o.p99_us, o.mean_us);
	(void)std::printf("  guest: p50 %8.2f us  p99 %8.2f us  mean %8.2f us  (p50 x%.1f)\n", g.p50_us, g.p99_us,
			  g.mean_us, o.p50_us > 0 ? g.p50_us / o.p50_us : 0.0);
	return 0;
}

} // namespace

int main(int argc, char **argv)
{
	try {
		return bench(argc, argv);
	} catch (const std::exception &e) {
		(void)std::fprintf(stderr, "xmem-bench-guest: %s\n", e.what());
		return 1;
	}
}
