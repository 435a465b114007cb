// seed.cpp - the seed design's flow written with its C++ names
// (../shared/seeds/xmem-design.zh.md, sections 6-8): two consumer processes connect to a
// pool before it exists; the producer connects, preallocates 8 CUDA buffers, and hands
// each frame it writes to both consumers by meta index (set_ref_count(i, 2), the index
// sent over a pipe, forget()); each consumer gets it, reads it, and copies it to the CPU
// (a buffer of the pool). Then section 7's copies: CPU -> CUDA, and GPU 0 -> GPU 1 where
// there is a second device. Every byte is checked; the exit status says whether all were
// right. Run it on a GPU, or on tests/cudasim (XMEM_CUDA_DRIVER, XMEM_CUDASIM_DEVICES=2,
// XMEM_CUDASIM_PEER=all): the simulator proves xmem's logic, not the driver's.
#include <xmem/xmem.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

using namespace std::chrono_literals;

constexpr uint64_t kSize = uint64_t{ 1920 } * 1080 * 3;

// What the producer sends a consumer for each frame: its meta index and the byte it
// wrote everywhere (so the consumer can check it).
struct Sent {
	uint32_t meta_index;
	uint32_t value;
};

int fail(const char *who, const char *what, const xmem::Error &e)
{
	(void)std::fprintf(stderr, "%s: %s: %s\n", who, what, e.message.c_str());
	return 1;
}

bool all(const std::vector<std::byte> &bytes, uint32_t value)
{
	for (std::byte b : bytes)
		if (b != std::byte(value))
			return false;
	return true;
}

// The device bytes at ADDRESS on DEVICE, copied to the host.
xmem::Result<std::vector<std::byte>> read_device(uint64_t address, uint32_t device)
{
	std::vector<std::byte> host(kSize);
	auto copied = xmem::cuda_copy_2d({ reinterpret_cast<uint64_t>(host.data()), kSize, false },
					 { address, kSize, true }, kSize, 1, device);
	if (!copied)
		return copied.error();
	return host;
}

// The decoder of section 8 (decode_to): writes VALUE into the device buffer.
xmem::Result<void> decode_to(uint64_t address, uint32_t device, uint32_t value)
{
	std::vector<std::byte> frame(kSize, std::byte(value));
	return xmem::cuda_copy_2d({ address, kSize, true }, { reinterpret_cast<uint64_t>(frame.data()), kSize, false },
				  kSize, 1, device);
}

// A consumer process: connects (the pool may not exist yet), then gets each frame by the
// meta index the producer sends, reads it (process()), and copies it to the CPU.
int consume(const std::string &name, int k, int from, uint32_t frames)
{
	char who[32];
	(void)std::snprintf(who, sizeof(who), "consumer %d", k);
	auto pool = xmem::BufferPool::connect(name);
	if (!pool)
		return fail(who, "connect", pool.error());
	uint32_t got = 0;
	Sent sent;
	while (::read(from, &sent, sizeof(sent)) == ssize_t(sizeof(sent))) {
		// 消费者: buf = pool.get(meta_index); process(buf.cuda_ptr)
		auto buf = (*pool)->get(sent.meta_index);
		if (!buf)
			return fail(who, "get", buf.error());
		auto ptr = buf->as_cuda_ptr();
		if (!ptr)
			return fail(who, "as_cuda_ptr", ptr.error());
		auto bytes = read_device(*ptr, buf->device());
		if (!bytes)
			return fail(who, "read", bytes.error());
		if (!all(*bytes, sent.value)) {
			(void)std::fprintf(stderr, "%s: frame %u: wrong bytes\n", who, sent.meta_index);
			return 1;
		}
		// Section 7: CUDA -> CPU through get(meta_index), into a buffer of the pool.
		auto cpu_buf = buf->copy_to_cpu();
		if (!cpu_buf)
			return fail(who, "copy_to_cpu", cpu_buf.error());
		auto slice = cpu_buf->as_cpu_slice();
		if (!slice || slice->size() < kSize || slice->first(kSize)[kSize - 1] != std::byte(sent.value) ||
		    cpu_buf->meta_index() == sent.meta_index) {
			(void)std::fprintf(stderr, "%s: frame %u: its CPU copy is wrong\n", who, sent.meta_index);
			return 1;
		}
		got++;
	}
	std::printf("%s: %u frames by meta index, each read on the device and copied to the CPU\n", who, got);
	return got == frames ? 0 : 1;
}

