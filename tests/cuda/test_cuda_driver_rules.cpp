// test_cuda_driver_rules.cpp - CUDA pools where the driver refuses: the control segment that
// cannot be page-locked, devices in an exclusive or prohibited compute mode, MIG devices.
// Against the CUDA driver simulator only (its XMEM_CUDASIM_* settings make the refusals).
#include "../common.hpp"

#include "arena.hpp"

#include <string>
#include <vector>

#include <sys/mman.h>

using namespace std::chrono_literals;
using xmem::test::on_cuda_simulator;
using xmem::test::Process;
using xmem::test::RuntimeDir;

namespace {

std::string cuda_peer()
{
	const char *p = std::getenv("XMEM_CUDA_PEER");
	return p ? p : "tests/cuda/xmem-cuda-peer";
}

// Runs the peer with extra environment (VAR=VALUE...), its stderr in output() too: xmem's
// notices (a fallback and its reason) go there.
Process peer(const std::vector<std::string> &env, const std::vector<std::string> &args)
{
	std::vector<std::string> argv{ "/bin/sh", "-c", "exec \"$@\" 2>&1", "sh", "/usr/bin/env" };
	argv.insert(argv.end(), env.begin(), env.end());
	argv.push_back(cuda_peer());
	argv.insert(argv.end(), args.begin(), args.end());
	return Process(argv);
}

bool contains(const std::string &text, const std::string &part)
{
	return text.find(part) != std::string::npos;
}

} // namespace

// A producer whose driver cannot page-lock the control segment (pinning fails, as when the
// kernel locks no more pages) orders on the CPU, says why, and every consumer follows: every
// byte of every frame is right. A consumer alone failing to pin orders its own reads on the
// CPU against a producer that orders on the GPU.
TEST(CudaHostRegistration, PinningFailsAndTheCpuOrdersWithAReason)
{
	if (!on_cuda_simulator())
		GTEST_SKIP() << "the failure is the simulator's (XMEM_CUDASIM_HOST_PIN_LIMIT)";
	RuntimeDir dir;
	const std::string frames = "300";
	// Less than the control segment (tens of KiB). The consumer peer's own copy buffer
	// (a slot, rounded to the VMM granularity) does not fit either: it falls back to
	// pageable memory for it, which changes nothing here.
	const std::string no_pin = "XMEM_CUDASIM_HOST_PIN_LIMIT=12k";
	for (bool producer_pins : { false, true }) {
		SCOPED_TRACE(producer_pins ? "a consumer cannot pin" : "the producer cannot pin");
		std::string name = producer_pins ? "pin-consumer" : "pin-producer";
		std::vector<std::string> producer_env{ "XMEM_CUDASIM_DELAY_US=500" };
		if (!producer_pins)
			producer_env.push_back(no_pin);
		Process producer = peer(producer_env, { "produce", name, "--frames", frames, "--slots", "3", "--size",
							"8192", "--wait-consumers", "2", "--linger-ms", "200" });
		std::string ordering = producer_pins ? "stream-memops" : "cpu";
		ASSERT_TRUE(producer.wait_output("ready ordering=" + ordering)) << producer.output();
		if (!producer_pins) {
			EXPECT_TRUE(contains(producer.output(), "GPU ordering falls back to CPU synchronization: the "
								"pool's control segment"))
				<< producer.output();
			EXPECT_TRUE(contains(producer.output(), "cuMemHostRegister failed: CUDA_ERROR_OUT_OF_MEMORY"))
				<< producer.output();
		}
		Process pinned = peer({ "XMEM_CUDASIM_DELAY_US=500" }, { "consume", name, "--stream" });
		Process unpinned = peer({ "XMEM_CUDASIM_DELAY_US=500", no_pin }, { "consume", name, "--stream" });
		for (Process *p : { &pinned, &unpinned }) {
			EXPECT_EQ(p->wait(120s), 0) << p->output();
			EXPECT_TRUE(contains(p->output(), "frames=" + frames + " bad=0")) << p->output();
		}
		EXPECT_TRUE(contains(pinned.output(), "attached ordering=" + ordering)) << pinned.output();
		EXPECT_TRUE(contains(unpinned.output(), "attached ordering=cpu")) << unpinned.output();
		if (producer_pins) {
			EXPECT_TRUE(contains(unpinned.output(), "cuMemHostRegister failed: CUDA_ERROR_OUT_OF_MEMORY"))
				<< unpinned.output();
		}
		EXPECT_EQ(producer.wait(60s), 0) << producer.output();
	}
}

