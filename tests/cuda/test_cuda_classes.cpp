// test_cuda_classes.cpp - size classes of device pools: a class of larger device slots
// added while consumers are attached, in this process and in another one that imports the
// new class's VMM fds once, with its first frame; every word of every frame checked; pools
// of mixed memories (a system pool taking a class of device memory, a device pool one of
// system memory), in this process and in another one attached before, killed holding a
// device frame; classes on two simulated devices, peers or not, with copies between them
// that are pool buffers; another memory beside a spill tier refused. Run as
// cuda-classes-sim against the driver
// simulator (tests/cudasim), which proves xmem's logic, not the driver's behaviour, and as
// cuda-classes-gpu against the real driver (exits 77 without a GPU).
#include "../common.hpp"

#include "cuda/contexts.hpp"
#include "cuda/driver.hpp"
#include "peer_frames.hpp"

#include <xmem/snapshot.hpp>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <thread>

#include <unistd.h>

using namespace std::chrono_literals;
using xmem::Errc;
using xmem::Storage;
using xmem::test::eventually;
using xmem::test::Process;
using xmem::test::RuntimeDir;

namespace {

const auto *const gpu_or_skip = ::testing::AddGlobalTestEnvironment(new xmem::test::RealGpuOrSkip);

constexpr uint64_t kSmall = 64 * 1024;
constexpr uint64_t kLarge = 1024 * 1024;

xmem::PoolConfig cuda_config(uint32_t slots)
{
	xmem::PoolConfig c;
	c.storage = Storage::cuda;
	c.slot_size = kSmall;
	c.slot_count = slots;
	return c;
}

struct Gpu {
	const xmem::cuda::Driver *d = nullptr;
	std::shared_ptr<xmem::cuda::PrimaryContext> ctx;
	CUstream stream = nullptr;

