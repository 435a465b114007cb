// test_cuda_classes.cpp - size classes of device pools: a class of larger device slots
// added while consumers are attached, in this process and in another one that imports the
// new class's VMM fds once, with its first frame; every word of every frame checked; a
// class of another memory or device refused. Run as cuda-classes-sim against the driver
// simulator (tests/cudasim), which proves xmem's logic, not the driver's behaviour, and as
// cuda-classes-gpu against the real driver (exits 77 without a GPU).
#include "../common.hpp"

#include "cuda/contexts.hpp"
#include "cuda/driver.hpp"
#include "peer_frames.hpp"

#include <csignal>
#include <thread>

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

	Gpu()
	{
		d = xmem::cuda::driver().value();
		ctx = xmem::cuda::PrimaryContext::retain(0, "test").value();
		xmem::cuda::ContextScope scope(*ctx);
		EXPECT_EQ(d->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	}
	~Gpu()
	{
		xmem::cuda::ContextScope scope(*ctx);
		d->cuStreamDestroy(stream);
	}
};

// Publishes frame SEQ (peer_frames.hpp: its words, then its tail) of SIZE bytes from a
// slot of SIZE bytes or more, written on the GPU on G's stream.
void publish_frame(xmem::BufferPool &owner, Gpu &g, uint64_t size)
{
	xmem::cuda::ContextScope scope(*g.ctx);
	auto f = owner.acquire(size, 10s, g.stream);
	ASSERT_TRUE(f.ok()) << xmem::test::why(f);
	ASSERT_GE(f->capacity(), size);
	uint64_t seq = owner.stats().published + 1;
	uint64_t body = size - xmem::test::kFrameTail;
	ASSERT_EQ(g.d->cuMemsetD32Async(f->device_ptr(), xmem::test::frame_word(seq), body / 4, g.stream),
		  CUDA_SUCCESS);
	ASSERT_EQ(g.d->cuMemsetD32Async(f->device_ptr() + body, xmem::test::frame_tail_word(seq),
					xmem::test::kFrameTail / 4, g.stream),
		  CUDA_SUCCESS);
	f->meta_mut().value()->size = size;
	auto published = owner.publish(std::move(f.value()), g.stream);
	ASSERT_TRUE(published.ok()) << xmem::test::why(published);
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
	// One memory per pool: system memory or another device is refused, with the reason.
	auto system = (*owner)->preallocate(kLarge, 1, Storage::system);
	EXPECT_EQ(system.code(), Errc::invalid_argument);
	EXPECT_NE(system.error().message.find("CUDA device 0"), std::string::npos) << system.error().message;
	EXPECT_EQ((*owner)->preallocate(kLarge, 1, Storage::cuda, 1).code(), Errc::invalid_argument);
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
		auto host = r->copy_to_cpu();
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
	ASSERT_TRUE(eventually([&] { return (*owner)->stats().consumers == 1; }));
	publish_frame(**owner, g, kLarge);
	ASSERT_TRUE(holder.wait_output("holding")) << holder.output();
	holder.signal(SIGKILL);
	holder.wait(10s);
	EXPECT_TRUE(eventually([&] { return (*owner)->stats().slots_free == 5; }, 20s))
		<< "the killed consumer's slot of the new class is free again";
}