// xmem waits with CU_STREAM_WAIT_VALUE_GEQ and writes with CU_STREAM_WRITE_VALUE_DEFAULT
// only: on a device without CU_STREAM_WAIT_VALUE_FLUSH and CU_STREAM_WAIT_VALUE_NOR (whose
// driver refuses them) it still orders on the GPU, and every frame is right.
TEST(CudaMemopFlags, GpuOrderingNeedsNeitherFlushNorNor)
{
	if (!on_cuda_simulator())
		GTEST_SKIP() << "the device is the simulator's (XMEM_CUDASIM_FAIL=no_flush,no_wait_nor)";
	RuntimeDir dir;
	const std::vector<std::string> env{ "XMEM_CUDASIM_FAIL=no_flush,no_wait_nor", "XMEM_CUDASIM_DELAY_US=500" };
	Process producer = peer(env, { "produce", "flags", "--frames", "300", "--slots", "3", "--wait-consumers", "2",
				       "--linger-ms", "200" });
	ASSERT_TRUE(producer.wait_output("ready ordering=stream-memops")) << producer.output();
	Process streamed = peer(env, { "consume", "flags", "--stream" });
	Process plain = peer(env, { "consume", "flags", "--no-stream" });
	for (Process *p : { &streamed, &plain }) {
		EXPECT_EQ(p->wait(120s), 0) << p->output();
		EXPECT_TRUE(contains(p->output(), "attached ordering=stream-memops")) << p->output();
		EXPECT_TRUE(contains(p->output(), "frames=300 bad=0")) << p->output();
	}
	EXPECT_EQ(producer.wait(60s), 0) << producer.output();
	EXPECT_FALSE(contains(producer.output(), "falls back")) << producer.output();
}

// A device whose minimum and recommended allocation granularities differ (64 KiB and 1 MiB):
// slots are a multiple of both, the arena is reserved aligned to the minimum (the simulator
// aligns no more than asked), and every frame crosses processes intact.
TEST(CudaGranularity, SlotsFollowBothGranularities)
{
	if (!on_cuda_simulator())
		GTEST_SKIP() << "the granularities are the simulator's (XMEM_CUDASIM_RECOMMENDED_GRANULARITY)";
	RuntimeDir dir;
	const std::vector<std::string> env{ "XMEM_CUDASIM_GRANULARITY=64k", "XMEM_CUDASIM_RECOMMENDED_GRANULARITY=1M",
					    "XMEM_CUDASIM_DELAY_US=300" };
	Process producer = peer(env, { "produce", "gran", "--frames", "200", "--slots", "3", "--size", "100000",
				       "--wait-consumers", "1", "--linger-ms", "200" });
	ASSERT_TRUE(producer.wait_output("ready ordering=stream-memops")) << producer.output();
	const char *inspect = std::getenv("XMEM_INSPECT");
	ASSERT_TRUE(inspect) << "XMEM_INSPECT must name the built xmem-inspect";
	Process tool({ inspect, "--json", "gran" });
	EXPECT_EQ(tool.wait(10s), 0) << tool.output();
	EXPECT_TRUE(contains(tool.output(), "\"slot_stride\":1048576")) << tool.output();
	Process consumer = peer(env, { "consume", "gran", "--stream" });
	EXPECT_EQ(consumer.wait(120s), 0) << consumer.output();
	EXPECT_TRUE(contains(consumer.output(), "frames=200 bad=0")) << consumer.output();
	EXPECT_EQ(producer.wait(60s), 0) << producer.output();
}

// The slot stride comes from the owner's segment: one that is not a multiple of the
// device's minimum granularity (the driver would refuse every mapping) is named as such.
TEST(CudaGranularity, AStrideOffTheGranularityIsRefusedByName)
{
	if (!on_cuda_simulator())
		GTEST_SKIP() << "the granularity is the simulator's";
	constexpr uint64_t kStride = (2 << 20) + (64 << 10); // the simulator's 2 MiB, and a bit
	std::vector<xmem::UniqueFd> fds;
	for (int i = 0; i < 2; i++) {
		int fd = ::memfd_create("not-cuda", MFD_CLOEXEC);
		ASSERT_GE(fd, 0);
		fds.emplace_back(fd);
	}
	xmem::ArenaSpec spec{ "odd", xmem::Storage::cuda, 0, 2, 4096, 0600 };
	auto arena = xmem::import_cuda_arena(spec, kStride, std::move(fds), "pool 'odd'");
	ASSERT_FALSE(arena.ok());
	EXPECT_EQ(arena.code(), xmem::Errc::not_a_pool);
	EXPECT_TRUE(contains(arena.error().message, "slot stride (2162688 bytes) is not a multiple of CUDA device "
						    "0's allocation granularity (2097152 bytes)"))
		<< arena.error().message;
}

