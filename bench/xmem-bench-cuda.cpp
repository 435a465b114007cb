// xmem-bench-cuda.cpp - device-pool figures for a GPU machine: the per-frame handoff
// from publish to "ready on the consumer's stream" for NV12 device frames, frames per
// second unthrottled, and the slot import cost at attach; with stream memory
// operations and with the CPU-synchronizing fallback (XMEM_CUDA_SYNC=cpu).
//
//   xmem-bench-cuda [--width W --height H] [--frames N] [--fps F] [--cpu-sync]
//   xmem-bench-cuda --copy-bandwidth [--width W --height H] [--frames N]
//
// --copy-bandwidth times what xmemsink does with each CUDA frame (one pitched 2D copy
// per NV12 plane, device to device, through xmem::cuda_copy_2d, from GStreamer's
// 512-byte pitch to the pool's) against the device's plain linear copy of the same
// bytes (cuMemcpyDtoDAsync), in GB/s, one process.
//
// Spawns itself as the consumer (another process, as in use) and prints one JSON
// object. Against tests/cudasim (XMEM_CUDA_DRIVER) it runs too, but its timings are
// the simulator's, not a GPU's: the "driver" field says which one was used.
#include "common.hpp"

#include <xmem/xmem.hpp>

#include "cuda/driver.hpp"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include <spawn.h>
#include <sys/wait.h>

extern char **environ;

using namespace std::chrono_literals;

