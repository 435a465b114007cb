// test_cudasim_streams.cpp - self-test of how the simulator's calls wait: copies with a
// pageable host side, and the legacy and per-thread default streams (README.md).
// Part of cudasim-selftest: test_cudasim.cpp's settings (two devices, 2 ms delays) apply.

#include <cuda.h>

#include <gtest/gtest.h>

#include "selftest_driver.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

// cuda.h 13 renames cuCtxCreate to cuCtxCreate_v4; GStreamer 1.22 loads the flags-only v2.
extern "C" CUresult CUDAAPI cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);

// test_cudasim.cpp's: failure messages name CUresult values.
void PrintTo(CUresult result, std::ostream *os);

namespace {

using namespace std::chrono_literals;

#define STREAMS_ENTRY_POINTS(X)                                                                                        \
	X(cuInit)                                                                                                      \
	X(cuDevicePrimaryCtxRetain)                                                                                    \
	X(cuDevicePrimaryCtxRelease)                                                                                   \
	X(cuCtxPushCurrent)                                                                                            \
	X(cuCtxPopCurrent)                                                                                             \
	X(cuCtxCreate_v2)                                                                                              \
	X(cuCtxDestroy)                                                                                                \
	X(cuCtxSynchronize)                                                                                            \
	X(cuStreamCreate)                                                                                              \
	X(cuStreamDestroy)                                                                                             \
	X(cuStreamSynchronize)                                                                                         \
	X(cuStreamQuery)                                                                                               \
	X(cuStreamGetCtx)                                                                                              \
	X(cuStreamAddCallback)                                                                                         \
	X(cuStreamWaitValue64)                                                                                         \
	X(cuStreamWriteValue64)                                                                                        \
	X(cuMemAlloc)                                                                                                  \
	X(cuMemFree)                                                                                                   \
	X(cuMemAllocHost)                                                                                              \
	X(cuMemFreeHost)                                                                                               \
	X(cuMemHostRegister)                                                                                           \
	X(cuMemHostUnregister)                                                                                         \
	X(cuMemHostGetDevicePointer)                                                                                   \
	X(cuMemsetD8Async)                                                                                             \
	X(cuMemcpyHtoDAsync)                                                                                           \
	X(cuMemcpyDtoHAsync)                                                                                           \
	X(cuMemcpyAsync)                                                                                               \
	X(cuMemcpy2DAsync)                                                                                             \
	X(cuMemcpyHtoD)                                                                                                \
	X(cuMemcpyDtoH)                                                                                                \
	X(cuMemcpy2D)                                                                                                  \
	X(cuEventCreate)                                                                                               \
	X(cuEventRecord)                                                                                               \
	X(cuEventQuery)                                                                                                \
	X(cuEventDestroy)

#define STREAMS_STRING(name) #name
#define STREAMS_ABI_NAME(name) STREAMS_STRING(name)

struct Driver {
#define STREAMS_DECLARE(fn) decltype(&::fn) fn = nullptr;
	STREAMS_ENTRY_POINTS(STREAMS_DECLARE)
#undef STREAMS_DECLARE
};

Driver load_driver()
{
	const cudasim_selftest::Module module = cudasim_selftest::open_driver();
	Driver driver;
#define STREAMS_LOAD(fn) driver.fn = cudasim_selftest::entry_point<decltype(driver.fn)>(module, STREAMS_ABI_NAME(fn));
	STREAMS_ENTRY_POINTS(STREAMS_LOAD)
#undef STREAMS_LOAD
	return driver;
}

const Driver &cu()
{
	static const Driver driver = load_driver();
	return driver;
}

constexpr size_t kSize = 4096;

// Words in a registered host page that streams wait on and write, through its device address.
class Gate
{
public:
	Gate()
	{
		void *mem = mmap(nullptr, kSize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		EXPECT_NE(mem, MAP_FAILED);
		mem_ = static_cast<uint64_t *>(mem);
		EXPECT_EQ(cu().cuMemHostRegister(mem_, kSize, CU_MEMHOSTREGISTER_DEVICEMAP), CUDA_SUCCESS);
		EXPECT_EQ(cu().cuMemHostGetDevicePointer(&dptr_, mem_, 0), CUDA_SUCCESS);
	}
	~Gate()
	{
		// The streams' waits and writes must be done with the page before it goes.
		EXPECT_EQ(cu().cuCtxSynchronize(), CUDA_SUCCESS);
		cu().cuMemHostUnregister(mem_);
		munmap(mem_, kSize);
	}
	Gate(const Gate &) = delete;
	Gate &operator=(const Gate &) = delete;

	// Holds STREAM's later work until open(i).
	void hold(CUstream stream, size_t i = 0)
	{
		EXPECT_EQ(cu().cuStreamWaitValue64(stream, device_word(i), 1, CU_STREAM_WAIT_VALUE_GEQ), CUDA_SUCCESS);
	}
	void open(size_t i = 0) { word(i).store(1, std::memory_order_release); }
	// Queues a write of 1 to word i on STREAM: it lands when the stream gets there.
	void mark(CUstream stream, size_t i)
	{
		EXPECT_EQ(cu().cuStreamWriteValue64(stream, device_word(i), 1, 0), CUDA_SUCCESS);
	}
	bool marked(size_t i) { return word(i).load(std::memory_order_acquire) == 1; }
	// Whether word i is written within the timeout.
	bool lands(size_t i, std::chrono::milliseconds timeout = 5s)
	{
		auto deadline = std::chrono::steady_clock::now() + timeout;
		while (!marked(i)) {
			if (std::chrono::steady_clock::now() > deadline)
				return false;
			std::this_thread::sleep_for(1ms);
		}
		return true;
	}

	std::atomic_ref<uint64_t> word(size_t i) { return std::atomic_ref<uint64_t>(mem_[i]); }
	CUdeviceptr device_word(size_t i) const { return dptr_ + i * sizeof(uint64_t); }
	char *bytes() const { return reinterpret_cast<char *>(mem_); }

private:
	uint64_t *mem_ = nullptr;
	CUdeviceptr dptr_ = 0;
};

// Page-locked host memory from cuMemAllocHost.
class Pinned
{
public:
	explicit Pinned(unsigned char fill = 0)
	{
		void *mem = nullptr;
		EXPECT_EQ(cu().cuMemAllocHost(&mem, kSize), CUDA_SUCCESS);
		data_ = static_cast<unsigned char *>(mem);
		if (data_)
			std::memset(data_, fill, kSize);
	}
	~Pinned() { cu().cuMemFreeHost(data_); }
	Pinned(const Pinned &) = delete;
	Pinned &operator=(const Pinned &) = delete;
	unsigned char *data() const { return data_; }

private:
	unsigned char *data_ = nullptr;
};

bool all_equal(const void *data, size_t size, unsigned char value)
{
	const auto *bytes = static_cast<const unsigned char *>(data);
	return std::all_of(bytes, bytes + size, [value](unsigned char b) { return b == value; });
}

// A driver call made on a thread of its own, with a context current: whether it has
// returned tells whether the driver made it wait.
class Call
{
public:
	Call(CUcontext ctx, std::function<CUresult()> body)
		: thread_([this, ctx, body = std::move(body)] {
			  cu().cuCtxPushCurrent(ctx);
			  result_ = body();
			  returned_.store(true, std::memory_order_release);
			  CUcontext popped;
			  cu().cuCtxPopCurrent(&popped);
		  })
	{
	}
	~Call()
	{
		if (thread_.joinable())
			thread_.join();
	}
	bool returned() const { return returned_.load(std::memory_order_acquire); }
	// Whether it returns within the timeout.
	bool returns(std::chrono::milliseconds timeout = 5s) const
	{
		auto deadline = std::chrono::steady_clock::now() + timeout;
		while (!returned()) {
			if (std::chrono::steady_clock::now() > deadline)
				return false;
			std::this_thread::sleep_for(1ms);
		}
		return true;
	}
	CUresult join()
	{
		thread_.join();
		return result_;
	}

private:
	std::atomic<bool> returned_{ false };
	CUresult result_ = CUDA_ERROR_UNKNOWN;
	std::thread thread_; // last: it starts once the fields above exist
};

// How long a call or a stream is given to show that it does not wait: far longer than the
// few 2 ms delays of the work before it.
constexpr auto kHeld = 60ms;

// A fresh primary context of device 0, current on the test's thread, with 4 KiB of device
// memory and a non-blocking stream.
class Streams : public ::testing::Test
{
protected:
	void SetUp() override
	{
		ASSERT_EQ(cu().cuInit(0), CUDA_SUCCESS);
		ASSERT_EQ(cu().cuDevicePrimaryCtxRetain(&ctx_, 0), CUDA_SUCCESS);
		ASSERT_EQ(cu().cuCtxPushCurrent(ctx_), CUDA_SUCCESS);
		ASSERT_EQ(cu().cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
		ASSERT_EQ(cu().cuMemAlloc(&device_, kSize), CUDA_SUCCESS);
	}
	void TearDown() override
	{
		cu().cuCtxSynchronize();
		cu().cuMemFree(device_);
		cu().cuStreamDestroy(stream_);
		CUcontext popped;
		cu().cuCtxPopCurrent(&popped);
		cu().cuDevicePrimaryCtxRelease(0);
	}

	CUstream blocking_stream()
	{
		CUstream stream = nullptr;
		EXPECT_EQ(cu().cuStreamCreate(&stream, CU_STREAM_DEFAULT), CUDA_SUCCESS);
		return stream;
	}

	CUcontext ctx_ = nullptr;
	CUstream stream_ = nullptr;
	CUdeviceptr device_ = 0;
};

// --- copies with a pageable host side ----------------------------------------------------

// cuda.h's "API synchronization behavior": a copy from the device to pageable host memory
// returns only once it has completed, so behind a stream that waits the calling thread
// waits too. Into page-locked memory the same copy is queued and returns at once.
TEST_F(Streams, ACopyToPageableMemoryReturnsOnceItHasExecuted)
{
	Gate gate;
	ASSERT_EQ(cu().cuMemsetD8Async(device_, 0x5a, kSize, stream_), CUDA_SUCCESS);
	gate.hold(stream_);
	std::vector<unsigned char> pageable(kSize, 0);
	Pinned pinned;
	ASSERT_EQ(cu().cuMemcpyDtoHAsync(pinned.data(), device_, kSize, stream_), CUDA_SUCCESS); // at once
	bool landed_at_return = false;
	Call copy(ctx_, [&] {
		CUresult r = cu().cuMemcpyDtoHAsync(pageable.data(), device_, kSize, stream_);
		landed_at_return = all_equal(pageable.data(), kSize, 0x5a);
		return r;
	});
	std::this_thread::sleep_for(kHeld);
	EXPECT_FALSE(copy.returned()) << "a copy into pageable memory returned before the stream reached it";
	EXPECT_EQ(cu().cuStreamQuery(stream_), CUDA_ERROR_NOT_READY);
	gate.open();
	EXPECT_EQ(copy.join(), CUDA_SUCCESS);
	EXPECT_TRUE(landed_at_return) << "the bytes were not there when the call returned";
	ASSERT_EQ(cu().cuStreamSynchronize(stream_), CUDA_SUCCESS);
	EXPECT_TRUE(all_equal(pinned.data(), kSize, 0x5a));
}

// From pageable memory, the driver synchronizes with the stream and stages the source before
// it returns; the bytes reach the device later. A caller may reuse its buffer at once.
TEST_F(Streams, ACopyFromPageableMemoryIsStagedAfterTheStreamsEarlierWork)
{
	Gate gate;
	gate.hold(stream_);
	std::vector<unsigned char> pageable(kSize, 0x11);
	Call copy(ctx_, [&] { return cu().cuMemcpyHtoDAsync(device_, pageable.data(), kSize, stream_); });
	std::this_thread::sleep_for(kHeld);
	EXPECT_FALSE(copy.returned()) << "a copy from pageable memory returned before its stream reached it";
	gate.open();
	EXPECT_EQ(copy.join(), CUDA_SUCCESS);
	std::fill(pageable.begin(), pageable.end(), 0x22); // staged already: this does not land

	Pinned back;
	ASSERT_EQ(cu().cuMemcpyDtoHAsync(back.data(), device_, kSize, stream_), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuStreamSynchronize(stream_), CUDA_SUCCESS);
	EXPECT_TRUE(all_equal(back.data(), kSize, 0x11));

	// From page-locked memory it is queued, and reads its source when it executes.
	gate.word(0).store(0, std::memory_order_release);
	gate.hold(stream_);
	Pinned source(0x33);
	ASSERT_EQ(cu().cuMemcpyHtoDAsync(device_, source.data(), kSize, stream_), CUDA_SUCCESS);
	std::memset(source.data(), 0x44, kSize);
	gate.open();
	ASSERT_EQ(cu().cuMemcpyDtoHAsync(back.data(), device_, kSize, stream_), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuStreamSynchronize(stream_), CUDA_SUCCESS);
	EXPECT_TRUE(all_equal(back.data(), kSize, 0x44));
}

// Every copy call with a pageable host side waits behind a held stream; with memory from
// cuMemAllocHost or cuMemHostRegister it does not. One byte of the range outside page-locked
// memory makes it pageable.
TEST_F(Streams, EveryCopyCallWaitsForItsStreamOnlyWithPageableMemory)
{
	Gate gate;
	CUdeviceptr device = device_;
	struct Case {
		const char *name;
		std::function<CUresult(unsigned char *host, CUstream stream)> call;
	};
	auto plane = [device](unsigned char *host, bool to_host) {
		CUDA_MEMCPY2D c = {};
		if (to_host) {
			c.dstMemoryType = CU_MEMORYTYPE_HOST;
			c.dstHost = host;
			c.srcMemoryType = CU_MEMORYTYPE_DEVICE;
			c.srcDevice = device;
		} else {
			c.srcMemoryType = CU_MEMORYTYPE_HOST;
			c.srcHost = host;
			c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
			c.dstDevice = device;
		}
		c.srcPitch = c.dstPitch = 256;
		c.WidthInBytes = 200;
		c.Height = kSize / 256;
		return c;
	};
	std::vector<Case> cases = {
		{ "cuMemcpyHtoDAsync",
		  [&](unsigned char *host, CUstream s) {
			  return cu().cuMemcpyHtoDAsync(device, host, kSize, s);
		  } },
		{ "cuMemcpyDtoHAsync",
		  [&](unsigned char *host, CUstream s) {
			  return cu().cuMemcpyDtoHAsync(host, device, kSize, s);
		  } },
		{ "cuMemcpyAsync to the device",
		  [&](unsigned char *host, CUstream s) {
			  return cu().cuMemcpyAsync(device, reinterpret_cast<CUdeviceptr>(host), kSize, s);
		  } },
		{ "cuMemcpyAsync to the host",
		  [&](unsigned char *host, CUstream s) {
			  return cu().cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(host), device, kSize, s);
		  } },
		{ "cuMemcpy2DAsync to the device",
		  [&](unsigned char *host, CUstream s) {
			  CUDA_MEMCPY2D c = plane(host, false);
			  return cu().cuMemcpy2DAsync(&c, s);
		  } },
		{ "cuMemcpy2DAsync to the host",
		  [&](unsigned char *host, CUstream s) {
			  CUDA_MEMCPY2D c = plane(host, true);
			  return cu().cuMemcpy2DAsync(&c, s);
		  } },
	};