// A device in EXCLUSIVE_PROCESS compute mode takes one process's context at a time: the
// producer has it, so a consumer in another process cannot map the pool, and its error names
// the compute mode, the device and the fix instead of a bare driver code. PROHIBITED takes
// none; the producer's error says so the same way.
TEST(CudaComputeMode, AnExclusiveOrProhibitedDeviceIsNamedWithTheFix)
{
	if (!on_cuda_simulator())
		GTEST_SKIP() << "the compute modes are the simulator's (XMEM_CUDASIM_DEVICES)";
	RuntimeDir dir; // its XDG_RUNTIME_DIR holds the simulated machine's device locks
	const std::vector<std::string> exclusive{ "XMEM_CUDASIM_DEVICES=exclusive_process" };
	Process producer = peer(exclusive, { "produce", "excl", "--frames", "1", "--linger-ms", "3000" });
	ASSERT_TRUE(producer.wait_output("ready ordering=stream-memops")) << producer.output();
	Process consumer = peer(exclusive, { "consume", "excl" });
	EXPECT_EQ(consumer.wait(30s), 1) << consumer.output();
	for (const char *part : { "CUDA device 0 (xmem cudasim device 0, GPU-", "is in EXCLUSIVE_PROCESS compute mode",
				  "only one process may use it at a time", "nvidia-smi -i GPU-", "-c DEFAULT" })
		EXPECT_TRUE(contains(consumer.output(), part)) << part << " in:\n" << consumer.output();
	EXPECT_EQ(producer.wait(60s), 0) << producer.output();

	Process prohibited = peer({ "XMEM_CUDASIM_DEVICES=default,prohibited" }, { "create", "proh", "--device", "1" });
	EXPECT_EQ(prohibited.wait(30s), 1) << prohibited.output();
	for (const char *part : { "CUDA device 1 (xmem cudasim device 1, GPU-", "compute mode prohibited",
				  "no process may use it", "nvidia-smi -i GPU-", "-c DEFAULT" })
		EXPECT_TRUE(contains(prohibited.output(), part)) << part << " in:\n" << prohibited.output();
}

// A pool on a MIG device (XMEM_CUDASIM_DEVICES=default,mig:2: GPU 1 in MIG mode). CUDA shows
// each process one MIG device, whose cuDeviceGetUuid is its own: xmem records and prints it as
// nvidia-smi does ("MIG-…", in xmem-inspect and errors), a consumer that sees the same MIG
// device (by default or by CUDA_VISIBLE_DEVICES=MIG-…) maps the pool, and one that sees
// another device is told which MIG device to pick.
TEST(CudaMig, APoolOnAMigDeviceIsNamedAndFoundByItsMigUuid)
{
	if (!on_cuda_simulator())
		GTEST_SKIP() << "the MIG devices are the simulator's (XMEM_CUDASIM_DEVICES)";
	RuntimeDir dir;
	const std::string machine = "XMEM_CUDASIM_DEVICES=default,mig:2";
	Process producer = peer({ machine }, { "produce", "mig", "--frames", "100", "--slots", "3", "--wait-consumers",
					       "2", "--linger-ms", "200" });
	ASSERT_TRUE(producer.wait_output("ready ordering=stream-memops")) << producer.output();
	const char *inspect = std::getenv("XMEM_INSPECT");
	ASSERT_TRUE(inspect) << "XMEM_INSPECT must name the built xmem-inspect";
	Process tool({ inspect, "--json", "mig" });
	EXPECT_EQ(tool.wait(10s), 0) << tool.output();
	const std::string key = "\"device_uuid\":\"";
	size_t at = tool.output().find(key);
	ASSERT_NE(at, std::string::npos) << tool.output();
	std::string uuid = tool.output().substr(at + key.size(), 40);
	ASSERT_EQ(uuid.substr(0, 4), "MIG-") << tool.output();

	Process elsewhere = peer({ machine, "CUDA_VISIBLE_DEVICES=0" }, { "consume", "mig" });
	EXPECT_EQ(elsewhere.wait(30s), 1) << elsewhere.output();
	const std::vector<std::string> parts{ "the pool's memory is on " + uuid + ", which this process does not see",
					      "CUDA shows a process one MIG device at most",
					      "CUDA_VISIBLE_DEVICES=" + uuid + " picks this one" };
	for (const std::string &part : parts)
		EXPECT_TRUE(contains(elsewhere.output(), part)) << part << " in:\n" << elsewhere.output();

	Process picked = peer({ machine, "CUDA_VISIBLE_DEVICES=" + uuid }, { "consume", "mig", "--stream" });
	Process by_default = peer({ machine }, { "consume", "mig", "--stream" });
	for (Process *p : { &picked, &by_default }) {
		EXPECT_EQ(p->wait(120s), 0) << p->output();
		EXPECT_TRUE(contains(p->output(), "attached ordering=stream-memops device=0")) << p->output();
		EXPECT_TRUE(contains(p->output(), "frames=100 bad=0")) << p->output();
	}
	EXPECT_EQ(producer.wait(60s), 0) << producer.output();
}