namespace {

struct Options {
	uint32_t width = 1920, height = 1080, frames = 2000, fps = 0, slots = 8;
	bool cpu_sync = false;
	bool copy_bandwidth = false;
	std::string pool = "xmem-bench-cuda";
};

// Error messages are best effort: nothing to do if stderr fails.
int fail(const std::string &what)
{
	(void)std::fprintf(stderr, "xmem-bench-cuda: %s\n", what.c_str());
	return 1;
}

struct Gpu {
	const xmem::cuda::Driver *d = nullptr;
	std::shared_ptr<xmem::cuda::PrimaryContext> ctx;
	CUstream stream = nullptr;
};

std::string init(Gpu &g)
{
	auto d = xmem::cuda::driver();
	if (!d)
		return d.error().message;
	g.d = d.value();
	auto ctx = xmem::cuda::PrimaryContext::retain(0, "bench");
	if (!ctx)
		return ctx.error().message;
	g.ctx = ctx.value();
	xmem::cuda::ContextScope scope(*g.ctx);
	if (g.d->cuStreamCreate(&g.stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS)
		return "cuStreamCreate failed";
	return {};
}

// The consumer: for each frame, its stream waits for `ready` and then writes the
// frame's sequence number into a registered host word; the CPU takes the time when
// it sees it. That is publish-to-ready-on-the-consumer's-stream, plus one poll.
int consume(const Options &o)
{
	Gpu g;
	if (auto e = init(g); !e.empty())
		return fail(e);
	xmem::cuda::ContextScope scope(*g.ctx);
	uint64_t t0 = bench::monotonic_ns();
	auto pool = xmem::BufferPool::open(o.pool, { 10s, 4, "bench", false });
	uint64_t attach_ns = bench::monotonic_ns() - t0;
	if (!pool)
		return fail(pool.error().message);
	alignas(4096) static uint64_t flag[512];
	if (g.d->cuMemHostRegister(flag, sizeof(flag), CU_MEMHOSTREGISTER_DEVICEMAP) != CUDA_SUCCESS)
		return fail("cuMemHostRegister of the flag failed");
	CUdeviceptr dflag = 0;
	g.d->cuMemHostGetDevicePointer(&dflag, flag, 0);
	std::vector<uint64_t> latency;
	uint64_t first = 0, last = 0;
	for (;;) {
		auto f = (*pool)->receive(10s, g.stream);
		if (!f)
			break;
		uint64_t seq = f->meta().seq;
		g.d->cuStreamWriteValue64(g.stream, dflag, seq, CU_STREAM_WRITE_VALUE_DEFAULT);
		(void)f->release(g.stream);
		while (__atomic_load_n(&flag[0], __ATOMIC_ACQUIRE) != seq)
			;
		uint64_t now = bench::monotonic_ns();
		latency.push_back(now - f->meta().timestamp);
		if (!first)
			first = now;
		last = now;
	}
	std::sort(latency.begin(), latency.end());
	double seconds = double(last - first) / 1e9;
	std::printf("{\"frames\":%zu,\"attach_us\":%.1f,\"p50_us\":%.1f,\"p99_us\":%.1f,\"fps\":%.0f,"
		    "\"gpu_ordering\":%s}\n",
		    latency.size(), double(attach_ns) / 1000.0, bench::percentile_us(latency, 0.5),
		    bench::percentile_us(latency, 0.99), seconds > 0 ? double(latency.size() - 1) / seconds : 0.0,
		    bench::json_string((*pool)->gpu_ordering()).c_str());
	g.d->cuMemHostUnregister(flag);
	return 0;
}

int produce(const Options &o, const char *self)
{
	// setenv() races only with getenv() in other threads, and there are none yet: the
	// CUDA driver is not loaded, the pool (and its I/O thread) not created.
	if (o.cpu_sync)
		::setenv("XMEM_CUDA_SYNC", "cpu", 1); // NOLINT(concurrency-mt-unsafe)
	Gpu g;
	if (auto e = init(g); !e.empty())
		return fail(e);
	xmem::cuda::ContextScope scope(*g.ctx);
	xmem::FrameMeta layout{};
	xmem::PoolConfig config;
	config.storage = xmem::Storage::cuda;
	config.slot_count = o.slots;
	config.policy = xmem::Policy::block;
	// The layout first, at the device's pitch, for the slot size.
	if (auto size = xmem::set_video_layout(layout, "NV12", o.width, o.height, 256); size)
		config.slot_size = *size;
	else
		return fail(size.error().message);
	uint64_t t0 = bench::monotonic_ns();
	auto pool = xmem::BufferPool::create(o.pool, config);
	uint64_t create_ns = bench::monotonic_ns() - t0;
	if (!pool)
		return fail(pool.error().message);

	int out[2];
	if (::pipe(out) < 0)
		return fail("pipe");
	posix_spawn_file_actions_t actions;
	posix_spawn_file_actions_init(&actions);
	posix_spawn_file_actions_adddup2(&actions, out[1], 1);
	std::vector<std::string> args{ self, "--consume", "--pool", o.pool };
	std::vector<char *> argv;
	argv.reserve(args.size() + 1);
	for (auto &a : args)
		argv.push_back(a.data());
	argv.push_back(nullptr);
	pid_t child;
	if (posix_spawn(&child, self, &actions, nullptr, argv.data(), environ) != 0)
		return fail("posix_spawn");
	::close(out[1]);
	auto deadline = std::chrono::steady_clock::now() + 20s;
	while ((*pool)->stats().consumers < 1 && std::chrono::steady_clock::now() < deadline)
		std::this_thread::sleep_for(1ms);

	uint64_t start = bench::monotonic_ns();
	for (uint32_t n = 0; n < o.frames; n++) {
		auto f = (*pool)->acquire(10s, g.stream);
		if (!f)
			return fail(f.error().message);
		*f->meta_mut().value() = layout;
		// The decoder's writes, standing in: one pass over the frame on the stream.
		g.d->cuMemsetD32Async(f->device_ptr(), n, layout.size / 4, g.stream);
		f->meta_mut().value()->timestamp = bench::monotonic_ns();
		if (auto r = (*pool)->publish(std::move(f.value()), g.stream); !r)
			return fail(r.error().message);
		if (o.fps)
			std::this_thread::sleep_until(std::chrono::steady_clock::time_point(
				std::chrono::nanoseconds(start + uint64_t(n + 1) * 1000000000ull / o.fps)));
	}
	(void)(*pool)->end_of_stream();
	std::string result;
	char buf[512];
	ssize_t r;
	while ((r = ::read(out[0], buf, sizeof(buf))) > 0)
		result.append(buf, size_t(r));
	int status = 0;
	::waitpid(child, &status, 0);
	while (!result.empty() && result.back() == '\n')
		result.pop_back();
	std::printf("{\"driver\":%s,\"width\":%u,\"height\":%u,\"slot_bytes\":%llu,\"slots\":%u,\"fps_target\":%u,"
		    "\"create_us\":%.1f,\"consumer\":%s}\n",
		    bench::json_string(xmem::cuda::driver().value()->library).c_str(), o.width, o.height,
		    (unsigned long long)config.slot_size, o.slots, o.fps, double(create_ns) / 1000.0,
		    result.empty() ? "null" : result.c_str());
	return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}

double seconds_since(std::chrono::steady_clock::time_point start)
{
	return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

int copy_bandwidth(const Options &o)
{
	Gpu g;
	if (auto e = init(g); !e.empty())
		return fail(e);
	xmem::cuda::ContextScope scope(*g.ctx);
	auto pitch = [](uint64_t w, uint64_t a) {
		return (w + a - 1) / a * a;
	};
	const uint64_t w = o.width, h = o.height, rows = h + (h + 1) / 2;
	const uint64_t src_pitch = pitch(w, 512), dst_pitch = pitch(w, 256);
	CUdeviceptr src = 0, dst = 0;
	if (g.d->cuMemAlloc(&src, src_pitch * rows) != CUDA_SUCCESS ||
	    g.d->cuMemAlloc(&dst, dst_pitch * rows) != CUDA_SUCCESS)
		return fail("cuMemAlloc failed");
	g.d->cuMemsetD32Async(src, 0x80108010u, src_pitch * rows / 4, g.stream);
	auto planes = [&]() -> bool {
		// Y, then UV (half the rows), as xmemsink copies an NV12 frame.
		for (int p = 0; p < 2; p++) {
			uint64_t so = p ? src_pitch * h : 0, dof = p ? dst_pitch * h : 0;
			if (!xmem::cuda_copy_2d({ dst + dof, dst_pitch, true }, { src + so, src_pitch, true }, w,
						p ? (h + 1) / 2 : h, 0, g.stream))
				return false;
		}
		return true;
	};
	const uint64_t bytes = w * rows; // the visible bytes either way
	for (int i = 0; i < 20; i++) // warm-up
		if (!planes())
			return fail("cuda_copy_2d failed");
	g.d->cuStreamSynchronize(g.stream);
	auto start = std::chrono::steady_clock::now();
	for (uint32_t i = 0; i < o.frames; i++)
		planes();
	g.d->cuStreamSynchronize(g.stream);
	double plane_s = seconds_since(start);
	start = std::chrono::steady_clock::now();
	for (uint32_t i = 0; i < o.frames; i++)
		g.d->cuMemcpyDtoDAsync(dst, src, bytes, g.stream);
	g.d->cuStreamSynchronize(g.stream);
	double plain_s = seconds_since(start);
	g.d->cuMemFree(src);
	g.d->cuMemFree(dst);
	double plane_gbps = double(bytes) * o.frames / plane_s / 1e9;
	double plain_gbps = double(bytes) * o.frames / plain_s / 1e9;
	std::printf("{\"mode\": \"copy-bandwidth\", \"driver\": \"%s\", \"width\": %u, \"height\": %u, "
		    "\"frames\": %u, \"frame_bytes\": %llu, \"plane_copy_gbps\": %.2f, \"plain_copy_gbps\": %.2f, "
		    "\"plane_us_per_frame\": %.2f, \"ratio\": %.3f}\n",
		    g.d->library.c_str(), o.width, o.height, o.frames, (unsigned long long)bytes, plane_gbps,
		    plain_gbps, plane_s * 1e6 / o.frames, plane_gbps / plain_gbps);
	return 0;
}

int run(int argc, char **argv)
{
	Options o;
	bool consumer = false;
	for (int i = 1; i < argc; i++) {
		std::string a = argv[i];
		auto next = [&] {
			return i + 1 < argc ? std::string(argv[++i]) : std::string();
		};
		if (a == "--consume")
			consumer = true;
		else if (a == "--pool")
			o.pool = next();
		else if (a == "--width")
			o.width = uint32_t(std::stoul(next()));
		else if (a == "--height")
			o.height = uint32_t(std::stoul(next()));
		else if (a == "--frames")
			o.frames = uint32_t(std::stoul(next()));
		else if (a == "--fps")
			o.fps = uint32_t(std::stoul(next()));
		else if (a == "--slots")
			o.slots = uint32_t(std::stoul(next()));
		else if (a == "--cpu-sync")
			o.cpu_sync = true;
		else if (a == "--copy-bandwidth")
			o.copy_bandwidth = true;
		else {
			(void)std::fprintf(stderr,
					   "usage: xmem-bench-cuda [--width W --height H] [--frames N] [--fps F] "
					   "[--slots K] [--cpu-sync] | --copy-bandwidth\n");
			return 2;
		}
	}
	if (o.copy_bandwidth)
		return copy_bandwidth(o);
	return consumer ? consume(o) : produce(o, argv[0]);
}

} // namespace

// A number that std::stoul cannot read (std::invalid_argument, std::out_of_range) or out
// of memory: a message and status 1 rather than std::terminate().
int main(int argc, char **argv)
{
	try {
		return run(argc, argv);
	} catch (const std::exception &e) {
		return fail(e.what());
	}
}