// The producer, in POOL (connected by main(), which keeps it until the consumers are done:
// the pool closes with its owner).
int produce(xmem::BufferPool &p, int to[2], uint32_t frames)
{
	const char *who = "producer";
	const std::string &name = p.name();
	// 预分配
	auto slots = p.preallocate_cuda(kSize, 8, 0);
	if (!slots)
		return fail(who, "preallocate_cuda", slots.error());
	std::printf("producer: owns pool '%s', slots %u..%u on CUDA device 0\n", name.c_str(), slots->front(),
		    slots->back());
	auto start = std::chrono::steady_clock::now();
	for (uint32_t n = 0; n < frames; n++) {
		// 生产者
		auto buf = p.acquire_cuda(kSize, 0, 10s);
		if (!buf)
			return fail(who, "acquire_cuda", buf.error());
		uint32_t value = 1 + n % 251;
		auto ptr = buf->as_cuda_ptr_mut();
		if (!ptr)
			return fail(who, "as_cuda_ptr_mut", ptr.error());
		if (auto written = decode_to(*ptr, 0, value); !written)
			return fail(who, "decode_to", written.error());
		if (auto set = p.set_ref_count(buf->meta_index(), 2); !set)
			return fail(who, "set_ref_count", set.error());
		Sent sent{ buf->meta_index(), value };
		if (auto forgotten = buf->forget(); !forgotten)
			return fail(who, "forget", forgotten.error());
		for (int k = 0; k < 2; k++)
			if (::write(to[k], &sent, sizeof(sent)) != ssize_t(sizeof(sent))) {
				std::perror("producer: write");
				return 1;
			}
	}
	double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
	std::printf("producer: %u frames through 8 slots to 2 holders each in %.2f s\n", frames, seconds);

	// CPU/CUDA 互操作: CPU -> CUDA. The pool has no class of system memory: made on demand.
	auto cpu_buf = p.acquire_cpu(kSize);
	if (!cpu_buf)
		return fail(who, "acquire_cpu", cpu_buf.error());
	auto slice = cpu_buf->as_cpu_slice_mut();
	if (!slice)
		return fail(who, "as_cpu_slice_mut", slice.error());
	std::memset(slice->data(), 0x33, kSize);
	auto cuda_buf = cpu_buf->copy_to_cuda(0, nullptr, 10s); // a device buffer once one is free
	if (!cuda_buf)
		return fail(who, "copy_to_cuda", cuda_buf.error());
	auto back = read_device(cuda_buf->as_cuda_ptr().value(), 0);
	if (!back || !all(*back, 0x33)) {
		(void)std::fprintf(stderr, "producer: the CPU -> CUDA copy is wrong\n");
		return 1;
	}
	std::printf("producer: CPU -> CUDA: buffer %u copied into buffer %u\n", cpu_buf->meta_index(),
		    cuda_buf->meta_index());

	// CUDA 0 -> CUDA 1, where there is a second device (a buffer there preallocated).
	if (auto second = xmem::cuda_check_device(1); !second) {
		std::printf("producer: GPU 0 -> GPU 1 not run: %s\n", second.error().message.c_str());
	} else if (auto slot = p.preallocate_cuda(kSize, 1, 1); !slot) {
		return fail(who, "preallocate_cuda on device 1", slot.error());
	} else {
		auto buf_gpu0 = p.acquire_cuda(kSize, 0, 10s);
		if (!buf_gpu0)
			return fail(who, "acquire_cuda", buf_gpu0.error());
		if (auto written = decode_to(buf_gpu0->as_cuda_ptr_mut().value(), 0, 0x44); !written)
			return fail(who, "decode_to", written.error());
		auto buf_gpu1 = buf_gpu0->copy_to_device(1);
		if (!buf_gpu1)
			return fail(who, "copy_to_device", buf_gpu1.error());
		auto there = read_device(buf_gpu1->as_cuda_ptr().value(), 1);
		if (!there || !all(*there, 0x44) || buf_gpu1->device() != 1) {
			(void)std::fprintf(stderr, "producer: the GPU 0 -> GPU 1 copy is wrong\n");
			return 1;
		}
		std::printf("producer: GPU 0 -> GPU 1: buffer %u copied into buffer %u\n", buf_gpu0->meta_index(),
			    buf_gpu1->meta_index());
	}
	return 0;
}

} // namespace

int main(int argc, char **argv)
{
	if (argc < 2 || argv[1][0] == '-') {
		(void)std::fprintf(stderr, "usage: xmem-seed-example NAME [FRAMES]\n");
		return 2;
	}
	std::string name = argv[1];
	uint32_t frames = argc > 2 ? uint32_t(std::strtoul(argv[2], nullptr, 10)) : 32;
	// The consumers start first: they connect before the pool exists.
	int to[2];
	pid_t consumers[2];
	for (int k = 0; k < 2; k++) {
		int fds[2];
		if (::pipe(fds) != 0) {
			std::perror("pipe");
			return 1;
		}
		consumers[k] = ::fork();
		if (consumers[k] < 0) {
			std::perror("fork");
			return 1;
		}
		if (consumers[k] == 0) {
			::close(fds[1]);
			if (k == 1)
				::close(to[0]);
			(void)std::fflush(stdout);
			int status = consume(name, k, fds[0], frames);
			(void)std::fflush(stdout);
			::_exit(status);
		}
		::close(fds[0]);
		to[k] = fds[1];
	}
	// The 8 preallocated device buffers are all there is of device memory (no growth), so
	// the producer waits for its consumers instead of running ahead of them: a frame's
	// holds that nobody takes within their lifetime (10 s) go back unused.
	xmem::ConnectOptions options;
	options.device_memory_cap = 0;
	auto pool = xmem::BufferPool::connect(name, options);
	if (!pool)
		return fail("producer", "connect", pool.error());
	int status = produce(**pool, to, frames);
	for (int k = 0; k < 2; k++)
		::close(to[k]);
	for (pid_t pid : consumers) {
		int s = 0;
		if (::waitpid(pid, &s, 0) != pid || !WIFEXITED(s) || WEXITSTATUS(s) != 0)
			status = 1;
	}
	std::printf(status == 0 ? "seed example: every byte checked, all right\n" : "seed example: FAILED\n");
	return status;
}
