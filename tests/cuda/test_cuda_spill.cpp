// test_cuda_spill.cpp - the spill tier of device pools: frames queued only for fifo-spill
// consumers copied out of their device slots into the page-locked tier on a stream of the
// owner's, the slot rewritten only after that copy read it, the copy made only after the
// frame's writes, and the frame handed back as a device copy or as host memory. Run as
// cuda-spill-sim against the CUDA driver simulator (xmem's ordering logic, not the
// driver's behaviour) and as cuda-spill-gpu against the real driver (77 without a GPU).
#include "../common.hpp"

#include "cuda/driver.hpp"
#include "gated_host.hpp"
#include "peer_frames.hpp"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <thread>

using namespace std::chrono_literals;
using xmem::Errc;
using xmem::test::eventually;
using xmem::test::on_cuda_simulator;
using xmem::test::Process;
using xmem::test::RuntimeDir;

namespace {

using xmem::test::GatedHost;

const auto *const gpu_or_skip = ::testing::AddGlobalTestEnvironment(new xmem::test::RealGpuOrSkip);

using xmem::test::cuda_peer_path;
// The peer's frame words, so its consumers check what this producer writes.
const auto word = xmem::test::frame_word;
const auto tail_word = xmem::test::frame_tail_word;
constexpr uint64_t kTail = xmem::test::kFrameTail;
constexpr uint64_t kSize = 64 * 1024;

xmem::PoolConfig spill_config(const char *producer, uint32_t slots, uint32_t spill_frames)
{
	xmem::PoolConfig c;
	c.storage = xmem::Storage::cuda;
	c.slot_size = kSize;
	c.slot_count = slots;
	c.spill_bytes = uint64_t{ spill_frames } * kSize;
	c.producer = producer;
	return c;
}

std::shared_ptr<xmem::BufferPool> attach(const std::string &name, xmem::Policy policy,
					 xmem::SpillDelivery delivery = xmem::SpillDelivery::device,
					 xmem::Policy fallback = xmem::Policy::drop_oldest)
{
	xmem::OpenOptions o;
	o.policy = policy;
	o.spill_delivery = delivery;
	o.fallback = fallback;
	auto p = xmem::BufferPool::open(name, o);
	EXPECT_TRUE(p.ok()) << xmem::test::why(p);
	return p.ok() ? std::move(p.value()) : nullptr;
}

struct Gpu {
	const xmem::cuda::Driver *d = xmem::cuda::driver().value();
	std::shared_ptr<xmem::cuda::PrimaryContext> ctx = xmem::cuda::PrimaryContext::retain(0, "test").value();
	CUstream stream = nullptr;
	Gpu() { create(&stream); }
	~Gpu()
	{
		xmem::cuda::ContextScope scope(*ctx);
		d->cuStreamSynchronize(stream);
		d->cuStreamDestroy(stream);
	}
	void create(CUstream *s) const
	{
		xmem::cuda::ContextScope scope(*ctx);
		ASSERT_EQ(d->cuStreamCreate(s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	}
};

// A GatedHost made and given back with the test's context current (the driver refuses
// cuMemHostRegister and cuMemHostUnregister without one, and a registration left behind
// would refuse the next one at the same address).
struct Gate {
	explicit Gate(const Gpu &gpu) : g(gpu)
	{
		xmem::cuda::ContextScope scope(*g.ctx);
		host.emplace(4096);
	}
	~Gate()
	{
		xmem::cuda::ContextScope scope(*g.ctx);
		host.reset();
	}
	GatedHost *operator->() { return &*host; }
	const Gpu &g;
	std::optional<GatedHost> host;
};

// Publishes one frame written on STREAM with frame SEQ's words (body, then tail page).
void publish(const Gpu &g, xmem::BufferPool &owner, CUstream stream)
{
	auto f = owner.acquire(5s, stream);
	ASSERT_TRUE(f.ok()) << xmem::test::why(f);
	uint64_t seq = owner.stats().published + 1;
	xmem::cuda::ContextScope scope(*g.ctx);
	ASSERT_EQ(g.d->cuMemsetD32Async(f->device_ptr(), word(seq), (kSize - kTail) / 4, stream), CUDA_SUCCESS);
	ASSERT_EQ(g.d->cuMemsetD32Async(f->device_ptr() + kSize - kTail, tail_word(seq), kTail / 4, stream),
		  CUDA_SUCCESS);
	f->meta_mut().value()->size = kSize;
	ASSERT_TRUE(owner.publish(std::move(f.value()), stream).ok());
}

// Checks every byte of a received frame: device frames copied back on the CPU, host
// ones read in place. Returns the first bad word's index, or -1.
long long bad_word(const Gpu &g, const xmem::BufferGuard &f, std::vector<uint32_t> &host)
{
	uint64_t seq = f.meta().seq;
	host.assign(kSize / 4, 0);
	if (f.storage() == xmem::Storage::system) {
		std::memcpy(host.data(), f.data().data(), kSize);
	} else {
		xmem::cuda::ContextScope scope(*g.ctx);
		EXPECT_EQ(g.d->cuMemcpyDtoHAsync(host.data(), f.device_ptr(), kSize, g.stream), CUDA_SUCCESS);
		EXPECT_EQ(g.d->cuStreamSynchronize(g.stream), CUDA_SUCCESS);
	}
	for (uint64_t i = 0; i < kSize / 4; i++)
		if (host[i] != (i < (kSize - kTail) / 4 ? word(seq) : tail_word(seq)))
			return (long long)i;
	return -1;
}

} // namespace

// The case on a device pool, in one process: a fifo-spill recorder reads nothing
// while a latest detector reads every frame; a second recorder takes spilled frames as
// host memory. The producer never waits, and both recorders later get every frame, in
// order, byte for byte: device frames (slots, or the recorder's copies of spilled ones)
// and host frames.
TEST(CudaSpill, StalledRecordersGetEveryFrameBesideALatestDetector)
{
	RuntimeDir dir;
	constexpr int kFrames = 24;
	auto owner = xmem::BufferPool::create("spill", spill_config("spill", 4, 2 * kFrames));
	ASSERT_TRUE(owner.ok()) << xmem::test::why(owner);
	auto device = attach("spill", xmem::Policy::fifo_spill);
	auto host = attach("spill", xmem::Policy::fifo_spill, xmem::SpillDelivery::host);
	auto detector = attach("spill", xmem::Policy::latest);
	ASSERT_TRUE(device && host && detector);
	Gpu g;
	std::vector<uint32_t> words;
	for (int i = 0; i < kFrames; i++) {
		auto start = std::chrono::steady_clock::now();
		publish(g, **owner, g.stream);
		EXPECT_LT(std::chrono::steady_clock::now() - start, 2s) << "the producer waited for the recorders";
		auto d = detector->receive(2s, g.stream);
		ASSERT_TRUE(d.ok()) << xmem::test::why(d);
		EXPECT_EQ(d->meta().seq, uint64_t(i + 1)) << "the detector did not get the newest frame";
		EXPECT_FALSE(d->spilled());
		EXPECT_EQ(bad_word(g, *d, words), -1) << "detector, frame " << d->meta().seq;
	}
	auto stats = (*owner)->spill_stats();
	EXPECT_GE(stats.spilled, uint64_t(kFrames - 4)) << "frames queued only for the recorders stay in slots";

	for (auto *recorder : { &device, &host }) {
		int spilled = 0;
		for (int i = 1; i <= kFrames; i++) {
			auto f = (*recorder)->receive(5s, g.stream);
			ASSERT_TRUE(f.ok()) << "frame " << i << ": " << xmem::test::why(f);
			ASSERT_EQ(f->meta().seq, uint64_t(i)) << "out of order";
			EXPECT_EQ(bad_word(g, *f, words), -1) << "frame " << i << (f->spilled() ? " (spilled)" : "");
			if (f->spilled()) {
				spilled++;
				bool to_host = recorder == &host;
				EXPECT_EQ(f->storage(), to_host ? xmem::Storage::system : xmem::Storage::cuda);
				EXPECT_EQ(f->is_copy(), !to_host) << "a device delivery is the recorder's own copy";
			} else {
				EXPECT_EQ(f->storage(), xmem::Storage::cuda);
			}
		}
		EXPECT_GE(spilled, kFrames - 4);
		auto s = (*recorder)->consumer_stats().value();
		EXPECT_EQ(s.dropped, 0u);
		EXPECT_GE(s.spilled, uint64_t(kFrames - 4));
	}
	// Every buffer went back (collected on the next publish).
	publish(g, **owner, g.stream);
	EXPECT_EQ((*owner)->spill_stats().frames, 0u);
	EXPECT_EQ((*owner)->spill_stats().bytes, 0u);
}

// The order on the GPU, with the producer's writes of frame 1 held behind a gate on one
// stream and frame 2 written on another: the spill copy of frame 1 must wait for those
// writes (else it copies stale bytes), and frame 2's writes to the slot must wait for the
// spill copy (else the recorder gets frame 2's bytes as frame 1). A stream-less receive
// meanwhile finds the spilled frame not copied yet and keeps it.
TEST(CudaSpill, TheCopyWaitsForTheFramesWritesAndTheSlotForTheCopy)
{
	RuntimeDir dir;
	if (!on_cuda_simulator() && !xmem::cuda::check_device(0, "").value().stream_mem_ops)
		GTEST_SKIP() << "this GPU has no 64-bit stream memory operations";
	auto owner = xmem::BufferPool::create("gated", spill_config("gated", 1, 4));
	ASSERT_TRUE(owner.ok()) << xmem::test::why(owner);
	ASSERT_STREQ((*owner)->gpu_ordering(), "stream-memops");
	auto recorder = attach("gated", xmem::Policy::fifo_spill);
	ASSERT_TRUE(recorder);
	Gpu g;
	CUstream second;
	g.create(&second);
	Gate gate(g);
	ASSERT_TRUE(gate->ok);

	{
		xmem::cuda::ContextScope scope(*g.ctx);
		auto f = (*owner)->acquire(5s, g.stream);
		ASSERT_TRUE(f.ok()) << xmem::test::why(f);
		ASSERT_EQ(g.d->cuStreamWaitValue64(g.stream, gate->gate_dev, 1, CU_STREAM_WAIT_VALUE_GEQ),
			  CUDA_SUCCESS);
		ASSERT_EQ(g.d->cuMemsetD32Async(f->device_ptr(), word(1), (kSize - kTail) / 4, g.stream), CUDA_SUCCESS);
		ASSERT_EQ(g.d->cuMemsetD32Async(f->device_ptr() + kSize - kTail, tail_word(1), kTail / 4, g.stream),
			  CUDA_SUCCESS);
		f->meta_mut().value()->size = kSize;
		ASSERT_TRUE((*owner)->publish(std::move(f.value()), g.stream).ok());
	}
	// The one slot is queued for the recorder only: acquire spills it, without waiting
	// for the gate (the copy is queued), and frame 2 is written on the second stream.
	auto start = std::chrono::steady_clock::now();
	publish(g, **owner, second);
	EXPECT_LT(std::chrono::steady_clock::now() - start, 1s) << "the spill waited on the CPU";
	EXPECT_GE((*owner)->spill_stats().spilled, 1u);
	std::this_thread::sleep_for(200ms);
	{
		xmem::cuda::ContextScope scope(*g.ctx);
		EXPECT_EQ(g.d->cuStreamQuery(second), CUDA_ERROR_NOT_READY)
			<< "frame 2's writes ran before the spill copy of frame 1 read the slot";
	}
	auto early = recorder->receive(0ns);
	EXPECT_EQ(early.code(), Errc::timed_out) << "a spilled frame handed out before its copy landed";

	gate->open();
	std::vector<uint32_t> words;
	for (uint64_t seq = 1; seq <= 2; seq++) {
		auto f = recorder->receive(5s, g.stream);
		ASSERT_TRUE(f.ok()) << xmem::test::why(f);
		ASSERT_EQ(f->meta().seq, seq);
		if (seq == 1) {
			EXPECT_TRUE(f->spilled()); // frame 2 may be too: the owner spills ahead
		}
		EXPECT_EQ(bad_word(g, *f, words), -1) << "frame " << seq;
	}
	recorder.reset();
	owner->reset();
	xmem::cuda::ContextScope scope(*g.ctx);
	g.d->cuStreamSynchronize(second);
	g.d->cuStreamDestroy(second);
}

// A recorder's copy back to the device is queued on the stream it received on (its
// mapping of the tier is page-locked): with that stream held behind a gate, receive
// returns at once (a copy from pageable memory would wait for the stream, on a GPU as on
// the simulator), the spill buffer stays held until the copy's memory is released, and
// the frame is intact once the gate opens.
TEST(CudaSpill, TheCopyBackIsQueuedOnTheRecordersStream)
{
	RuntimeDir dir;
	if (!on_cuda_simulator() && !xmem::cuda::check_device(0, "").value().stream_mem_ops)
		GTEST_SKIP() << "this GPU has no 64-bit stream memory operations";
	auto owner = xmem::BufferPool::create("back", spill_config("back", 1, 4));
	ASSERT_TRUE(owner.ok()) << xmem::test::why(owner);
	auto recorder = attach("back", xmem::Policy::fifo_spill);
	ASSERT_TRUE(recorder);
	Gpu g;
	CUstream read;
	g.create(&read);
	Gate gate(g);
	ASSERT_TRUE(gate->ok);
	publish(g, **owner, g.stream);
	publish(g, **owner, g.stream); // frame 1 spilled: its slot holds frame 2
	ASSERT_GE((*owner)->spill_stats().spilled, 1u);
	{
		xmem::cuda::ContextScope scope(*g.ctx);
		ASSERT_EQ(g.d->cuStreamWaitValue64(read, gate->gate_dev, 1, CU_STREAM_WAIT_VALUE_GEQ), CUDA_SUCCESS);
	}
	// Opened in 2 s at the latest, so that a receive that waits for the stream ends.
	std::atomic<bool> opened{ false };
	std::thread opener([&] {
		for (int i = 0; i < 200 && !opened.load(); i++)
			std::this_thread::sleep_for(10ms);
		gate->open();
	});
	auto start = std::chrono::steady_clock::now();
	auto f = recorder->receive(5s, read);
	EXPECT_LT(std::chrono::steady_clock::now() - start, 1s) << "the copy back waited for the held stream";
	ASSERT_TRUE(f.ok()) << xmem::test::why(f);
	ASSERT_TRUE(f->spilled());
	EXPECT_EQ(f->storage(), xmem::Storage::cuda);
	// A publish collects the buffers nobody holds (it spills frame 2 too): every buffer
	// spilled so far is still held, frame 1's by the copy.
	publish(g, **owner, g.stream);
	auto held = (*owner)->spill_stats();
	EXPECT_EQ(held.frames, held.spilled) << "frame 1's buffer went back under the queued copy";
	opened = true;
	opener.join();
	std::vector<uint32_t> words;
	{
		xmem::cuda::ContextScope scope(*g.ctx);
		ASSERT_EQ(g.d->cuStreamSynchronize(read), CUDA_SUCCESS);
	}
	EXPECT_EQ(bad_word(g, *f, words), -1);
	ASSERT_TRUE(f->release(read).ok());
	recorder.reset(); // frame 2's buffer goes with its queue
	EXPECT_TRUE(eventually([&] {
		publish(g, **owner, g.stream);
		return (*owner)->spill_stats().frames == 0;
	}));
	owner->reset();
	xmem::cuda::ContextScope scope(*g.ctx);
	g.d->cuStreamDestroy(read);
}

// A producer that closes its pool while its GPU writes (a frame's) and its spill copy
// (of the frame before) are still queued loses neither: close waits for them before it
// hangs up on its consumers, which take a hang-up for the owner's death (tests/model,
// Finding 7: before, the recorder dropped the spilled frame as "the owner died", and got
// the last one flagged incomplete, while both were still being written).
TEST(CudaSpill, AClosingProducerLosesNoFrameStillBeingWritten)
{
	RuntimeDir dir;
	if (!on_cuda_simulator() && !xmem::cuda::check_device(0, "").value().stream_mem_ops)
		GTEST_SKIP() << "this GPU has no 64-bit stream memory operations";
	auto owner = xmem::BufferPool::create("closing", spill_config("closing", 1, 4));
	ASSERT_TRUE(owner.ok()) << xmem::test::why(owner);
	auto recorder = attach("closing", xmem::Policy::fifo_spill);
	ASSERT_TRUE(recorder);
	Gpu g;
	Gate gate(g);
	ASSERT_TRUE(gate->ok);
	{
		// Frame 1 and frame 2 both behind the gate: frame 1's spill copy waits for its
		// writes, frame 2's writes for that copy.
		xmem::cuda::ContextScope scope(*g.ctx);
		ASSERT_EQ(g.d->cuStreamWaitValue64(g.stream, gate->gate_dev, 1, CU_STREAM_WAIT_VALUE_GEQ),
			  CUDA_SUCCESS);
	}
	publish(g, **owner, g.stream);
	publish(g, **owner, g.stream);
	ASSERT_GE((*owner)->spill_stats().spilled, 1u);
	std::thread opener([&] {
		std::this_thread::sleep_for(300ms);
		gate->open();
	});
	auto start = std::chrono::steady_clock::now();
	owner->reset(); // closes: waits for the gate
	EXPECT_GE(std::chrono::steady_clock::now() - start, 250ms) << "close did not wait for the queued writes";
	opener.join();
	std::vector<uint32_t> words;
	for (uint64_t seq = 1; seq <= 2; seq++) {
		auto f = recorder->receive(5s, g.stream);
		ASSERT_TRUE(f.ok()) << "frame " << seq << ": " << xmem::test::why(f);
		ASSERT_EQ(f->meta().seq, seq);
		EXPECT_FALSE(f->incomplete()) << "frame " << seq << " taken for a dead owner's";
		EXPECT_EQ(bad_word(g, *f, words), -1) << "frame " << seq;
	}
	EXPECT_EQ(recorder->receive(1s).code(), Errc::closed);
}

// Where the owner orders GPU work on the CPU (XMEM_CUDA_SYNC=cpu), each spill completes
// on the CPU: the same frames, every byte, only slower. (A tier that cannot be page-locked
// takes the same path in SpillCopier::spill; the simulator's pin limit, read once per
// process, cannot be set for one pool of this test program.)
TEST(CudaSpill, SpillsCompleteOnTheCpuWhereTheGpuCannotOrderThem)
{
	{
		RuntimeDir dir;
		setenv("XMEM_CUDA_SYNC", "cpu", 1);
		auto owner = xmem::BufferPool::create("cpu", spill_config("cpu", 2, 16));
		unsetenv("XMEM_CUDA_SYNC");
		ASSERT_TRUE(owner.ok()) << xmem::test::why(owner);
		EXPECT_STREQ((*owner)->gpu_ordering(), "cpu");
		auto recorder = attach("cpu", xmem::Policy::fifo_spill);
		ASSERT_TRUE(recorder);
		Gpu g;
		for (int i = 0; i < 10; i++)
			publish(g, **owner, g.stream);
		EXPECT_GE((*owner)->spill_stats().spilled, 8u);
		std::vector<uint32_t> words;
		for (uint64_t seq = 1; seq <= 10; seq++) {
			auto f = recorder->receive(5s, g.stream);
			ASSERT_TRUE(f.ok()) << xmem::test::why(f);
			ASSERT_EQ(f->meta().seq, seq);
			EXPECT_EQ(bad_word(g, *f, words), -1) << "frame " << seq;
		}
	}
}

// Past the tier's cap, each recorder's fallback decides what it loses, counted: drop-new
// loses the newest frames it had in slots, drop-oldest its oldest queued ones. What they
// get is in order and intact.
TEST(CudaSpill, PastTheCapEachRecordersFallbackApplies)
{
	RuntimeDir dir;
	constexpr int kFrames = 16;
	auto owner = xmem::BufferPool::create("cap", spill_config("cap", 2, 3));
	ASSERT_TRUE(owner.ok()) << xmem::test::why(owner);
	auto newest = attach("cap", xmem::Policy::fifo_spill, xmem::SpillDelivery::device, xmem::Policy::drop_new);
	auto oldest = attach("cap", xmem::Policy::fifo_spill, xmem::SpillDelivery::host, xmem::Policy::drop_oldest);
	ASSERT_TRUE(newest && oldest);
	Gpu g;
	for (int i = 0; i < kFrames; i++)
		publish(g, **owner, g.stream);
	ASSERT_TRUE((*owner)->end_of_stream().ok());
	EXPECT_GT((*owner)->spill_stats().full, 0u);
	std::vector<uint32_t> words;
	for (auto *recorder : { &newest, &oldest }) {
		uint64_t last = 0, got = 0;
		for (;;) {
			auto f = (*recorder)->receive(5s, g.stream);
			if (f.code() == Errc::end_of_stream)
				break;
			ASSERT_TRUE(f.ok()) << xmem::test::why(f);
			EXPECT_GT(f->meta().seq, last) << "out of order";
			last = f->meta().seq;
			EXPECT_EQ(bad_word(g, *f, words), -1) << "frame " << last;
			got++;
		}
		auto s = (*recorder)->consumer_stats().value();
		EXPECT_GT(s.dropped, 0u);
		EXPECT_EQ(got + s.dropped, uint64_t(kFrames)) << "a frame neither received nor counted as dropped";
	}
}

// Recorders in their own processes: a slow one with device delivery and one with host
// delivery get every one of hundreds of frames byte for byte, while the producer (this
// process) never waits; then one killed with spilled frames queued gives them back.
TEST(CudaSpill, RecordersInOtherProcessesAndOneKilled)
{
	RuntimeDir dir;
	constexpr int kFrames = 200;
	auto owner = xmem::BufferPool::create("procs", spill_config("procs", 4, kFrames));
	ASSERT_TRUE(owner.ok()) << xmem::test::why(owner);
	std::vector<std::string> consume{
		cuda_peer_path(),	 "consume",   "procs", "--policy", "fifo-spill", "--frames",
		std::to_string(kFrames), "--work-us", "3000"
	};
	Process device(consume);
	consume.insert(consume.end(), { "--spill-delivery", "host" });
	Process host(consume);
	ASSERT_TRUE(eventually([&] { return (*owner)->stats().consumers == 2; }));
	Gpu g;
	for (int i = 0; i < kFrames; i++) {
		auto start = std::chrono::steady_clock::now();
		publish(g, **owner, g.stream);
		EXPECT_LT(std::chrono::steady_clock::now() - start, 2s) << "the producer waited for a recorder";
		std::this_thread::sleep_for(500us);
	}
	for (auto *p : { &device, &host }) {
		EXPECT_EQ(p->wait(120s), 0) << p->output();
		EXPECT_EQ(p->field("frames"), kFrames) << p->output();
		EXPECT_EQ(p->field("bad"), 0) << p->output();
		EXPECT_GT(p->field("spilled"), 0) << p->output();
	}
	EXPECT_EQ((*owner)->spill_stats().full, 0u);

	Process killed({ cuda_peer_path(), "consume", "procs", "--policy", "fifo-spill", "--hold", "1" });
	// Attached first: until the owner reaps the two that just left, a count of 1
	// need not be this one.
	ASSERT_TRUE(killed.wait_output("attached")) << killed.output();
	ASSERT_TRUE(eventually([&] { return (*owner)->stats().consumers == 1; }));
	publish(g, **owner, g.stream);
	ASSERT_TRUE(killed.wait_output("holding " + std::to_string(kFrames + 1))) << killed.output();
	for (int i = 0; i < 20; i++)
		publish(g, **owner, g.stream);
	EXPECT_GE((*owner)->spill_stats().frames, 15u) << "the held recorder's queued frames were not spilled";
	killed.signal(SIGKILL);
	EXPECT_GE(killed.wait(), 0);
	ASSERT_TRUE(eventually([&] { return (*owner)->stats().reaped == 3; }));
	// Its buffers go back at a publish once their copies, queued on the owner's spill
	// stream, have landed (the simulator's delays keep that stream behind).
	EXPECT_TRUE(eventually([&] {
		publish(g, **owner, g.stream);
		return (*owner)->spill_stats().frames == 0;
	})) << (*owner)->spill_stats().frames
	    << " spill buffers still held";
	EXPECT_EQ((*owner)->spill_stats().bytes, 0u);
}