	explicit Gpu(uint32_t device = 0)
	{
		d = xmem::cuda::driver().value();
		ctx = xmem::cuda::PrimaryContext::retain(device, "test").value();
		xmem::cuda::ContextScope scope(*ctx);
		EXPECT_EQ(d->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	}
	~Gpu()
	{
		xmem::cuda::ContextScope scope(*ctx);
		d->cuStreamDestroy(stream);
	}
};

// Writes frame SEQ (peer_frames.hpp: its words, then its tail) into the SIZE bytes of
// device slot F on the GPU, queued on G's stream, and sets the frame's size.
void write_frame(xmem::BufferGuard &f, Gpu &g, uint64_t size, uint64_t seq)
{
	xmem::cuda::ContextScope scope(*g.ctx);
	uint64_t body = size - xmem::test::kFrameTail;
	ASSERT_EQ(g.d->cuMemsetD32Async(f.device_ptr(), xmem::test::frame_word(seq), body / 4, g.stream), CUDA_SUCCESS);
	ASSERT_EQ(g.d->cuMemsetD32Async(f.device_ptr() + body, xmem::test::frame_tail_word(seq),
					xmem::test::kFrameTail / 4, g.stream),
		  CUDA_SUCCESS);
	f.meta_mut().value()->size = size;
}

// Publishes frame SEQ (peer_frames.hpp: its words, then its tail) of SIZE bytes from a
// slot of SIZE bytes or more, written on the GPU on G's stream.
void publish_frame_in(xmem::BufferPool &owner, Gpu &g, uint64_t size, std::optional<Storage> memory)
{
	xmem::cuda::ContextScope scope(*g.ctx);
	uint32_t device = uint32_t(g.ctx->device());
	auto f = memory ? owner.acquire(size, *memory, device, 10s, g.stream) : owner.acquire(size, 10s, g.stream);
	ASSERT_TRUE(f.ok()) << xmem::test::why(f);
	ASSERT_GE(f->capacity(), size);
	write_frame(*f, g, size, owner.stats().published + 1);
	auto published = owner.publish(std::move(f.value()), g.stream);
	ASSERT_TRUE(published.ok()) << xmem::test::why(published);
}

// The same in a slot of system memory (of a pool of mixed memories), written by the CPU.
void publish_host_frame(xmem::BufferPool &owner, uint64_t size)
{
	auto f = owner.acquire(size, Storage::system, 0, 10s);
	ASSERT_TRUE(f.ok()) << xmem::test::why(f);
	ASSERT_EQ(f->storage(), Storage::system);
	uint64_t seq = owner.stats().published + 1;
	auto bytes = f->data_mut().value();
	ASSERT_GE(bytes.size(), size);
	auto *w = reinterpret_cast<uint32_t *>(bytes.data());
	uint64_t body = (size - xmem::test::kFrameTail) / 4;
	for (uint64_t i = 0; i < size / 4; i++)
		w[i] = i < body ? xmem::test::frame_word(seq) : xmem::test::frame_tail_word(seq);
	f->meta_mut().value()->size = size;
	auto published = owner.publish(std::move(f.value()));
	ASSERT_TRUE(published.ok()) << xmem::test::why(published);
}

std::string this_program()
{
	char path[4096] = {};
	ssize_t n = ::readlink("/proc/self/exe", path, sizeof(path) - 1);
	return std::string(path, n > 0 ? size_t(n) : 0);
}

void publish_frame(xmem::BufferPool &owner, Gpu &g, uint64_t size)
{
	publish_frame_in(owner, g, size, std::nullopt);
}

bool frame_is(const std::span<const std::byte> bytes, uint64_t seq)
{
	const auto *w = reinterpret_cast<const uint32_t *>(bytes.data());
	uint64_t body = (bytes.size() - xmem::test::kFrameTail) / 4;
	for (uint64_t i = 0; i < bytes.size() / 4; i++)
		if (w[i] != (i < body ? xmem::test::frame_word(seq) : xmem::test::frame_tail_word(seq)))
			return false;
	return true;
}

} // namespace

TEST(CudaClasses, AClassAddedWhileAttachedIsDeviceMemoryLikeTheFirst)
{
	RuntimeDir dir;
	auto owner = xmem::BufferPool::create("cls", cuda_config(2));
	ASSERT_TRUE(owner.ok()) << xmem::test::why(owner);
	auto consumer = xmem::BufferPool::open("cls");
	ASSERT_TRUE(consumer.ok()) << xmem::test::why(consumer);
	// A device that does not exist is refused, with the reason.
	auto missing = (*owner)->preallocate(kLarge, 1, Storage::cuda, 7);
	EXPECT_FALSE(missing.ok());
	EXPECT_EQ((*owner)->classes().size(), 1u) << "a refused class was counted";
	auto added = (*owner)->preallocate(kLarge, 2, Storage::cuda, 0);
	ASSERT_TRUE(added.ok()) << xmem::test::why(added);
	EXPECT_EQ(*added, 1u);

	Gpu g;
	for (uint64_t n = 0; n < 12; n++) {
		uint64_t size = n % 3 == 0 ? kSmall : n % 3 == 1 ? kLarge : kLarge / 2 + 4096;
		publish_frame(**owner, g, size);
		auto r = (*consumer)->receive(5s);
		ASSERT_TRUE(r.ok()) << xmem::test::why(r);
		EXPECT_EQ(r->storage(), Storage::cuda);
		EXPECT_EQ(r->meta().size, size);
		EXPECT_EQ(r->capacity(), size > kSmall ? kLarge : kSmall);
		EXPECT_TRUE(r->data().empty()) << "the CPU cannot touch device memory";
		auto host = r->private_copy_to_cpu();
		ASSERT_TRUE(host.ok()) << xmem::test::why(host);
		ASSERT_EQ(host->data().size(), size);
		EXPECT_TRUE(frame_is(host->data(), r->meta().seq)) << "frame " << n;
	}
}

// Another process attached before the class existed reads frames of both classes on
// its own stream, every word checked; then it is killed holding a read of a large frame
// and the slot comes back.
TEST(CudaClasses, AnotherProcessImportsTheClassOnceAndReadsEveryWord)
{
	RuntimeDir dir;
	// fifo: a slow reader holds the producer back instead of losing frames.
	xmem::PoolConfig config = cuda_config(3);
	config.policy = xmem::Policy::fifo;
	config.block_timeout = 10s;
	auto owner = xmem::BufferPool::create("cls-mp", config);
	ASSERT_TRUE(owner.ok()) << xmem::test::why(owner);
	Process consumer({ xmem::test::cuda_peer_path(), "consume", "cls-mp", "--frames", "20", "--max-size",
			   std::to_string(kLarge) });
	ASSERT_TRUE(consumer.wait_output("attached")) << consumer.output();
	ASSERT_TRUE(eventually([&] { return (*owner)->stats().consumers == 1; }));
	Gpu g;
	for (uint64_t n = 0; n < 20; n++) {
		if (n == 5) {
			ASSERT_TRUE((*owner)->preallocate(kLarge, 2, Storage::cuda, 0).ok());
		}
		publish_frame(**owner, g, n >= 5 && n % 2 ? kLarge : kSmall);
		std::this_thread::sleep_for(2ms);
	}
	EXPECT_EQ(consumer.wait(60s), 0) << consumer.output();
	EXPECT_NE(consumer.output().find("frames=20 bad=0"), std::string::npos) << consumer.output();

	Process holder({ xmem::test::cuda_peer_path(), "consume", "cls-mp", "--hold", "1", "--max-size",
			 std::to_string(kLarge) });
	// Attached first: until the owner reaps the consumer that just left, its count
	// is 1 without the holder, and a frame published then would reach nobody.
	ASSERT_TRUE(holder.wait_output("attached")) << holder.output();
	ASSERT_TRUE(eventually([&] { return (*owner)->stats().consumers == 1; }));
	publish_frame(**owner, g, kLarge);
	ASSERT_TRUE(holder.wait_output("holding")) << holder.output();
	holder.signal(SIGKILL);
	holder.wait(10s);
	EXPECT_TRUE(eventually([&] { return (*owner)->stats().slots_free == 5; }, 20s))
		<< "the killed consumer's slot of the new class is free again";
}

// A system pool takes a class of device memory while a consumer is attached: acquire()
// stays in system memory, acquire(size, cuda, 0) takes device slots, and the consumer
// gets both kinds in order, every word checked (a device frame's by a copy to the host).
TEST(CudaClasses, ASystemPoolTakesAClassOfDeviceMemory)
{
	RuntimeDir dir;
	xmem::PoolConfig config;
	config.slot_size = kSmall;
	config.slot_count = 2;
	auto owner = xmem::BufferPool::create("mixed", config);
	ASSERT_TRUE(owner.ok()) << xmem::test::why(owner);
	auto consumer = xmem::BufferPool::open("mixed");
	ASSERT_TRUE(consumer.ok()) << xmem::test::why(consumer);
	EXPECT_STREQ((*consumer)->gpu_ordering(), "none");
	auto none = (*owner)->acquire(kSmall, Storage::cuda, 0, 0s);
	EXPECT_EQ(none.code(), Errc::out_of_range);
	EXPECT_NE(none.error().message.find("no class of that memory"), std::string::npos) << none.error().message;
	EXPECT_EQ((*owner)->preallocate(kLarge, 1, Storage::system, 1).code(), Errc::invalid_argument);
	auto added = (*owner)->preallocate(kLarge, 2, Storage::cuda, 0);
	ASSERT_TRUE(added.ok()) << xmem::test::why(added);
	EXPECT_EQ(*added, 1u);
	auto classes = (*consumer)->classes();
	ASSERT_EQ(classes.size(), 2u);
	EXPECT_EQ(classes[0].storage, Storage::system);
	EXPECT_EQ(classes[1].storage, Storage::cuda);
	EXPECT_EQ(classes[1].slot_size, kLarge);
	// Without a memory, acquire keeps to the first class's: no system slot holds kLarge.
	EXPECT_EQ((*owner)->acquire(kLarge, 0s).code(), Errc::out_of_range);

	Gpu g;
	for (uint64_t n = 0; n < 12; n++) {
		bool device = n % 2 == 1;
		uint64_t size = device ? (n % 4 == 1 ? kSmall : kLarge) : kSmall;
		if (device)
			publish_frame_in(**owner, g, size, Storage::cuda);
		else
			publish_host_frame(**owner, size);
		auto r = (*consumer)->receive(5s);
		ASSERT_TRUE(r.ok()) << xmem::test::why(r);
		SCOPED_TRACE("frame " + std::to_string(n));
		EXPECT_EQ(r->storage(), device ? Storage::cuda : Storage::system);
		EXPECT_EQ(r->meta().size, size);
		if (device) {
			EXPECT_EQ(r->capacity(), kLarge) << "a device frame comes from the device class";
			auto host = r->private_copy_to_cpu();
			ASSERT_TRUE(host.ok()) << xmem::test::why(host);
			EXPECT_TRUE(frame_is(host->data(), r->meta().seq));
		} else {
			EXPECT_TRUE(frame_is(r->data().first(size), r->meta().seq));
		}
	}
	EXPECT_STRNE((*consumer)->gpu_ordering(), "") << "the consumer orders device frames since it met one";
}

// A device pool takes a class of system memory: acquire(size, system) frames are host
// memory for the consumer, the device class goes on as before. Another memory beside a
// spill tier is refused (its copies are of the first memory only).
TEST(CudaClasses, ADevicePoolTakesAClassOfSystemMemory)
{
	RuntimeDir dir;
	auto owner = xmem::BufferPool::create("mixed-dev", cuda_config(2));
	ASSERT_TRUE(owner.ok()) << xmem::test::why(owner);
	auto consumer = xmem::BufferPool::open("mixed-dev");
	ASSERT_TRUE(consumer.ok()) << xmem::test::why(consumer);
	auto added = (*owner)->preallocate(kLarge, 2, Storage::system);
	ASSERT_TRUE(added.ok()) << xmem::test::why(added);
	Gpu g;
	for (uint64_t n = 0; n < 8; n++) {
		bool host = n % 2 == 0;
		uint64_t size = host ? kLarge : kSmall;
		if (host)
			publish_host_frame(**owner, size);
		else
			publish_frame(**owner, g, size);
		auto r = (*consumer)->receive(5s);
		ASSERT_TRUE(r.ok()) << xmem::test::why(r);
		SCOPED_TRACE("frame " + std::to_string(n));
		EXPECT_EQ(r->storage(), host ? Storage::system : Storage::cuda);
		if (host) {
			EXPECT_TRUE(frame_is(r->data().first(size), r->meta().seq));
		} else {
			auto copy = r->private_copy_to_cpu();
			ASSERT_TRUE(copy.ok()) << xmem::test::why(copy);
			EXPECT_TRUE(frame_is(copy->data(), r->meta().seq));
		}
	}

	for (Storage first : { Storage::cuda, Storage::system }) {
		xmem::PoolConfig config = cuda_config(2);
		config.storage = first;
		config.spill_bytes = 4 * kSmall;
		std::string name = first == Storage::cuda ? "spill-dev" : "spill-sys";
		auto spilling = xmem::BufferPool::create(name, config);
		ASSERT_TRUE(spilling.ok()) << xmem::test::why(spilling);
		auto other =
			(*spilling)->preallocate(kLarge, 1, first == Storage::cuda ? Storage::system : Storage::cuda);
		EXPECT_EQ(other.code(), Errc::invalid_argument);
		EXPECT_NE(other.error().message.find("spill tier"), std::string::npos) << other.error().message;
	}
}

// Another process attached to a system pool before its class of device memory existed:
// it imports the class with its first device frame, checks every word of frames of both
// memories, then one killed holding a read of a device frame gives its slot back.
TEST(CudaClasses, AnotherProcessTakesFramesOfBothMemories)
{
	RuntimeDir dir;
	xmem::PoolConfig config;
	config.slot_size = kSmall;
	config.slot_count = 3;
	config.policy = xmem::Policy::fifo;
	config.block_timeout = 10s;
	auto owner = xmem::BufferPool::create("mixed-mp", config);
	ASSERT_TRUE(owner.ok()) << xmem::test::why(owner);
	Process consumer({ xmem::test::cuda_peer_path(), "consume", "mixed-mp", "--frames", "20", "--mixed",
			   "--max-size", std::to_string(kLarge) });
	ASSERT_TRUE(consumer.wait_output("attached")) << consumer.output();
	ASSERT_TRUE(eventually([&] { return (*owner)->stats().consumers == 1; }));
	Gpu g;
	for (uint64_t n = 0; n < 20; n++) {
		if (n == 5) {
			ASSERT_TRUE((*owner)->preallocate(kLarge, 2, Storage::cuda, 0).ok());
		}
		if (n >= 5 && n % 2)
			publish_frame_in(**owner, g, kLarge, Storage::cuda);
		else
			publish_host_frame(**owner, kSmall);
		std::this_thread::sleep_for(2ms);
	}
	EXPECT_EQ(consumer.wait(60s), 0) << consumer.output();
	EXPECT_NE(consumer.output().find("frames=20 bad=0"), std::string::npos) << consumer.output();

	Process holder({ xmem::test::cuda_peer_path(), "consume", "mixed-mp", "--hold", "1", "--mixed", "--max-size",
			 std::to_string(kLarge) });
	// Attached first: until the owner reaps the consumer that just left, its count
	// is 1 without the holder, and a frame published then would reach nobody.
	ASSERT_TRUE(holder.wait_output("attached")) << holder.output();
	ASSERT_TRUE(eventually([&] { return (*owner)->stats().consumers == 1; }));
	publish_frame_in(**owner, g, kLarge, Storage::cuda);
	ASSERT_TRUE(holder.wait_output("holding")) << holder.output();
	holder.signal(SIGKILL);
	holder.wait(10s);
	EXPECT_TRUE(eventually([&] { return (*owner)->stats().slots_free == 5; }, 20s))
		<< "the killed consumer's device slot is free again";
}

// Classes on two devices, on a machine of two simulated devices: the tests below run
// themselves so, in a child.
TEST(CudaClasses, ClassesOnTwoDevices)
{
	if (!xmem::test::on_cuda_simulator())
		GTEST_SKIP() << "two devices are the simulator's (XMEM_CUDASIM_DEVICES=2)";
	Process child({ "/usr/bin/env", "XMEM_CUDASIM_DEVICES=2", this_program(), "--gtest_also_run_disabled_tests",
			"--gtest_filter=DISABLED_CudaClassesOnTwoSimulatedGpus.*" });
	EXPECT_EQ(child.wait(120s), 0) << child.output();
	EXPECT_NE(child.output().find("[  PASSED  ] 3 tests"), std::string::npos) << child.output();
}

// The same on two simulated GPUs that are each other's peers (XMEM_CUDASIM_PEER=all): a
// copy to the other device reads the slot in place, given access once, instead of
// staging it through host memory.
TEST(CudaClasses, ClassesOnTwoPeerDevices)
{
	if (!xmem::test::on_cuda_simulator())
		GTEST_SKIP() << "two devices are the simulator's (XMEM_CUDASIM_DEVICES=2)";
	Process child({ "/usr/bin/env", "XMEM_CUDASIM_DEVICES=2", "XMEM_CUDASIM_PEER=all", this_program(),
			"--gtest_also_run_disabled_tests", "--gtest_filter=DISABLED_CudaClassesOnTwoSimulatedGpus.*" });
	EXPECT_EQ(child.wait(120s), 0) << child.output();
	EXPECT_NE(child.output().find("[  PASSED  ] 3 tests"), std::string::npos) << child.output();
}

// A device pool takes a class on the other device, and a second class there shares that
// device's ordering; a system pool takes classes on both, in either order. Each device's
// slots come out of its own classes.
TEST(DISABLED_CudaClassesOnTwoSimulatedGpus, EachDeviceHasItsClasses)
{
	RuntimeDir dir;
	auto device = xmem::BufferPool::create("two-dev", cuda_config(1));
	ASSERT_TRUE(device.ok()) << xmem::test::why(device);
	ASSERT_TRUE((*device)->preallocate(kLarge, 1, Storage::cuda, 1).ok());
	ASSERT_TRUE((*device)->preallocate(kSmall, 1, Storage::cuda, 1).ok());
	auto classes = (*device)->classes();
	ASSERT_EQ(classes.size(), 3u);
	EXPECT_EQ(classes[1].device, 1u);
	EXPECT_EQ(classes[2].device, 1u);
	// Both devices' streams order the slots themselves: the control segment's one
	// registration serves both (a second registration of it would fail, and fall back
	// to CPU synchronization).
	for (const xmem::SizeClass &c : classes)
		EXPECT_STREQ(xmem::gpu_ordering_name(c.sync_mode), "stream-memops") << "class " << c.index;
	// xmem-inspect, from another process, names each class's memory and its ordering.
	const char *inspect = std::getenv("XMEM_INSPECT");
	ASSERT_TRUE(inspect) << "XMEM_INSPECT must name the built xmem-inspect";
	Process tool({ inspect, "two-dev" });
	EXPECT_EQ(tool.wait(10s), 0) << tool.output();
	EXPECT_NE(tool.output().find("(slots 1..1), CUDA device 1, GPU ordering stream-memops"), std::string::npos)
		<< tool.output();
	Process json({ inspect, "--json", "two-dev" });
	EXPECT_EQ(json.wait(10s), 0) << json.output();
	EXPECT_NE(json.output().find("\"device_id\":1,\"slot_size\":1048576,\"first_slot\":1,\"count\":1,"
				     "\"gpu_ordering\":\"stream-memops\""),
		  std::string::npos)
		<< json.output();
	for (uint32_t d : { 1u, 0u, 1u }) {
		auto f = (*device)->acquire(kSmall, Storage::cuda, d, 0s);
		ASSERT_TRUE(f.ok()) << "device " << d << ": " << xmem::test::why(f);
		EXPECT_EQ(f->storage(), Storage::cuda);
		EXPECT_EQ(f->device(), d);
		EXPECT_EQ(f->meta().device_id, d);
	}
	EXPECT_EQ((*device)->acquire(kLarge + 1, Storage::cuda, 1, 0s).code(), Errc::out_of_range);

	xmem::PoolConfig config;
	config.slot_size = kSmall;
	config.slot_count = 1;
	auto system = xmem::BufferPool::create("two-sys", config);
	ASSERT_TRUE(system.ok()) << xmem::test::why(system);
	ASSERT_TRUE((*system)->preallocate(kLarge, 1, Storage::cuda, 1).ok());
	ASSERT_TRUE((*system)->preallocate(kLarge, 1, Storage::cuda, 0).ok());
	auto on0 = (*system)->acquire(0, Storage::cuda, 0, 0s);
	ASSERT_TRUE(on0.ok()) << xmem::test::why(on0);
	EXPECT_EQ(on0->device(), 0u);
	EXPECT_EQ((*system)->acquire(0, Storage::cuda, 2, 0s).code(), Errc::out_of_range) << "no device 2";
}

// Another process attached to a pool of device 0 before its class on device 1 existed:
// it imports the class with its first frame and checks every word of frames written on
// both GPUs, each read and released on its own device's stream; then one killed holding
// a read of a device-1 frame gives its slot back.
TEST(DISABLED_CudaClassesOnTwoSimulatedGpus, AnotherProcessTakesFramesOfBothDevices)
{
	RuntimeDir dir;
	xmem::PoolConfig config = cuda_config(2);
	config.policy = xmem::Policy::fifo;
	config.block_timeout = 10s;
	auto owner = xmem::BufferPool::create("two-mp", config);
	ASSERT_TRUE(owner.ok()) << xmem::test::why(owner);
	Process consumer({ xmem::test::cuda_peer_path(), "consume", "two-mp", "--frames", "20", "--any-device",
			   "--max-size", std::to_string(kLarge) });
	ASSERT_TRUE(consumer.wait_output("attached")) << consumer.output();
	ASSERT_TRUE(eventually([&] { return (*owner)->stats().consumers == 1; }));
	Gpu g0(0), g1(1);
	for (uint64_t n = 0; n < 20; n++) {
		if (n == 5) {
			ASSERT_TRUE((*owner)->preallocate(kLarge, 2, Storage::cuda, 1).ok());
		}
		if (n >= 5 && n % 2)
			publish_frame_in(**owner, g1, kLarge, Storage::cuda);
		else
			publish_frame_in(**owner, g0, kSmall, Storage::cuda);
		std::this_thread::sleep_for(2ms);
	}
	EXPECT_EQ(consumer.wait(60s), 0) << consumer.output();
	EXPECT_NE(consumer.output().find("frames=20 bad=0"), std::string::npos) << consumer.output();
	EXPECT_EQ(consumer.output().find("falls back"), std::string::npos)
		<< "the consumer's streams order device 1's slots too: " << consumer.output();

	Process holder({ xmem::test::cuda_peer_path(), "consume", "two-mp", "--hold", "1", "--any-device", "--max-size",
			 std::to_string(kLarge) });
	// Attached first: until the owner reaps the consumer that just left, its count
	// is 1 without the holder, and a frame published then would reach nobody.
	ASSERT_TRUE(holder.wait_output("attached")) << holder.output();
	ASSERT_TRUE(eventually([&] { return (*owner)->stats().consumers == 1; }));
	publish_frame_in(**owner, g1, kLarge, Storage::cuda);
	ASSERT_TRUE(holder.wait_output("holding")) << holder.output();
	holder.signal(SIGKILL);
	holder.wait(10s);
	EXPECT_TRUE(eventually([&] { return (*owner)->stats().slots_free == 4; }, 20s))
		<< "the killed consumer's device-1 slot is free again";
	// Its slot is written again: the owner's wait for the dead reader's done word ends.
	publish_frame_in(**owner, g1, kLarge, Storage::cuda);
	publish_frame_in(**owner, g1, kLarge, Storage::cuda);
}

// Copies to the other GPU that are buffers of the pool: a frame written on device 0,
// copied into a device-1 slot and published; a device-1 frame copied into a device-0
// slot and handed over as a ticket; a consumer's private copy of a device-0 frame on
// device 1. Every word arrives.
TEST(DISABLED_CudaClassesOnTwoSimulatedGpus, CopiesToTheOtherDeviceArePoolBuffers)
{
	RuntimeDir dir;
	auto owner = xmem::BufferPool::create("two-copies", cuda_config(2));
	ASSERT_TRUE(owner.ok()) << xmem::test::why(owner);
	auto consumer = xmem::BufferPool::open("two-copies");
	ASSERT_TRUE(consumer.ok()) << xmem::test::why(consumer);
	ASSERT_TRUE((*owner)->preallocate(kSmall, 2, Storage::cuda, 1).ok());
	Gpu g0(0), g1(1);
	auto write = [&](xmem::BufferGuard &f, Gpu &g, uint64_t seq) {
		write_frame(f, g, kSmall, seq);
		// The copy below runs on the other device's stream: these writes are over first.
		xmem::cuda::ContextScope scope(*g.ctx);
		ASSERT_EQ(g.d->cuStreamSynchronize(g.stream), CUDA_SUCCESS);
	};

	// Where the devices are peers, the copies read the source slot in place: this
	// process's mapping of it has been given access for the copying device. Elsewhere
	// they go through host memory, and no access is given.
	int peers = 0;
	ASSERT_EQ(g0.d->cuDeviceCanAccessPeer(&peers, 1, 0), CUDA_SUCCESS);
	auto access = [&](const xmem::BufferGuard &f, int device) {
		CUmemLocation at{};
		at.type = CU_MEM_LOCATION_TYPE_DEVICE;
		at.id = device;
		unsigned long long flags = ~0ull;
		xmem::cuda::ContextScope scope(*g0.ctx);
		EXPECT_EQ(g0.d->cuMemGetAccess(&flags, &at, f.device_ptr()), CUDA_SUCCESS);
		return flags;
	};
	const unsigned long long reached = peers ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE : CU_MEM_ACCESS_FLAGS_PROT_NONE;

	auto src = (*owner)->acquire(kSmall, Storage::cuda, 0, 10s, g0.stream);
	ASSERT_TRUE(src.ok()) << xmem::test::why(src);
	uint64_t seq = (*owner)->stats().published + 1;
	write(*src, g0, seq);
	src->meta_mut().value()->pts = 77;
	EXPECT_EQ(access(*src, 1), CU_MEM_ACCESS_FLAGS_PROT_NONE) << "no access before a copy needs it";
	auto on1 = (*owner)->copy(*src, Storage::cuda, 1, 10s, g1.stream);
	ASSERT_TRUE(on1.ok()) << xmem::test::why(on1);
	EXPECT_EQ(access(*src, 1), reached) << (peers ? "peers: read in place" : "no peers: through host memory");
	EXPECT_EQ(on1->device(), 1u);
	EXPECT_TRUE(on1->writable()) << "a pool buffer, ready to publish";
	ASSERT_TRUE(src->release(g0.stream).ok());
	ASSERT_TRUE((*owner)->publish(std::move(*on1), g1.stream).ok());
	auto r = (*consumer)->receive(5s);
	ASSERT_TRUE(r.ok()) << xmem::test::why(r);
	EXPECT_EQ(r->device(), 1u);
	EXPECT_EQ(r->meta().pts, 77u);
	EXPECT_EQ(r->meta().seq, seq);
	auto back = r->private_copy_to_cpu();
	ASSERT_TRUE(back.ok()) << xmem::test::why(back);
	EXPECT_TRUE(frame_is(back->data(), seq)) << "the device-1 copy's bytes";
	r->reset();

	auto dsrc = (*owner)->acquire(kSmall, Storage::cuda, 1, 10s, g1.stream);
	ASSERT_TRUE(dsrc.ok()) << xmem::test::why(dsrc);
	seq = (*owner)->stats().published + 1;
	write(*dsrc, g1, seq);
	auto on0 = (*owner)->copy(*dsrc, Storage::cuda, 0, 10s, g0.stream);
	ASSERT_TRUE(on0.ok()) << xmem::test::why(on0);
	EXPECT_EQ(on0->device(), 0u);
	EXPECT_EQ(access(*dsrc, 0), reached);
	ASSERT_TRUE(dsrc->release(g1.stream).ok());
	auto ticket = (*owner)->publish_ticket(std::move(*on0), 1, 5s, g0.stream);
	ASSERT_TRUE(ticket.ok()) << xmem::test::why(ticket);
	auto redeemed = (*consumer)->get(*ticket);
	ASSERT_TRUE(redeemed.ok()) << xmem::test::why(redeemed);
	EXPECT_EQ(redeemed->device(), 0u);
	EXPECT_EQ(access(*redeemed, 1), CU_MEM_ACCESS_FLAGS_PROT_NONE) << "the consumer's own mapping";
	auto private_copy = redeemed->private_copy_to_cuda(1);
	ASSERT_TRUE(private_copy.ok()) << xmem::test::why(private_copy);
	EXPECT_EQ(private_copy->device(), 1u);
	EXPECT_EQ(access(*redeemed, 1), reached) << "given by the consumer, in its own mapping";
	auto host = private_copy->private_copy_to_cpu();
	ASSERT_TRUE(host.ok()) << xmem::test::why(host);
	EXPECT_TRUE(frame_is(host->data(), seq)) << "device 1 -> pool slot on device 0 -> private copy on device 1";
}

// Copies that are buffers of the pool: a host frame copied into a device slot and
// published on the copy's stream, a device frame copied into a host slot and handed over
// as a ticket; their bytes and metadata arrive; a memory the pool has no class of, and a
// consumer's copy, are refused.
TEST(CudaClasses, CopiesAcrossMemoriesAreBuffersOfThePool)
{
	RuntimeDir dir;
	xmem::PoolConfig config;
	config.slot_size = kLarge;
	config.slot_count = 2;
	auto owner = xmem::BufferPool::create("copies", config);
	ASSERT_TRUE(owner.ok()) << xmem::test::why(owner);
	auto consumer = xmem::BufferPool::open("copies");
	ASSERT_TRUE(consumer.ok()) << xmem::test::why(consumer);
	ASSERT_TRUE((*owner)->preallocate(kLarge, 2, Storage::cuda, 0).ok());
	Gpu g;

	// Host to device: the source is an acquired slot, written by the CPU.
	auto src = (*owner)->acquire(kSmall, 10s);
	ASSERT_TRUE(src.ok()) << xmem::test::why(src);
	uint64_t seq = (*owner)->stats().published + 1;
	auto *w = reinterpret_cast<uint32_t *>(src->data_mut().value().data());
	for (uint64_t i = 0; i < kSmall / 4; i++)
		w[i] = i < (kSmall - xmem::test::kFrameTail) / 4 ? xmem::test::frame_word(seq)
								 : xmem::test::frame_tail_word(seq);
	src->meta_mut().value()->size = kSmall;
	src->meta_mut().value()->pts = 1234;
	auto device = (*owner)->copy(*src, Storage::cuda, 0, 10s, g.stream);
	ASSERT_TRUE(device.ok()) << xmem::test::why(device);
	EXPECT_EQ(device->storage(), Storage::cuda);
	EXPECT_TRUE(device->writable()) << "a pool buffer, ready to publish";
	EXPECT_NE(device->index(), src->index());
	src->reset();
	ASSERT_TRUE((*owner)->publish(std::move(*device), g.stream).ok());
	auto r = (*consumer)->receive(5s);
	ASSERT_TRUE(r.ok()) << xmem::test::why(r);
	EXPECT_EQ(r->storage(), Storage::cuda);
	EXPECT_EQ(r->meta().size, kSmall);
	EXPECT_EQ(r->meta().pts, 1234u);
	EXPECT_EQ(r->meta().seq, seq);
	auto back = r->private_copy_to_cpu();
	ASSERT_TRUE(back.ok()) << xmem::test::why(back);
	EXPECT_TRUE(frame_is(back->data(), seq)) << "the device copy's bytes";
	r->reset();

	// Device to host, as a ticket: the source is a device slot written on the GPU.
	auto dsrc = (*owner)->acquire(kLarge, Storage::cuda, 0, 10s, g.stream);
	ASSERT_TRUE(dsrc.ok()) << xmem::test::why(dsrc);
	seq = (*owner)->stats().published + 1;
	write_frame(*dsrc, g, kLarge, seq);
	auto host = (*owner)->copy(*dsrc, Storage::system, 0, 10s, g.stream);
	ASSERT_TRUE(host.ok()) << xmem::test::why(host);
	EXPECT_EQ(host->storage(), Storage::system);
	EXPECT_TRUE(frame_is(host->data(), seq)) << "complete on return";
	ASSERT_TRUE(dsrc->release(g.stream).ok());
	auto ticket = (*owner)->publish_ticket(std::move(*host), 1, 5s);
	ASSERT_TRUE(ticket.ok()) << xmem::test::why(ticket);
	auto redeemed = (*consumer)->get(*ticket);
	ASSERT_TRUE(redeemed.ok()) << xmem::test::why(redeemed);
	EXPECT_EQ(redeemed->storage(), Storage::system);
	EXPECT_TRUE(frame_is(redeemed->data(), seq));
	redeemed->reset();
	while ((*consumer)->receive(0s).ok()) {
	}

	auto plain = (*owner)->acquire(kSmall, 10s);
	ASSERT_TRUE(plain.ok());
	plain->meta_mut().value()->size = kSmall;
	EXPECT_EQ((*owner)->copy(*plain, Storage::cuda, 3, 0s).code(), Errc::out_of_range) << "no class on device 3";
	EXPECT_EQ((*owner)->copy(*plain, Storage::cuda, 0, 0s, g.stream).ok(), true);
	// A consumer's copy is a slot the owner leases it (a guest's), to publish in turn.
	auto guest_copy = (*consumer)->copy(*plain, Storage::cuda, 0, 1s, g.stream);
	ASSERT_TRUE(guest_copy.ok()) << xmem::test::why(guest_copy);
	EXPECT_EQ(guest_copy->storage(), Storage::cuda);
	EXPECT_TRUE(guest_copy->writable());
	EXPECT_EQ(guest_copy->meta().size, kSmall);
	guest_copy->reset();
	EXPECT_EQ((*owner)->copy(xmem::BufferGuard(), Storage::cuda, 0, 0s).code(), Errc::invalid_argument);
}
