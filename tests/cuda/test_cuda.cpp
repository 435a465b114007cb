// test_cuda.cpp - CUDA device pools: slots shared as VMM fds, GPU-side ordering across
// processes, its CPU fallback, consumers killed with GPU reads queued, and every error
// a device pool can report. Run twice: as cuda-sim against the CUDA driver simulator
// (tests/cudasim, in CI), which proves xmem's logic (ordering, lifetimes, error
// paths) but not the driver's behaviour; and as cuda-gpu against the real driver,
// which exits 77 (skipped) without a GPU. docs/gpu-results.md records GPU runs.
#include "../common.hpp"

#include "../scribble.hpp"
#include "arena.hpp"
#include "cuda/driver.hpp"
#include "gated_host.hpp"
#include "peer_frames.hpp"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include <dlfcn.h>
#include <poll.h>
#include <sys/mman.h>

using namespace std::chrono_literals;
using xmem::Errc;
using xmem::test::eventually;
using xmem::test::on_cuda_simulator;
using xmem::test::Process;
using xmem::test::RuntimeDir;

namespace {

using xmem::test::GatedHost;

// Against the real driver without a usable GPU, the whole program is skipped.
const auto *const gpu_or_skip = ::testing::AddGlobalTestEnvironment(new xmem::test::RealGpuOrSkip);

std::string cuda_peer()
{
	return xmem::test::cuda_peer_path();
}

// Runs the peer with extra environment (VAR=VALUE...) prepended through env(1).
Process peer(std::vector<std::string> env, std::vector<std::string> args)
{
	std::vector<std::string> argv{ "/usr/bin/env" };
	argv.insert(argv.end(), env.begin(), env.end());
	argv.push_back(cuda_peer());
	argv.insert(argv.end(), args.begin(), args.end());
	return Process(argv);
}

xmem::PoolConfig cuda_config(uint64_t size = 64 * 1024, uint32_t slots = 4)
{
	xmem::PoolConfig c;
	c.storage = xmem::Storage::cuda;
	c.slot_size = size;
	c.slot_count = slots;
	return c;
}

} // namespace

TEST(CudaPool, DeviceSlotsAreNotCpuMemory)
{
	RuntimeDir dir;
	if (!on_cuda_simulator() && !xmem::cuda::check_device(0, "").value().stream_mem_ops)
		GTEST_SKIP() << "this GPU has no 64-bit stream memory operations";
	auto pool = xmem::BufferPool::create("dev", cuda_config());
	ASSERT_TRUE(pool.ok()) << xmem::test::why(pool);
	auto &p = **pool;
	EXPECT_EQ(p.storage(), xmem::Storage::cuda);
	EXPECT_STREQ(p.gpu_ordering(), "stream-memops");
	// NVENC's 256 at least, and a multiple of the device's texture pitch alignment.
	EXPECT_GE(p.pitch_alignment(), 256u);
	EXPECT_EQ(p.pitch_alignment() % uint32_t(xmem::cuda::check_device(0, "").value().pitch_alignment), 0u);
	auto f = p.acquire(1s);
	ASSERT_TRUE(f.ok()) << xmem::test::why(f);
	EXPECT_NE(f->device_ptr(), 0u);
	EXPECT_TRUE(f->data().empty()) << "the CPU cannot touch device memory";
	EXPECT_EQ(f->data_mut().code(), Errc::invalid_argument);
	EXPECT_EQ(f->storage(), xmem::Storage::cuda);
	EXPECT_EQ(f->meta().storage_type, XMEM_STORAGE_CUDA);
	// xmem-inspect, from another process, says how GPU work is ordered.
	const char *inspect = std::getenv("XMEM_INSPECT");
	ASSERT_TRUE(inspect) << "XMEM_INSPECT must name the built xmem-inspect";
	Process tool({ inspect, "--json", "dev" });
	EXPECT_EQ(tool.wait(10s), 0) << tool.output();
	EXPECT_NE(tool.output().find("\"storage_type\":1"), std::string::npos) << tool.output();
	EXPECT_NE(tool.output().find("\"gpu_ordering\":\"stream-memops\""), std::string::npos) << tool.output();
	// The simulator's device pointers fault on a CPU access.
	GTEST_FLAG_SET(death_test_style, "threadsafe");
	EXPECT_DEATH(*reinterpret_cast<volatile char *>(f->device_ptr()) = 1, "");
}

