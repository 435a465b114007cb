// test_cuda_growth.cpp - growth on demand of CUDA device memory (PoolConfig::
// device_memory_cap): device slots made by acquire() up to the cap, each an allocation of
// its own; trimmed when idle, their memory freed once no process maps it; made again as new
// memory, which consumers map again (PeerRole::slot) and read word for word; a consumer in
// another process, and one SIGKILLed holding a device frame of a dynamic slot. Run as
// cuda-growth-sim against the driver simulator (tests/cudasim), which proves xmem's logic,
// not the driver's behaviour, and as cuda-growth-gpu against the real driver (exits 77
// without a GPU). Allocations are counted in /proc/PID/maps on the simulator only (its
// memfds are named after the device and size).
#include "../common.hpp"

#include "cuda/contexts.hpp"
#include "cuda/driver.hpp"
#include "layout.hpp"
#include "peer_frames.hpp"

#include <csignal>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

using namespace std::chrono_literals;
using xmem::Errc;
using xmem::Storage;
using xmem::test::eventually;
using xmem::test::Process;
using xmem::test::RuntimeDir;

namespace {

const auto *const gpu_or_skip = ::testing::AddGlobalTestEnvironment(new xmem::test::RealGpuOrSkip);

constexpr uint64_t kMiB = 1 << 20;
// Class 0: 2 slots of 64 KiB (2 MiB apart: the simulator's granularity is 2 MiB, as a
// GPU's). Frames of 3 MiB go to dynamic slots of 3 MiB, 4 MiB apart: their allocations
// are told from class 0's by their size.
constexpr uint64_t kFirst = 64 * 1024;
constexpr uint64_t kFirstBytes = 2 * 2 * kMiB;
constexpr uint64_t kFrame = 3 * kMiB;
constexpr uint64_t kDynamicStride = 4 * kMiB;
constexpr uint64_t kCap = 20 * kMiB; // class 0's 4 MiB and 4 dynamic slots

xmem::PoolConfig growing_config(std::chrono::milliseconds trim_idle)
{
	xmem::PoolConfig c;
	c.storage = Storage::cuda;
	c.slot_size = kFirst;
	c.slot_count = 2;
	c.device_memory_cap = kCap;
	c.trim_idle = trim_idle;
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

// A device slot of SIZE bytes or more, frame SEQ written into it on G's stream
// (peer_frames.hpp: its words, then its tail).
xmem::Result<xmem::BufferGuard> written(xmem::BufferPool &owner, Gpu &g, uint64_t size, uint64_t seq,
					std::chrono::milliseconds timeout = 10s)
{
	xmem::cuda::ContextScope scope(*g.ctx);
	auto f = owner.acquire(size, Storage::cuda, 0, timeout, g.stream);
	if (!f)
		return f;
	uint64_t body = size - xmem::test::kFrameTail;
	EXPECT_EQ(g.d->cuMemsetD32Async(f->device_ptr(), xmem::test::frame_word(seq), body / 4, g.stream),
		  CUDA_SUCCESS);
	EXPECT_EQ(g.d->cuMemsetD32Async(f->device_ptr() + body, xmem::test::frame_tail_word(seq),
					xmem::test::kFrameTail / 4, g.stream),
		  CUDA_SUCCESS);
	f->meta_mut().value()->size = size;
	return f;
}

void publish(xmem::BufferPool &owner, Gpu &g, xmem::BufferGuard f)
{
	auto published = owner.publish(std::move(f), g.stream);
	ASSERT_TRUE(published.ok()) << xmem::test::why(published);
}

// The frame a consumer received, read back to the host: every word of frame SEQ.
void expect_frame(xmem::Result<xmem::BufferGuard> &r, uint64_t seq)
{
	ASSERT_TRUE(r.ok()) << xmem::test::why(r);
	EXPECT_EQ(r->storage(), Storage::cuda);
	auto host = r->private_copy_to_cpu();
	ASSERT_TRUE(host.ok()) << xmem::test::why(host);
	const auto *w = reinterpret_cast<const uint32_t *>(host->data().data());
	uint64_t size = host->data().size(), body = (size - xmem::test::kFrameTail) / 4, wrong = 0;
	for (uint64_t i = 0; i < size / 4; i++)
		wrong += w[i] != (i < body ? xmem::test::frame_word(seq) : xmem::test::frame_tail_word(seq));
	EXPECT_EQ(wrong, 0u) << "frame " << seq;
}

// The simulator's allocations of BYTES on device 0 that process PID maps (each a memfd
// named cudasim:dev0:BYTES, mapped by the simulator while any handle or mapping holds it);
// -1 on a real GPU, where they cannot be counted so.
int allocations(pid_t pid, uint64_t bytes)
{
	if (!xmem::test::on_cuda_simulator())
		return -1;
	std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
	// The path ends the line: "/memfd:cudasim:dev0:BYTES (deleted)".
	std::string name = "cudasim:dev0:" + std::to_string(bytes), line;
	std::set<std::string> inodes;
	while (std::getline(maps, line)) {
		size_t at = line.find(name);
		if (at == std::string::npos || (at + name.size() < line.size() && line[at + name.size()] != ' '))
			continue;
		// The inode: the fifth field.
		std::istringstream fields(line);
		std::string range, perms, offset, dev, inode;
		fields >> range >> perms >> offset >> dev >> inode;
		inodes.insert(inode);
	}
	return int(inodes.size());
}

bool simulated()
{
	return xmem::test::on_cuda_simulator();
}

} // namespace

// Held device frames of 1 MiB make dynamic slots up to the cap; past it an acquire waits
// (a dynamic class holds the size) or is refused at once (none does); the frames reach a
// consumer word for word. Released, the slots are trimmed once idle: the owner's memory
// goes at once, the consumer's mapping at its next frame. Made again, a slot is new memory
// the consumer maps again, and its frames read right.
TEST(CudaGrowth, DeviceSlotsGrowToTheCapAndGiveTheirMemoryBack)
{
	RuntimeDir dir;
	// Idle for 1 s: nothing is trimmed between the frames of a round, however slow the
	// machine (a sanitizer's), so the counts below are exact.
	auto owner = xmem::BufferPool::create("grow-dev", growing_config(1s));
	ASSERT_TRUE(owner.ok()) << xmem::test::why(owner);
	auto consumer = xmem::BufferPool::open("grow-dev");
	ASSERT_TRUE(consumer.ok()) << xmem::test::why(consumer);
	EXPECT_EQ((*owner)->growth_stats().device_memory_cap, kCap);
	EXPECT_EQ((*owner)->growth_stats().device_bytes, kFirstBytes) << "class 0 counts too";
	EXPECT_EQ(allocations(::getpid(), kDynamicStride), simulated() ? 0 : -1);

	Gpu g;
	uint64_t seq = 1;
	std::vector<xmem::BufferGuard> frames;
	for (int n = 0; n < 4; n++) {
		auto f = written(**owner, g, kFrame, seq++);
		ASSERT_TRUE(f.ok()) << xmem::test::why(f);
		EXPECT_EQ(f->capacity(), kFrame) << "a quarter-power-of-two slot";
		frames.push_back(std::move(f.value()));
	}
	xmem::GrowthStats s = (*owner)->growth_stats();
	EXPECT_EQ(s.device_bytes, kCap);
	EXPECT_EQ(s.dynamic_slots, 4u);
	EXPECT_EQ(s.system_bytes, 0u);
	EXPECT_EQ(allocations(::getpid(), kDynamicStride), simulated() ? 4 : -1);
	auto classes = (*owner)->classes();
	ASSERT_EQ(classes.size(), 2u);
	EXPECT_TRUE(classes[1].dynamic);
	EXPECT_EQ(classes[1].storage, Storage::cuda);
	EXPECT_EQ(classes[1].committed, 4u);

	// At the cap: a size the dynamic class holds waits, one no class holds is refused.
	auto waits = (*owner)->acquire(kFrame, Storage::cuda, 0, 50ms);
	EXPECT_EQ(waits.code(), Errc::timed_out) << xmem::test::why(waits);
	auto refused = (*owner)->acquire(6 * kMiB, Storage::cuda, 0, 50ms);
	EXPECT_EQ((*owner)->growth_stats().dynamic_slots, 4u) << "no slot given back for it";
	EXPECT_EQ(refused.code(), Errc::full) << xmem::test::why(refused);
	EXPECT_NE(refused.error().message.find("memory of CUDA device 0 under the pool's memory cap"),
		  std::string::npos)
		<< refused.error().message;

	for (auto &f : frames)
		publish(**owner, g, std::move(f));
	frames.clear();
	// Held until all four are read: a slot let go of earlier could be trimmed, and
	// unmapped here at the next frame, before the counts below.
	std::vector<xmem::BufferGuard> received;
	for (uint64_t n = 1; n <= 4; n++) {
		auto r = (*consumer)->receive(5s);
		expect_frame(r, n);
		ASSERT_TRUE(r.ok());
		EXPECT_EQ(r->capacity(), kFrame);
		received.push_back(std::move(r.value()));
	}
	received.clear();

	// Idle: trimmed. The owner's allocations go at once; the consumer still maps them.
	ASSERT_TRUE(eventually([&] { return (*owner)->growth_stats().dynamic_slots == 0; }, 10s));
	s = (*owner)->growth_stats();
	EXPECT_EQ(s.device_bytes, kFirstBytes);
	EXPECT_EQ(s.trimmed, 4u);
	EXPECT_EQ(allocations(::getpid(), kDynamicStride), simulated() ? 4 : -1)
		<< "the consumer's mappings keep the memory until its next frame";

	// A frame of class 0: the consumer lets the trimmed slots' memory go.
	auto small = written(**owner, g, kFirst, seq++);
	ASSERT_TRUE(small.ok()) << xmem::test::why(small);
	EXPECT_EQ(small->capacity(), kFirst);
	publish(**owner, g, std::move(small.value()));
	{
		auto r = (*consumer)->receive(5s);
		expect_frame(r, 5);
	}
	EXPECT_EQ(allocations(::getpid(), kDynamicStride), simulated() ? 0 : -1)
		<< "no process maps a trimmed slot's memory";

	// Made again: new memory, mapped again by the consumer, its frames right.
	for (uint64_t n = 0; n < 6; n++) {
		auto f = written(**owner, g, kFrame, seq);
		ASSERT_TRUE(f.ok()) << xmem::test::why(f);
		publish(**owner, g, std::move(f.value()));
		auto r = (*consumer)->receive(5s);
		expect_frame(r, seq++);
	}
	EXPECT_EQ((*owner)->growth_stats().grown, 4u + 1u) << "a freed dynamic slot is reused, not made again";
	EXPECT_EQ(allocations(::getpid(), kDynamicStride), simulated() ? 1 : -1);
}

// A consumer in another process reads frames of dynamic device slots while they are
// trimmed and made again (each time new memory it maps again), every word checked; then
// another, SIGKILLed holding a dynamic slot's frame, keeps it from the trims only until
// it is reaped.
TEST(CudaGrowth, AnotherProcessMapsEachSlotsMemoryAgainAfterATrim)
{
	RuntimeDir dir;
	xmem::PoolConfig config = growing_config(50ms);
	config.policy = xmem::Policy::fifo;
	config.block_timeout = 10s;
	auto owner = xmem::BufferPool::create("grow-dev-mp", config);
	ASSERT_TRUE(owner.ok()) << xmem::test::why(owner);
	constexpr int kFrames = 12;
	Process consumer({ xmem::test::cuda_peer_path(), "consume", "grow-dev-mp", "--frames", std::to_string(kFrames),
			   "--max-size", std::to_string(kFrame) });
	ASSERT_TRUE(consumer.wait_output("attached")) << consumer.output();
	ASSERT_TRUE(eventually([&] { return (*owner)->stats().consumers == 1; }));
	Gpu g;
	for (uint64_t seq = 1; seq <= kFrames; seq++) {
		auto f = written(**owner, g, seq % 4 == 0 ? kFirst : kFrame, seq);
		ASSERT_TRUE(f.ok()) << xmem::test::why(f);
		publish(**owner, g, std::move(f.value()));
		if (seq % 3 == 0) {
			// Every dynamic slot trimmed before the next frame makes one again.
			ASSERT_TRUE(eventually([&] { return (*owner)->growth_stats().dynamic_slots == 0; }, 10s));
		}
	}
	EXPECT_EQ(consumer.wait(60s), 0) << consumer.output();
	EXPECT_NE(consumer.output().find("frames=12 bad=0"), std::string::npos) << consumer.output();
	EXPECT_GE((*owner)->growth_stats().trimmed, 3u);

	Process holder({ xmem::test::cuda_peer_path(), "consume", "grow-dev-mp", "--hold", "1", "--max-size",
			 std::to_string(kFrame) });
	ASSERT_TRUE(holder.wait_output("attached")) << holder.output();
	ASSERT_TRUE(eventually([&] { return (*owner)->stats().consumers == 1; }));
	auto f = written(**owner, g, kFrame, 100);
	ASSERT_TRUE(f.ok()) << xmem::test::why(f);
	publish(**owner, g, std::move(f.value()));
	ASSERT_TRUE(holder.wait_output("holding")) << holder.output();
	EXPECT_EQ(allocations(holder.pid(), kDynamicStride), simulated() ? 1 : -1);
	std::this_thread::sleep_for(200ms);
	EXPECT_EQ((*owner)->growth_stats().dynamic_slots, 1u) << "a held slot is never trimmed";
	holder.signal(SIGKILL);
	holder.wait(10s);
	EXPECT_TRUE(eventually([&] { return (*owner)->growth_stats().dynamic_slots == 0; }, 20s))
		<< "the killed consumer's slot is trimmed once it is reaped";
	EXPECT_EQ((*owner)->growth_stats().device_bytes, kFirstBytes);
	EXPECT_EQ(allocations(::getpid(), kDynamicStride), simulated() ? 0 : -1);
}

// Settings: a device cap alone makes device memory grow and not system memory; without
// one, device memory keeps its classes (a size past them out of range).
TEST(CudaGrowth, OnlyTheMemoryWithACapGrows)
{
	RuntimeDir dir;
	auto owner = xmem::BufferPool::create("grow-dev-only", growing_config(0ms));
	ASSERT_TRUE(owner.ok()) << xmem::test::why(owner);
	auto preallocated = (*owner)->preallocate(4096, 1, Storage::system, 0);
	ASSERT_TRUE(preallocated.ok()) << xmem::test::why(preallocated);
	auto host = (*owner)->acquire(1 << 20, Storage::system, 0, 50ms);
	EXPECT_EQ(host.code(), Errc::out_of_range) << xmem::test::why(host);
	EXPECT_EQ((*owner)->growth_stats().trim_idle_ns, 10'000'000'000u) << "the default idle time";

	xmem::PoolConfig fixed = growing_config(0ms);
	fixed.device_memory_cap = 0;
	auto still = xmem::BufferPool::create("grow-dev-none", fixed);
	ASSERT_TRUE(still.ok()) << xmem::test::why(still);
	auto past = (*still)->acquire(kFrame, Storage::cuda, 0, 50ms);
	EXPECT_EQ(past.code(), Errc::out_of_range) << xmem::test::why(past);
	EXPECT_EQ((*still)->growth_stats().device_memory_cap, 0u);
}

// A peer writes the memory generations of the slot records (any attached process can):
// a consumer whose mapping the record no longer names asks the owner, which answers with
// the slot's memory as it committed it and the generation it really is, so frames still
// read right and no other memory is ever mapped.
TEST(CudaGrowth, ScribbledGenerationsCostARoundTripNeverTheWrongMemory)
{
	RuntimeDir dir;
	auto owner = xmem::BufferPool::create("grow-dev-scribble", growing_config(60s));
	ASSERT_TRUE(owner.ok()) << xmem::test::why(owner);
	auto consumer = xmem::BufferPool::open("grow-dev-scribble");
	ASSERT_TRUE(consumer.ok()) << xmem::test::why(consumer);
	auto bytes = (*consumer)->control_segment();
	auto *base = const_cast<std::byte *>(bytes.data());
	auto *slots = reinterpret_cast<xmem::layout::SlotRecord *>(base + xmem::layout::slots_offset());
	Gpu g;
	uint32_t index = 0;
	for (uint64_t seq = 1; seq <= 8; seq++) {
		auto f = written(**owner, g, kFrame, seq);
		ASSERT_TRUE(f.ok()) << xmem::test::why(f);
		index = f->index();
		publish(**owner, g, std::move(f.value()));
		auto r = (*consumer)->receive(5s);
		expect_frame(r, seq);
		EXPECT_EQ(r->index(), index) << "one dynamic slot, reused";
		r = xmem::Result<xmem::BufferGuard>(xmem::Error{ Errc::closed, "" });
		// Each round, another lie: a generation of no commit, 0, or every bit.
		slots[index].memory_gen.store(seq % 3 == 0 ? 0u : seq % 3 == 1 ? 12345u : ~0u);
	}
	EXPECT_EQ((*owner)->growth_stats().grown, 1u) << "the slot's memory was committed once";
	EXPECT_EQ(allocations(::getpid(), kDynamicStride), simulated() ? 1 : -1)
		<< "the consumer mapped the one allocation each time";
}

// A guest (an attached process producing) leases a device slot the owner makes on
// demand for it: the guest maps the slot's memory as a consumer does, writes a frame and
// publishes it as a ticket, which another handle redeems and reads word for word. After
// a trim the next lease is new memory, mapped again by both.
TEST(CudaGrowth, AGuestsLeaseAndATicketOfASlotMadeOnDemand)
{
	RuntimeDir dir;
	auto owner = xmem::BufferPool::create("grow-dev-guest", growing_config(50ms));
	ASSERT_TRUE(owner.ok()) << xmem::test::why(owner);
	auto guest = xmem::BufferPool::open("grow-dev-guest");
	auto redeemer = xmem::BufferPool::open("grow-dev-guest");
	ASSERT_TRUE(guest.ok() && redeemer.ok());
	Gpu g;
	for (uint64_t seq = 1; seq <= 3; seq++) {
		auto f = written(**guest, g, kFrame, 0x700 + seq);
		ASSERT_TRUE(f.ok()) << xmem::test::why(f);
		EXPECT_EQ(f->capacity(), kFrame);
		auto ticket = (*guest)->publish_ticket(std::move(f.value()), 1, 10s, g.stream);
		ASSERT_TRUE(ticket.ok()) << xmem::test::why(ticket);
		auto r = (*redeemer)->get(*ticket);
		expect_frame(r, 0x700 + seq);
		r = xmem::Result<xmem::BufferGuard>(xmem::Error{ Errc::closed, "" });
		EXPECT_EQ((*owner)->growth_stats().dynamic_slots, 1u);
		// Given back once idle: the next lease is of new memory.
		ASSERT_TRUE(eventually([&] { return (*owner)->growth_stats().dynamic_slots == 0; }, 10s));
	}
	xmem::GrowthStats s = (*owner)->growth_stats();
	EXPECT_EQ(s.grown, 3u);
	EXPECT_EQ(s.trimmed, 3u);
	EXPECT_EQ(s.device_bytes, kFirstBytes);
}