	// Registered host memory: two pages, the first registered.
	const size_t page = size_t(sysconf(_SC_PAGESIZE));
	void *mem = mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ASSERT_NE(mem, MAP_FAILED);
	auto *registered = static_cast<unsigned char *>(mem);
	ASSERT_EQ(cu().cuMemHostRegister(registered, page, 0), CUDA_SUCCESS);

	Pinned pinned;
	std::vector<unsigned char> pageable(kSize);
	struct Memory {
		const char *name;
		unsigned char *host;
		bool waits;
	} memories[] = {
		{ "pageable", pageable.data(), true },
		{ "cuMemAllocHost", pinned.data(), false },
		{ "cuMemHostRegister", registered, false },
		{ "partly registered", registered + page / 2, true },
	};
	for (const Case &c : cases) {
		for (const Memory &m : memories) {
			SCOPED_TRACE(std::string(c.name) + " with " + m.name + " memory");
			gate.word(0).store(0, std::memory_order_release);
			gate.hold(stream_);
			Call copy(ctx_, [&] { return c.call(m.host, stream_); });
			if (m.waits) {
				std::this_thread::sleep_for(kHeld);
				EXPECT_FALSE(copy.returned()) << "returned before its held stream reached it";
			} else {
				EXPECT_TRUE(copy.returns()) << "waited for its held stream";
				EXPECT_EQ(cu().cuStreamQuery(stream_), CUDA_ERROR_NOT_READY);
			}
			gate.open();
			EXPECT_EQ(copy.join(), CUDA_SUCCESS);
			ASSERT_EQ(cu().cuStreamSynchronize(stream_), CUDA_SUCCESS);
		}
	}
	EXPECT_EQ(cu().cuMemHostUnregister(registered), CUDA_SUCCESS);
	munmap(mem, 2 * page);
}

// A copy into pageable memory on a stream that does not wait returns while another stream,
// even the legacy one, is held: it waits for its own stream only.
TEST_F(Streams, APageableCopyWaitsForItsOwnStreamOnly)
{
	Gate gate;
	gate.hold(nullptr);
	CUstream blocking = blocking_stream();
	gate.hold(blocking, 1);
	std::vector<unsigned char> pageable(kSize, 0);
	ASSERT_EQ(cu().cuMemsetD8Async(device_, 0x77, kSize, stream_), CUDA_SUCCESS);
	Call copy(ctx_, [&] { return cu().cuMemcpyDtoHAsync(pageable.data(), device_, kSize, stream_); });
	EXPECT_TRUE(copy.returns());
	EXPECT_TRUE(all_equal(pageable.data(), kSize, 0x77));
	gate.open(0);
	gate.open(1);
	EXPECT_EQ(copy.join(), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuStreamDestroy(blocking), CUDA_SUCCESS);
}

// --- the legacy default stream ---------------------------------------------------------

// Work on the legacy stream (0 or CU_STREAM_LEGACY) starts after the work queued before it
// on every blocking stream of its context, but not on non-blocking ones.
TEST_F(Streams, TheLegacyStreamWaitsForEarlierWorkOnBlockingStreams)
{
	Gate gate;
	CUstream blocking = blocking_stream();
	gate.hold(blocking, 0);
	gate.hold(stream_, 1); // non-blocking: the legacy stream does not wait for it
	gate.mark(nullptr, 2);
	gate.mark(CU_STREAM_LEGACY, 3);
	std::this_thread::sleep_for(kHeld);
	EXPECT_FALSE(gate.marked(2)) << "the legacy stream did not wait for a blocking stream";
	EXPECT_FALSE(gate.marked(3));
	EXPECT_EQ(cu().cuStreamQuery(nullptr), CUDA_ERROR_NOT_READY);
	EXPECT_EQ(cu().cuStreamQuery(blocking), CUDA_ERROR_NOT_READY);
	gate.open(0);
	EXPECT_TRUE(gate.lands(2)) << "held by the non-blocking stream";
	EXPECT_TRUE(gate.lands(3));
	EXPECT_EQ(cu().cuStreamSynchronize(nullptr), CUDA_SUCCESS);
	gate.open(1);
	EXPECT_EQ(cu().cuStreamDestroy(blocking), CUDA_SUCCESS);
}

// Work on a blocking stream starts after the legacy work queued before it; non-blocking
// streams do not wait for it.
TEST_F(Streams, BlockingStreamsWaitForEarlierLegacyWork)
{
	Gate gate;
	gate.hold(nullptr, 0);
	CUstream blocking = blocking_stream();
	gate.mark(blocking, 1);
	gate.mark(stream_, 2);
	EXPECT_TRUE(gate.lands(2)) << "a non-blocking stream waited for the legacy stream";
	std::this_thread::sleep_for(kHeld);
	EXPECT_FALSE(gate.marked(1)) << "a blocking stream did not wait for the legacy stream";
	EXPECT_EQ(cu().cuStreamQuery(blocking), CUDA_ERROR_NOT_READY);
	gate.open(0);
	EXPECT_TRUE(gate.lands(1));
	EXPECT_EQ(cu().cuStreamSynchronize(blocking), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuStreamDestroy(blocking), CUDA_SUCCESS);
}

// Each operation waits only for what was queued before it, when it was queued: later work on
// the other streams holds nothing back, so crossing waits never deadlock.
TEST_F(Streams, LegacyWaitsAreTakenWhenWorkIsQueued)
{
	Gate gate;
	CUstream blocking = blocking_stream();
	// The legacy stream is held by its own wait; its mark is queued before the blocking
	// stream's wait, so that wait, queued later, does not hold it.
	gate.hold(nullptr, 0);
	gate.mark(nullptr, 1);
	gate.hold(blocking, 2);
	gate.open(0);
	EXPECT_TRUE(gate.lands(1)) << "legacy work waited for blocking work queued after it";
	gate.open(2);
	EXPECT_EQ(cu().cuCtxSynchronize(), CUDA_SUCCESS);

	// Alternating work runs in the order it was queued: B1, L1 (after B1), B2 (after L1),
	// L2 (after B2), each logged by a host callback.
	struct Log {
		std::mutex lock;
		std::vector<int> order;
	} log;
	struct Entry {
		Log *log;
		int id;
	};
	auto record = [](CUstream, CUresult, void *user) {
		auto *e = static_cast<Entry *>(user);
		std::lock_guard<std::mutex> guard(e->log->lock);
		e->log->order.push_back(e->id);
	};
	Entry b1{ &log, 1 }, l1{ &log, 2 }, b2{ &log, 3 }, l2{ &log, 4 };
	gate.word(0).store(0, std::memory_order_release);
	gate.hold(blocking, 0);
	ASSERT_EQ(cu().cuStreamAddCallback(blocking, record, &b1, 0), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuStreamAddCallback(nullptr, record, &l1, 0), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuStreamAddCallback(blocking, record, &b2, 0), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuStreamAddCallback(CU_STREAM_LEGACY, record, &l2, 0), CUDA_SUCCESS);
	std::this_thread::sleep_for(kHeld);
	{
		std::lock_guard<std::mutex> guard(log.lock);
		EXPECT_TRUE(log.order.empty());
	}
	gate.open(0);
	EXPECT_EQ(cu().cuStreamSynchronize(nullptr), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuStreamSynchronize(blocking), CUDA_SUCCESS);
	EXPECT_EQ(log.order, (std::vector<int>{ 1, 2, 3, 4 }));
	EXPECT_EQ(cu().cuStreamDestroy(blocking), CUDA_SUCCESS);
}

// Synchronous copies use the legacy stream: they return only after the blocking streams'
// earlier work, and so wait for a blocking stream that is held.
TEST_F(Streams, SynchronousCopiesWaitForBlockingStreams)
{
	Gate gate;
	CUstream blocking = blocking_stream();
	ASSERT_EQ(cu().cuMemsetD8Async(device_, 0x5c, kSize, blocking), CUDA_SUCCESS);
	gate.hold(blocking);
	Pinned result;
	Call copy(ctx_, [&] { return cu().cuMemcpyDtoH(result.data(), device_, kSize); });
	std::this_thread::sleep_for(kHeld);
	EXPECT_FALSE(copy.returned()) << "cuMemcpyDtoH did not wait for a held blocking stream";
	gate.open();
	EXPECT_EQ(copy.join(), CUDA_SUCCESS);
	EXPECT_TRUE(all_equal(result.data(), kSize, 0x5c));

	// Non-blocking streams are not waited for.
	gate.word(0).store(0, std::memory_order_release);
	gate.hold(stream_);
	Call other(ctx_, [&] { return cu().cuMemcpyDtoH(result.data(), device_, kSize); });
	EXPECT_TRUE(other.returns()) << "cuMemcpyDtoH waited for a non-blocking stream";
	gate.open();
	EXPECT_EQ(other.join(), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuStreamDestroy(blocking), CUDA_SUCCESS);
}

// An event recorded on the legacy stream completes after the blocking streams' earlier work.
TEST_F(Streams, AnEventOnTheLegacyStreamCompletesAfterBlockingWork)
{
	Gate gate;
	CUstream blocking = blocking_stream();
	gate.hold(blocking);
	CUevent event;
	ASSERT_EQ(cu().cuEventCreate(&event, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuEventRecord(event, nullptr), CUDA_SUCCESS);
	std::this_thread::sleep_for(kHeld);
	EXPECT_EQ(cu().cuEventQuery(event), CUDA_ERROR_NOT_READY);
	gate.open();
	EXPECT_EQ(cu().cuStreamSynchronize(nullptr), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuEventQuery(event), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuEventDestroy(event), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuStreamDestroy(blocking), CUDA_SUCCESS);
}

// The legacy stream synchronizes with the blocking streams of its own context only.
TEST_F(Streams, TheLegacyStreamIgnoresOtherContexts)
{
	Gate gate;
	CUstream blocking = blocking_stream();
	gate.hold(blocking);
	CUcontext created;
	ASSERT_EQ(cu().cuCtxCreate_v2(&created, 0, 0), CUDA_SUCCESS); // pushed
	CUstream theirs;
	ASSERT_EQ(cu().cuStreamCreate(&theirs, CU_STREAM_DEFAULT), CUDA_SUCCESS);
	Gate their_gate; // registered in the created context
	their_gate.mark(nullptr, 0);
	EXPECT_TRUE(their_gate.lands(0)) << "another context's legacy stream waited for a blocking stream";
	their_gate.mark(theirs, 1);
	EXPECT_TRUE(their_gate.lands(1));
	EXPECT_EQ(cu().cuCtxDestroy(created), CUDA_SUCCESS);
	gate.open();
	EXPECT_EQ(cu().cuStreamDestroy(blocking), CUDA_SUCCESS);
}

// --- the per-thread default stream ---------------------------------------------------------

// CU_STREAM_PER_THREAD is each thread's own stream of the context: one thread's held
// per-thread stream does not hold another's, and cuStreamSynchronize, cuStreamQuery and
// cuStreamGetCtx work on the caller's own. It is blocking: it synchronizes with the legacy
// stream both ways. cuCtxSynchronize waits for every thread's.
TEST_F(Streams, EachThreadHasItsOwnBlockingPerThreadStream)
{
	Gate gate;
	gate.hold(CU_STREAM_PER_THREAD, 0);
	EXPECT_EQ(cu().cuStreamQuery(CU_STREAM_PER_THREAD), CUDA_ERROR_NOT_READY);
	CUcontext ctx = nullptr;
	EXPECT_EQ(cu().cuStreamGetCtx(CU_STREAM_PER_THREAD, &ctx), CUDA_SUCCESS);
	EXPECT_EQ(ctx, ctx_);

	// Another thread's per-thread stream runs; its synchronize waits for its own only.
	Call other(ctx_, [&] {
		gate.mark(CU_STREAM_PER_THREAD, 1);
		return cu().cuStreamSynchronize(CU_STREAM_PER_THREAD);
	});
	if (!other.returns()) {
		gate.open(0);
		other.join();
		FAIL() << "another thread's per-thread stream is held by this one's";
	}
	EXPECT_EQ(other.join(), CUDA_SUCCESS);
	EXPECT_TRUE(gate.marked(1));

	// The legacy stream waits for this thread's held per-thread stream, and a blocking
	// stream for that legacy work; a non-blocking one does not.
	gate.mark(nullptr, 2);
	CUstream blocking = blocking_stream();
	gate.mark(blocking, 3);
	gate.mark(stream_, 4);
	EXPECT_TRUE(gate.lands(4));
	std::this_thread::sleep_for(kHeld);
	EXPECT_FALSE(gate.marked(2)) << "the legacy stream did not wait for a per-thread stream";
	EXPECT_FALSE(gate.marked(3));

	// And a per-thread stream waits for earlier legacy work: another thread's too.
	Call third(ctx_, [&] {
		gate.mark(CU_STREAM_PER_THREAD, 5);
		return CUDA_SUCCESS;
	});
	EXPECT_EQ(third.join(), CUDA_SUCCESS);
	std::this_thread::sleep_for(kHeld);
	EXPECT_FALSE(gate.marked(5)) << "a per-thread stream did not wait for the legacy stream";

	// cuCtxSynchronize waits for all of it, the exited thread's per-thread stream included.
	std::thread opener([&] {
		std::this_thread::sleep_for(20ms);
		gate.open(0);
	});
	EXPECT_EQ(cu().cuCtxSynchronize(), CUDA_SUCCESS);
	opener.join();
	EXPECT_TRUE(gate.marked(2));
	EXPECT_TRUE(gate.marked(3));
	EXPECT_TRUE(gate.marked(5));
	EXPECT_EQ(cu().cuStreamSynchronize(CU_STREAM_PER_THREAD), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuStreamDestroy(CU_STREAM_PER_THREAD), CUDA_ERROR_INVALID_HANDLE);
	EXPECT_EQ(cu().cuStreamDestroy(blocking), CUDA_SUCCESS);
}

} // namespace
