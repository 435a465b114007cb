// cuda_peer.cpp - the process the CUDA pool tests spawn: a producer that writes every
// frame through asynchronous operations on its stream, consumers that read each one
// back on theirs and check every byte, and calls that must fail with a named cause.
// Against the simulator this proves xmem's ordering logic, not the driver's.
#include <xmem/xmem.hpp>

#include "../options.hpp"
#include "cuda/driver.hpp"
#include "gated_host.hpp"
#include "peer_frames.hpp"

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

using namespace std::chrono_literals;

namespace {

using xmem::test::number_option;

uint32_t word(uint64_t seq)
{
	return xmem::test::frame_word(seq);
}
uint32_t tail_word(uint64_t seq)
{
	return xmem::test::frame_tail_word(seq);
}
constexpr uint64_t kTail = xmem::test::kFrameTail;
// What a late in-place write leaves in a slot (hang-up-writing).
constexpr uint32_t kLateWord = 0xdeadbeef;

int fail(const std::string &what)
{
	std::printf("error %s\n", what.c_str());
	std::fflush(stdout);
	return 1;
}

struct Gpu {
	const xmem::cuda::Driver *d = nullptr;
	std::shared_ptr<xmem::cuda::PrimaryContext> ctx;
	CUstream stream = nullptr;
};

// A stream on DEVICE (this process's ordinal).
std::string gpu_init(Gpu &g, uint32_t device = 0)
{
	auto d = xmem::cuda::driver();
	if (!d)
		return d.error().message;
	g.d = d.value();
	auto ctx = xmem::cuda::PrimaryContext::retain(device, "peer");
	if (!ctx)
		return ctx.error().message;
	g.ctx = ctx.value();
	xmem::cuda::ContextScope scope(*g.ctx);
	if (g.d->cuStreamCreate(&g.stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS)
		return "cuStreamCreate failed";
	return {};
}

// produce NAME --frames N --size BYTES --slots K --wait-consumers C --linger-ms T
int produce(const std::string &name, const xmem::test::Options &o)
{
	Gpu g;
	if (auto e = gpu_init(g); !e.empty())
		return fail(e);
	xmem::PoolConfig config;
	config.storage = xmem::Storage::cuda;
	config.slot_count = uint32_t(number_option(o, "slots", 4));
	config.slot_size = number_option(o, "size", 64 * 1024);
	config.policy = o.count("drop") ? xmem::Policy::drop_oldest : xmem::Policy::block;
	config.block_timeout = 10s;
	config.producer = "cuda-peer";
	auto pool = xmem::BufferPool::create(name, config);
	if (!pool)
		return fail(pool.error().message);
	auto &p = **pool;
	std::printf("ready ordering=%s\n", p.gpu_ordering());
	std::fflush(stdout);
	auto deadline = std::chrono::steady_clock::now() + 20s;
	while (p.stats().consumers < number_option(o, "wait-consumers", 0) &&
	       std::chrono::steady_clock::now() < deadline)
		std::this_thread::sleep_for(1ms);
	uint64_t frames = number_option(o, "frames", 100), size = config.slot_size;
	xmem::cuda::ContextScope scope(*g.ctx);
	for (uint64_t n = 1; n <= frames; n++) {
		auto f = p.acquire(10s, g.stream);
		if (!f)
			return fail("acquire: " + f.error().message);
		uint64_t seq = p.stats().published + 1;
		CUdeviceptr dev = f->device_ptr();
		// Two asynchronous writes: the body, then the tail page.
		if (g.d->cuMemsetD32Async(dev, word(seq), (size - kTail) / 4, g.stream) != CUDA_SUCCESS ||
		    g.d->cuMemsetD32Async(dev + size - kTail, tail_word(seq), kTail / 4, g.stream) != CUDA_SUCCESS)
			return fail("cuMemsetD32Async");
		f->meta_mut().value()->size = size;
		if (auto r = p.publish(std::move(f.value()), g.stream); !r)
			return fail("publish: " + r.error().message);
		if (o.count("fps"))
			std::this_thread::sleep_for(std::chrono::microseconds(1000000 / number_option(o, "fps", 1)));
	}
	(void)p.end_of_stream();
	std::printf("done published=%llu\n", (unsigned long long)p.stats().published);
	std::fflush(stdout);
	std::this_thread::sleep_for(std::chrono::milliseconds(number_option(o, "linger-ms", 0)));
	return 0;
}

// consume NAME --frames N [--no-stream] [--hold] [--policy P] [--spill-delivery host]
// [--work-us T] : checks every byte of every frame, read on a stream of the device the
// pool is on (as this process numbers it), or on the CPU for a spilled frame delivered
// as host memory; --work-us T takes T µs more per frame (a slow consumer). With --hold
// it keeps a frame and a queued read of it forever (to be killed). --max-size S: frames of
// up to S bytes (size classes larger than the first). --mixed: the pool holds classes of
// system memory too, whose frames are read on the CPU. --any-device: classes on several
// devices; each frame is received without a stream (ready for any stream once taken) and
// read and released on a stream of its own device. Prints spilled=N.
int consume(const std::string &name, const xmem::test::Options &o)
{
	xmem::OpenOptions options;
	options.timeout = 10s;
	options.client = "cuda-peer";
	if (o.count("policy")) {
		auto policy = xmem::policy_from_name(o.at("policy"));
		if (!policy)
			return fail("unknown policy " + o.at("policy"));
		options.policy = *policy;
	}
	if (o.count("spill-delivery"))
		options.spill_delivery =
			o.at("spill-delivery") == "host" ? xmem::SpillDelivery::host : xmem::SpillDelivery::device;
	auto pool = xmem::BufferPool::open(name, options);
	if (!pool)
		return fail(pool.error().message);
	auto &p = **pool;
	Gpu g;
	if (auto e = gpu_init(g, p.device()); !e.empty())
		return fail(e);
	std::printf("attached ordering=%s device=%u\n", p.gpu_ordering(), p.device());
	std::fflush(stdout);
	bool use_stream = !o.count("no-stream");
	bool any_device = o.count("any-device") != 0;
	CUstream stream = use_stream && !any_device ? g.stream : nullptr;
	// --any-device: a stream on each further device, made when its first frame comes.
	std::map<uint32_t, Gpu> others;
	uint64_t frames = 0, bad = 0, last = 0, limit = number_option(o, "frames", UINT64_MAX);
	xmem::cuda::ContextScope scope(*g.ctx);
	// Page-locked, so the copy stays queued on the stream: into pageable memory a GPU
	// finishes it before cuMemcpyDtoHAsync returns, and a held read would be over. Where
	// pinning fails (XMEM_CUDASIM_HOST_PIN_LIMIT) the copies go to pageable memory.
	// As large as the first class's slots, or --max-size (frames of later size classes).
	uint64_t capacity = std::max<uint64_t>(p.slot_size(), number_option(o, "max-size", 0));
	void *pinned = mmap(nullptr, capacity, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (pinned == MAP_FAILED)
		return fail("mmap");
	std::vector<uint32_t> pageable;
	auto *host = static_cast<uint32_t *>(pinned);
	// PORTABLE: page-locked for the streams of every device too (--any-device).
	if (g.d->cuMemHostRegister(pinned, capacity, CU_MEMHOSTREGISTER_PORTABLE) != CUDA_SUCCESS) {
		munmap(pinned, capacity);
		pageable.resize(capacity / 4);
		host = pageable.data();
	}
	std::vector<xmem::BufferGuard> held;
	uint64_t spilled = 0;
	while (frames < limit) {
		auto f = p.receive(10s, stream);
		if (f.code() == xmem::Errc::end_of_stream || f.code() == xmem::Errc::closed)
			break;
		if (!f)
			return fail("receive, after " + std::to_string(frames) + " frames: " + f.error().message);
		uint64_t seq = f->meta().seq, size = f->meta().size;
		if (size > capacity || size < kTail)
			return fail("frame " + std::to_string(seq) + " of " + std::to_string(size) +
				    " bytes: past --max-size or shorter than its tail");
		spilled += f->spilled() ? 1 : 0;
		if (f->storage() == xmem::Storage::system) {
			// A spilled frame as the tier holds it (--spill-delivery host), or a frame
			// of a class of system memory (--mixed).
			bool expected = f->spilled() ? options.spill_delivery == xmem::SpillDelivery::host
						     : o.count("mixed") != 0;
			if (!expected)
				return fail("frame " + std::to_string(seq) + " in host memory, not spilled for host");
			std::memcpy(host, f->data().data(), size);
		} else if (f->device() != p.device() && !any_device) {
			return fail("frame " + std::to_string(seq) + " says device " + std::to_string(f->device()) +
				    ", the pool is on " + std::to_string(p.device()));
		}
		Gpu *on = &g;
		if (f->storage() == xmem::Storage::cuda && f->device() != p.device()) {
			on = &others[f->device()];
			if (!on->ctx)
				if (auto e = gpu_init(*on, f->device()); !e.empty())
					return fail(e);
		}
		xmem::cuda::ContextScope frame_scope(*on->ctx);
		if (f->storage() == xmem::Storage::cuda &&
		    on->d->cuMemcpyDtoHAsync(host, f->device_ptr(), size, on->stream) != CUDA_SUCCESS)
			return fail("cuMemcpyDtoHAsync");
		if (o.count("hold")) {
			// A read still queued on the GPU when the process is killed.
			held.push_back(std::move(f.value()));
			std::printf("holding %llu\n", (unsigned long long)seq);
			std::fflush(stdout);
			if (held.size() >= number_option(o, "hold", 1))
				for (;;)
					std::this_thread::sleep_for(1s);
			continue;
		}
		auto released = use_stream ? f->release(on->stream) : (f->reset(), xmem::Result<void>());
		if (!released)
			return fail("release: " + released.error().message);
		if (on->d->cuStreamSynchronize(on->stream) != CUDA_SUCCESS)
			return fail("cuStreamSynchronize");
		bool ok = seq > last;
		for (uint64_t i = 0; ok && i < (size - kTail) / 4; i++)
			ok = host[i] == word(seq);
		for (uint64_t i = (size - kTail) / 4; ok && i < size / 4; i++)
			ok = host[i] == tail_word(seq);
		if (!ok && bad++ < 5)
			std::printf("bad frame %llu\n", (unsigned long long)seq);
		last = seq;
		frames++;
		if (o.count("work-us"))
			std::this_thread::sleep_for(std::chrono::microseconds(number_option(o, "work-us", 0)));
	}
	std::printf("spilled=%llu\n", (unsigned long long)spilled);
	std::printf("frames=%llu bad=%llu\n", (unsigned long long)frames, (unsigned long long)bad);
	std::fflush(stdout);
	return bad == 0 ? 0 : 1;
}

// hang-up-writing NAME --gate-ms T --linger-ms L [--keep] : receives a frame, takes it for
// writing in place (try_make_writable: this process its only holder) and queues an in-place
// write on its stream behind a host gate, releases it on the stream, then shuts its
// pool socket down: the owner sees the hang-up while this process's GPU write is still
// queued, as when a killed process's device files close after its socket. The gate
// opens after T ms, the write lands, and the process lingers L ms before it exits.
int hang_up_writing(const std::string &name, const xmem::test::Options &o)
{
	xmem::OpenOptions options;
	options.timeout = 10s;
	options.client = "cuda-peer-late";
	auto pool = xmem::BufferPool::open(name, options);
	if (!pool)
		return fail(pool.error().message);
	auto &p = **pool;
	Gpu g;
	if (auto e = gpu_init(g, p.device()); !e.empty())
		return fail(e);
	xmem::cuda::ContextScope scope(*g.ctx);
	auto f = p.receive(10s, g.stream);
	if (!f)
		return fail("receive: " + f.error().message);
	uint32_t index = f->index();
	if (!f->try_make_writable())
		return fail("the slot could not be taken for writing in place");
	auto &w = f;
	xmem::test::GatedHost gate(0);
	if (!gate.ok)
		return fail("cannot register the gate page");
	if (g.d->cuStreamWaitValue64(g.stream, gate.gate_dev, 1, CU_STREAM_WAIT_VALUE_GEQ) != CUDA_SUCCESS ||
	    g.d->cuMemsetD32Async(w->device_ptr(), kLateWord, p.slot_size() / 4, g.stream) != CUDA_SUCCESS)
		return fail("cannot queue the gated in-place write");
	// --keep: still held for writing when the socket goes (as a process killed while
	// writing in place): no done write follows the queued write.
	if (!o.count("keep"))
		if (auto r = w->release(g.stream); !r)
			return fail("release: " + r.error().message);
	// The pool's socket: the one connected to the owner's, whose address names the pool.
	// (The real CUDA driver has sockets of its own, which must stay.)
	int sockets = 0;
	for (int fd = 3; fd < 1024; fd++) {
		sockaddr_un peer{};
		socklen_t len = sizeof(peer);
		if (::getpeername(fd, reinterpret_cast<sockaddr *>(&peer), &len) < 0 || peer.sun_family != AF_UNIX ||
		    len <= offsetof(sockaddr_un, sun_path))
			continue;
		// An abstract name starts with a zero byte; a path ends with one.
		std::string address(peer.sun_path, len - offsetof(sockaddr_un, sun_path));
		if (address.find(name) != std::string::npos && ::shutdown(fd, SHUT_RDWR) == 0)
			sockets++;
	}
	std::printf("hung-up slot=%u sockets=%d\n", index, sockets);
	std::fflush(stdout);
	std::this_thread::sleep_for(std::chrono::milliseconds(number_option(o, "gate-ms", 1000)));
	gate.open();
	if (g.d->cuStreamSynchronize(g.stream) != CUDA_SUCCESS)
		return fail("cuStreamSynchronize");
	std::printf("landed\n");
	std::fflush(stdout);
	std::this_thread::sleep_for(std::chrono::milliseconds(number_option(o, "linger-ms", 0)));
	// Exits without closing anything: as a killed process would.
	std::_Exit(0);
}

// fault-and-close NAME : receives a frame on its stream, queues a copy from an address
// nothing maps on the same stream (an illegal address: the context's sticky error, which
// ends every later piece of its work unrun), releases the frame there (a done write that
// will never land) and closes its pool: prints how long the close took, then lingers
// until killed, as a process that reports the error and has not exited yet. The copy
// and the release wait behind a host gate, opened once both are queued: the release
// comes before the fault however fast the stream runs (a release after the fault finds
// the context faulted, and the CPU stores its done word).
int fault_and_close(const std::string &name, const xmem::test::Options &)
{
	xmem::OpenOptions options;
	options.timeout = 10s;
	options.client = "cuda-peer-fault";
	auto pool = xmem::BufferPool::open(name, options);
	if (!pool)
		return fail(pool.error().message);
	Gpu g;
	if (auto e = gpu_init(g, (*pool)->device()); !e.empty())
		return fail(e);
	xmem::cuda::ContextScope scope(*g.ctx);
	auto f = (*pool)->receive(10s, g.stream);
	if (!f)
		return fail("receive: " + f.error().message);
	xmem::test::GatedHost gate(0);
	if (!gate.ok)
		return fail("cannot register the gate page");
	CUdeviceptr nowhere = f->device_ptr() + (uint64_t{ 1 } << 40);
	if (g.d->cuStreamWaitValue64(g.stream, gate.gate_dev, 1, CU_STREAM_WAIT_VALUE_GEQ) != CUDA_SUCCESS ||
	    g.d->cuMemcpyDtoDAsync(f->device_ptr(), nowhere, 4096, g.stream) != CUDA_SUCCESS)
		return fail("cannot queue the faulting copy");
	if (auto r = f->release(g.stream); !r)
		return fail("release: " + r.error().message);
	gate.open();
	CUresult fault = g.d->cuStreamSynchronize(g.stream);
	std::printf("faulted %s\n", fault == CUDA_SUCCESS ? "no" : "yes");
	std::fflush(stdout);
	auto start = std::chrono::steady_clock::now();
	pool->reset();
	auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
	std::printf("closed close_ms=%lld\n", (long long)ms.count());
	std::fflush(stdout);
	for (;;)
		std::this_thread::sleep_for(1s);
}

// create NAME [--device D] [--size B] : prints "ok" or "error MESSAGE" for a CUDA pool.
int create(const std::string &name, const xmem::test::Options &o)
{
	xmem::PoolConfig config;
	config.storage = xmem::Storage::cuda;
	config.device = uint32_t(number_option(o, "device", 0));
	config.slot_count = uint32_t(number_option(o, "slots", 2));
	config.slot_size = number_option(o, "size", 4096);
	auto pool = xmem::BufferPool::create(name, config);
	if (!pool)
		return fail(pool.error().message);
	std::printf("ok ordering=%s\n", (*pool)->gpu_ordering());
	return 0;
}

// guest NAME --frames N --hold K: attaches and produces as a guest (a producer besides the
// owner): N frames whose every word is word(1000 + n), written on its stream and published
// on it ("published=n"); then, with K, leases K slots more, queues a write into each and
// says "leased=K", and waits to be killed.
int guest(const std::string &name, const xmem::test::Options &o)
{
	xmem::OpenOptions options;
	options.timeout = 10s;
	options.client = "cuda-peer-guest";
	auto pool = xmem::BufferPool::open(name, options);
	if (!pool)
		return fail(pool.error().message);
	auto &p = **pool;
	Gpu g;
	if (auto e = gpu_init(g, p.device()); !e.empty())
		return fail(e);
	xmem::cuda::ContextScope scope(*g.ctx);
	uint64_t frames = number_option(o, "frames", 0);
	for (uint64_t n = 0; n < frames; n++) {
		auto f = p.acquire(10s, g.stream);
		if (!f)
			return fail("acquire: " + f.error().message);
		if (g.d->cuMemsetD32Async(f->device_ptr(), word(1000 + n), p.slot_size() / 4, g.stream) != CUDA_SUCCESS)
			return fail("cuMemsetD32Async");
		f->meta_mut().value()->size = p.slot_size();
		f->meta_mut().value()->pts = 1000 + n;
		if (auto r = p.publish(std::move(f.value()), g.stream); !r)
			return fail("publish: " + r.error().message);
		std::printf("published=%llu\n", (unsigned long long)(n + 1));
		std::fflush(stdout);
	}
	uint64_t hold = number_option(o, "hold", 0);
	if (hold == 0)
		return 0;
	std::vector<xmem::BufferGuard> leased;
	for (uint64_t k = 0; k < hold; k++) {
		auto f = p.acquire(10s, g.stream);
		if (!f)
			return fail("acquire: " + f.error().message);
		if (g.d->cuMemsetD32Async(f->device_ptr(), kLateWord, p.slot_size() / 4, g.stream) != CUDA_SUCCESS)
			return fail("cuMemsetD32Async");
		leased.push_back(std::move(f.value()));
	}
	std::printf("leased=%llu\n", (unsigned long long)hold);
	std::fflush(stdout);
	for (;;)
		std::this_thread::sleep_for(1s);
}

} // namespace

int main(int argc, char **argv)
{
	if (argc < 3) {
		std::fprintf(stderr, "usage: xmem-cuda-peer produce|consume|create NAME [options]\n");
		return 2;
	}
	std::string mode = argv[1], name = argv[2];
	auto o = xmem::test::parse_options(argc, argv, 3);
	if (mode == "produce")
		return produce(name, o);
	if (mode == "consume")
		return consume(name, o);
	if (mode == "create")
		return create(name, o);
	if (mode == "fault-and-close")
		return fault_and_close(name, o);
	if (mode == "hang-up-writing")
		return hang_up_writing(name, o);
	if (mode == "guest")
		return guest(name, o);
	return 2;
}