TEST(CudaPool, InProcessFramesArriveInOrderAndCopyToCpu)
{
	RuntimeDir dir;
	auto owner = xmem::BufferPool::create("inproc", cuda_config());
	ASSERT_TRUE(owner.ok()) << xmem::test::why(owner);
	auto consumer = xmem::BufferPool::open("inproc");
	ASSERT_TRUE(consumer.ok()) << xmem::test::why(consumer);
	EXPECT_EQ((*consumer)->storage(), xmem::Storage::cuda);
	const xmem::cuda::Driver *d = xmem::cuda::driver().value();
	auto ctx = xmem::cuda::PrimaryContext::retain(0, "test").value();
	xmem::cuda::ContextScope scope(*ctx);
	CUstream stream;
	ASSERT_EQ(d->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	for (uint32_t n = 1; n <= 50; n++) {
		auto f = (*owner)->acquire(5s, stream);
		ASSERT_TRUE(f.ok()) << xmem::test::why(f);
		ASSERT_EQ(d->cuMemsetD32Async(f->device_ptr(), n, 64 * 1024 / 4, stream), CUDA_SUCCESS);
		f->meta_mut().value()->size = 64 * 1024;
		ASSERT_TRUE((*owner)->publish(std::move(f.value()), stream).ok());
		// No stream: the frame is ready for any use when receive returns.
		auto r = (*consumer)->receive(5s);
		ASSERT_TRUE(r.ok()) << xmem::test::why(r);
		EXPECT_EQ(r->meta().seq, n);
		auto host = r->private_copy_to_cpu();
		ASSERT_TRUE(host.ok()) << xmem::test::why(host);
		ASSERT_EQ(host->data().size(), 64u * 1024);
		const uint32_t *words = reinterpret_cast<const uint32_t *>(host->data().data());
		for (size_t i = 0; i < 64 * 1024 / 4; i++)
			ASSERT_EQ(words[i], n) << "frame " << n << " word " << i;
	}
	d->cuStreamDestroy(stream);
}

// A device frame's layout is another process's writing too: one that does not fit its
// slot is refused before any copy could follow it out of the slot's mapping (an illegal
// address would end this process's context), with and without a stream; the slot goes
// back to the owner, whose next acquire does not wait for reads that never happened.
TEST(CudaPool, AFrameWhoseLayoutDoesNotFitIsRefusedBeforeAnyCopy)
{
	RuntimeDir dir;
	auto owner = xmem::BufferPool::create("layout", cuda_config(64 * 1024, 2));
	ASSERT_TRUE(owner.ok()) << xmem::test::why(owner);
	auto consumer = xmem::BufferPool::open("layout");
	ASSERT_TRUE(consumer.ok()) << xmem::test::why(consumer);
	const xmem::cuda::Driver *d = xmem::cuda::driver().value();
	auto ctx = xmem::cuda::PrimaryContext::retain(0, "test").value();
	xmem::cuda::ContextScope scope(*ctx);
	CUstream stream;
	ASSERT_EQ(d->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	for (uint32_t n = 1; n <= 8; n++) {
		auto f = (*owner)->acquire(5s, stream);
		ASSERT_TRUE(f.ok()) << xmem::test::why(f);
		ASSERT_EQ(d->cuMemsetD32Async(f->device_ptr(), n, 64 * 1024 / 4, stream), CUDA_SUCCESS);
		auto layout = xmem::set_video_layout(*f->meta_mut().value(), "NV12", 128, 64, 256);
		ASSERT_TRUE(layout.ok()) << xmem::test::why(layout);
		f->meta_mut().value()->size = *layout;
		uint32_t index = f->index();
		ASSERT_TRUE((*owner)->publish(std::move(f.value()), stream).ok());
		bool scribbled = n % 2 == 1;
		if (scribbled) // the UV plane moved past the slot
			xmem::test::slot_record(**consumer, index)->meta.plane_offset[1] = 64 * 1024 + 4096;
		// Odd rounds with a stream, even ones without, so both are refused.
		auto r = (*consumer)->receive(5s, n % 4 == 1 ? stream : nullptr);
		if (scribbled) {
			ASSERT_EQ(r.code(), Errc::bad_frame) << "frame " << n << ": " << xmem::test::why(r);
			EXPECT_NE(r.error().message.find("plane 1 starts at byte 69632"), std::string::npos)
				<< r.error().message;
			continue;
		}
		ASSERT_TRUE(r.ok()) << "frame " << n << ": " << xmem::test::why(r);
		EXPECT_EQ(r->meta().seq, n);
		auto host = r->private_copy_to_cpu();
		ASSERT_TRUE(host.ok()) << xmem::test::why(host);
		const uint32_t *words = reinterpret_cast<const uint32_t *>(host->data().data());
		EXPECT_EQ(words[0], n);
	}
	EXPECT_EQ((*consumer)->frames_refused(), 4u);
	// Every refused slot came back: both slots can be taken at once, without a wait.
	auto a = (*owner)->acquire(1s, stream);
	auto b = (*owner)->acquire(1s, stream);
	EXPECT_TRUE(a.ok() && b.ok()) << xmem::test::why(a) << " " << xmem::test::why(b);
	// Before their stream goes: a stream-less release waits for the stream a frame
	// was acquired on (a destroyed stream's handle dangles in the real driver).
	for (auto *g : { &a, &b })
		if (g->ok())
			(*g)->reset();
	EXPECT_EQ(d->cuStreamSynchronize(stream), CUDA_SUCCESS);
	d->cuStreamDestroy(stream);
}

// A caller's streams may come from a context of its own (GStreamer's CUDA elements
// make one with cuCtxCreate): xmem's work on them runs in that context. The simulator
// refuses work on a stream while another context is current, so this fails if xmem
// pushes its primary context instead. Frames go in and out with cuda_copy_2d.
TEST(CudaPool, StreamsOfAnotherContextAndPlaneCopies)
{
	RuntimeDir dir;
	const xmem::cuda::Driver *d = xmem::cuda::driver().value();
	void *lib = dlopen(d->library.c_str(), RTLD_LAZY | RTLD_NOLOAD);
	ASSERT_NE(lib, nullptr) << d->library;
	// cuda.h 13 maps cuCtxCreate to _v4 (with parameters); _v2 is what GStreamer 1.22 calls.
	using CtxCreate = CUresult (*)(CUcontext *, unsigned int, CUdevice);
	auto create = reinterpret_cast<CtxCreate>(dlsym(lib, "cuCtxCreate_v2"));
	auto destroy = reinterpret_cast<decltype(&cuCtxDestroy)>(dlsym(lib, "cuCtxDestroy_v2"));
	ASSERT_TRUE(create && destroy);
	auto info = xmem::cuda::check_device(0, "test").value();
	CUcontext own = nullptr;
	ASSERT_EQ(create(&own, 0, info.device), CUDA_SUCCESS); // current until popped
	CUstream in = nullptr, out = nullptr;
	ASSERT_EQ(d->cuStreamCreate(&in, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	ASSERT_EQ(d->cuStreamCreate(&out, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	CUcontext popped;
	ASSERT_EQ(d->cuCtxPopCurrent(&popped), CUDA_SUCCESS);

	auto owner = xmem::BufferPool::create("ctx", cuda_config(64 * 1024, 3));
	ASSERT_TRUE(owner.ok()) << xmem::test::why(owner);
	auto consumer = xmem::BufferPool::open("ctx");
	ASSERT_TRUE(consumer.ok()) << xmem::test::why(consumer);
	// A 100 x 40 byte image at pitch 128 on the host, 256 in the slot.
	const uint64_t width = 100, height = 40, pitch = 256;
	for (uint32_t n = 1; n <= 20; n++) {
		std::vector<uint8_t> image(128 * height);
		for (size_t i = 0; i < image.size(); i++)
			image[i] = uint8_t(i * 7 + n);
		auto f = (*owner)->acquire(5s, in);
		ASSERT_TRUE(f.ok()) << xmem::test::why(f);
		auto put = xmem::cuda_copy_2d({ f->device_ptr(), pitch, true },
					      { uint64_t(uintptr_t(image.data())), 128, false }, width, height, 0, in);
		ASSERT_TRUE(put.ok()) << xmem::test::why(put);
		f->meta_mut().value()->size = pitch * height;
		ASSERT_TRUE((*owner)->publish(std::move(f.value()), in).ok());

		auto r = (*consumer)->receive(5s, out);
		ASSERT_TRUE(r.ok()) << xmem::test::why(r);
		std::vector<uint8_t> back(width * height, 0);
		auto get = xmem::cuda_copy_2d({ uint64_t(uintptr_t(back.data())), width, false },
					      { r->device_ptr(), pitch, true }, width, height, 0, out);
		ASSERT_TRUE(get.ok()) << xmem::test::why(get);
		ASSERT_TRUE(r->release(out).ok());
		ASSERT_TRUE(xmem::cuda_synchronize(0, out).ok());
		auto done = xmem::cuda_stream_done(0, out);
		ASSERT_TRUE(done.ok()) << xmem::test::why(done);
		EXPECT_TRUE(*done);
		for (uint64_t y = 0; y < height; y++)
			ASSERT_EQ(0, std::memcmp(&back[y * width], &image[y * 128], width))
				<< "frame " << n << " row " << y;
	}
	// Every stream of the caller's own context, from outside it.
	EXPECT_TRUE(xmem::cuda_synchronize_context(own).ok());
	EXPECT_EQ(xmem::cuda_synchronize_context(nullptr).code(), Errc::invalid_argument);
	owner->reset();
	consumer->reset();
	d->cuStreamDestroy(in);
	d->cuStreamDestroy(out);
	EXPECT_EQ(destroy(own), CUDA_SUCCESS);
	dlclose(lib);
}

TEST(CudaErrors, PlaneCopiesRefuseBadArguments)
{
	std::vector<uint8_t> host(4096);
	uint64_t h = uint64_t(uintptr_t(host.data()));
	auto both_host = xmem::cuda_copy_2d({ h, 64, false }, { h, 64, false }, 64, 4, 0);
	EXPECT_EQ(both_host.code(), Errc::invalid_argument);
	EXPECT_NE(xmem::test::why(both_host).find("both sides are host memory"), std::string::npos);
	auto wide = xmem::cuda_copy_2d({ 0x1000, 64, true }, { h, 128, false }, 100, 4, 0);
	EXPECT_EQ(wide.code(), Errc::invalid_argument);
	EXPECT_NE(xmem::test::why(wide).find("exceed a pitch"), std::string::npos);
	auto null = xmem::cuda_copy_2d({ 0, 64, true }, { h, 64, false }, 64, 4, 0);
	EXPECT_EQ(null.code(), Errc::invalid_argument);
	auto far = xmem::cuda_check_device(40);
	EXPECT_FALSE(far.ok());
	EXPECT_NE(xmem::test::why(far).find("out of range"), std::string::npos);
}

TEST(CudaPool, CopiesBetweenHostAndDeviceAndCopyOnWrite)
{
	RuntimeDir dir;
	auto owner = xmem::BufferPool::create("copies", cuda_config(8192, 2));
	ASSERT_TRUE(owner.ok()) << xmem::test::why(owner);
	auto consumer = xmem::BufferPool::open("copies");
	ASSERT_TRUE(consumer.ok()) << xmem::test::why(consumer);
	const xmem::cuda::Driver *d = xmem::cuda::driver().value();
	auto ctx = xmem::cuda::PrimaryContext::retain(0, "test").value();
	xmem::cuda::ContextScope scope(*ctx);
	CUstream stream;
	ASSERT_EQ(d->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);

	auto f = (*owner)->acquire(5s, stream);
	ASSERT_TRUE(f.ok());
	ASSERT_EQ(d->cuMemsetD32Async(f->device_ptr(), 0xabcd1234, 8192 / 4, stream), CUDA_SUCCESS);
	f->meta_mut().value()->size = 8192;
	ASSERT_TRUE((*owner)->publish(std::move(f.value()), stream).ok());
	auto r = (*consumer)->receive(5s, stream);
	ASSERT_TRUE(r.ok()) << xmem::test::why(r);
	uint32_t r_index = r->index();

	// Device to device, on the consumer's stream, then back to the CPU.
	auto dev = r->private_copy_to_cuda(0, stream);
	ASSERT_TRUE(dev.ok()) << xmem::test::why(dev);
	EXPECT_NE(dev->device_ptr(), r->device_ptr());
	EXPECT_TRUE(dev->is_copy());
	EXPECT_EQ(dev->storage(), xmem::Storage::cuda);
	ASSERT_TRUE(r->release(stream).ok());
	auto host = dev->private_copy_to_cpu(stream);
	ASSERT_TRUE(host.ok()) << xmem::test::why(host);
	EXPECT_EQ(host->storage(), xmem::Storage::system);
	auto words = reinterpret_cast<const uint32_t *>(host->data().data());
	ASSERT_EQ(host->data().size(), 8192u);
	for (size_t i = 0; i < 8192 / 4; i++)
		ASSERT_EQ(words[i], 0xabcd1234u) << i;

	// Host to device and back: copy_to_cuda of a host copy.
	auto again = host->private_copy_to_cuda(0, stream);
	ASSERT_TRUE(again.ok()) << xmem::test::why(again);
	auto back = again->private_copy_to_cpu(stream);
	ASSERT_TRUE(back.ok());
	EXPECT_EQ(std::memcmp(back->data().data(), host->data().data(), 8192), 0);

	// A device out of range names the cause, and a failed copy of a frame still held
	// leaves this process's reference to its slot alone.
	auto bad = host->private_copy_to_cuda(7, stream);
	ASSERT_FALSE(bad.ok());
	EXPECT_NE(bad.error().message.find("out of range"), std::string::npos) << bad.error().message;
	auto again_held = (*consumer)->get(r_index);
	ASSERT_TRUE(again_held.ok()) << xmem::test::why(again_held);
	EXPECT_EQ((*consumer)->ref_count(r_index), 1u);
	EXPECT_FALSE(again_held->private_copy_to_cuda(7, stream).ok());
	EXPECT_EQ((*consumer)->ref_count(r_index), 1u) << "a failed copy released the source's reference";
	again_held->reset();
	EXPECT_EQ((*consumer)->ref_count(r_index), 0u);

	// get_mut of a frame another process holds: a private device copy, writable.
	auto g2 = (*owner)->acquire(5s, stream);
	ASSERT_TRUE(g2.ok());
	ASSERT_EQ(d->cuMemsetD32Async(g2->device_ptr(), 77, 8192 / 4, stream), CUDA_SUCCESS);
	g2->meta_mut().value()->size = 8192;
	uint32_t index = g2->index();
	ASSERT_TRUE((*owner)->publish(std::move(g2.value()), stream).ok());
	auto held = (*consumer)->receive(5s);
	ASSERT_TRUE(held.ok());
	auto mine = (*owner)->get_mut(index);
	ASSERT_TRUE(mine.ok()) << xmem::test::why(mine);
	EXPECT_TRUE(mine->writable());
	EXPECT_TRUE(mine->is_copy());
	EXPECT_NE(mine->device_ptr(), held->device_ptr());
	auto check = mine->private_copy_to_cpu();
	ASSERT_TRUE(check.ok());
	EXPECT_EQ(reinterpret_cast<const uint32_t *>(check->data().data())[100], 77u);
	// The copies made on STREAM go before it: freeing one waits for the stream it
	// was made on (a destroyed stream's handle dangles in the real driver).
	dev->reset();
	again->reset();
	d->cuStreamDestroy(stream);
}

// A consumer holding device frames when the producer is SIGKILLed keeps reading
// them: its import keeps every allocation alive (in the simulator, the memfds; on a
// GPU, the driver's reference; docs/gpu-results.md says whether that was run).
TEST(CudaCrash, FramesOutliveAKilledProducer)
{
	RuntimeDir dir;
	Process producer = peer({}, { "produce", "dies", "--frames", "3", "--slots", "4", "--wait-consumers", "1",
				      "--linger-ms", "60000" });
	ASSERT_TRUE(producer.wait_output("ready")) << producer.output();
	auto pool = xmem::BufferPool::open("dies", { 5s, 4, "holder", false });
	ASSERT_TRUE(pool.ok()) << xmem::test::why(pool);
	std::vector<xmem::BufferGuard> frames;
	for (int i = 0; i < 3; i++) {
		auto f = (*pool)->receive(5s);
		ASSERT_TRUE(f.ok()) << xmem::test::why(f);
		frames.push_back(std::move(f.value()));
	}
	ASSERT_TRUE(producer.wait_output("done"));
	producer.kill_wait();
	EXPECT_EQ((*pool)->receive(2s).code(), Errc::end_of_stream);
	for (auto &f : frames) {
		auto host = f.private_copy_to_cpu();
		ASSERT_TRUE(host.ok()) << xmem::test::why(host);
		auto words = reinterpret_cast<const uint32_t *>(host->data().data());
		// The peer's pattern (cuda_peer.cpp): the body's word, then the tail page's.
		uint32_t word = uint32_t(f.meta().seq * 2654435761u) | 1u;
		EXPECT_EQ(words[0], word) << "frame " << f.meta().seq;
		EXPECT_EQ(words[host->data().size() / 4 - 1], ~word) << "frame " << f.meta().seq;
	}
}

// The ordering test: a producer writes each frame through two delayed asynchronous
// operations on its stream and publishes at once; three consumers read each frame on
// their own streams (one without a stream) and check every byte. The simulator runs
// each stream late, so a missing wait shows up as bad frames:
// - slow producer stream, idle consumers: a consumer that does not wait for `ready`
//   reads the previous frame of the slot (stale);
// - fast producer, slow consumer streams: a producer that does not wait for `done`
//   rewrites a slot under a queued read (torn).
struct OrderingCase {
	const char *name;
	std::string mode_env; // how GPU ordering is made to work, "" for stream memops
	const char *want; // gpu_ordering() expected
	bool slow_producer;
};

// Checked against mutations: with wait_ready or wait_done in lib/cuda/ordering.cpp
// made a no-op, the stream_memops cases report hundreds of bad frames. The CPU cases
// need neither wait (the producer synchronizes before publishing, consumers before
// releasing), so they prove the fallback's own path.
class CudaOrdering : public ::testing::TestWithParam<OrderingCase>
{
};

TEST_P(CudaOrdering, EveryByteOfEveryFrameAcrossProcesses)
{
	const OrderingCase &c = GetParam();
	if (!on_cuda_simulator() && c.mode_env.find("CUDASIM") != std::string::npos)
		GTEST_SKIP() << "a device without stream memory operations is the simulator's";
	RuntimeDir dir;
	auto env_with = [&](const char *delay) {
		std::vector<std::string> env{ std::string("XMEM_CUDASIM_DELAY_US=") + delay };
		if (!c.mode_env.empty())
			env.push_back(c.mode_env);
		return env;
	};
	// Thousands of frames where the waits matter most (stream memory operations).
	const int frames = c.mode_env.empty() ? 2000 : 500;
	std::vector<std::string> args{ "produce",     "order", "--frames",	   std::to_string(frames),
				       "--slots",     "3",     "--wait-consumers", "3",
				       "--linger-ms", "200" };
	if (c.slow_producer) {
		args.push_back("--fps");
		args.push_back("250");
	}
	Process producer = peer(env_with(c.slow_producer ? "2000" : "30"), args);
	ASSERT_TRUE(producer.wait_output(std::string("ready ordering=") + c.want)) << producer.output();
	std::vector<Process> consumers;
	for (int i = 0; i < 3; i++)
		consumers.push_back(peer(env_with(c.slow_producer ? "30" : "2000"),
					 { "consume", "order", i == 2 ? "--no-stream" : "--stream" }));
	for (auto &p : consumers) {
		EXPECT_EQ(p.wait(120s), 0) << p.output();
		EXPECT_NE(p.output().find("frames=" + std::to_string(frames) + " bad=0"), std::string::npos)
			<< p.output();
		EXPECT_NE(p.output().find(std::string("attached ordering=") + c.want), std::string::npos) << p.output();
	}
	EXPECT_EQ(producer.wait(60s), 0) << producer.output();
}

INSTANTIATE_TEST_SUITE_P(
	Modes, CudaOrdering,
	::testing::Values(OrderingCase{ "stream_memops_ready", "", "stream-memops", true },
			  OrderingCase{ "stream_memops_done", "", "stream-memops", false },
			  OrderingCase{ "device_without_memops_ready", "XMEM_CUDASIM_FAIL=no_memops", "cpu", true },
			  OrderingCase{ "device_without_memops_done", "XMEM_CUDASIM_FAIL=no_memops", "cpu", false },
			  OrderingCase{ "forced_cpu_done", "XMEM_CUDA_SYNC=cpu", "cpu", false }),
	[](const auto &info) { return std::string(info.param.name); });

// More slots than one message carries fds (253): the rest come in ArenaFds messages,
// and a consumer in another process maps all of them.
TEST(CudaPool, SlotFdsBeyondOneMessage)
{
	RuntimeDir dir;
	std::vector<std::string> env{ "XMEM_CUDASIM_GRANULARITY=65536", "XMEM_CUDASIM_DELAY_US=0" };
	if (!on_cuda_simulator())
		env.clear();
	Process producer = peer(env, { "produce", "many", "--frames", "600", "--slots", "300", "--size", "8192",
				       "--wait-consumers", "1", "--linger-ms", "200" });
	ASSERT_TRUE(producer.wait_output("ready")) << producer.output();
	Process consumer = peer(env, { "consume", "many" });
	EXPECT_EQ(consumer.wait(60s), 0) << consumer.output();
	EXPECT_NE(consumer.output().find("frames=600 bad=0"), std::string::npos) << consumer.output();
	EXPECT_EQ(producer.wait(60s), 0) << producer.output();
}

// A consumer that closes its pool right after releasing a frame on a stream that has
// not read it yet: the close waits for that stream's done write (drain_done), so the
// owner, which reaps the consumer once its socket closes and then counts its reads as
// done, cannot rewrite the slot under the queued read. The stream is held back by a
// wait on a host word the test sets, which makes the order deterministic. Found by the
// model (tests/model, configuration gpu and the mutant no-drain-at-close); this is the
// same bug in the library itself.
TEST(CudaPool, AClosingConsumerWaitsForItsQueuedReads)
{
	RuntimeDir dir;
	if (!on_cuda_simulator() && !xmem::cuda::check_device(0, "").value().stream_mem_ops)
		GTEST_SKIP() << "this GPU has no 64-bit stream memory operations";
	constexpr uint64_t kSize = 64 * 1024;
	auto owner = xmem::BufferPool::create("drain", cuda_config(kSize, 1)); // one slot: the owner reuses it
	ASSERT_TRUE(owner.ok()) << xmem::test::why(owner);
	auto consumer = xmem::BufferPool::open("drain");
	ASSERT_TRUE(consumer.ok()) << xmem::test::why(consumer);
	const xmem::cuda::Driver *d = xmem::cuda::driver().value();
	auto ctx = xmem::cuda::PrimaryContext::retain(0, "test").value();
	xmem::cuda::ContextScope scope(*ctx);
	CUstream produce, read;
	ASSERT_EQ(d->cuStreamCreate(&produce, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	ASSERT_EQ(d->cuStreamCreate(&read, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	// Page-locked host memory for the gate word and the copy's destination (a
	// pageable destination would make the copy synchronous on a real GPU).
	const size_t page = size_t(sysconf(_SC_PAGESIZE));
	const size_t host_size = page + kSize;
	void *host = mmap(nullptr, host_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ASSERT_NE(host, MAP_FAILED);
	ASSERT_EQ(d->cuMemHostRegister(host, host_size, CU_MEMHOSTREGISTER_DEVICEMAP), CUDA_SUCCESS);
	auto *gate = static_cast<uint64_t *>(host);
	auto *copy = reinterpret_cast<uint32_t *>(static_cast<char *>(host) + page);
	CUdeviceptr gate_dev;
	ASSERT_EQ(d->cuMemHostGetDevicePointer(&gate_dev, gate, 0), CUDA_SUCCESS);

	auto f = (*owner)->acquire(5s, produce);
	ASSERT_TRUE(f.ok()) << xmem::test::why(f);
	ASSERT_EQ(d->cuMemsetD32Async(f->device_ptr(), 0xaaaaaaaa, kSize / 4, produce), CUDA_SUCCESS);
	f->meta_mut().value()->size = kSize;
	ASSERT_TRUE((*owner)->publish(std::move(f.value()), produce).ok());

	auto r = (*consumer)->receive(5s, read);
	ASSERT_TRUE(r.ok()) << xmem::test::why(r);
	// The read stream stops until the gate opens, then copies the frame out.
	ASSERT_EQ(d->cuStreamWaitValue64(read, gate_dev, 1, CU_STREAM_WAIT_VALUE_GEQ), CUDA_SUCCESS);
	ASSERT_EQ(d->cuMemcpyDtoHAsync(copy, r->device_ptr(), kSize, read), CUDA_SUCCESS);
	ASSERT_TRUE(r->release(read).ok());

	std::atomic<bool> closed{ false };
	std::thread closer([&] {
		consumer->reset();
		closed.store(true);
	});
	// The owner takes the slot again and overwrites it on its stream, which waits for
	// the consumer's done word on the GPU; acquire itself does not wait.
	// No ASSERT until the closer is joined: a test that returned here would leave it
	// running, and the gate shut.
	auto again = (*owner)->acquire(5s, produce);
	EXPECT_TRUE(again.ok()) << xmem::test::why(again);
	if (again.ok()) {
		EXPECT_EQ(d->cuMemsetD32Async(again->device_ptr(), 0xbbbbbbbb, kSize / 4, produce), CUDA_SUCCESS);
	}
	// Time for a close that did not wait to be reaped, and for the overwrite to run.
	std::this_thread::sleep_for(500ms);
	EXPECT_FALSE(closed.load()) << "the consumer closed with a read still queued on its stream";
	EXPECT_EQ((*owner)->stats().consumers, 1u) << "the owner reaped a consumer whose stream still reads";

	__atomic_store_n(gate, 1, __ATOMIC_RELEASE);
	closer.join();
	ASSERT_TRUE(again.ok());
	ASSERT_EQ(d->cuStreamSynchronize(read), CUDA_SUCCESS);
	for (size_t i = 0; i < kSize / 4; i++)
		ASSERT_EQ(copy[i], 0xaaaaaaaau) << "word " << i << ": the slot was rewritten under the queued read";
	ASSERT_EQ(d->cuStreamSynchronize(produce), CUDA_SUCCESS);
	again->reset();
	owner->reset();
	d->cuStreamDestroy(produce);
	d->cuStreamDestroy(read);
	EXPECT_EQ(d->cuMemHostUnregister(host), CUDA_SUCCESS);
	munmap(host, host_size);
}

// Processes number GPUs by what CUDA_VISIBLE_DEVICES lets them see: a consumer finds
// the pool's device by its UUID, not by the producer's ordinal. On the simulator, a
// machine of two devices: the producer sees only the second (its ordinal 0), one
// consumer sees both (ordinal 1), another only the first (an error naming the
// device). The simulator refuses access to memory from another device, so a
// consumer importing on the producer's ordinal fails there. On real GPUs this needs
// two of them.
TEST(CudaPool, ConsumersFindTheDeviceByUuid)
{
	RuntimeDir dir;
	if (!on_cuda_simulator()) {
		int count = 0;
		const xmem::cuda::Driver *d = xmem::cuda::driver().value();
		if (d->cuDeviceGetCount(&count) != CUDA_SUCCESS || count < 2)
			GTEST_SKIP() << "needs two GPUs";
	}
	std::vector<std::string> machine{ "XMEM_CUDASIM_DEVICES=2" };
	std::vector<std::string> second = machine;
	second.push_back("CUDA_VISIBLE_DEVICES=1");
	// It lingers, so the pool is still there for the consumer that cannot use it.
	Process producer = peer(second, { "produce", "uuid", "--frames", "30", "--slots", "3", "--wait-consumers", "1",
					  "--linger-ms", "3000" });
	ASSERT_TRUE(producer.wait_output("ready")) << producer.output();
	Process consumer = peer(machine, { "consume", "uuid" });
	ASSERT_TRUE(consumer.wait_output("attached")) << consumer.output();

	std::vector<std::string> first = machine;
	first.push_back("CUDA_VISIBLE_DEVICES=0");
	Process blind = peer(first, { "consume", "uuid" });
	EXPECT_EQ(blind.wait(30s), 1) << blind.output();
	EXPECT_NE(blind.output().find("which this process does not see"), std::string::npos) << blind.output();
	EXPECT_NE(blind.output().find("CUDA_VISIBLE_DEVICES '0'"), std::string::npos) << blind.output();
	EXPECT_NE(blind.output().find("GPU-"), std::string::npos) << blind.output();

	EXPECT_EQ(consumer.wait(60s), 0) << consumer.output();
	EXPECT_NE(consumer.output().find("device=1"), std::string::npos) << consumer.output();
	EXPECT_NE(consumer.output().find("frames=30 bad=0"), std::string::npos) << consumer.output();
	EXPECT_EQ(producer.wait(60s), 0) << producer.output();
}

// Consumers SIGKILLed at random moments while they hold device frames with GPU
// reads queued: every slot comes back, and the producer never waits forever on a
// stream of a dead process (its done words are written by the reaper).
// The producer is paced below what its (simulated, slow) stream executes: a CPU that
// enqueues faster than the GPU runs would only grow the stream's backlog.
TEST(CudaCrash, ConsumersKilledWithGpuReadsPending)
{
	RuntimeDir dir;
	std::vector<std::string> env{ "XMEM_CUDASIM_DELAY_US=2000" };
	constexpr uint32_t kSlots = 6;
	Process producer = peer(env, { "produce", "crash", "--frames", "100000000", "--slots", std::to_string(kSlots),
				       "--drop", "--fps", "100" });
	ASSERT_TRUE(producer.wait_output("ready")) << producer.output();
	uint64_t seed = uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
	std::printf("seed %llu\n", (unsigned long long)seed);
	std::mt19937_64 rng(seed);
	int kills = 0, attached = 0;
	while (kills < 200) {
		// Half hold frames with a read queued; half release each frame on their
		// stream, so their done writes are still queued when they die. Each dies at
		// its own random moment: attaching, waiting, reading, releasing.
		std::vector<Process> batch;
		for (int i = 0; i < 4; i++)
			batch.push_back(
				i % 2 ? peer(env, { "consume", "crash", "--hold", std::to_string(1 + rng() % 3) })
				      : peer(env, { "consume", "crash" }));
		for (auto &c : batch) {
			// Half the kills wait until the victim has attached (bounded), so a
			// sanitizer build on two busy cores, whose processes start slowly,
			// still kills plenty of attached consumers.
			if (rng() % 2 == 0)
				(void)c.wait_output("attached", 5s);
			std::this_thread::sleep_for(std::chrono::microseconds(rng() % 40000));
			c.kill_wait();
			kills++;
			attached += c.output().find("attached") != std::string::npos;
		}
	}
	std::printf("kills %d, %d of them attached\n", kills, attached);
	EXPECT_GT(attached, kills / 4) << "too few kills hit attached consumers";

	// A survivor gets every frame intact, on its stream, after the churn: no stream
	// of the producer waits on a dead consumer.
	{
		const xmem::cuda::Driver *d = xmem::cuda::driver().value();
		auto ctx = xmem::cuda::PrimaryContext::retain(0, "test").value();
		xmem::cuda::ContextScope scope(*ctx);
		CUstream stream;
		ASSERT_EQ(d->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
		auto pool = xmem::BufferPool::open("crash", { 5s, 4, "survivor", false });
		ASSERT_TRUE(pool.ok()) << xmem::test::why(pool);
		EXPECT_TRUE(eventually([&] { return (*pool)->stats().consumers == 1; }, 10s))
			<< (*pool)->stats().consumers << " consumers";
		for (int i = 0; i < 20; i++) {
			auto f = (*pool)->receive(5s, stream);
			ASSERT_TRUE(f.ok()) << "frame " << i << ": " << xmem::test::why(f) << "\n" << producer.output();
			auto host = f->private_copy_to_cpu(stream);
			ASSERT_TRUE(host.ok()) << xmem::test::why(host);
			ASSERT_TRUE(f->release(stream).ok());
			auto words = reinterpret_cast<const uint32_t *>(host->data().data());
			uint32_t word = uint32_t(f->meta().seq * 2654435761u) | 1u;
			ASSERT_EQ(words[0], word) << "frame " << f->meta().seq;
			ASSERT_EQ(words[host->data().size() / 4 - 1], ~word) << "frame " << f->meta().seq;
		}
		pool->reset();
		d->cuStreamSynchronize(stream);
		d->cuStreamDestroy(stream);
	}

	// Every consumer is reaped and every slot comes back, as an inspector sees it.
	auto inspector = xmem::BufferPool::open("crash", { 5s, 4, "inspector", true });
	ASSERT_TRUE(inspector.ok()) << xmem::test::why(inspector);
	EXPECT_TRUE(eventually(
		[&] {
			auto st = (*inspector)->stats();
			return st.consumers == 0 && st.slots_free == kSlots;
		},
		20s))
		<< "consumers " << (*inspector)->stats().consumers << ", free " << (*inspector)->stats().slots_free;
	EXPECT_GE((*inspector)->stats().reaped, uint64_t(attached));
	EXPECT_TRUE(producer.running());
	producer.signal(SIGTERM);
	producer.wait(10s);
}

// Producers SIGKILLed at random moments under a consumer that reads on its stream:
// each time the consumer sees the pool close, its frames stay readable, and a new
// producer's pool attaches again.
TEST(CudaCrash, ProducerKilledAtRandomMoments)
{
	RuntimeDir dir;
	std::mt19937_64 rng(uint64_t(std::chrono::steady_clock::now().time_since_epoch().count()));
	const xmem::cuda::Driver *d = xmem::cuda::driver().value();
	auto ctx = xmem::cuda::PrimaryContext::retain(0, "test").value();
	xmem::cuda::ContextScope scope(*ctx);
	CUstream stream;
	ASSERT_EQ(d->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	int intact = 0, incomplete = 0;
	for (int round = 0; round < 20; round++) {
		SCOPED_TRACE("round " + std::to_string(round));
		Process producer =
			peer({ "XMEM_CUDASIM_DELAY_US=300" }, { "produce", "restart", "--frames", "100000000",
								"--slots", "4", "--drop", "--fps", "1000" });
		ASSERT_TRUE(producer.wait_output("ready")) << producer.output();
		auto pool = xmem::BufferPool::open("restart", { 5s, 4, "survivor", false });
		ASSERT_TRUE(pool.ok()) << xmem::test::why(pool);
		auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(rng() % 50000);
		std::vector<xmem::BufferGuard> kept;
		bool killed = false;
		for (;;) {
			if (!killed && std::chrono::steady_clock::now() >= deadline) {
				producer.kill_wait();
				killed = true;
			}
			auto f = (*pool)->receive(killed ? 5s : 20ms, stream);
			if (f.code() == Errc::timed_out && !killed)
				continue;
			if (f.code() == Errc::closed)
				break;
			ASSERT_TRUE(f.ok()) << xmem::test::why(f);
			if (kept.size() < 2)
				kept.push_back(std::move(f.value()));
		}
		EXPECT_TRUE(killed);
		for (auto &f : kept) {
			auto host = f.private_copy_to_cpu(stream);
			ASSERT_TRUE(host.ok()) << xmem::test::why(host);
			// A frame the producer died writing says so; every other is intact.
			if (f.incomplete()) {
				incomplete++;
				continue;
			}
			intact++;
			uint32_t word = uint32_t(f.meta().seq * 2654435761u) | 1u;
			auto words = reinterpret_cast<const uint32_t *>(host->data().data());
			EXPECT_EQ(words[0], word) << "frame " << f.meta().seq;
			EXPECT_EQ(words[host->data().size() / 4 - 1], ~word) << "frame " << f.meta().seq;
		}
	}
	std::printf("frames kept across producer deaths: %d intact, %d incomplete\n", intact, incomplete);
	EXPECT_GT(intact, 0);
	d->cuStreamDestroy(stream);
}

// Each cause a device pool can fail with, named in the error. Each needs a fresh
// process: the driver is loaded once per process.
struct ErrorCase {
	const char *what;
	std::vector<std::string> env;
	std::vector<std::string> args;
	const char *message;
};

TEST(CudaErrors, EveryCauseIsNamed)
{
	if (!on_cuda_simulator())
		GTEST_SKIP() << "the failures are the simulator's (XMEM_CUDASIM_FAIL)";
	RuntimeDir dir;
	const std::vector<ErrorCase> cases = {
		{ "no driver", { "XMEM_CUDA_DRIVER=/nonexistent/libcuda.so.1" }, {}, "no CUDA driver" },
		{ "cuInit fails", { "XMEM_CUDASIM_FAIL=init" }, {}, "cuInit failed" },
		{ "no device", { "XMEM_CUDASIM_DEVICES=0" }, {}, "cuInit failed" },
		{ "device out of range", {}, { "--device", "3" }, "CUDA device 3 out of range" },
		{ "no VMM", { "XMEM_CUDASIM_FAIL=no_vmm" }, {}, "lacks virtual memory management" },
		{ "no POSIX fds", { "XMEM_CUDASIM_FAIL=no_posix_fd" }, {}, "cannot share memory as POSIX file" },
		{ "compute mode prohibited", { "XMEM_CUDASIM_FAIL=prohibited" }, {}, "compute mode prohibited" },
		{ "allocation fails", { "XMEM_CUDASIM_FAIL=alloc" }, {}, "cuMemCreate failed" },
		{ "slot past device memory",
		  { "XMEM_CUDASIM_MEMORY=67108864" },
		  { "--size", "134217728" },
		  "cuMemCreate failed: CUDA_ERROR_OUT_OF_MEMORY" },
	};
	for (const auto &c : cases) {
		SCOPED_TRACE(c.what);
		std::vector<std::string> args{ "create", std::string("err-") + std::to_string(&c - cases.data()) };
		args.insert(args.end(), c.args.begin(), c.args.end());
		Process p = peer(c.env, args);
		EXPECT_EQ(p.wait(30s), 1) << p.output();
		EXPECT_NE(p.output().find(c.message), std::string::npos) << p.output();
	}
	// With a second device, device 1 works.
	Process two = peer({ "XMEM_CUDASIM_DEVICES=2" }, { "create", "dev1", "--device", "1" });
	EXPECT_EQ(two.wait(30s), 0) << two.output();
	// Host registration failing falls back to CPU ordering, and says so.
	Process noreg = peer({ "XMEM_CUDASIM_FAIL=no_host_register" }, { "create", "noreg" });
	EXPECT_EQ(noreg.wait(30s), 0) << noreg.output();
	EXPECT_NE(noreg.output().find("ok ordering=cpu"), std::string::npos) << noreg.output();
}

TEST(CudaErrors, AnFdThatIsNotACudaHandleIsRefused)
{
	int fd = ::memfd_create("not-cuda", MFD_CLOEXEC);
	ASSERT_GE(fd, 0);
	ASSERT_EQ(::ftruncate(fd, 2 << 20), 0);
	std::vector<xmem::UniqueFd> fds;
	fds.emplace_back(fd);
	xmem::ArenaSpec spec{ "fake", xmem::Storage::cuda, 0, 1, 4096, 0600 };
	auto arena = xmem::import_cuda_arena(spec, 2 << 20, std::move(fds), "pool 'fake'");
	ASSERT_FALSE(arena.ok());
	EXPECT_EQ(arena.code(), Errc::not_a_pool);
	EXPECT_NE(arena.error().message.find("is not a CUDA allocation"), std::string::npos) << arena.error().message;
}

namespace {

// A consumer that never blocks in receive(): receive(0), then poll() its fd, as
// xmemsrc, Python's frames() and event-loop applications do. Returns the frames'
// sequence numbers and first words, or stops at DEADLINE.
struct Polled {
	std::vector<uint64_t> seqs;
	std::vector<uint32_t> first_words;
	std::string error;
};

Polled poll_frames(xmem::BufferPool &consumer, size_t count, std::chrono::seconds limit)
{
	Polled got;
	auto deadline = std::chrono::steady_clock::now() + limit;
	while (got.seqs.size() < count && std::chrono::steady_clock::now() < deadline) {
		auto r = consumer.receive(0s);
		if (r.ok()) {
			got.seqs.push_back(r->meta().seq);
			auto host = r->private_copy_to_cpu();
			if (!host.ok()) {
				got.error = xmem::test::why(host);
				return got;
			}
			uint32_t word;
			std::memcpy(&word, host->data().data(), sizeof(word));
			got.first_words.push_back(word);
			continue;
		}
		if (r.code() != Errc::timed_out) {
			got.error = xmem::test::why(r);
			return got;
		}
		pollfd p{ consumer.fd(), POLLIN, 0 };
		::poll(&p, 1, 100);
	}
	return got;
}

} // namespace

// A frame taken off the queue by a receive without a stream whose time runs out
// before the producer's GPU writes are done stays the consumer's: the next receive
// hands it out, and the pool's fd polls readable again so a poller comes back for it.
// The producer's stream is held by a wait on a host word, so the frame is certainly
// not ready at the first receive(0). (Issue 15: the frame used to be released and
// lost; with the old code the second half of this test times out.)
TEST(CudaPool, APollingConsumerKeepsAFrameWhoseWritesAreLate)
{
	RuntimeDir dir;
	if (!on_cuda_simulator() && !xmem::cuda::check_device(0, "").value().stream_mem_ops)
		GTEST_SKIP() << "this GPU has no 64-bit stream memory operations";
	constexpr uint64_t kSize = 64 * 1024;
	auto owner = xmem::BufferPool::create("late", cuda_config(kSize, 2));
	ASSERT_TRUE(owner.ok()) << xmem::test::why(owner);
	auto consumer = xmem::BufferPool::open("late");
	ASSERT_TRUE(consumer.ok()) << xmem::test::why(consumer);
	const xmem::cuda::Driver *d = xmem::cuda::driver().value();
	auto ctx = xmem::cuda::PrimaryContext::retain(0, "test").value();
	xmem::cuda::ContextScope scope(*ctx);
	CUstream produce;
	ASSERT_EQ(d->cuStreamCreate(&produce, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	// A page-locked host word the producer's stream waits on.
	GatedHost host(0);
	ASSERT_TRUE(host.ok);
	uint64_t *gate = host.gate();
	CUdeviceptr gate_dev = host.gate_dev;

	auto f = (*owner)->acquire(5s, produce);
	ASSERT_TRUE(f.ok()) << xmem::test::why(f);
	// The producer's writes wait for the gate.
	ASSERT_EQ(d->cuStreamWaitValue64(produce, gate_dev, 1, CU_STREAM_WAIT_VALUE_GEQ), CUDA_SUCCESS);
	ASSERT_EQ(d->cuMemsetD32Async(f->device_ptr(), 0x5eed0001, kSize / 4, produce), CUDA_SUCCESS);
	f->meta_mut().value()->size = kSize;
	ASSERT_TRUE((*owner)->publish(std::move(f.value()), produce).ok());

	auto early = (*consumer)->receive(0s);
	ASSERT_FALSE(early.ok()) << "the frame cannot be ready: its writes wait for the gate";
	EXPECT_EQ(early.code(), Errc::timed_out);
	EXPECT_NE(early.error().message.find("not done yet"), std::string::npos) << early.error().message;
	auto waited = (*consumer)->receive(50ms);
	EXPECT_EQ(waited.code(), Errc::timed_out) << "the gate is still shut";

	__atomic_store_n(gate, 1, __ATOMIC_RELEASE);
	Polled got = poll_frames(**consumer, 1, 10s);
	ASSERT_TRUE(got.error.empty()) << got.error;
	ASSERT_EQ(got.seqs.size(), 1u) << "the frame whose writes were late never arrived";
	EXPECT_EQ(got.seqs[0], 1u);
	EXPECT_EQ(got.first_words[0], 0x5eed0001u);

	// A parked frame goes back to the owner when the consumer closes.
	auto g = (*owner)->acquire(5s, produce);
	ASSERT_TRUE(g.ok()) << xmem::test::why(g);
	*gate = 0;
	ASSERT_EQ(d->cuStreamWaitValue64(produce, gate_dev, 2, CU_STREAM_WAIT_VALUE_GEQ), CUDA_SUCCESS);
	g->meta_mut().value()->size = kSize;
	ASSERT_TRUE((*owner)->publish(std::move(g.value()), produce).ok());
	EXPECT_EQ((*consumer)->receive(0s).code(), Errc::timed_out);
	// Closing releases the parked frame first; then it synchronizes this process's
	// primary context, which the producer's stream (in this same process) belongs
	// to: the gate opens a little later.
	std::thread opener([gate] {
		std::this_thread::sleep_for(200ms);
		__atomic_store_n(gate, 2, __ATOMIC_RELEASE);
	});
	consumer->reset();
	opener.join();
	ASSERT_EQ(d->cuStreamSynchronize(produce), CUDA_SUCCESS);
	EXPECT_TRUE(eventually([&] { return (*owner)->stats().slots_free == 2; }))
		<< (*owner)->stats().slots_free << " of 2 slots free after the consumer closed";
	owner->reset();
	d->cuStreamDestroy(produce);
}

// The reproduction: 300 frames written and published on a stream while the
// simulator runs each stream operation up to 300 us late; a consumer that only ever
// calls receive(0) and polls the fd gets all of them, in order, bit-exact (block
// policy: the pool drops nothing on its own).
TEST(CudaPool, APollingConsumerGetsEveryFrame)
{
	RuntimeDir dir;
	if (!on_cuda_simulator() && !xmem::cuda::check_device(0, "").value().stream_mem_ops)
		GTEST_SKIP() << "this GPU has no 64-bit stream memory operations";
	constexpr uint32_t kFrames = 300;
	constexpr uint64_t kSize = 64 * 1024;
	auto config = cuda_config(kSize, 4);
	config.policy = xmem::Policy::block;
	config.block_timeout = 10s;
	auto owner = xmem::BufferPool::create("polled", config);
	ASSERT_TRUE(owner.ok()) << xmem::test::why(owner);
	auto consumer = xmem::BufferPool::open("polled");
	ASSERT_TRUE(consumer.ok()) << xmem::test::why(consumer);
	const xmem::cuda::Driver *d = xmem::cuda::driver().value();
	auto ctx = xmem::cuda::PrimaryContext::retain(0, "test").value();
	std::string produced;
	std::thread producer([&] {
		xmem::cuda::ContextScope scope(*ctx);
		CUstream stream;
		if (d->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
			produced = "cuStreamCreate failed";
			return;
		}
		for (uint32_t n = 1; n <= kFrames && produced.empty(); n++) {
			auto f = (*owner)->acquire(10s, stream);
			if (!f.ok()) {
				produced = xmem::test::why(f);
				break;
			}
			if (d->cuMemsetD32Async(f->device_ptr(), n, kSize / 4, stream) != CUDA_SUCCESS)
				produced = "cuMemsetD32Async failed";
			f->meta_mut().value()->size = kSize;
			if (auto p = (*owner)->publish(std::move(f.value()), stream); !p.ok())
				produced = xmem::test::why(p);
		}
		d->cuStreamSynchronize(stream);
		d->cuStreamDestroy(stream);
	});
	Polled got = poll_frames(**consumer, kFrames, 120s);
	producer.join();
	ASSERT_TRUE(produced.empty()) << produced;
	ASSERT_TRUE(got.error.empty()) << got.error;
	EXPECT_EQ((*owner)->stats().dropped, 0u);
	ASSERT_EQ(got.seqs.size(), kFrames) << got.seqs.size() << " of " << kFrames << " frames arrived";
	for (uint32_t i = 0; i < kFrames; i++) {
		ASSERT_EQ(got.seqs[i], i + 1) << "frame " << i;
		ASSERT_EQ(got.first_words[i], i + 1) << "frame " << i;
	}
}

// cuCtxCreate_v2 and cuCtxDestroy_v2 of the driver in use (cuda.h 13's cuCtxCreate is
// another call): a context of the test's own, made as GStreamer's CUDA library makes
// its, current once made. Null where the driver lacks them.
struct ContextCalls {
	CUresult (*create)(CUcontext *, unsigned int, CUdevice) = nullptr;
	decltype(&cuCtxDestroy) destroy = nullptr;
};

ContextCalls context_calls(const xmem::cuda::Driver &d)
{
	ContextCalls calls;
	void *lib = dlopen(d.library.c_str(), RTLD_LAZY | RTLD_NOLOAD);
	if (!lib)
		return calls;
	calls.create = reinterpret_cast<decltype(calls.create)>(dlsym(lib, "cuCtxCreate_v2"));
	calls.destroy = reinterpret_cast<decltype(calls.destroy)>(dlsym(lib, "cuCtxDestroy_v2"));
	dlclose(lib); // xmem keeps the driver loaded
	return calls;
}

// A caller's streams may belong to a context of its own (GStreamer's, a framework's):
// - a private copy (copy_to_cuda) used on such a stream must be memory every context
//   of the device reaches: cuMemAlloc's belongs to the context that made it, and the
//   simulator faults another context's stream that touches it (as a real driver
//   without peer access does);
// - a stream-less publish waits for "every stream of this process", which
//   cuCtxSynchronize alone (the current context's) does not reach: here the producer's
//   writes are on its own context's stream, held by a host gate, and the publish must
//   wait for them (before issue 15 it returned at once, and the consumer read the slot
//   before the writes).
TEST(CudaPool, CopiesAndStreamLessCallsReachEveryContext)
{
	RuntimeDir dir;
	if (!on_cuda_simulator() && !xmem::cuda::check_device(0, "").value().stream_mem_ops)
		GTEST_SKIP() << "this GPU has no 64-bit stream memory operations";
	constexpr uint64_t kSize = 64 * 1024;
	const xmem::cuda::Driver *d = xmem::cuda::driver().value();
	auto [create, destroy] = context_calls(*d);
	ASSERT_TRUE(create && destroy) << d->library;
	auto info = xmem::cuda::check_device(0, "test").value();
	CUcontext own = nullptr;
	ASSERT_EQ(create(&own, 0, info.device), CUDA_SUCCESS); // current until popped
	CUstream theirs = nullptr;
	ASSERT_EQ(d->cuStreamCreate(&theirs, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	// The gate: a page-locked host word the created context's stream waits on.
	const size_t page = size_t(sysconf(_SC_PAGESIZE));
	void *host = mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ASSERT_NE(host, MAP_FAILED);
	ASSERT_EQ(d->cuMemHostRegister(host, page, CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE),
		  CUDA_SUCCESS);
	auto *gate = static_cast<uint64_t *>(host);
	CUdeviceptr gate_dev;
	ASSERT_EQ(d->cuMemHostGetDevicePointer(&gate_dev, gate, 0), CUDA_SUCCESS);
	CUcontext popped;
	ASSERT_EQ(d->cuCtxPopCurrent(&popped), CUDA_SUCCESS);

	auto owner = xmem::BufferPool::create("ctxcopy", cuda_config(kSize, 2));
	ASSERT_TRUE(owner.ok()) << xmem::test::why(owner);
	auto consumer = xmem::BufferPool::open("ctxcopy");
	ASSERT_TRUE(consumer.ok()) << xmem::test::why(consumer);

	// The writes go on the created context's stream and wait for the gate; the
	// publish names no stream.
	auto f = (*owner)->acquire(5s, theirs);
	ASSERT_TRUE(f.ok()) << xmem::test::why(f);
	{
		ASSERT_EQ(d->cuCtxPushCurrent(own), CUDA_SUCCESS);
		ASSERT_EQ(d->cuStreamWaitValue64(theirs, gate_dev, 1, CU_STREAM_WAIT_VALUE_GEQ), CUDA_SUCCESS);
		ASSERT_EQ(d->cuMemsetD32Async(f->device_ptr(), 0xc0ffee01, kSize / 4, theirs), CUDA_SUCCESS);
		ASSERT_EQ(d->cuCtxPopCurrent(&popped), CUDA_SUCCESS);
	}
	f->meta_mut().value()->size = kSize;
	std::thread opener([gate] {
		std::this_thread::sleep_for(300ms);
		__atomic_store_n(gate, 1, __ATOMIC_RELEASE);
	});
	auto started = std::chrono::steady_clock::now();
	auto published = (*owner)->publish(std::move(f.value()));
	auto took = std::chrono::steady_clock::now() - started;
	opener.join();
	ASSERT_TRUE(published.ok()) << xmem::test::why(published);
	EXPECT_GE(took, 250ms) << "a publish without a stream did not wait for the other context's stream";

	auto r = (*consumer)->receive(5s);
	ASSERT_TRUE(r.ok()) << xmem::test::why(r);
	auto seen = r->private_copy_to_cpu();
	ASSERT_TRUE(seen.ok()) << xmem::test::why(seen);
	uint32_t first;
	std::memcpy(&first, seen->data().data(), sizeof(first));
	EXPECT_EQ(first, 0xc0ffee01u) << "the consumer read the slot before the producer's writes";

	// A private device copy, made and read on the created context's stream.
	auto copy = r->private_copy_to_cuda(0, theirs);
	ASSERT_TRUE(copy.ok()) << xmem::test::why(copy);
	auto back = copy->private_copy_to_cpu(theirs);
	ASSERT_TRUE(back.ok()) << xmem::test::why(back);
	ASSERT_TRUE(xmem::cuda_synchronize(0, theirs).ok()) << "the copy faulted on the other context's stream";
	const auto *words = reinterpret_cast<const uint32_t *>(back->data().data());
	for (size_t i = 0; i < kSize / 4; i++)
		ASSERT_EQ(words[i], 0xc0ffee01u) << "word " << i;

	copy->reset();
	back->reset();
	r->reset();
	seen->reset();
	owner->reset();
	consumer->reset();
	EXPECT_TRUE(xmem::cuda_synchronize_context(own).ok());
	d->cuStreamDestroy(theirs);
	ASSERT_EQ(d->cuCtxPushCurrent(own), CUDA_SUCCESS); // the registration is the created context's
	EXPECT_EQ(d->cuMemHostUnregister(host), CUDA_SUCCESS);
	munmap(host, page);
	EXPECT_EQ(destroy(own), CUDA_SUCCESS); // and pops it
}

// A consumer whose socket hangs up while a GPU write of its own is still queued (a
// killed process's device files may close after its socket): it took a slot for
// writing in place, queued the write behind a host gate, released the slot on its
// stream (a done write queued after the write) and hung up. Until its process has
// exited the owner leaves its done words alone, so the owner's stream, rewriting that
// slot, waits for the late write; and it keeps the consumer's record taken, so a late
// done write cannot land in another consumer's words: the record is "quarantined".
// Once the process is gone the record comes back. Before issue 15 the reaper stored
// the done words at the hang-up, the owner's rewrite ran at once, and the late write
// landed on top of it.
TEST(CudaCrash, AHungUpConsumersLateGpuWritesLandBeforeTheSlotIsRewritten)
{
	RuntimeDir dir;
	if (!on_cuda_simulator() && !xmem::cuda::check_device(0, "").value().stream_mem_ops)
		GTEST_SKIP() << "this GPU has no 64-bit stream memory operations";
	constexpr uint64_t kSize = 64 * 1024;
	auto config = cuda_config(kSize, 1); // one slot: the owner rewrites the one written
	config.max_consumers = 1;
	auto owner = xmem::BufferPool::create("late-write", config);
	ASSERT_TRUE(owner.ok()) << xmem::test::why(owner);
	auto &p = **owner;
	const xmem::cuda::Driver *d = xmem::cuda::driver().value();
	auto ctx = xmem::cuda::PrimaryContext::retain(0, "test").value();
	xmem::cuda::ContextScope scope(*ctx);
	CUstream stream;
	ASSERT_EQ(d->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	// Page-locked host memory to read the slot back on the owner's stream.
	GatedHost host(kSize);
	ASSERT_TRUE(host.ok);

	Process late = peer({}, { "hang-up-writing", "late-write", "--gate-ms", "1500", "--linger-ms", "500" });
	ASSERT_TRUE(eventually([&] { return p.stats().consumers == 1; })) << late.output();
	auto f = p.acquire(5s, stream);
	ASSERT_TRUE(f.ok()) << xmem::test::why(f);
	ASSERT_EQ(d->cuMemsetD32Async(f->device_ptr(), 0x11111111, kSize / 4, stream), CUDA_SUCCESS);
	f->meta_mut().value()->size = kSize;
	ASSERT_TRUE(p.publish(std::move(f.value()), stream).ok());
	ASSERT_TRUE(late.wait_output("hung-up slot=0 sockets=1")) << late.output();
	ASSERT_TRUE(eventually([&] { return p.stats().consumers == 0; })) << "the hang-up was not reaped";
	EXPECT_EQ(late.output().find("landed"), std::string::npos) << "the gate opened too early";

	// The owner rewrites the slot on its stream while the late write is still queued.
	auto again = p.acquire(5s, stream);
	ASSERT_TRUE(again.ok()) << xmem::test::why(again);
	ASSERT_EQ(d->cuMemsetD32Async(again->device_ptr(), 0x33333333, kSize / 4, stream), CUDA_SUCCESS);
	// No new consumer takes the record while the late writes may land.
	xmem::OpenOptions quick;
	quick.timeout = 200ms;
	EXPECT_EQ(xmem::BufferPool::open("late-write", quick).code(), Errc::full)
		<< "the quarantined record was given to a new consumer";
	const char *inspect = std::getenv("XMEM_INSPECT");
	ASSERT_TRUE(inspect);
	Process tool({ inspect, "--json", "late-write" });
	EXPECT_EQ(tool.wait(10s), 0) << tool.output();
	EXPECT_NE(tool.output().find("\"state\":\"quarantined\""), std::string::npos) << tool.output();

	// The late write lands, the process exits; the owner's rewrite came after it.
	EXPECT_EQ(late.wait(20s), 0) << late.output();
	EXPECT_NE(late.output().find("landed"), std::string::npos) << late.output();
	ASSERT_EQ(d->cuMemcpyDtoHAsync(host.data(), again->device_ptr(), kSize, stream), CUDA_SUCCESS);
	ASSERT_EQ(d->cuStreamSynchronize(stream), CUDA_SUCCESS);
	const uint32_t *words = host.data();
	for (size_t i = 0; i < kSize / 4; i++)
		ASSERT_EQ(words[i], 0x33333333u) << "word " << i << ": the late in-place write landed on the rewrite";
	again->reset();
	// And the record comes back.
	xmem::OpenOptions patient;
	patient.timeout = 10s;
	auto consumer = xmem::BufferPool::open("late-write", patient);
	EXPECT_TRUE(consumer.ok()) << xmem::test::why(consumer);
	consumer = xmem::Error{};
	owner->reset();
	d->cuStreamDestroy(stream);
}

// GPU ordering, with the streams held at the interesting moment by a wait on a host
// word, so that the same test proves the waits on a real GPU, where copies finish in
// microseconds and an ordering test without a hold passes whether or not they are
// right. Here: the producer's writes are held; the consumer's stream, which received
// the frame, must not read the slot before them.
TEST(CudaOrdering, AConsumersStreamWaitsForTheProducersHeldWrites)
{
	RuntimeDir dir;
	if (!on_cuda_simulator() && !xmem::cuda::check_device(0, "").value().stream_mem_ops)
		GTEST_SKIP() << "this GPU has no 64-bit stream memory operations";
	constexpr uint64_t kSize = 64 * 1024;
	auto owner = xmem::BufferPool::create("held-writes", cuda_config(kSize, 2));
	ASSERT_TRUE(owner.ok()) << xmem::test::why(owner);
	auto consumer = xmem::BufferPool::open("held-writes");
	ASSERT_TRUE(consumer.ok()) << xmem::test::why(consumer);
	const xmem::cuda::Driver *d = xmem::cuda::driver().value();
	auto ctx = xmem::cuda::PrimaryContext::retain(0, "test").value();
	xmem::cuda::ContextScope scope(*ctx);
	CUstream produce, read;
	ASSERT_EQ(d->cuStreamCreate(&produce, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	ASSERT_EQ(d->cuStreamCreate(&read, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	GatedHost host(kSize);
	ASSERT_TRUE(host.ok);
	std::memset(host.data(), 0, kSize);

	auto f = (*owner)->acquire(5s, produce);
	ASSERT_TRUE(f.ok()) << xmem::test::why(f);
	ASSERT_EQ(d->cuStreamWaitValue64(produce, host.gate_dev, 1, CU_STREAM_WAIT_VALUE_GEQ), CUDA_SUCCESS);
	ASSERT_EQ(d->cuMemsetD32Async(f->device_ptr(), 0xabababab, kSize / 4, produce), CUDA_SUCCESS);
	f->meta_mut().value()->size = kSize;
	ASSERT_TRUE((*owner)->publish(std::move(f.value()), produce).ok());

	// Received on a stream: returns at once, the stream waits for the writes.
	auto r = (*consumer)->receive(5s, read);
	ASSERT_TRUE(r.ok()) << xmem::test::why(r);
	ASSERT_EQ(d->cuMemcpyDtoHAsync(host.data(), r->device_ptr(), kSize, read), CUDA_SUCCESS);
	std::this_thread::sleep_for(200ms);
	EXPECT_EQ(d->cuStreamQuery(read), CUDA_ERROR_NOT_READY) << "the read ran before the producer's held writes";
	EXPECT_EQ(__atomic_load_n(&host.data()[0], __ATOMIC_ACQUIRE), 0u) << "the slot was read before its writes";

	host.open();
	ASSERT_EQ(d->cuStreamSynchronize(read), CUDA_SUCCESS);
	for (size_t i = 0; i < kSize / 4; i++)
		ASSERT_EQ(host.data()[i], 0xababababu) << "word " << i;
	ASSERT_TRUE(r->release(read).ok());
	ASSERT_EQ(d->cuStreamSynchronize(produce), CUDA_SUCCESS);
	ASSERT_EQ(d->cuStreamSynchronize(read), CUDA_SUCCESS);
	consumer->reset();
	owner->reset();
	d->cuStreamDestroy(produce);
	d->cuStreamDestroy(read);
}

// A frame ticket of a device pool (issue 19): the ticketed frame's writes are held on
// the producer's stream; a redemption returns only once they landed (the CPU waits, as
// get() does: a redeemed frame is ready for any stream). Another redemption than the
// ticket's count is refused, and the slot comes back once the redeemer let go.
TEST(CudaPool, ATicketsRedemptionWaitsForTheProducersHeldWrites)
{
	RuntimeDir dir;
	if (!on_cuda_simulator() && !xmem::cuda::check_device(0, "").value().stream_mem_ops)
		GTEST_SKIP() << "this GPU has no 64-bit stream memory operations";
	constexpr uint64_t kSize = 64 * 1024;
	auto owner = xmem::BufferPool::create("ticket-writes", cuda_config(kSize, 1));
	ASSERT_TRUE(owner.ok()) << xmem::test::why(owner);
	auto consumer = xmem::BufferPool::open("ticket-writes");
	ASSERT_TRUE(consumer.ok()) << xmem::test::why(consumer);
	const xmem::cuda::Driver *d = xmem::cuda::driver().value();
	auto ctx = xmem::cuda::PrimaryContext::retain(0, "test").value();
	xmem::cuda::ContextScope scope(*ctx);
	CUstream produce;
	ASSERT_EQ(d->cuStreamCreate(&produce, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	GatedHost host(kSize);
	ASSERT_TRUE(host.ok);
	std::memset(host.data(), 0, kSize);

	auto f = (*owner)->acquire(5s, produce);
	ASSERT_TRUE(f.ok()) << xmem::test::why(f);
	ASSERT_EQ(d->cuStreamWaitValue64(produce, host.gate_dev, 1, CU_STREAM_WAIT_VALUE_GEQ), CUDA_SUCCESS);
	ASSERT_EQ(d->cuMemsetD32Async(f->device_ptr(), 0xcdcdcdcd, kSize / 4, produce), CUDA_SUCCESS);
	f->meta_mut().value()->size = kSize;
	auto ticket = (*owner)->publish_ticket(std::move(f.value()), 1, 30s, produce);
	ASSERT_TRUE(ticket.ok()) << xmem::test::why(ticket);

	std::atomic<bool> returned{ false };
	xmem::Result<xmem::BufferGuard> redeemed = xmem::Error{};
	std::thread redeemer([&] {
		redeemed = (*consumer)->get(*ticket);
		returned = true;
	});
	std::this_thread::sleep_for(200ms);
	EXPECT_FALSE(returned.load()) << "the redemption returned before the producer's held writes";
	host.open();
	redeemer.join();
	ASSERT_TRUE(redeemed.ok()) << xmem::test::why(redeemed);
	EXPECT_EQ(redeemed->meta().seq, ticket->seq);
	ASSERT_EQ(d->cuMemcpyDtoHAsync(host.data(), redeemed->device_ptr(), kSize, produce), CUDA_SUCCESS);
	ASSERT_EQ(d->cuStreamSynchronize(produce), CUDA_SUCCESS);
	for (size_t i = 0; i < kSize / 4; i++)
		ASSERT_EQ(host.data()[i], 0xcdcdcdcdu) << "word " << i;
	EXPECT_EQ((*consumer)->get(*ticket).code(), Errc::bad_ticket) << "issued for one redemption";
	redeemed = xmem::Error{};
	auto next = (*owner)->acquire(5s, produce);
	ASSERT_TRUE(next.ok()) << "the ticket's slot came back: " << xmem::test::why(next);
	next = xmem::Error{};
	ASSERT_EQ(d->cuStreamSynchronize(produce), CUDA_SUCCESS);
	consumer->reset();
	owner->reset();
	d->cuStreamDestroy(produce);
}

// The other way: a consumer's reads of a frame are held on its stream, and it released
// the frame on that stream. The owner takes the slot back for the next frame (one
// slot) and rewrites it on its stream, which must wait for the held reads.
TEST(CudaOrdering, TheProducersStreamWaitsForAConsumersHeldReads)
{
	RuntimeDir dir;
	if (!on_cuda_simulator() && !xmem::cuda::check_device(0, "").value().stream_mem_ops)
		GTEST_SKIP() << "this GPU has no 64-bit stream memory operations";
	constexpr uint64_t kSize = 64 * 1024;
	auto owner = xmem::BufferPool::create("held-reads", cuda_config(kSize, 1));
	ASSERT_TRUE(owner.ok()) << xmem::test::why(owner);
	auto consumer = xmem::BufferPool::open("held-reads");
	ASSERT_TRUE(consumer.ok()) << xmem::test::why(consumer);
	const xmem::cuda::Driver *d = xmem::cuda::driver().value();
	auto ctx = xmem::cuda::PrimaryContext::retain(0, "test").value();
	xmem::cuda::ContextScope scope(*ctx);
	CUstream produce, read;
	ASSERT_EQ(d->cuStreamCreate(&produce, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	ASSERT_EQ(d->cuStreamCreate(&read, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	GatedHost host(kSize);
	ASSERT_TRUE(host.ok);

	auto f = (*owner)->acquire(5s, produce);
	ASSERT_TRUE(f.ok()) << xmem::test::why(f);
	ASSERT_EQ(d->cuMemsetD32Async(f->device_ptr(), 0x11111111, kSize / 4, produce), CUDA_SUCCESS);
	f->meta_mut().value()->size = kSize;
	ASSERT_TRUE((*owner)->publish(std::move(f.value()), produce).ok());
	auto r = (*consumer)->receive(5s, read);
	ASSERT_TRUE(r.ok()) << xmem::test::why(r);
	ASSERT_EQ(d->cuStreamWaitValue64(read, host.gate_dev, 1, CU_STREAM_WAIT_VALUE_GEQ), CUDA_SUCCESS);
	ASSERT_EQ(d->cuMemcpyDtoHAsync(host.data(), r->device_ptr(), kSize, read), CUDA_SUCCESS);
	ASSERT_TRUE(r->release(read).ok());

	auto again = (*owner)->acquire(5s, produce);
	ASSERT_TRUE(again.ok()) << xmem::test::why(again);
	ASSERT_EQ(d->cuMemsetD32Async(again->device_ptr(), 0x22222222, kSize / 4, produce), CUDA_SUCCESS);
	std::this_thread::sleep_for(200ms);
	EXPECT_EQ(d->cuStreamQuery(produce), CUDA_ERROR_NOT_READY) << "the rewrite ran before the held reads";

	host.open();
	ASSERT_EQ(d->cuStreamSynchronize(read), CUDA_SUCCESS);
	ASSERT_EQ(d->cuStreamSynchronize(produce), CUDA_SUCCESS);
	for (size_t i = 0; i < kSize / 4; i++)
		ASSERT_EQ(host.data()[i], 0x11111111u)
			<< "word " << i << ": the slot was rewritten under the held read";
	again->reset();
	consumer->reset();
	owner->reset();
	d->cuStreamDestroy(produce);
	d->cuStreamDestroy(read);
}

// Closing a pool while a ready write is still queued on a stream of another context
// (one xmem keeps no handle of): the close waits for the write by its word before the
// control segment is unregistered, or the GPU would write to an address that is gone
// (the simulator faults the stream then). Nobody holds the frame, so no done word
// waits for it either.
TEST(CudaOrdering, ClosingAPoolWaitsForItsReadyWritesOnAnotherContextsStream)
{
	RuntimeDir dir;
	if (!on_cuda_simulator() && !xmem::cuda::check_device(0, "").value().stream_mem_ops)
		GTEST_SKIP() << "this GPU has no 64-bit stream memory operations";
	const xmem::cuda::Driver *d = xmem::cuda::driver().value();
	auto [create, destroy] = context_calls(*d);
	ASSERT_TRUE(create && destroy) << d->library;
	auto info = xmem::cuda::check_device(0, "test").value();
	CUcontext own = nullptr;
	ASSERT_EQ(create(&own, 0, info.device), CUDA_SUCCESS); // current until popped
	CUstream theirs = nullptr;
	ASSERT_EQ(d->cuStreamCreate(&theirs, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	GatedHost host(4096);
	ASSERT_TRUE(host.ok);
	CUcontext popped;
	ASSERT_EQ(d->cuCtxPopCurrent(&popped), CUDA_SUCCESS);

	auto owner = xmem::BufferPool::create("close-drain", cuda_config(64 * 1024, 1));
	ASSERT_TRUE(owner.ok()) << xmem::test::why(owner);
	auto f = (*owner)->acquire(5s, theirs);
	ASSERT_TRUE(f.ok()) << xmem::test::why(f);
	ASSERT_EQ(d->cuCtxPushCurrent(own), CUDA_SUCCESS);
	ASSERT_EQ(d->cuStreamWaitValue64(theirs, host.gate_dev, 1, CU_STREAM_WAIT_VALUE_GEQ), CUDA_SUCCESS);
	ASSERT_EQ(d->cuCtxPopCurrent(&popped), CUDA_SUCCESS);
	ASSERT_TRUE((*owner)->publish(std::move(f.value()), theirs).ok());

	std::thread opener([&host] {
		std::this_thread::sleep_for(300ms);
		host.open();
	});
	auto started = std::chrono::steady_clock::now();
	owner->reset(); // the ready write waits behind the gate
	auto took = std::chrono::steady_clock::now() - started;
	opener.join();
	EXPECT_GE(took, 250ms) << "the pool closed under a ready write still queued on another context's stream";
	ASSERT_EQ(d->cuCtxPushCurrent(own), CUDA_SUCCESS);
	EXPECT_EQ(d->cuStreamSynchronize(theirs), CUDA_SUCCESS) << "the queued write faulted its stream";
	d->cuStreamDestroy(theirs);
	ASSERT_EQ(destroy(own), CUDA_SUCCESS);
}

// A producer writing on two streams: frame 1 published on stream A, held back by a gate,
// so its ready write is still queued when the slot (nobody took frame 1) is acquired
// again on stream B. Without an order between them B's ready write for frame 2 could
// land first and A's late write then take the word back to frame 1: consumers waiting
// for frame 2 would wait forever. Acquire on B therefore waits on the GPU for the
// slot's last ready write before anything queued after it.
TEST(CudaOrdering, ASlotsReadyWordNeverGoesBackToAnOlderFrame)
{
	RuntimeDir dir;
	if (!on_cuda_simulator() && !xmem::cuda::check_device(0, "").value().stream_mem_ops)
		GTEST_SKIP() << "this GPU has no 64-bit stream memory operations";
	constexpr uint64_t kSize = 64 * 1024;
	auto owner = xmem::BufferPool::create("two-streams", cuda_config(kSize, 1));
	ASSERT_TRUE(owner.ok()) << xmem::test::why(owner);
	const xmem::cuda::Driver *d = xmem::cuda::driver().value();
	auto ctx = xmem::cuda::PrimaryContext::retain(0, "test").value();
	xmem::cuda::ContextScope scope(*ctx);
	CUstream a, b;
	ASSERT_EQ(d->cuStreamCreate(&a, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	ASSERT_EQ(d->cuStreamCreate(&b, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	GatedHost host(kSize);
	ASSERT_TRUE(host.ok);

	auto f = (*owner)->acquire(5s, a);
	ASSERT_TRUE(f.ok()) << xmem::test::why(f);
	ASSERT_EQ(d->cuStreamWaitValue64(a, host.gate_dev, 1, CU_STREAM_WAIT_VALUE_GEQ), CUDA_SUCCESS);
	ASSERT_EQ(d->cuMemsetD32Async(f->device_ptr(), 0x11111111, kSize / 4, a), CUDA_SUCCESS);
	f->meta_mut().value()->size = kSize;
	ASSERT_TRUE((*owner)->publish(std::move(f.value()), a).ok());

	// Nobody holds frame 1: the slot is free at once, and B's work must still wait.
	auto again = (*owner)->acquire(5s, b);
	ASSERT_TRUE(again.ok()) << xmem::test::why(again);
	ASSERT_EQ(d->cuMemsetD32Async(again->device_ptr(), 0x22222222, kSize / 4, b), CUDA_SUCCESS);
	std::this_thread::sleep_for(200ms);
	EXPECT_EQ(d->cuStreamQuery(b), CUDA_ERROR_NOT_READY) << "stream B ran before frame 1's ready write on stream A";

	auto consumer = xmem::BufferPool::open("two-streams");
	ASSERT_TRUE(consumer.ok()) << xmem::test::why(consumer);
	again->meta_mut().value()->size = kSize;
	ASSERT_TRUE((*owner)->publish(std::move(again.value()), b).ok());
	host.open();
	// Frame 2 is ready once B's writes land, and stays so after A's.
	auto r = (*consumer)->receive(5s);
	ASSERT_TRUE(r.ok()) << xmem::test::why(r);
	EXPECT_EQ(r->meta().seq, 2u);
	auto seen = r->private_copy_to_cpu();
	ASSERT_TRUE(seen.ok()) << xmem::test::why(seen);
	EXPECT_EQ(reinterpret_cast<const uint32_t *>(seen->data().data())[0], 0x22222222u);
	ASSERT_EQ(d->cuStreamSynchronize(a), CUDA_SUCCESS);
	ASSERT_EQ(d->cuStreamSynchronize(b), CUDA_SUCCESS);
	r->reset();
	consumer->reset();
	owner->reset();
	d->cuStreamDestroy(a);
	d->cuStreamDestroy(b);
}

// As above, but the consumer still holds the slot for writing when its socket goes (a
// process killed while writing in place): no done write follows its queued write, so
// the owner must keep the slot itself out of use until the process has exited. Before
// issue 15 the reaper freed it at once, and the late write landed on the next frame.
TEST(CudaCrash, ASlotHeldForWritingAtAHangUpStaysOutOfUseUntilTheExit)
{
	RuntimeDir dir;
	if (!on_cuda_simulator() && !xmem::cuda::check_device(0, "").value().stream_mem_ops)
		GTEST_SKIP() << "this GPU has no 64-bit stream memory operations";
	constexpr uint64_t kSize = 64 * 1024;
	auto owner = xmem::BufferPool::create("late-held", cuda_config(kSize, 1));
	ASSERT_TRUE(owner.ok()) << xmem::test::why(owner);
	auto &p = **owner;
	const xmem::cuda::Driver *d = xmem::cuda::driver().value();
	auto ctx = xmem::cuda::PrimaryContext::retain(0, "test").value();
	xmem::cuda::ContextScope scope(*ctx);
	CUstream stream;
	ASSERT_EQ(d->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	GatedHost host(kSize);
	ASSERT_TRUE(host.ok);

	Process late =
		peer({}, { "hang-up-writing", "late-held", "--gate-ms", "1000", "--linger-ms", "300", "--keep" });
	ASSERT_TRUE(eventually([&] { return p.stats().consumers == 1; })) << late.output();
	auto f = p.acquire(5s, stream);
	ASSERT_TRUE(f.ok()) << xmem::test::why(f);
	ASSERT_EQ(d->cuMemsetD32Async(f->device_ptr(), 0x11111111, kSize / 4, stream), CUDA_SUCCESS);
	f->meta_mut().value()->size = kSize;
	ASSERT_TRUE(p.publish(std::move(f.value()), stream).ok());
	ASSERT_TRUE(late.wait_output("hung-up slot=0 sockets=1")) << late.output();
	ASSERT_TRUE(eventually([&] { return p.stats().consumers == 0; })) << "the hang-up was not reaped";

	auto early = p.acquire(300ms, stream);
	EXPECT_EQ(early.code(), Errc::timed_out) << "the slot was handed out under a queued in-place write";
	bool handed_out = early.ok();
	if (handed_out) { // the old code: rewrite it now, as a producer would
		EXPECT_EQ(d->cuMemsetD32Async(early->device_ptr(), 0x33333333, kSize / 4, stream), CUDA_SUCCESS);
	}
	EXPECT_EQ(late.wait(20s), 0) << late.output();
	EXPECT_NE(late.output().find("landed"), std::string::npos) << late.output();
	xmem::Result<xmem::BufferGuard> again = handed_out ? std::move(early) : p.acquire(10s, stream);
	ASSERT_TRUE(again.ok()) << "the slot did not come back after the exit: " << xmem::test::why(again);
	if (!handed_out) {
		ASSERT_EQ(d->cuMemsetD32Async(again->device_ptr(), 0x33333333, kSize / 4, stream), CUDA_SUCCESS);
	}
	ASSERT_EQ(d->cuMemcpyDtoHAsync(host.data(), again->device_ptr(), kSize, stream), CUDA_SUCCESS);
	ASSERT_EQ(d->cuStreamSynchronize(stream), CUDA_SUCCESS);
	for (size_t i = 0; i < kSize / 4; i++)
		ASSERT_EQ(host.data()[i], 0x33333333u)
			<< "word " << i << ": the late in-place write landed on the rewrite";
	again->reset();
	owner->reset();
	d->cuStreamDestroy(stream);
}

// A consumer produces too (a guest): the device slot the owner leases it is written on its
// stream; the owner's other consumers read every word; the guest's own frames are not
// queued back to it. In this process and in another one, which is then SIGKILLed while it
// writes leased slots: they come back once it has exited.
TEST(CudaGuests, DeviceFramesFromAGuestAndAKilledGuestsSlots)
{
	RuntimeDir dir;
	constexpr uint64_t kSize = 64 * 1024;
	auto owner = xmem::BufferPool::create("cuda-guests", cuda_config(kSize, 4));
	ASSERT_TRUE(owner.ok()) << xmem::test::why(owner);
	auto guest = xmem::BufferPool::open("cuda-guests");
	// fifo: the other guest's frames wait for it however far ahead that process runs
	// (drop-oldest would give their slots to that guest's next leases).
	xmem::OpenOptions fifo;
	fifo.policy = xmem::Policy::fifo;
	fifo.block_timeout = 30s;
	auto reader = xmem::BufferPool::open("cuda-guests", fifo);
	ASSERT_TRUE(guest.ok() && reader.ok());
	const xmem::cuda::Driver *d = xmem::cuda::driver().value();
	auto ctx = xmem::cuda::PrimaryContext::retain(0, "test").value();
	xmem::cuda::ContextScope scope(*ctx);
	CUstream stream;
	ASSERT_EQ(d->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	auto check_words = [&](xmem::Result<xmem::BufferGuard> &r, uint32_t want) {
		ASSERT_TRUE(r.ok()) << xmem::test::why(r);
		auto host = r->private_copy_to_cpu();
		ASSERT_TRUE(host.ok()) << xmem::test::why(host);
		const uint32_t *words = reinterpret_cast<const uint32_t *>(host->data().data());
		for (size_t i = 0; i < kSize / 4; i++)
			ASSERT_EQ(words[i], want) << "word " << i;
	};
	for (uint32_t n = 1; n <= 20; n++) {
		auto f = (*guest)->acquire(5s, stream);
		ASSERT_TRUE(f.ok()) << xmem::test::why(f);
		EXPECT_EQ(f->storage(), xmem::Storage::cuda);
		ASSERT_EQ(d->cuMemsetD32Async(f->device_ptr(), 0x5000 + n, kSize / 4, stream), CUDA_SUCCESS);
		f->meta_mut().value()->size = kSize;
		ASSERT_TRUE((*guest)->publish(std::move(f.value()), stream).ok());
		auto r = (*reader)->receive(5s);
		check_words(r, 0x5000 + n);
		EXPECT_EQ(r->meta().seq, n);
	}
	EXPECT_EQ((*guest)->receive(0s).code(), Errc::timed_out) << "its own frames are not queued for it";
	guest.value().reset(); // its queue would hold the other guest's frames

	Process other = peer({}, { "guest", "cuda-guests", "--frames", "5", "--hold", "3" });
	for (uint64_t n = 0; n < 5; n++) {
		auto r = (*reader)->receive(20s);
		ASSERT_TRUE(r.ok()) << xmem::test::why(r) << "; the guest said: " << other.output();
		check_words(r, xmem::test::frame_word(1000 + n));
		EXPECT_EQ(r->meta().pts, 1000 + n);
	}
	ASSERT_TRUE(other.wait_output("leased=3")) << other.output();
	EXPECT_EQ((*owner)->stats().slots_free, 1u);
	other.signal(SIGKILL);
	EXPECT_EQ(other.wait(), 128 + SIGKILL);
	EXPECT_TRUE(eventually([&] { return (*owner)->stats().slots_free == 4; }))
		<< "a killed guest's device slots did not come back after its exit";
	d->cuStreamDestroy(stream);
}

// A consumer whose context took a sticky error (an illegal address on its stream) will
// never write the done words queued behind it: its close stops waiting for them at once
// instead of after the 10 s drain bound, and the owner quarantines it until it exits,
// then has its slot back. (The simulator runs nothing more in a faulted context, as the
// driver documents for sticky errors; that a GPU does the same is the driver's to show.)
TEST(CudaCrash, AConsumerWhoseContextFaultedClosesAtOnce)
{
	RuntimeDir dir;
	if (!on_cuda_simulator())
		GTEST_SKIP() << "faults its context on purpose: on the simulator only";
	auto owner = xmem::BufferPool::create("faulted", cuda_config(64 * 1024, 1));
	ASSERT_TRUE(owner.ok()) << xmem::test::why(owner);
	auto &p = **owner;
	Process faulty = peer({}, { "fault-and-close", "faulted" });
	ASSERT_TRUE(eventually([&] { return p.stats().consumers == 1; })) << faulty.output();
	auto f = p.acquire(5s);
	ASSERT_TRUE(f.ok()) << xmem::test::why(f);
	f->meta_mut().value()->size = 64 * 1024;
	ASSERT_TRUE(p.publish(std::move(f.value())).ok());
	ASSERT_TRUE(faulty.wait_output("closed", 20s)) << faulty.output();
	EXPECT_NE(faulty.output().find("faulted yes"), std::string::npos) << faulty.output();
	EXPECT_LT(faulty.field("close_ms"), 2000) << "the close waited for done words a faulted context never writes";
	// Quarantined while the process lives: its queued writes are not known to be over.
	EXPECT_FALSE(p.acquire(300ms).ok()) << "the slot came back while the faulted consumer lives";
	faulty.kill_wait();
	auto again = p.acquire(10s);
	EXPECT_TRUE(again.ok()) << "the slot did not come back after the exit: " << xmem::test::why(again);
}

// --- copies to another GPU -----------------------------------------------------------
//
// copy_to_cuda (copy_to_device) of a frame on one GPU to another, and back. A device
// reaches a VMM mapping only where cuMemSetAccess gave it access, and a pool's slots and
// its private copies give it to their own device alone, so a stream of the other device
// cannot read them, peers or not: xmem copies through host memory. On the simulator the
// tests below run in a child process of this program on a machine of two devices, once
// whose devices are not peers (XMEM_CUDASIM_PEER=none) and once with peers (all); before
// the fix both faulted ("cuMemSetAccess gave device 1 no access"). That proves xmem's
// logic (which device runs each half of the copy, the order after the caller's stream),
// not the driver's behaviour; on real GPUs they run in-process and need two of them.

namespace {

std::string this_program()
{
	char path[4096] = {};
	ssize_t n = ::readlink("/proc/self/exe", path, sizeof(path) - 1);
	return std::string(path, n > 0 ? size_t(n) : 0);
}

// A frame's bytes: no two neighbouring words alike, so a copy from the wrong place or a
// stale one shows.
std::vector<std::byte> frame_pattern(size_t size, uint32_t seed)
{
	std::vector<std::byte> bytes(size);
	for (size_t i = 0; i < size; i++)
		bytes[i] = std::byte((i * 7 + i / 251 + seed * 13) & 0xff);
	return bytes;
}

void expect_frame(const xmem::BufferGuard &host, const std::vector<std::byte> &want, const char *what)
{
	ASSERT_EQ(host.storage(), xmem::Storage::system) << what;
	ASSERT_EQ(host.data().size(), want.size()) << what;
	auto got = host.data();
	auto at = std::mismatch(got.begin(), got.end(), want.begin());
	EXPECT_TRUE(at.first == got.end()) << what << ": byte " << (at.first - got.begin()) << " differs";
}

// A frame of a pool on device FROM, written on a stream of FROM and received without a
// stream, is copied to device TO, then that copy back to FROM; each copy is read back on
// the CPU. WITH_STREAM: each copy is made on a stream of its target device's primary
// context, and the first one is held back by that stream's earlier work (a wait on a host
// gate: staged through host memory, the call waits for it, opened 300 ms later; between
// peers the copy is queued behind it) and done before the stream's later work reads it.
void copy_between_gpus(uint32_t from, uint32_t to, bool with_stream)
{
	constexpr uint64_t kSize = 256 * 1024;
	const xmem::cuda::Driver *d = xmem::cuda::driver().value();
	auto from_ctx = xmem::cuda::PrimaryContext::retain(from, "test");
	auto to_ctx = xmem::cuda::PrimaryContext::retain(to, "test");
	ASSERT_TRUE(from_ctx.ok() && to_ctx.ok()) << xmem::test::why(from_ctx) << xmem::test::why(to_ctx);
	// Peers or not (xmem asks the same): the copy reads the slot in place, or stages it.
	int can = -1;
	ASSERT_EQ(d->cuDeviceCanAccessPeer(&can, (*to_ctx)->device(), (*from_ctx)->device()), CUDA_SUCCESS);
	std::printf("peer access possible: %s\n", can ? "yes" : "no");
	bool gated = with_stream && (on_cuda_simulator() || xmem::cuda::check_device(to, "").value().stream_mem_ops);

	CUstream from_stream = nullptr, to_stream = nullptr;
	{
		xmem::cuda::ContextScope scope(**from_ctx);
		ASSERT_EQ(d->cuStreamCreate(&from_stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	}
	// The caller's context is current while it hands its stream over, as GStreamer's is.
	xmem::cuda::ContextScope scope(**to_ctx);
	ASSERT_EQ(d->cuStreamCreate(&to_stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	xmem::test::GatedHost gate(0);
	ASSERT_TRUE(gate.ok);

	std::string name = "across" + std::to_string(from) + std::to_string(to) + (with_stream ? "s" : "");
	xmem::PoolConfig config = cuda_config(kSize, 2);
	config.device = from;
	auto owner = xmem::BufferPool::create(name, config);
	ASSERT_TRUE(owner.ok()) << xmem::test::why(owner);
	auto consumer = xmem::BufferPool::open(name);
	ASSERT_TRUE(consumer.ok()) << xmem::test::why(consumer);
	const std::vector<std::byte> want = frame_pattern(kSize, from * 2 + to);
	auto f = (*owner)->acquire(5s, from_stream);
	ASSERT_TRUE(f.ok()) << xmem::test::why(f);
	{
		xmem::cuda::ContextScope inner(**from_ctx);
		ASSERT_EQ(d->cuMemcpyHtoDAsync(f->device_ptr(), want.data(), kSize, from_stream), CUDA_SUCCESS);
	}
	f->meta_mut().value()->size = kSize;
	ASSERT_TRUE((*owner)->publish(std::move(f.value()), from_stream).ok());
	auto r = (*consumer)->receive(5s);
	ASSERT_TRUE(r.ok()) << xmem::test::why(r);
	ASSERT_EQ(r->device(), from);

	CUstream there = with_stream ? to_stream : nullptr;
	if (gated) {
		ASSERT_EQ(d->cuStreamWaitValue64(to_stream, gate.gate_dev, 1, CU_STREAM_WAIT_VALUE_GEQ), CUDA_SUCCESS);
	}
	// Between peers the copy reads the slot in place, queued on the stream behind its
	// earlier work (the gate, opened here after the look); otherwise it is staged through
	// host memory and waits for that work before it returns (the gate opened by a thread).
	std::thread opener;
	if (!can)
		opener = std::thread([&] {
			std::this_thread::sleep_for(300ms);
			gate.open();
		});
	auto started = std::chrono::steady_clock::now();
	auto copy = r->private_copy_to_cuda(to, there);
	auto took = std::chrono::steady_clock::now() - started;
	if (can) {
		if (gated) {
			EXPECT_EQ(d->cuStreamQuery(to_stream), CUDA_ERROR_NOT_READY) << "queued behind the gate";
		}
		gate.open();
	} else {
		opener.join();
	}
	ASSERT_TRUE(copy.ok()) << xmem::test::why(copy);
	if (gated && !can) {
		EXPECT_GE(took, 250ms) << "the copy did not wait for the stream's earlier work";
	}
	EXPECT_EQ(copy->storage(), xmem::Storage::cuda);
	EXPECT_EQ(copy->device(), to);
	EXPECT_TRUE(copy->is_copy());
	r->reset(); // the copy lives on its own
	auto seen = copy->private_copy_to_cpu(there);
	ASSERT_TRUE(seen.ok()) << xmem::test::why(seen);
	expect_frame(*seen, want, "the copy on the other device");

	// Back to the first device, from the private copy (mapped for its own device alone).
	CUstream here = with_stream ? from_stream : nullptr;
	auto back = copy->private_copy_to_cuda(from, here);
	ASSERT_TRUE(back.ok()) << xmem::test::why(back);
	EXPECT_EQ(back->device(), from);
	auto seen_back = back->private_copy_to_cpu(here);
	ASSERT_TRUE(seen_back.ok()) << xmem::test::why(seen_back);
	expect_frame(*seen_back, want, "the copy brought back");

	// Copies made on a stream are freed once its work is done: before the stream goes.
	copy->reset();
	back->reset();
	owner->reset();
	consumer->reset();
	d->cuStreamDestroy(to_stream);
	xmem::cuda::ContextScope inner(**from_ctx);
	d->cuStreamDestroy(from_stream);
}

} // namespace

TEST(CudaCopies, AFrameCopiedToAnotherGpuReadsBackTheSame)
{
	RuntimeDir dir;
	if (!on_cuda_simulator()) {
		int count = 0;
		if (xmem::cuda::driver().value()->cuDeviceGetCount(&count) != CUDA_SUCCESS || count < 2)
			GTEST_SKIP() << "needs two GPUs";
		for (auto [from, to] : { std::pair{ 0u, 1u }, std::pair{ 1u, 0u } }) {
			for (bool with_stream : { true, false }) {
				SCOPED_TRACE(std::to_string(from) + " to " + std::to_string(to) +
					     (with_stream ? " on a stream" : " without a stream"));
				copy_between_gpus(from, to, with_stream);
			}
		}
		return;
	}
	for (std::string peers : { "none", "all" }) {
		SCOPED_TRACE("XMEM_CUDASIM_PEER=" + peers);
		Process child({ "/usr/bin/env", "XMEM_CUDASIM_DEVICES=2", "XMEM_CUDASIM_PEER=" + peers, this_program(),
				"--gtest_also_run_disabled_tests",
				"--gtest_filter=DISABLED_CudaCopiesOnTwoSimulatedGpus.*" });
		EXPECT_EQ(child.wait(120s), 0) << child.output();
		EXPECT_NE(child.output().find("[  PASSED  ] 4 tests"), std::string::npos) << child.output();
		EXPECT_NE(child.output().find(std::string("peer access possible: ") + (peers == "all" ? "yes" : "no")),
			  std::string::npos)
			<< child.output();
	}
}

// Device memory as arena.cpp answers for it (the simulator proves xmem's dispatch and
// copies, the real driver its UUIDs and copies): its device has a UUID, by which another
// process's ordinal is found; its ordering follows XMEM_CUDA_SYNC and the device; private
// device memory round-trips bytes through host memory and between device places.
TEST(CudaMemoryKind, DeviceMemoryIsFoundByItsUuidOrderedAndCopied)
{
	using xmem::Memory;
	using xmem::Storage;
	const Memory device{ Storage::cuda, 0 };
	auto identity = xmem::memory_identity(device, "p");
	ASSERT_TRUE(identity.ok()) << xmem::test::why(identity);
	EXPECT_NE(identity->uuid, xmem::DeviceUuid{});
	// The owner's ordinal (7 here) means nothing in this process: the UUID finds device 0.
	auto here = xmem::memory_here(Storage::cuda, 7, identity->uuid, "p");
	ASSERT_TRUE(here.ok()) << xmem::test::why(here);
	EXPECT_EQ(*here, device);
	xmem::DeviceUuid stranger;
	stranger.fill(0xee);
	auto lost = xmem::memory_here(Storage::cuda, 0, stranger, "p");
	ASSERT_FALSE(lost.ok());
	EXPECT_NE(lost.error().message.find("CUDA_VISIBLE_DEVICES"), std::string::npos) << lost.error().message;

	const char *was = std::getenv("XMEM_CUDA_SYNC");
	std::string saved = was ? was : "";
	::setenv("XMEM_CUDA_SYNC", "cpu", 1);
	EXPECT_EQ(xmem::ordering_wanted(device), xmem::layout::kSyncCpu);
	::unsetenv("XMEM_CUDA_SYNC");
	EXPECT_EQ(xmem::ordering_wanted(device),
		  xmem::device_has_stream_mem_ops(0) ? xmem::layout::kSyncStreamMemOps : xmem::layout::kSyncCpu);
	if (was)
		::setenv("XMEM_CUDA_SYNC", saved.c_str(), 1);

	constexpr uint64_t kBytes = 64 * 1024;
	auto d1 = xmem::allocate_private(device, kBytes, nullptr);
	ASSERT_TRUE(d1.ok()) << xmem::test::why(d1);
	EXPECT_EQ(d1->host, nullptr) << "the CPU cannot touch device memory";
	ASSERT_NE(d1->address, 0u);
	auto d2 = xmem::allocate_private(device, kBytes, nullptr);
	ASSERT_TRUE(d2.ok()) << xmem::test::why(d2);
	std::vector<std::byte> in(kBytes), out(kBytes);
	for (size_t i = 0; i < kBytes; i++)
		in[i] = std::byte(i * 13 + 5);
	xmem::Place host_in{ Memory{}, in.data(), 0 };
	xmem::Place host_out{ Memory{}, out.data(), 0 };
	xmem::Place first{ device, nullptr, d1->address };
	xmem::Place second{ device, nullptr, d2->address };
	// Host to device, device to device, device to host: each without a stream, complete.
	ASSERT_TRUE(xmem::copy_bytes(first, host_in, kBytes, nullptr).ok());
	ASSERT_TRUE(xmem::copy_bytes(second, first, kBytes, nullptr).ok());
	ASSERT_TRUE(xmem::copy_bytes(host_out, second, kBytes, nullptr).ok());
	EXPECT_EQ(in, out);
}

// On the simulator only, run by the test above on a machine of two simulated devices.
TEST(DISABLED_CudaCopiesOnTwoSimulatedGpus, Device0FrameToDevice1OnAStream)
{
	RuntimeDir dir;
	ASSERT_TRUE(on_cuda_simulator());
	copy_between_gpus(0, 1, true);
}

TEST(DISABLED_CudaCopiesOnTwoSimulatedGpus, Device0FrameToDevice1WithoutAStream)
{
	RuntimeDir dir;
	ASSERT_TRUE(on_cuda_simulator());
	copy_between_gpus(0, 1, false);
}

TEST(DISABLED_CudaCopiesOnTwoSimulatedGpus, Device1FrameToDevice0OnAStream)
{
	RuntimeDir dir;
	ASSERT_TRUE(on_cuda_simulator());
	copy_between_gpus(1, 0, true);
}

TEST(DISABLED_CudaCopiesOnTwoSimulatedGpus, Device1FrameToDevice0WithoutAStream)
{
	RuntimeDir dir;
	ASSERT_TRUE(on_cuda_simulator());
	copy_between_gpus(1, 0, false);
}

// The seed's names on a device pool (issue 34): guards give device pointers only, write
// access only through a writable guard; copies are buffers of the pool with their own
// meta index, and a copy into memory no class holds is refused naming the class to add.
// A pool from connect() grows that class instead. On the simulator: xmem's logic.
TEST(CudaSeed, GuardsCopiesAndTheClassACopyNeeds)
{
	RuntimeDir dir;
	auto owner = xmem::BufferPool::create("seed-cuda", cuda_config());
	ASSERT_TRUE(owner.ok()) << xmem::test::why(owner);
	auto consumer = xmem::BufferPool::open("seed-cuda");
	ASSERT_TRUE(consumer.ok()) << xmem::test::why(consumer);
	auto f = (*owner)->acquire_cuda(64 * 1024, 0);
	ASSERT_TRUE(f.ok()) << xmem::test::why(f);
	EXPECT_EQ(f->as_cpu_slice().code(), Errc::invalid_argument) << "device memory has no CPU slice";
	EXPECT_EQ(f->as_cpu_slice_mut().code(), Errc::invalid_argument);
	auto ptr = f->as_cuda_ptr_mut();
	ASSERT_TRUE(ptr.ok()) << xmem::test::why(ptr);
	std::vector<uint8_t> bytes(64 * 1024, 0x5a);
	ASSERT_TRUE(xmem::cuda_copy_2d({ *ptr, bytes.size(), true },
				       { reinterpret_cast<uint64_t>(bytes.data()), bytes.size(), false }, bytes.size(),
				       1, 0)
			    .ok());
	// A copy within the device's class: a buffer of the pool, its own meta index.
	auto copy = f->copy_to_cuda(0);
	ASSERT_TRUE(copy.ok()) << xmem::test::why(copy);
	EXPECT_FALSE(copy->is_copy());
	EXPECT_NE(copy->meta_index(), f->meta_index());
	// Into system memory no class holds: refused, naming the class.
	auto none = f->copy_to_cpu();
	EXPECT_EQ(none.code(), Errc::out_of_range);
	EXPECT_NE(none.error().message.find("preallocate_cpu(65536, COUNT)"), std::string::npos)
		<< none.error().message;
	uint32_t mi = f->meta_index();
	ASSERT_TRUE((*owner)->set_ref_count(mi, 1).ok());
	auto got = (*consumer)->get(mi);
	ASSERT_TRUE(got.ok()) << xmem::test::why(got);
	EXPECT_EQ(got->as_cuda_ptr_mut().code(), Errc::read_only) << "a received frame is read-only";
	auto read = got->as_cuda_ptr();
	ASSERT_TRUE(read.ok());
	std::vector<uint8_t> back(bytes.size());
	ASSERT_TRUE(xmem::cuda_copy_2d({ reinterpret_cast<uint64_t>(back.data()), back.size(), false },
				       { *read, back.size(), true }, back.size(), 1, 0)
			    .ok());
	EXPECT_EQ(back, bytes);
	// The consumer's copy to the device is a slot the owner leases it.
	auto theirs = got->copy_to_device(0);
	ASSERT_TRUE(theirs.ok()) << xmem::test::why(theirs);
	EXPECT_NE(theirs->meta_index(), mi);

	// A pool from connect() makes the class a copy needs (growth within its caps).
	auto grown = xmem::BufferPool::connect("seed-cuda-grown");
	ASSERT_TRUE(grown.ok()) << xmem::test::why(grown);
	auto g = (*grown)->acquire_cuda(64 * 1024, 0);
	ASSERT_TRUE(g.ok()) << xmem::test::why(g);
	EXPECT_EQ((*grown)->role(), xmem::Role::owner);
	auto host = g->copy_to_cpu();
	ASSERT_TRUE(host.ok()) << xmem::test::why(host);
	EXPECT_EQ(host->storage(), xmem::Storage::system);
	EXPECT_GE((*grown)->growth_stats().grown, 1u);
}
