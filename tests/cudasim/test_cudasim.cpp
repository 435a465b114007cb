// test_cudasim.cpp - self-test of the CUDA driver simulator: each test checks one promise
// of README.md through dlopen(), the way xmem loads the driver.

#include <cuda.h>

#include <gtest/gtest.h>

#include "selftest_driver.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

// cuda.h 13 renames cuCtxCreate to cuCtxCreate_v4; GStreamer 1.22 loads the flags-only v2.
extern "C" CUresult CUDAAPI cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);

namespace {

// Every entry point xmem and GStreamer's CUDA elements use, by the name cuda.h gives it;
// each expands to its ABI name (cuMemHostRegister -> cuMemHostRegister_v2) both as a member
// and as the dlsym() string.
#define CUDASIM_ENTRY_POINTS(X)                                                                                        \
	X(cuInit)                                                                                                      \
	X(cuDriverGetVersion)                                                                                          \
	X(cuDeviceGetCount)                                                                                            \
	X(cuDeviceGet)                                                                                                 \
	X(cuDeviceGetName)                                                                                             \
	X(cuDeviceGetUuid)                                                                                             \
	X(cuDeviceTotalMem)                                                                                            \
	X(cuDeviceGetAttribute)                                                                                        \
	X(cuGetErrorName)                                                                                              \
	X(cuGetErrorString)                                                                                            \
	X(cuDevicePrimaryCtxRetain)                                                                                    \
	X(cuDevicePrimaryCtxRelease)                                                                                   \
	X(cuCtxPushCurrent)                                                                                            \
	X(cuCtxPopCurrent)                                                                                             \
	X(cuCtxGetCurrent)                                                                                             \
	X(cuCtxSetCurrent)                                                                                             \
	X(cuCtxGetDevice)                                                                                              \
	X(cuCtxSynchronize)                                                                                            \
	X(cuMemGetAllocationGranularity)                                                                               \
	X(cuMemCreate)                                                                                                 \
	X(cuMemRelease)                                                                                                \
	X(cuMemExportToShareableHandle)                                                                                \
	X(cuMemImportFromShareableHandle)                                                                              \
	X(cuMemAddressReserve)                                                                                         \
	X(cuMemAddressFree)                                                                                            \
	X(cuMemMap)                                                                                                    \
	X(cuMemUnmap)                                                                                                  \
	X(cuMemSetAccess)                                                                                              \
	X(cuMemAlloc)                                                                                                  \
	X(cuMemFree)                                                                                                   \
	X(cuMemHostRegister)                                                                                           \
	X(cuMemHostUnregister)                                                                                         \
	X(cuMemHostGetDevicePointer)                                                                                   \
	X(cuStreamCreate)                                                                                              \
	X(cuStreamDestroy)                                                                                             \
	X(cuStreamSynchronize)                                                                                         \
	X(cuStreamQuery)                                                                                               \
	X(cuStreamWaitValue64)                                                                                         \
	X(cuStreamWriteValue64)                                                                                        \
	X(cuMemcpy2DAsync)                                                                                             \
	X(cuMemcpyHtoDAsync)                                                                                           \
	X(cuMemcpyDtoHAsync)                                                                                           \
	X(cuMemcpyDtoDAsync)                                                                                           \
	X(cuMemsetD8Async)                                                                                             \
	X(cuMemsetD32Async)                                                                                            \
	X(cuCtxCreate_v2)                                                                                              \
	X(cuCtxCreate)                                                                                                 \
	X(cuCtxDestroy)                                                                                                \
	X(cuDeviceCanAccessPeer)                                                                                       \
	X(cuCtxEnablePeerAccess)                                                                                       \
	X(cuCtxDisablePeerAccess)                                                                                      \
	X(cuMemAllocPitch)                                                                                             \
	X(cuMemAllocHost)                                                                                              \
	X(cuMemFreeHost)                                                                                               \
	X(cuMemcpy2D)                                                                                                  \
	X(cuStreamGetCtx)                                                                                              \
	X(cuEventCreate)                                                                                               \
	X(cuEventRecord)                                                                                               \
	X(cuEventQuery)                                                                                                \
	X(cuEventSynchronize)                                                                                          \
	X(cuEventDestroy)                                                                                              \
	X(cuModuleLoadData)                                                                                            \
	X(cuLaunchKernel)                                                                                              \
	X(cuTexObjectCreate)                                                                                           \
	X(cuGraphicsMapResources)                                                                                      \
	X(cuDevicePrimaryCtxSetFlags)                                                                                  \
	X(cuDevicePrimaryCtxGetState)                                                                                  \
	X(cuDevicePrimaryCtxReset)                                                                                     \
	X(cuCtxSetLimit)                                                                                               \
	X(cuMemcpy)                                                                                                    \
	X(cuMemcpyAsync)                                                                                               \
	X(cuMemcpyHtoD)                                                                                                \
	X(cuMemcpyDtoH)                                                                                                \
	X(cuMemcpyDtoD)                                                                                                \
	X(cuStreamAddCallback)                                                                                         \
	X(cuMemAllocManaged)                                                                                           \
	X(cuArray3DCreate)                                                                                             \
	X(cuCtxGetLimit)                                                                                               \
	X(cuMemsetD2D8)                                                                                                \
	X(cuMemsetD2D16Async)                                                                                          \
	X(cuMemsetD2D32Async)                                                                                          \
	X(cuStreamWaitEvent)                                                                                           \
	X(cuIpcGetEventHandle)                                                                                         \
	X(cuIpcOpenEventHandle)                                                                                        \
	X(cuMemGetAccess)                                                                                              \
	X(cuMemRetainAllocationHandle)                                                                                 \
	X(cuMemGetAllocationPropertiesFromHandle)

#define CUDASIM_STRING(name) #name
#define CUDASIM_ABI_NAME(name) CUDASIM_STRING(name)

struct Driver {
#define CUDASIM_DECLARE(fn) decltype(&::fn) fn = nullptr;
	CUDASIM_ENTRY_POINTS(CUDASIM_DECLARE)
#undef CUDASIM_DECLARE
	// Deprecated in cuda.h, so typed here: FFmpeg's loader still requires it.
	CUresult(CUDAAPI *cuDeviceComputeCapability)(int *major, int *minor, CUdevice dev) = nullptr;
};

constexpr size_t MiB = size_t(1) << 20;
constexpr size_t granularity = 2 * MiB; // the simulator's default
constexpr int segv_exit = 42;

// This process runs with two devices of 64 MiB and long delays; child processes inherit
// that and add their own settings.
bool apply_settings()
{
	if (std::getenv("CUDASIM_SELFTEST_CHILD"))
		return false;
	setenv("XMEM_CUDASIM_DEVICES", "2", 1);
	setenv("XMEM_CUDASIM_MEMORY", "64M", 1);
	setenv("XMEM_CUDASIM_DELAY_US", "2000", 1);
	unsetenv("CUDA_VISIBLE_DEVICES");
	unsetenv("XMEM_CUDASIM_GRANULARITY");
	unsetenv("XMEM_CUDASIM_FAIL");
	unsetenv("XMEM_CUDASIM_VERBOSE");
	return true;
}

[[maybe_unused]] const bool settings_applied = apply_settings();

using cudasim_selftest::driver_path;

Driver load_driver()
{
	const cudasim_selftest::Module module = cudasim_selftest::open_driver();
	Driver driver;
#define CUDASIM_LOAD(fn) driver.fn = cudasim_selftest::entry_point<decltype(driver.fn)>(module, CUDASIM_ABI_NAME(fn));
	CUDASIM_ENTRY_POINTS(CUDASIM_LOAD)
	CUDASIM_LOAD(cuDeviceComputeCapability)
#undef CUDASIM_LOAD
	return driver;
}

const Driver &cu()
{
	static const Driver driver = load_driver();
	return driver;
}

} // namespace

// Failure messages name CUresult values.
void PrintTo(CUresult result, std::ostream *os)
{
	const char *name = nullptr;
	if (cu().cuGetErrorName(result, &name) == CUDA_SUCCESS)
		*os << name;
	else
		*os << "CUresult " << int(result);
}

namespace {

CUmemAllocationProp device_prop(int device = 0, bool exportable = true)
{
	CUmemAllocationProp prop = {};
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = device;
	prop.requestedHandleTypes = exportable ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
	return prop;
}

CUmemAccessDesc access_for(int device, CUmemAccess_flags flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
{
	CUmemAccessDesc desc = {};
	desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	desc.location.id = device;
	desc.flags = flags;
	return desc;
}

// A fresh reservation of size bytes with handle mapped at its start, read-write for
// device 0 when access is set.
CUdeviceptr map_fresh(CUmemGenericAllocationHandle handle, size_t size, bool access = true)
{
	CUdeviceptr va = 0;
	EXPECT_EQ(cu().cuMemAddressReserve(&va, size, 0, 0, 0), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuMemMap(va, size, 0, handle, 0), CUDA_SUCCESS);
	if (access) {
		CUmemAccessDesc desc = access_for(0);
		EXPECT_EQ(cu().cuMemSetAccess(va, size, &desc, 1), CUDA_SUCCESS);
	}
	return va;
}

void unmap_fresh(CUdeviceptr va, size_t size)
{
	EXPECT_EQ(cu().cuMemUnmap(va, size), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuMemAddressFree(va, size), CUDA_SUCCESS);
}

// A VMM allocation mapped at a reservation of its own: the sequence xmem uses.
struct VmmBuffer {
	CUmemGenericAllocationHandle handle = 0;
	CUdeviceptr va = 0;
	size_t size = 0;
};

VmmBuffer make_vmm(size_t size, bool access = true)
{
	VmmBuffer buffer;
	buffer.size = size;
	CUmemAllocationProp prop = device_prop();
	EXPECT_EQ(cu().cuMemCreate(&buffer.handle, size, &prop, 0), CUDA_SUCCESS);
	buffer.va = map_fresh(buffer.handle, size, access);
	return buffer;
}

void free_vmm(const VmmBuffer &buffer)
{
	unmap_fresh(buffer.va, buffer.size);
	EXPECT_EQ(cu().cuMemRelease(buffer.handle), CUDA_SUCCESS);
}

// A page of host memory registered with the simulator: words another thread (or
// process) writes and stream memory operations use through the page's device address.
// PORTABLE: the streams of every context may use it (the simulator refuses a registration
// without it to other contexts than the registering one).
class HostPage
{
public:
	HostPage()
	{
		void *mem = mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		EXPECT_NE(mem, MAP_FAILED);
		mem_ = static_cast<char *>(mem);
		EXPECT_EQ(
			cu().cuMemHostRegister(mem_, size_, CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE),
			CUDA_SUCCESS);
		EXPECT_EQ(cu().cuMemHostGetDevicePointer(&dptr_, mem_, 0), CUDA_SUCCESS);
	}
	~HostPage()
	{
		// Fails harmlessly when a destroyed context already dropped the registration.
		cu().cuMemHostUnregister(mem_);
		munmap(mem_, size_);
	}
	HostPage(const HostPage &) = delete;
	HostPage &operator=(const HostPage &) = delete;

	std::atomic_ref<uint64_t> word(size_t i)
	{
		return std::atomic_ref<uint64_t>(reinterpret_cast<uint64_t *>(mem_)[i]);
	}
	CUdeviceptr device_word(size_t i) const { return dptr_ + i * sizeof(uint64_t); }
	char *data() const { return mem_; }
	CUdeviceptr dptr() const { return dptr_; }

private:
	static constexpr size_t size_ = 4096;
	char *mem_ = nullptr;
	CUdeviceptr dptr_ = 0;
};

// Page-locked host memory from cuMemAllocHost, of the current context: copies to and from it
// stay asynchronous, where pageable memory (a std::vector) makes a copy wait for its stream.
class Pinned
{
public:
	explicit Pinned(size_t size, unsigned char fill = 0) : size_(size)
	{
		void *mem = nullptr;
		EXPECT_EQ(cu().cuMemAllocHost(&mem, size), CUDA_SUCCESS);
		data_ = static_cast<unsigned char *>(mem);
		if (data_)
			std::memset(data_, fill, size);
	}
	// Fails harmlessly when a destroyed context already freed it.
	~Pinned() { cu().cuMemFreeHost(data_); }
	Pinned(const Pinned &) = delete;
	Pinned &operator=(const Pinned &) = delete;

	unsigned char *data() const { return data_; }
	size_t size() const { return size_; }

private:
	unsigned char *data_ = nullptr;
	size_t size_ = 0;
};

template<typename Body>
void on_fresh_thread(Body body)
{
	// A new thread's context stack is empty, whatever the test runner's thread holds.
	std::thread thread(body);
	thread.join();
}

// Whether the stream ran dry within the timeout: a broken wait fails the test instead of
// hanging it.
bool finishes(CUstream stream, std::chrono::milliseconds timeout = std::chrono::seconds(5))
{
	auto deadline = std::chrono::steady_clock::now() + timeout;
	while (cu().cuStreamQuery(stream) == CUDA_ERROR_NOT_READY) {
		if (std::chrono::steady_clock::now() > deadline)
			return false;
		std::this_thread::sleep_for(std::chrono::milliseconds(1));
	}
	return true;
}

bool all_equal(const void *data, size_t size, unsigned char value)
{
	const auto *bytes = static_cast<const unsigned char *>(data);
	return std::all_of(bytes, bytes + size, [value](unsigned char b) { return b == value; });
}

// Reads one byte at address in a death test's child: exits segv_exit on SIGSEGV, the same
// with and without AddressSanitizer, and 0 when the read works.
[[noreturn]] void touch(uintptr_t address)
{
	struct sigaction action = {};
	action.sa_handler = [](int) {
		_exit(segv_exit);
	};
	sigaction(SIGSEGV, &action, nullptr);
	(void)*reinterpret_cast<volatile const char *>(address);
	_exit(0);
}

// A CUDA_MEMCPY2D of width x height bytes between two pitched planes.
CUDA_MEMCPY2D plane_copy(CUmemorytype dst_type, uintptr_t dst, size_t dst_pitch, CUmemorytype src_type, uintptr_t src,
			 size_t src_pitch, size_t width, size_t height)
{
	CUDA_MEMCPY2D copy = {};
	copy.dstMemoryType = dst_type;
	copy.dstPitch = dst_pitch;
	if (dst_type == CU_MEMORYTYPE_HOST)
		copy.dstHost = reinterpret_cast<void *>(dst);
	else
		copy.dstDevice = CUdeviceptr(dst);
	copy.srcMemoryType = src_type;
	copy.srcPitch = src_pitch;
	if (src_type == CU_MEMORYTYPE_HOST)
		copy.srcHost = reinterpret_cast<const void *>(src);
	else
		copy.srcDevice = CUdeviceptr(src);
	copy.WidthInBytes = width;
	copy.Height = height;
	return copy;
}

// --- child processes -----------------------------------------------------------------

using cudasim_selftest::ChildResult;
using cudasim_selftest::exited_cleanly;

// Runs the test DISABLED_Child.<test> in a new process of this binary, with extra
// environment entries ("NAME=value") and, when given, fd as its fd 3.
ChildResult run_child(const std::string &test, const std::vector<std::string> &extra_env, int fd = -1)
{
	return cudasim_selftest::run_child("DISABLED_Child", test, "CUDASIM_SELFTEST_CHILD=1", extra_env, fd);
}

bool send_fd(int sock, int fd)
{
	char byte = 'f';
	iovec iov = { &byte, 1 };
	alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
	msghdr msg = {};
	msg.msg_iov = &iov;
	msg.msg_iovlen = 1;
	msg.msg_control = control;
	msg.msg_controllen = sizeof(control);
	cmsghdr *cmsg = CMSG_FIRSTHDR(&msg);
	cmsg->cmsg_level = SOL_SOCKET;
	cmsg->cmsg_type = SCM_RIGHTS;
	cmsg->cmsg_len = CMSG_LEN(sizeof(int));
	std::memcpy(CMSG_DATA(cmsg), &fd, sizeof(int));
	return sendmsg(sock, &msg, 0) == 1;
}

int receive_fd(int sock)
{
	char byte;
	iovec iov = { &byte, 1 };
	alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
	msghdr msg = {};
	msg.msg_iov = &iov;
	msg.msg_iovlen = 1;
	msg.msg_control = control;
	msg.msg_controllen = sizeof(control);
	if (recvmsg(sock, &msg, MSG_CMSG_CLOEXEC) != 1)
		return -1;
	cmsghdr *cmsg = CMSG_FIRSTHDR(&msg);
	if (!cmsg || cmsg->cmsg_type != SCM_RIGHTS)
		return -1;
	int fd;
	std::memcpy(&fd, CMSG_DATA(cmsg), sizeof(int));
	return fd;
}

// --- the fixture: a fresh primary context of device 0 and a stream per test ------------

class Sim : public ::testing::Test
{
protected:
	void SetUp() override
	{
		ASSERT_EQ(cu().cuInit(0), CUDA_SUCCESS);
		ASSERT_EQ(cu().cuDevicePrimaryCtxRetain(&ctx_, 0), CUDA_SUCCESS);
		ASSERT_EQ(cu().cuCtxPushCurrent(ctx_), CUDA_SUCCESS);
		ASSERT_EQ(cu().cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	}

	void TearDown() override
	{
		// The last release destroys the primary context: the next test gets a fresh
		// one, even after a sticky error.
		cu().cuStreamDestroy(stream_);
		CUcontext popped;
		cu().cuCtxPopCurrent(&popped);
		cu().cuDevicePrimaryCtxRelease(0);
	}

	// Destroys and recreates the context, so a test can clean up after a sticky error.
	void reset_context()
	{
		TearDown();
		SetUp();
	}

	// Expects what enqueue() put on stream_ to fault when it executes: one line on
	// stderr naming the operation, then CUDA_ERROR_ILLEGAL_ADDRESS from every call that
	// takes the context, until the context is destroyed.
	void expect_illegal(const char *op, const std::function<void()> &enqueue)
	{
		testing::internal::CaptureStderr();
		enqueue();
		CUresult synced = cu().cuStreamSynchronize(stream_);
		std::string err = testing::internal::GetCapturedStderr();
		EXPECT_EQ(synced, CUDA_ERROR_ILLEGAL_ADDRESS);
		EXPECT_NE(err.find(std::string("cudasim: illegal address: ") + op), std::string::npos) << err;
		EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;

		CUdeviceptr p;
		CUstream other;
		EXPECT_EQ(cu().cuStreamSynchronize(stream_), CUDA_ERROR_ILLEGAL_ADDRESS);
		EXPECT_EQ(cu().cuStreamQuery(stream_), CUDA_ERROR_ILLEGAL_ADDRESS);
		EXPECT_EQ(cu().cuCtxSynchronize(), CUDA_ERROR_ILLEGAL_ADDRESS);
		EXPECT_EQ(cu().cuMemAlloc(&p, 4096), CUDA_ERROR_ILLEGAL_ADDRESS);
		EXPECT_EQ(cu().cuStreamCreate(&other, 0), CUDA_ERROR_ILLEGAL_ADDRESS);
		EXPECT_EQ(cu().cuMemsetD8Async(0x1000, 0, 1, stream_), CUDA_ERROR_ILLEGAL_ADDRESS);

		reset_context();
		EXPECT_EQ(cu().cuStreamSynchronize(stream_), CUDA_SUCCESS);
		EXPECT_EQ(cu().cuMemAlloc(&p, 4096), CUDA_SUCCESS);
		EXPECT_EQ(cu().cuMemFree(p), CUDA_SUCCESS);
	}

	CUcontext ctx_ = nullptr;
	CUstream stream_ = nullptr;
};

// --- devices and contexts ------------------------------------------------------------

TEST(Init, CallsBeforeCuInitFail)
{
	ChildResult child = run_child("BeforeInit", {});
	EXPECT_TRUE(exited_cleanly(child)) << child.output;
}

TEST_F(Sim, DevicesAnswerQueries)
{
	int count = 0;
	EXPECT_EQ(cu().cuDeviceGetCount(&count), CUDA_SUCCESS);
	EXPECT_EQ(count, 2);

	CUdevice dev = -1;
	EXPECT_EQ(cu().cuDeviceGet(&dev, 1), CUDA_SUCCESS);
	EXPECT_EQ(dev, 1);
	EXPECT_EQ(cu().cuDeviceGet(&dev, 2), CUDA_ERROR_INVALID_DEVICE);

	char name[64];
	EXPECT_EQ(cu().cuDeviceGetName(name, sizeof(name), 1), CUDA_SUCCESS);
	EXPECT_STREQ(name, "xmem cudasim device 1");

	size_t total = 0;
	EXPECT_EQ(cu().cuDeviceTotalMem(&total, 0), CUDA_SUCCESS);
	EXPECT_EQ(total, 64 * MiB);

	int version = 0;
	EXPECT_EQ(cu().cuDriverGetVersion(&version), CUDA_SUCCESS);
	EXPECT_EQ(version, 13000);

	struct {
		CUdevice_attribute attribute;
		int value;
	} expected[] = {
		{ CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 1 },
		{ CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, 1 },
		{ CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, 1 },
		{ CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1, 1 },
		{ CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS_V1, 1 },
		{ CU_DEVICE_ATTRIBUTE_COMPUTE_MODE, CU_COMPUTEMODE_DEFAULT },
		{ CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 1 },
		{ CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT, 32 },
		{ CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT, 512 },
		{ CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM, 0 },
		{ CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, 0x10 },
		{ CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, 0 },
		{ CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, 0 },
		{ CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 9 },
		{ CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0 },
		{ CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 132 },
		{ CU_DEVICE_ATTRIBUTE_MAX_PITCH, 2147483647 },
		{ CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, 0 },
	};
	for (const auto &e : expected) {
		int value = -1;
		EXPECT_EQ(cu().cuDeviceGetAttribute(&value, e.attribute, 0), CUDA_SUCCESS) << e.attribute;
		EXPECT_EQ(value, e.value) << "attribute " << e.attribute;
	}
	int bus = -1;
	EXPECT_EQ(cu().cuDeviceGetAttribute(&bus, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, 1), CUDA_SUCCESS);
	EXPECT_EQ(bus, 0x11);

	// The deprecated query FFmpeg still loads gives the attributes' answer.
	int major = -1, minor = -1;
	EXPECT_EQ(cu().cuDeviceComputeCapability(&major, &minor, 1), CUDA_SUCCESS);
	EXPECT_EQ(major, 9);
	EXPECT_EQ(minor, 0);
	EXPECT_EQ(cu().cuDeviceComputeCapability(&major, &minor, 2), CUDA_ERROR_INVALID_DEVICE);
	EXPECT_EQ(cu().cuDeviceComputeCapability(nullptr, &minor, 0), CUDA_ERROR_INVALID_VALUE);

	// An attribute the simulator does not know is an error a caller notices.
	int value = -1;
	testing::internal::CaptureStderr();
	EXPECT_EQ(cu().cuDeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, 0),
		  CUDA_ERROR_INVALID_VALUE);
	std::string err = testing::internal::GetCapturedStderr();
	EXPECT_NE(err.find("attribute 1 "), std::string::npos) << err;
}

TEST(Errors, EveryCodeTheSimulatorReturnsHasItsRealNameAndString)
{
	struct {
		CUresult code;
		const char *name;
		const char *string;
	} expected[] = {
		{ CUDA_SUCCESS, "CUDA_SUCCESS", "no error" },
		{ CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument" },
		{ CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory" },
		{ CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error" },
		{ CUDA_ERROR_DEVICE_UNAVAILABLE, "CUDA_ERROR_DEVICE_UNAVAILABLE",
		  "CUDA-capable device(s) is/are busy or unavailable" },
		{ CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected" },
		{ CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal" },
		{ CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context" },
		{ CUDA_ERROR_UNSUPPORTED_LIMIT, "CUDA_ERROR_UNSUPPORTED_LIMIT",
		  "limit is not supported on this architecture" },
		{ CUDA_ERROR_OPERATING_SYSTEM, "CUDA_ERROR_OPERATING_SYSTEM",
		  "OS call failed or operation not supported on this OS" },
		{ CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE, "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE", "primary context active" },
		{ CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle" },
		{ CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED",
		  "peer access is not supported between these two devices" },
		{ CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready" },
		{ CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS",
		  "an illegal memory access was encountered" },
		{ CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED",
		  "peer access has not been enabled" },
		{ CUDA_ERROR_CONTEXT_IS_DESTROYED, "CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed" },
		{ CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
		  "part or all of the requested memory range is already mapped" },
		{ CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
		  "pointer does not correspond to a registered memory region" },
		{ CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported" },
		{ CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error" },
	};
	for (const auto &e : expected) {
		const char *name = nullptr;
		const char *string = nullptr;
		EXPECT_EQ(cu().cuGetErrorName(e.code, &name), CUDA_SUCCESS);
		EXPECT_EQ(cu().cuGetErrorString(e.code, &string), CUDA_SUCCESS);
		EXPECT_STREQ(name, e.name);
		EXPECT_STREQ(string, e.string);
	}
	const char *name = "unchanged";
	EXPECT_EQ(cu().cuGetErrorName(CUresult(12345), &name), CUDA_ERROR_INVALID_VALUE);
	EXPECT_EQ(name, nullptr);
	EXPECT_EQ(cu().cuGetErrorString(CUDA_SUCCESS, nullptr), CUDA_ERROR_INVALID_VALUE);
}

TEST(Context, CallsNeedACurrentContextOnTheirThread)
{
	ASSERT_EQ(cu().cuInit(0), CUDA_SUCCESS);
	on_fresh_thread([] {
		CUcontext current = reinterpret_cast<CUcontext>(1);
		EXPECT_EQ(cu().cuCtxGetCurrent(&current), CUDA_SUCCESS);
		EXPECT_EQ(current, nullptr);

		CUdeviceptr p;
		CUstream stream;
		CUdevice dev;
		CUcontext popped;
		int host = 0;
		CUmemAllocationProp prop = device_prop();
		CUmemGenericAllocationHandle handle;
		EXPECT_EQ(cu().cuMemAlloc(&p, 4096), CUDA_ERROR_INVALID_CONTEXT);
		EXPECT_EQ(cu().cuMemCreate(&handle, granularity, &prop, 0), CUDA_ERROR_INVALID_CONTEXT);
		EXPECT_EQ(cu().cuMemAddressReserve(&p, granularity, 0, 0, 0), CUDA_ERROR_INVALID_CONTEXT);
		EXPECT_EQ(cu().cuMemHostRegister(&host, sizeof(host), 0), CUDA_ERROR_INVALID_CONTEXT);
		EXPECT_EQ(cu().cuStreamCreate(&stream, 0), CUDA_ERROR_INVALID_CONTEXT);
		EXPECT_EQ(cu().cuMemsetD8Async(0x1000, 0, 1, nullptr), CUDA_ERROR_INVALID_CONTEXT);
		EXPECT_EQ(cu().cuCtxGetDevice(&dev), CUDA_ERROR_INVALID_CONTEXT);
		EXPECT_EQ(cu().cuCtxSynchronize(), CUDA_ERROR_INVALID_CONTEXT);
		EXPECT_EQ(cu().cuCtxPopCurrent(&popped), CUDA_ERROR_INVALID_CONTEXT);
		EXPECT_EQ(cu().cuStreamGetCtx(nullptr, &current), CUDA_ERROR_INVALID_CONTEXT);
		CUevent event;
		EXPECT_EQ(cu().cuEventCreate(&event, 0), CUDA_ERROR_INVALID_CONTEXT);

		CUcontext c0, c1;
		ASSERT_EQ(cu().cuDevicePrimaryCtxRetain(&c0, 0), CUDA_SUCCESS);
		ASSERT_EQ(cu().cuDevicePrimaryCtxRetain(&c1, 1), CUDA_SUCCESS);
		EXPECT_NE(c0, c1);
		EXPECT_EQ(cu().cuCtxPushCurrent(c0), CUDA_SUCCESS);
		EXPECT_EQ(cu().cuCtxPushCurrent(c1), CUDA_SUCCESS);
		EXPECT_EQ(cu().cuCtxGetDevice(&dev), CUDA_SUCCESS);
		EXPECT_EQ(dev, 1);
		EXPECT_EQ(cu().cuCtxSetCurrent(c0), CUDA_SUCCESS); // replaces the top
		EXPECT_EQ(cu().cuCtxGetDevice(&dev), CUDA_SUCCESS);
		EXPECT_EQ(dev, 0);
		EXPECT_EQ(cu().cuCtxPopCurrent(&popped), CUDA_SUCCESS);
		EXPECT_EQ(popped, c0);
		EXPECT_EQ(cu().cuCtxGetCurrent(&current), CUDA_SUCCESS);
		EXPECT_EQ(current, c0);
		EXPECT_EQ(cu().cuCtxSetCurrent(nullptr), CUDA_SUCCESS); // pops
		EXPECT_EQ(cu().cuCtxGetCurrent(&current), CUDA_SUCCESS);
		EXPECT_EQ(current, nullptr);
		EXPECT_EQ(cu().cuCtxSetCurrent(nullptr), CUDA_SUCCESS); // no-op on an empty stack
		EXPECT_EQ(cu().cuCtxSetCurrent(c1), CUDA_SUCCESS); // pushes on an empty stack
		EXPECT_EQ(cu().cuCtxGetDevice(&dev), CUDA_SUCCESS);
		EXPECT_EQ(dev, 1);
		EXPECT_EQ(cu().cuCtxPopCurrent(nullptr), CUDA_SUCCESS);

		EXPECT_EQ(cu().cuCtxPushCurrent(nullptr), CUDA_ERROR_INVALID_VALUE);
		EXPECT_EQ(cu().cuCtxPushCurrent(reinterpret_cast<CUcontext>(&host)), CUDA_ERROR_INVALID_CONTEXT);
		EXPECT_EQ(cu().cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
		EXPECT_EQ(cu().cuDevicePrimaryCtxRelease(1), CUDA_SUCCESS);
	});
}

TEST(Context, TheLastReleaseDestroysThePrimaryContextAndWhatItOwns)
{
	ASSERT_EQ(cu().cuInit(0), CUDA_SUCCESS);
	on_fresh_thread([] {
		CUcontext ctx, again;
		CUdeviceptr p;
		CUstream stream;
		ASSERT_EQ(cu().cuDevicePrimaryCtxRetain(&ctx, 1), CUDA_SUCCESS);
		ASSERT_EQ(cu().cuCtxPushCurrent(ctx), CUDA_SUCCESS);
		ASSERT_EQ(cu().cuMemAlloc(&p, 4096), CUDA_SUCCESS);
		ASSERT_EQ(cu().cuStreamCreate(&stream, 0), CUDA_SUCCESS);

		ASSERT_EQ(cu().cuDevicePrimaryCtxRelease(1), CUDA_SUCCESS);
		CUdeviceptr q;
		EXPECT_EQ(cu().cuMemAlloc(&q, 4096), CUDA_ERROR_CONTEXT_IS_DESTROYED);
		EXPECT_EQ(cu().cuDevicePrimaryCtxRelease(1), CUDA_ERROR_INVALID_CONTEXT);

		ASSERT_EQ(cu().cuDevicePrimaryCtxRetain(&again, 1), CUDA_SUCCESS);
		EXPECT_EQ(again, ctx); // the primary context's handle is stable
		EXPECT_EQ(cu().cuMemFree(p), CUDA_ERROR_INVALID_VALUE);
		EXPECT_EQ(cu().cuStreamQuery(stream), CUDA_ERROR_INVALID_HANDLE);
		EXPECT_EQ(cu().cuDevicePrimaryCtxRelease(1), CUDA_SUCCESS);
		EXPECT_EQ(cu().cuCtxPopCurrent(nullptr), CUDA_SUCCESS);
	});
}

// A destroyed context's handle dangles in the real driver: cuCtxPushCurrent returns
// CUDA_SUCCESS and the next call crashes (H200, driver 580.159.04). The simulator
// stops the process at the first call naming it.
TEST(ContextDeathTest, ADestroyedContextsHandleStopsTheProcess)
{
	GTEST_FLAG_SET(death_test_style, "threadsafe");
	auto use_destroyed = [](const std::string &call) {
		CUcontext primary = nullptr;
		CUcontext created = nullptr;
		if (cu().cuInit(0) != CUDA_SUCCESS || cu().cuDevicePrimaryCtxRetain(&primary, 1) != CUDA_SUCCESS ||
		    cu().cuCtxCreate_v2(&created, 0, 1) != CUDA_SUCCESS || cu().cuCtxDestroy(created) != CUDA_SUCCESS)
			std::exit(3);
		if (call == "cuCtxPushCurrent")
			cu().cuCtxPushCurrent(created);
		else if (call == "cuCtxSetCurrent")
			cu().cuCtxSetCurrent(created);
		else
			cu().cuCtxDestroy(created);
		std::exit(4);
	};
	for (std::string call : { "cuCtxPushCurrent", "cuCtxSetCurrent", "cuCtxDestroy" })
		EXPECT_DEATH(use_destroyed(call), "cudasim: " + call + ".*the context was destroyed") << call;
}

TEST(Context, CreatedContextsArePushedAndDestroyedWithWhatTheyOwn)
{
	ASSERT_EQ(cu().cuInit(0), CUDA_SUCCESS);
	on_fresh_thread([] {
		CUcontext primary, created, current, other;
		CUdevice dev = -1;
		ASSERT_EQ(cu().cuDevicePrimaryCtxRetain(&primary, 1), CUDA_SUCCESS);
		ASSERT_EQ(cu().cuCtxPushCurrent(primary), CUDA_SUCCESS);

		EXPECT_EQ(cu().cuCtxCreate_v2(&created, 0x100, 1), CUDA_ERROR_INVALID_VALUE);
		EXPECT_EQ(cu().cuCtxCreate_v2(&created, 3, 1), CUDA_ERROR_INVALID_VALUE); // no such schedule
		EXPECT_EQ(cu().cuCtxCreate_v2(&created, 0, 2), CUDA_ERROR_INVALID_DEVICE);
		EXPECT_EQ(cu().cuCtxCreate_v2(nullptr, 0, 1), CUDA_ERROR_INVALID_VALUE);
		ASSERT_EQ(cu().cuCtxCreate_v2(&created, CU_CTX_SCHED_BLOCKING_SYNC, 1), CUDA_SUCCESS);
		EXPECT_NE(created, primary);
		EXPECT_EQ(cu().cuCtxGetCurrent(&current), CUDA_SUCCESS);
		EXPECT_EQ(current, created); // pushed, as the real driver does
		EXPECT_EQ(cu().cuCtxGetDevice(&dev), CUDA_SUCCESS);
		EXPECT_EQ(dev, 1);

		// cuda.h 13's cuCtxCreate (_v4) makes the same kind of context.
		CUctxCreateParams params = {};
		ASSERT_EQ(cu().cuCtxCreate(&other, &params, 0, 1), CUDA_SUCCESS);
		EXPECT_EQ(cu().cuCtxDestroy(other), CUDA_SUCCESS); // and pops it
		EXPECT_EQ(cu().cuCtxGetCurrent(&current), CUDA_SUCCESS);
		EXPECT_EQ(current, created);
		CUexecAffinityParam affinity = {};
		params.execAffinityParams = &affinity;
		params.numExecAffinityParams = 1;
		EXPECT_EQ(cu().cuCtxCreate(&other, &params, 0, 1), CUDA_ERROR_NOT_SUPPORTED);

		// What the context owns.
		CUdeviceptr p;
		CUstream stream;
		CUevent event;
		void *host = nullptr;
		ASSERT_EQ(cu().cuMemAlloc(&p, 4096), CUDA_SUCCESS);
		ASSERT_EQ(cu().cuStreamCreate(&stream, 0), CUDA_SUCCESS);
		ASSERT_EQ(cu().cuEventCreate(&event, 0), CUDA_SUCCESS);
		ASSERT_EQ(cu().cuMemAllocHost(&host, 4096), CUDA_SUCCESS);

		// Pushed twice: destroying pops one, and the copy left below is a destroyed
		// context, as it stays on another thread that has it current.
		ASSERT_EQ(cu().cuCtxPushCurrent(created), CUDA_SUCCESS);
		EXPECT_EQ(cu().cuCtxDestroy(primary), CUDA_ERROR_INVALID_CONTEXT); // primary: released, never destroyed
		ASSERT_EQ(cu().cuCtxDestroy(created), CUDA_SUCCESS);
		EXPECT_EQ(cu().cuCtxGetCurrent(&current), CUDA_SUCCESS);
		EXPECT_EQ(current, created);
		CUdeviceptr q;
		EXPECT_EQ(cu().cuMemAlloc(&q, 4096), CUDA_ERROR_CONTEXT_IS_DESTROYED);
		EXPECT_EQ(cu().cuCtxPopCurrent(nullptr), CUDA_SUCCESS);

		// The handle is gone, and so is everything the context owned.
		EXPECT_EQ(cu().cuCtxGetCurrent(&current), CUDA_SUCCESS);
		EXPECT_EQ(current, primary);
		EXPECT_EQ(cu().cuMemFree(p), CUDA_ERROR_INVALID_VALUE);
		EXPECT_EQ(cu().cuStreamQuery(stream), CUDA_ERROR_INVALID_HANDLE);
		EXPECT_EQ(cu().cuStreamGetCtx(stream, &current), CUDA_ERROR_INVALID_HANDLE);
		EXPECT_EQ(cu().cuEventQuery(event), CUDA_ERROR_INVALID_HANDLE);
		EXPECT_EQ(cu().cuMemFreeHost(host), CUDA_ERROR_INVALID_VALUE);

		EXPECT_EQ(cu().cuCtxPopCurrent(nullptr), CUDA_SUCCESS);
		EXPECT_EQ(cu().cuDevicePrimaryCtxRelease(1), CUDA_SUCCESS);
	});
}

TEST(Context, PrimaryContextFlagsStateAndReset)
{
	ASSERT_EQ(cu().cuInit(0), CUDA_SUCCESS);
	// FFmpeg loads the unversioned v1 calls: Release and Reset as the _v2, SetFlags stricter.
	void *driver = dlopen(driver_path().c_str(), RTLD_NOW | RTLD_LOCAL);
	ASSERT_NE(driver, nullptr) << dlerror();
	using ByDevice = CUresult (*)(CUdevice);
	using SetFlags = CUresult (*)(CUdevice, unsigned);
	auto release_v1 = reinterpret_cast<ByDevice>(dlsym(driver, "cuDevicePrimaryCtxRelease"));
	auto reset_v1 = reinterpret_cast<ByDevice>(dlsym(driver, "cuDevicePrimaryCtxReset"));
	auto set_flags_v1 = reinterpret_cast<SetFlags>(dlsym(driver, "cuDevicePrimaryCtxSetFlags"));
	ASSERT_TRUE(release_v1 && reset_v1 && set_flags_v1);

	on_fresh_thread([&] {
		unsigned flags = 99;
		int active = -1;
		EXPECT_EQ(cu().cuDevicePrimaryCtxGetState(1, &flags, &active), CUDA_SUCCESS);
		EXPECT_EQ(flags, 0u);
		EXPECT_EQ(active, 0);
		EXPECT_EQ(cu().cuDevicePrimaryCtxGetState(2, &flags, &active), CUDA_ERROR_INVALID_DEVICE);
		EXPECT_EQ(cu().cuDevicePrimaryCtxGetState(1, nullptr, &active), CUDA_ERROR_INVALID_VALUE);

		EXPECT_EQ(set_flags_v1(1, CU_CTX_SCHED_YIELD), CUDA_SUCCESS); // inactive: v1 may
		EXPECT_EQ(cu().cuDevicePrimaryCtxGetState(1, &flags, &active), CUDA_SUCCESS);
		EXPECT_EQ(flags, unsigned(CU_CTX_SCHED_YIELD));

		CUcontext ctx;
		ASSERT_EQ(cu().cuDevicePrimaryCtxRetain(&ctx, 1), CUDA_SUCCESS);
		EXPECT_EQ(cu().cuDevicePrimaryCtxGetState(1, &flags, &active), CUDA_SUCCESS);
		EXPECT_EQ(active, 1);
		EXPECT_EQ(set_flags_v1(1, CU_CTX_SCHED_SPIN), CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE);
		EXPECT_EQ(cu().cuDevicePrimaryCtxSetFlags(1, CU_CTX_SCHED_BLOCKING_SYNC), CUDA_SUCCESS); // _v2 may
		EXPECT_EQ(cu().cuDevicePrimaryCtxSetFlags(1, 3), CUDA_ERROR_INVALID_VALUE); // no such schedule
		EXPECT_EQ(cu().cuDevicePrimaryCtxSetFlags(1, 0x100), CUDA_ERROR_INVALID_VALUE);
		EXPECT_EQ(cu().cuDevicePrimaryCtxGetState(1, &flags, &active), CUDA_SUCCESS);
		EXPECT_EQ(flags, unsigned(CU_CTX_SCHED_BLOCKING_SYNC));

		// Reset destroys what the context owns but keeps the retain: the handle still works.
		ASSERT_EQ(cu().cuCtxPushCurrent(ctx), CUDA_SUCCESS);
		CUdeviceptr p, q;
		CUstream stream;
		ASSERT_EQ(cu().cuMemAlloc(&p, 4096), CUDA_SUCCESS);
		ASSERT_EQ(cu().cuStreamCreate(&stream, 0), CUDA_SUCCESS);
		EXPECT_EQ(cu().cuDevicePrimaryCtxReset(1), CUDA_SUCCESS);
		EXPECT_EQ(cu().cuMemFree(p), CUDA_ERROR_INVALID_VALUE);
		EXPECT_EQ(cu().cuStreamQuery(stream), CUDA_ERROR_INVALID_HANDLE);
		ASSERT_EQ(cu().cuMemAlloc(&q, 4096), CUDA_SUCCESS);
		EXPECT_EQ(reset_v1(1), CUDA_SUCCESS);
		EXPECT_EQ(cu().cuMemFree(q), CUDA_ERROR_INVALID_VALUE);
		EXPECT_EQ(cu().cuDevicePrimaryCtxGetState(1, &flags, &active), CUDA_SUCCESS);
		EXPECT_EQ(active, 1);

		EXPECT_EQ(release_v1(1), CUDA_SUCCESS); // the last retain: destroyed
		EXPECT_EQ(cu().cuMemAlloc(&q, 4096), CUDA_ERROR_CONTEXT_IS_DESTROYED);
		EXPECT_EQ(release_v1(1), CUDA_ERROR_INVALID_CONTEXT);
		EXPECT_EQ(cu().cuDevicePrimaryCtxGetState(1, &flags, &active), CUDA_SUCCESS);
		EXPECT_EQ(active, 0);
		EXPECT_EQ(cu().cuCtxPopCurrent(nullptr), CUDA_SUCCESS);
		EXPECT_EQ(set_flags_v1(1, 0), CUDA_SUCCESS); // as the other tests expect
	});
	dlclose(driver);
}

TEST_F(Sim, CtxSetLimitAcceptsTheLimitsThatCanBeSet)
{
	// Kernel limits: accepted, and nothing runs kernels to notice them.
	for (CUlimit limit : { CU_LIMIT_STACK_SIZE, CU_LIMIT_PRINTF_FIFO_SIZE, CU_LIMIT_MALLOC_HEAP_SIZE,
			       CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT, CU_LIMIT_MAX_L2_FETCH_GRANULARITY,
			       CU_LIMIT_PERSISTING_L2_CACHE_SIZE, CU_LIMIT_CIG_SHMEM_FALLBACK_ENABLED })
		EXPECT_EQ(cu().cuCtxSetLimit(limit, 4096), CUDA_SUCCESS) << int(limit);
	// Below compute capability 9.0 only.
	EXPECT_EQ(cu().cuCtxSetLimit(CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH, 4), CUDA_ERROR_UNSUPPORTED_LIMIT);
	// Queried only, or unknown.
	EXPECT_EQ(cu().cuCtxSetLimit(CU_LIMIT_SHMEM_SIZE, 4096), CUDA_ERROR_INVALID_VALUE);
	EXPECT_EQ(cu().cuCtxSetLimit(CU_LIMIT_CIG_ENABLED, 1), CUDA_ERROR_INVALID_VALUE);
	EXPECT_EQ(cu().cuCtxSetLimit(CU_LIMIT_MAX, 1), CUDA_ERROR_INVALID_VALUE);
	on_fresh_thread([] { EXPECT_EQ(cu().cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 4096), CUDA_ERROR_INVALID_CONTEXT); });
}

TEST_F(Sim, CtxGetLimitReadsBackWhatWasSetPerContext)
{
	size_t value = 0, primary_heap = 0;
	ASSERT_EQ(cu().cuCtxGetLimit(&primary_heap, CU_LIMIT_MALLOC_HEAP_SIZE), CUDA_SUCCESS);
	CUcontext created;
	ASSERT_EQ(cu().cuCtxCreate_v2(&created, 0, 0), CUDA_SUCCESS);
	// A fresh context has the defaults; every limit, even one that cannot be set, reads.
	ASSERT_EQ(cu().cuCtxGetLimit(&value, CU_LIMIT_STACK_SIZE), CUDA_SUCCESS);
	EXPECT_EQ(value, 1024u);
	ASSERT_EQ(cu().cuCtxGetLimit(&value, CU_LIMIT_SHMEM_SIZE), CUDA_SUCCESS);
	EXPECT_GT(value, 0u);
	ASSERT_EQ(cu().cuCtxGetLimit(&value, CU_LIMIT_CIG_ENABLED), CUDA_SUCCESS);
	EXPECT_EQ(value, 0u);
	ASSERT_EQ(cu().cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, 3 * MiB), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuCtxGetLimit(&value, CU_LIMIT_MALLOC_HEAP_SIZE), CUDA_SUCCESS);
	EXPECT_EQ(value, 3 * MiB);
	EXPECT_EQ(cu().cuCtxGetLimit(nullptr, CU_LIMIT_STACK_SIZE), CUDA_ERROR_INVALID_VALUE);
	EXPECT_EQ(cu().cuCtxGetLimit(&value, CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH), CUDA_ERROR_UNSUPPORTED_LIMIT);
	EXPECT_EQ(cu().cuCtxGetLimit(&value, CU_LIMIT_MAX), CUDA_ERROR_INVALID_VALUE);
	EXPECT_EQ(cu().cuCtxDestroy(created), CUDA_SUCCESS);
	// The primary context (the fixture's, current again) kept its own.
	ASSERT_EQ(cu().cuCtxGetLimit(&value, CU_LIMIT_MALLOC_HEAP_SIZE), CUDA_SUCCESS);
	EXPECT_EQ(value, primary_heap);
	on_fresh_thread([] {
		size_t v = 0;
		EXPECT_EQ(cu().cuCtxGetLimit(&v, CU_LIMIT_STACK_SIZE), CUDA_ERROR_INVALID_CONTEXT);
	});
}

TEST_F(Sim, AStreamTakesWorkOnlyWhileItsOwnContextIsCurrent)
{
	CUdeviceptr buffer;
	ASSERT_EQ(cu().cuMemAlloc(&buffer, 4096), CUDA_SUCCESS);
	CUcontext created;
	CUstream theirs;
	ASSERT_EQ(cu().cuCtxCreate_v2(&created, 0, 0), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuStreamCreate(&theirs, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuCtxPopCurrent(nullptr), CUDA_SUCCESS); // the primary context is current again

	CUcontext owner = nullptr;
	EXPECT_EQ(cu().cuStreamGetCtx(theirs, &owner), CUDA_SUCCESS);
	EXPECT_EQ(owner, created);
	EXPECT_EQ(cu().cuStreamGetCtx(stream_, &owner), CUDA_SUCCESS);
	EXPECT_EQ(owner, ctx_);
	EXPECT_EQ(cu().cuStreamGetCtx(CU_STREAM_LEGACY, &owner), CUDA_SUCCESS); // the current context's
	EXPECT_EQ(owner, ctx_);
	EXPECT_EQ(cu().cuStreamGetCtx(theirs, nullptr), CUDA_ERROR_INVALID_VALUE);
	on_fresh_thread([&] {
		// A named stream knows its context without a current one.
		CUcontext found = nullptr;
		EXPECT_EQ(cu().cuStreamGetCtx(theirs, &found), CUDA_SUCCESS);
		EXPECT_EQ(found, created);
	});

	// Under the primary context, the created context's stream takes no work, and each
	// refusal names both contexts.
	char byte = 1;
	HostPage page;
	CUevent event;
	ASSERT_EQ(cu().cuEventCreate(&event, 0), CUDA_SUCCESS);
	CUDA_MEMCPY2D copy = plane_copy(CU_MEMORYTYPE_DEVICE, buffer, 64, CU_MEMORYTYPE_HOST,
					reinterpret_cast<uintptr_t>(&byte), 1, 1, 1);
	testing::internal::CaptureStderr();
	EXPECT_EQ(cu().cuMemsetD8Async(buffer, 0, 1, theirs), CUDA_ERROR_INVALID_CONTEXT);
	EXPECT_EQ(cu().cuMemsetD32Async(buffer, 0, 1, theirs), CUDA_ERROR_INVALID_CONTEXT);
	EXPECT_EQ(cu().cuMemcpyHtoDAsync(buffer, &byte, 1, theirs), CUDA_ERROR_INVALID_CONTEXT);
	EXPECT_EQ(cu().cuMemcpyDtoHAsync(&byte, buffer, 1, theirs), CUDA_ERROR_INVALID_CONTEXT);
	EXPECT_EQ(cu().cuMemcpyDtoDAsync(buffer, buffer + 8, 1, theirs), CUDA_ERROR_INVALID_CONTEXT);
	EXPECT_EQ(cu().cuMemcpy2DAsync(&copy, theirs), CUDA_ERROR_INVALID_CONTEXT);
	EXPECT_EQ(cu().cuStreamWriteValue64(theirs, page.device_word(0), 1, 0), CUDA_ERROR_INVALID_CONTEXT);
	EXPECT_EQ(cu().cuStreamWaitValue64(theirs, page.device_word(0), 0, 0), CUDA_ERROR_INVALID_CONTEXT);
	EXPECT_EQ(cu().cuEventRecord(event, theirs), CUDA_ERROR_INVALID_CONTEXT);
	std::string err = testing::internal::GetCapturedStderr();
	EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 9) << err;
	EXPECT_NE(err.find("cudasim: cuMemsetD8Async: stream "), std::string::npos) << err;
	EXPECT_NE(err.find(" belongs to created context "), std::string::npos) << err;
	EXPECT_NE(err.find(", current is primary context "), std::string::npos) << err;

	// Waiting and asking are not enqueueing: they work from any context.
	EXPECT_EQ(cu().cuStreamQuery(theirs), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuStreamSynchronize(theirs), CUDA_SUCCESS);

	// The other way round: the primary context's stream under the created context.
	ASSERT_EQ(cu().cuCtxPushCurrent(created), CUDA_SUCCESS);
	testing::internal::CaptureStderr();
	EXPECT_EQ(cu().cuMemsetD8Async(buffer, 0, 1, stream_), CUDA_ERROR_INVALID_CONTEXT);
	err = testing::internal::GetCapturedStderr();
	EXPECT_NE(err.find("belongs to primary context"), std::string::npos) << err;

	// Under its own context the stream works, on its own context's memory (see
	// CuMemAllocMemoryBelongsToItsContext for another context's).
	CUdeviceptr own;
	ASSERT_EQ(cu().cuMemAlloc(&own, 4096), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuMemsetD8Async(own, 0x3c, 64, theirs), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuMemcpyDtoHAsync(&byte, own + 63, 1, theirs), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuStreamSynchronize(theirs), CUDA_SUCCESS);
	EXPECT_EQ(byte, 0x3c);
	// The default stream is always the current context's own.
	ASSERT_EQ(cu().cuMemsetD8Async(own, 0x3d, 1, nullptr), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuStreamSynchronize(nullptr), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuMemFree(own), CUDA_SUCCESS);

	EXPECT_EQ(cu().cuCtxDestroy(created), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuStreamSynchronize(theirs), CUDA_ERROR_INVALID_HANDLE); // went with its context
	EXPECT_EQ(cu().cuEventDestroy(event), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuMemFree(buffer), CUDA_SUCCESS);
}

// Memory from cuMemAlloc belongs to its context: a stream of another context on the
// same device reaches it only through peer access (never granted here), and touching it
// is an illegal access. VMM memory with access set for the device is reachable from
// every context on it, which is why xmem makes its private copies that way.
TEST_F(Sim, CuMemAllocMemoryBelongsToItsContext)
{
	CUdeviceptr primary_buffer;
	ASSERT_EQ(cu().cuMemAlloc(&primary_buffer, 4096), CUDA_SUCCESS);
	VmmBuffer shared = make_vmm(granularity);
	CUcontext created;
	ASSERT_EQ(cu().cuCtxCreate_v2(&created, 0, 0), CUDA_SUCCESS);
	CUstream theirs;
	ASSERT_EQ(cu().cuStreamCreate(&theirs, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);

	// VMM memory: any context of the device.
	ASSERT_EQ(cu().cuMemsetD8Async(shared.va, 0x5a, 64, theirs), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuStreamSynchronize(theirs), CUDA_SUCCESS);

	// The primary context's cuMemAlloc memory, from the created context's stream.
	testing::internal::CaptureStderr();
	ASSERT_EQ(cu().cuMemcpyDtoDAsync(shared.va, primary_buffer, 64, theirs), CUDA_SUCCESS);
	CUresult synced = cu().cuStreamSynchronize(theirs);
	std::string err = testing::internal::GetCapturedStderr();
	EXPECT_EQ(synced, CUDA_ERROR_ILLEGAL_ADDRESS);
	EXPECT_NE(err.find("cuMemAlloc memory of primary context"), std::string::npos) << err;
	EXPECT_NE(err.find("touched by a stream of created context"), std::string::npos) << err;
	EXPECT_NE(err.find("only through peer access"), std::string::npos) << err;
	EXPECT_EQ(cu().cuCtxDestroy(created), CUDA_SUCCESS);

	// The primary context itself is untouched by the other context's fault.
	ASSERT_EQ(cu().cuMemsetD8Async(primary_buffer, 1, 64, stream_), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuMemcpyDtoDAsync(shared.va, primary_buffer, 64, stream_), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuStreamSynchronize(stream_), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuMemFree(primary_buffer), CUDA_SUCCESS);
	free_vmm(shared);
}

// Without XMEM_CUDASIM_PEER (Settings.PeersReachEachOthersMemoryOnlyWhereAccessIsGiven
// runs the other case).
TEST_F(Sim, PeerAccessIsUnavailableByDefault)
{
	int can = -1;
	EXPECT_EQ(cu().cuDeviceCanAccessPeer(&can, 0, 1), CUDA_SUCCESS);
	EXPECT_EQ(can, 0);
	can = -1;
	EXPECT_EQ(cu().cuDeviceCanAccessPeer(&can, 0, 0), CUDA_SUCCESS);
	EXPECT_EQ(can, 0);
	EXPECT_EQ(cu().cuDeviceCanAccessPeer(&can, 0, 2), CUDA_ERROR_INVALID_DEVICE);
	EXPECT_EQ(cu().cuDeviceCanAccessPeer(nullptr, 0, 1), CUDA_ERROR_INVALID_VALUE);

	CUcontext peer;
	ASSERT_EQ(cu().cuDevicePrimaryCtxRetain(&peer, 1), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuCtxEnablePeerAccess(peer, 0), CUDA_ERROR_PEER_ACCESS_UNSUPPORTED);
	EXPECT_EQ(cu().cuCtxEnablePeerAccess(peer, 1), CUDA_ERROR_INVALID_VALUE);
	EXPECT_EQ(cu().cuCtxEnablePeerAccess(ctx_, 0), CUDA_ERROR_INVALID_CONTEXT); // itself
	EXPECT_EQ(cu().cuCtxEnablePeerAccess(reinterpret_cast<CUcontext>(&can), 0), CUDA_ERROR_INVALID_CONTEXT);
	EXPECT_EQ(cu().cuCtxDisablePeerAccess(peer), CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
	EXPECT_EQ(cu().cuCtxDisablePeerAccess(reinterpret_cast<CUcontext>(&can)), CUDA_ERROR_INVALID_CONTEXT);
	EXPECT_EQ(cu().cuDevicePrimaryCtxRelease(1), CUDA_SUCCESS);
}

// --- virtual memory management ---------------------------------------------------------

// A device reaches a VMM mapping only where cuMemSetAccess gave it access: a stream of
// another device that reads device 0's memory, mapped for device 0 alone, makes an illegal
// access (what a copy on the wrong device's stream meets on a GPU). Its own context gets
// the sticky error; device 0's stays usable.
TEST_F(Sim, AnotherDevicesStreamCannotReachMemoryMappedForDevice0)
{
	VmmBuffer buffer = make_vmm(granularity);
	ASSERT_EQ(cu().cuMemsetD8Async(buffer.va, 0x33, 64, stream_), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuStreamSynchronize(stream_), CUDA_SUCCESS);
	on_fresh_thread([&] {
		CUcontext other;
		ASSERT_EQ(cu().cuDevicePrimaryCtxRetain(&other, 1), CUDA_SUCCESS);
		ASSERT_EQ(cu().cuCtxPushCurrent(other), CUDA_SUCCESS);
		CUstream theirs;
		ASSERT_EQ(cu().cuStreamCreate(&theirs, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
		Pinned pinned(64);
		testing::internal::CaptureStderr();
		ASSERT_EQ(cu().cuMemcpyDtoHAsync(pinned.data(), buffer.va, 64, theirs), CUDA_SUCCESS);
		CUresult synced = cu().cuStreamSynchronize(theirs);
		std::string err = testing::internal::GetCapturedStderr();
		EXPECT_EQ(synced, CUDA_ERROR_ILLEGAL_ADDRESS);
		EXPECT_NE(err.find("(device 1)"), std::string::npos) << err;
		EXPECT_NE(err.find("cuMemSetAccess gave device 1 no access"), std::string::npos) << err;
		cu().cuStreamDestroy(theirs);
		CUcontext popped;
		EXPECT_EQ(cu().cuCtxPopCurrent(&popped), CUDA_SUCCESS);
		EXPECT_EQ(cu().cuDevicePrimaryCtxRelease(1), CUDA_SUCCESS); // clears the sticky error
	});
	std::vector<unsigned char> bytes(64);
	ASSERT_EQ(cu().cuMemcpyDtoHAsync(bytes.data(), buffer.va, 64, stream_), CUDA_SUCCESS);
	EXPECT_TRUE(all_equal(bytes.data(), bytes.size(), 0x33));
	free_vmm(buffer);
}

// cuMemGetAccess reads what cuMemSetAccess set, per device; cuMemRetainAllocationHandle
// takes any address of a mapping and gives back the handle mapped there, even once every
// earlier reference was released, counting one reference more; its properties name the
// allocation's device.
TEST_F(Sim, AMappingTellsItsAccessHandleAndDevice)
{
	CUmemAllocationProp prop = device_prop(1);
	CUmemGenericAllocationHandle handle;
	ASSERT_EQ(cu().cuMemCreate(&handle, 2 * granularity, &prop, 0), CUDA_SUCCESS);
	CUdeviceptr va = map_fresh(handle, 2 * granularity, false);
	CUmemAccessDesc read_only = access_for(1, CU_MEM_ACCESS_FLAGS_PROT_READ);
	ASSERT_EQ(cu().cuMemSetAccess(va, 2 * granularity, &read_only, 1), CUDA_SUCCESS);

	CUmemLocation device0 = access_for(0).location, device1 = access_for(1).location;
	unsigned long long flags = 99;
	EXPECT_EQ(cu().cuMemGetAccess(&flags, &device1, va + granularity + 5), CUDA_SUCCESS);
	EXPECT_EQ(flags, static_cast<unsigned long long>(CU_MEM_ACCESS_FLAGS_PROT_READ));
	EXPECT_EQ(cu().cuMemGetAccess(&flags, &device0, va), CUDA_SUCCESS);
	EXPECT_EQ(flags, static_cast<unsigned long long>(CU_MEM_ACCESS_FLAGS_PROT_NONE));
	CUmemLocation device2 = access_for(2).location, host = device0;
	host.type = CU_MEM_LOCATION_TYPE_HOST;
	EXPECT_EQ(cu().cuMemGetAccess(&flags, &device2, va), CUDA_ERROR_INVALID_DEVICE);
	EXPECT_EQ(cu().cuMemGetAccess(&flags, &host, va), CUDA_ERROR_INVALID_VALUE);
	EXPECT_EQ(cu().cuMemGetAccess(nullptr, &device0, va), CUDA_ERROR_INVALID_VALUE);
	EXPECT_EQ(cu().cuMemGetAccess(&flags, &device0, va + 2 * granularity), CUDA_ERROR_INVALID_VALUE);
	CUdeviceptr plain;
	ASSERT_EQ(cu().cuMemAlloc(&plain, 4096), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuMemGetAccess(&flags, &device0, plain), CUDA_ERROR_INVALID_VALUE);

	CUmemGenericAllocationHandle retained = 0;
	auto *inside = reinterpret_cast<void *>(uintptr_t(va + granularity + 100));
	ASSERT_EQ(cu().cuMemRetainAllocationHandle(&retained, inside), CUDA_SUCCESS);
	EXPECT_EQ(retained, handle);
	CUmemAllocationProp got;
	std::memset(&got, 0xff, sizeof(got));
	ASSERT_EQ(cu().cuMemGetAllocationPropertiesFromHandle(&got, retained), CUDA_SUCCESS);
	EXPECT_EQ(got.type, CU_MEM_ALLOCATION_TYPE_PINNED);
	EXPECT_EQ(got.location.type, CU_MEM_LOCATION_TYPE_DEVICE);
	EXPECT_EQ(got.location.id, 1);
	EXPECT_EQ(got.requestedHandleTypes, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	// Two references: cuMemCreate's and the retain's.
	EXPECT_EQ(cu().cuMemRelease(handle), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuMemGetAllocationPropertiesFromHandle(&got, handle), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuMemRelease(retained), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuMemGetAllocationPropertiesFromHandle(&got, handle), CUDA_ERROR_INVALID_VALUE);
	EXPECT_EQ(cu().cuMemRelease(handle), CUDA_ERROR_INVALID_VALUE);
	// The mapping keeps the memory, and the handle comes back.
	ASSERT_EQ(cu().cuMemRetainAllocationHandle(&retained, reinterpret_cast<void *>(uintptr_t(va))), CUDA_SUCCESS);
	EXPECT_EQ(retained, handle);
	EXPECT_EQ(cu().cuMemRelease(retained), CUDA_SUCCESS);

	EXPECT_EQ(cu().cuMemRetainAllocationHandle(&retained, reinterpret_cast<void *>(uintptr_t(plain))),
		  CUDA_ERROR_INVALID_VALUE);
	EXPECT_EQ(cu().cuMemRetainAllocationHandle(nullptr, inside), CUDA_ERROR_INVALID_VALUE);
	EXPECT_EQ(cu().cuMemGetAllocationPropertiesFromHandle(nullptr, handle), CUDA_ERROR_INVALID_VALUE);
	EXPECT_EQ(cu().cuMemFree(plain), CUDA_SUCCESS);
	unmap_fresh(va, 2 * granularity);
	EXPECT_EQ(cu().cuMemRetainAllocationHandle(&retained, inside), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(Sim, VmmCallsCheckTheirArguments)
{
	CUmemAllocationProp prop = device_prop();
	size_t g = 0;
	EXPECT_EQ(cu().cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), CUDA_SUCCESS);
	EXPECT_EQ(g, granularity);
	EXPECT_EQ(cu().cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED), CUDA_SUCCESS);
	EXPECT_EQ(g, granularity);

	CUmemGenericAllocationHandle h;
	EXPECT_EQ(cu().cuMemCreate(&h, g + 4096, &prop, 0), CUDA_ERROR_INVALID_VALUE);
	EXPECT_EQ(cu().cuMemCreate(&h, 0, &prop, 0), CUDA_ERROR_INVALID_VALUE);
	EXPECT_EQ(cu().cuMemCreate(&h, g, &prop, 1), CUDA_ERROR_INVALID_VALUE);
	EXPECT_EQ(cu().cuMemCreate(nullptr, g, &prop, 0), CUDA_ERROR_INVALID_VALUE);
	CUmemAllocationProp bad = prop;
	bad.type = CU_MEM_ALLOCATION_TYPE_INVALID;
	EXPECT_EQ(cu().cuMemCreate(&h, g, &bad, 0), CUDA_ERROR_INVALID_VALUE);
	bad = prop;
	bad.location.type = CU_MEM_LOCATION_TYPE_HOST;
	EXPECT_EQ(cu().cuMemCreate(&h, g, &bad, 0), CUDA_ERROR_INVALID_VALUE);
	bad = prop;
	bad.location.id = 5;
	EXPECT_EQ(cu().cuMemCreate(&h, g, &bad, 0), CUDA_ERROR_INVALID_DEVICE);
	ASSERT_EQ(cu().cuMemCreate(&h, 2 * g, &prop, 0), CUDA_SUCCESS);

	CUdeviceptr va;
	EXPECT_EQ(cu().cuMemAddressReserve(&va, 4 * g, 3, 0, 0), CUDA_ERROR_INVALID_VALUE);
	EXPECT_EQ(cu().cuMemAddressReserve(&va, g + 1, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
	EXPECT_EQ(cu().cuMemAddressReserve(&va, g, 0, 0, 1), CUDA_ERROR_INVALID_VALUE);
	ASSERT_EQ(cu().cuMemAddressReserve(&va, 4 * g, 0, 0, 0), CUDA_SUCCESS);
	EXPECT_EQ(va % g, 0u);

	EXPECT_EQ(cu().cuMemMap(va + 4096, g, 0, h, 0), CUDA_ERROR_INVALID_VALUE); // misaligned
	EXPECT_EQ(cu().cuMemMap(va, g, 2 * g, h, 0), CUDA_ERROR_INVALID_VALUE); // past the allocation
	EXPECT_EQ(cu().cuMemMap(va + 3 * g, 2 * g, 0, h, 0), CUDA_ERROR_INVALID_VALUE); // past the reservation
	EXPECT_EQ(cu().cuMemMap(va, 2 * g, 0, h + 12345, 0), CUDA_ERROR_INVALID_VALUE); // unknown handle
	EXPECT_EQ(cu().cuMemMap(va, 2 * g, 0, h, 1), CUDA_ERROR_INVALID_VALUE);
	ASSERT_EQ(cu().cuMemMap(va, 2 * g, 0, h, 0), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuMemMap(va + g, g, 0, h, 0), CUDA_ERROR_INVALID_VALUE); // already mapped
	ASSERT_EQ(cu().cuMemMap(va + 2 * g, g, g, h, 0), CUDA_SUCCESS); // the second half, again

	CUmemAccessDesc rw = access_for(0);
	CUmemAccessDesc nowhere = access_for(7);
	EXPECT_EQ(cu().cuMemSetAccess(va, g, &rw, 1), CUDA_ERROR_INVALID_VALUE); // part of a mapping
	EXPECT_EQ(cu().cuMemSetAccess(va, 4 * g, &rw, 1), CUDA_ERROR_INVALID_VALUE); // a hole at the end
	EXPECT_EQ(cu().cuMemSetAccess(va, 3 * g, &nowhere, 1), CUDA_ERROR_INVALID_DEVICE);
	EXPECT_EQ(cu().cuMemSetAccess(va, 3 * g, &rw, 0), CUDA_ERROR_INVALID_VALUE);
	EXPECT_EQ(cu().cuMemSetAccess(va, 3 * g, &rw, 1), CUDA_SUCCESS); // two whole mappings

	EXPECT_EQ(cu().cuMemUnmap(va, g), CUDA_ERROR_INVALID_VALUE); // part of a mapping
	EXPECT_EQ(cu().cuMemAddressFree(va, 4 * g), CUDA_ERROR_INVALID_VALUE); // still mapped
	EXPECT_EQ(cu().cuMemAddressFree(va, 2 * g), CUDA_ERROR_INVALID_VALUE); // not its size
	EXPECT_EQ(cu().cuMemUnmap(va, 3 * g), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuMemUnmap(va, 2 * g), CUDA_ERROR_INVALID_VALUE); // no longer mapped
	EXPECT_EQ(cu().cuMemAddressFree(va, 4 * g), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuMemAddressFree(va, 4 * g), CUDA_ERROR_INVALID_VALUE);
	EXPECT_EQ(cu().cuMemRelease(h), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuMemRelease(h), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(Sim, MemoryLivesUntilReleasedAndUnmapped)
{
	CUmemAllocationProp prop = device_prop();
	VmmBuffer a = make_vmm(32 * MiB);
	std::vector<unsigned char> pattern(4096);
	for (size_t i = 0; i < pattern.size(); i++)
		pattern[i] = static_cast<unsigned char>(i * 7);
	ASSERT_EQ(cu().cuMemcpyHtoDAsync(a.va + 5 * MiB, pattern.data(), pattern.size(), stream_), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuStreamSynchronize(stream_), CUDA_SUCCESS);

	// The device has 64 MiB.
	CUmemGenericAllocationHandle b, c;
	ASSERT_EQ(cu().cuMemCreate(&b, 32 * MiB, &prop, 0), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuMemCreate(&c, granularity, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
	CUdeviceptr p;
	EXPECT_EQ(cu().cuMemAlloc(&p, 4096), CUDA_ERROR_OUT_OF_MEMORY);

	// Released while mapped: legal, and the bytes stay until the mapping goes.
	ASSERT_EQ(cu().cuMemRelease(a.handle), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuMemCreate(&c, granularity, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
	std::vector<unsigned char> back(pattern.size(), 0);
	ASSERT_EQ(cu().cuMemcpyDtoHAsync(back.data(), a.va + 5 * MiB, back.size(), stream_), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuStreamSynchronize(stream_), CUDA_SUCCESS);
	EXPECT_EQ(back, pattern);

	unmap_fresh(a.va, a.size);
	ASSERT_EQ(cu().cuMemCreate(&c, granularity, &prop, 0), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuMemRelease(c), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuMemRelease(b), CUDA_SUCCESS);
}

TEST_F(Sim, TheCpuCannotTouchDeviceAddresses)
{
	GTEST_FLAG_SET(death_test_style, "threadsafe");
	VmmBuffer buffer = make_vmm(granularity);
	CUdeviceptr plain = 0;
	ASSERT_EQ(cu().cuMemAlloc(&plain, 4096), CUDA_SUCCESS);
	HostPage page;

	EXPECT_EXIT(touch(buffer.va), testing::ExitedWithCode(segv_exit), "");
	EXPECT_EXIT(touch(plain), testing::ExitedWithCode(segv_exit), "");
	EXPECT_EXIT(touch(page.dptr()), testing::ExitedWithCode(segv_exit), "");
	EXPECT_NE(page.dptr(), reinterpret_cast<CUdeviceptr>(page.data()));

	EXPECT_EQ(cu().cuMemFree(plain), CUDA_SUCCESS);
	free_vmm(buffer);
}

// --- streams ---------------------------------------------------------------------------

TEST_F(Sim, CopiesRunLaterAndReadTheirSourceWhenTheyExecute)
{
	HostPage gate;
	VmmBuffer buffer = make_vmm(granularity);
	// Page-locked: a copy from or to pageable memory would wait for the stream.
	Pinned source(4096, 'a');
	Pinned result(4096, 0);

	ASSERT_EQ(cu().cuStreamWaitValue64(stream_, gate.device_word(0), 1, CU_STREAM_WAIT_VALUE_GEQ), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuMemcpyHtoDAsync(buffer.va, source.data(), source.size(), stream_), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuMemcpyDtoHAsync(result.data(), buffer.va, result.size(), stream_), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuStreamQuery(stream_), CUDA_ERROR_NOT_READY);

	std::memset(source.data(), 'b', source.size()); // not read yet
	std::this_thread::sleep_for(std::chrono::milliseconds(20));
	EXPECT_TRUE(all_equal(result.data(), result.size(), 0));

	gate.word(0).store(1, std::memory_order_release);
	ASSERT_EQ(cu().cuStreamSynchronize(stream_), CUDA_SUCCESS);
	EXPECT_TRUE(all_equal(result.data(), result.size(), 'b'));
	EXPECT_EQ(cu().cuStreamQuery(stream_), CUDA_SUCCESS);
	free_vmm(buffer);
}

TEST_F(Sim, AStreamRunsItsOperationsInOrder)
{
	VmmBuffer buffer = make_vmm(granularity);
	constexpr size_t size = 65536;
	auto start = std::chrono::steady_clock::now();
	for (int i = 1; i <= 40; i++)
		ASSERT_EQ(cu().cuMemsetD8Async(buffer.va, static_cast<unsigned char>(i), size, stream_), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuMemsetD32Async(buffer.va + 4, 0x04030201, 1, stream_), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuStreamQuery(stream_), CUDA_ERROR_NOT_READY); // ~40 ms of delays queued

	ASSERT_EQ(cu().cuMemcpyDtoDAsync(buffer.va + MiB, buffer.va, size, stream_), CUDA_SUCCESS);
	std::vector<unsigned char> result(size, 0);
	ASSERT_EQ(cu().cuMemcpyDtoHAsync(result.data(), buffer.va + MiB, size, stream_), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuStreamSynchronize(stream_), CUDA_SUCCESS);
	// 43 random delays of up to 2 ms each: about 43 ms, surely more than 10.
	EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(10));

	EXPECT_TRUE(all_equal(result.data(), 4, 40));
	EXPECT_EQ(result[4], 1);
	EXPECT_EQ(result[5], 2);
	EXPECT_EQ(result[6], 3);
	EXPECT_EQ(result[7], 4);
	EXPECT_TRUE(all_equal(result.data() + 8, size - 8, 40));
	free_vmm(buffer);
}

TEST_F(Sim, WaitValueHoldsLaterWorkUntilTheWordIsWritten)
{
	HostPage gate;
	VmmBuffer buffer = make_vmm(granularity);
	Pinned result(4096, 0);
	ASSERT_EQ(cu().cuMemsetD8Async(buffer.va, 0x5a, result.size(), stream_), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuStreamWaitValue64(stream_, gate.device_word(0), 7, CU_STREAM_WAIT_VALUE_EQ), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuMemcpyDtoHAsync(result.data(), buffer.va, result.size(), stream_), CUDA_SUCCESS);

	auto start = std::chrono::steady_clock::now();
	std::thread writer([&] {
		std::this_thread::sleep_for(std::chrono::milliseconds(60));
		gate.word(0).store(7, std::memory_order_release);
	});
	std::this_thread::sleep_for(std::chrono::milliseconds(30));
	EXPECT_EQ(cu().cuStreamQuery(stream_), CUDA_ERROR_NOT_READY);
	EXPECT_TRUE(all_equal(result.data(), result.size(), 0));

	bool finished = finishes(stream_);
	writer.join();
	if (!finished) {
		reset_context();
		FAIL() << "the wait was never satisfied";
	}
	EXPECT_EQ(cu().cuStreamSynchronize(stream_), CUDA_SUCCESS);
	EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(60));
	EXPECT_TRUE(all_equal(result.data(), result.size(), 0x5a));
	free_vmm(buffer);
}

TEST_F(Sim, WaitValueConditionsFollowCudaH)
{
	HostPage gate;
	constexpr uint64_t minus16 = ~uint64_t(15);
	constexpr uint64_t int64_min = uint64_t(1) << 63;
	struct {
		uint64_t word;
		uint64_t value;
		unsigned flags;
		bool satisfied;
		uint64_t then; // a word that satisfies it
	} cases[] = {
		{ 5, 5, CU_STREAM_WAIT_VALUE_GEQ, true, 0 },
		{ 4, 5, CU_STREAM_WAIT_VALUE_GEQ, false, 6 },
		{ 5, minus16, CU_STREAM_WAIT_VALUE_GEQ, true, 0 }, // wraps: 5 comes after -16
		{ minus16, 5, CU_STREAM_WAIT_VALUE_GEQ, false, 5 },
		{ int64_min, 0, CU_STREAM_WAIT_VALUE_GEQ, false, 1 },
		{ 3, 3, CU_STREAM_WAIT_VALUE_EQ, true, 0 },
		{ 3, 4, CU_STREAM_WAIT_VALUE_EQ, false, 4 },
		{ 0x6, 0x4, CU_STREAM_WAIT_VALUE_AND, true, 0 },
		{ 0x6, 0x9, CU_STREAM_WAIT_VALUE_AND, false, 0x8 },
		{ 0, 0, CU_STREAM_WAIT_VALUE_NOR, true, 0 },
		{ ~uint64_t(0), 0, CU_STREAM_WAIT_VALUE_NOR, false, 0x7 },
		{ 9, 9, CU_STREAM_WAIT_VALUE_EQ | CU_STREAM_WAIT_VALUE_FLUSH, true, 0 },
	};
	for (const auto &c : cases) {
		SCOPED_TRACE(testing::Message() << "word " << c.word << " value " << c.value << " flags " << c.flags);
		gate.word(0).store(c.word, std::memory_order_release);
		gate.word(1).store(0, std::memory_order_release);
		ASSERT_EQ(cu().cuStreamWaitValue64(stream_, gate.device_word(0), c.value, c.flags), CUDA_SUCCESS);
		ASSERT_EQ(cu().cuStreamWriteValue64(stream_, gate.device_word(1), 1, 0), CUDA_SUCCESS);
		if (!c.satisfied) {
			std::this_thread::sleep_for(std::chrono::milliseconds(15));
			EXPECT_EQ(cu().cuStreamQuery(stream_), CUDA_ERROR_NOT_READY);
			EXPECT_EQ(gate.word(1).load(std::memory_order_acquire), 0u);
			gate.word(0).store(c.then, std::memory_order_release);
		}
		if (!finishes(stream_)) {
			reset_context(); // abandons the stuck wait
			FAIL() << "the wait was never satisfied";
		}
		ASSERT_EQ(cu().cuStreamSynchronize(stream_), CUDA_SUCCESS);
		EXPECT_EQ(gate.word(1).load(std::memory_order_acquire), 1u);
	}

	EXPECT_EQ(cu().cuStreamWaitValue64(stream_, gate.device_word(0), 0, 0x10), CUDA_ERROR_INVALID_VALUE);
	EXPECT_EQ(cu().cuStreamWaitValue64(stream_, gate.device_word(0) + 4, 0, 0), CUDA_ERROR_INVALID_VALUE);
	EXPECT_EQ(cu().cuStreamWaitValue64(stream_, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(Sim, WriteValueLandsAfterEarlierWork)
{
	HostPage flag;
	constexpr size_t size = 8 * MiB, chunk = 512 * 1024;
	VmmBuffer buffer = make_vmm(size);
	Pinned result(size, 0); // pageable memory would make each copy complete on return
	ASSERT_EQ(cu().cuMemsetD8Async(buffer.va, 0xab, size, stream_), CUDA_SUCCESS);
	for (size_t offset = 0; offset < size; offset += chunk)
		ASSERT_EQ(cu().cuMemcpyDtoHAsync(result.data() + offset, buffer.va + offset, chunk, stream_),
			  CUDA_SUCCESS);
	ASSERT_EQ(cu().cuStreamWriteValue64(stream_, flag.device_word(0), 1, CU_STREAM_WRITE_VALUE_DEFAULT),
		  CUDA_SUCCESS);

	// A consumer that waits for the word, not for the stream, sees every earlier byte.
	auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
	while (flag.word(0).load(std::memory_order_acquire) != 1 && std::chrono::steady_clock::now() < deadline)
		std::this_thread::yield();
	ASSERT_EQ(flag.word(0).load(std::memory_order_acquire), 1u);
	EXPECT_TRUE(all_equal(result.data(), size, 0xab));

	ASSERT_EQ(cu().cuStreamWriteValue64(stream_, flag.device_word(0), 2, CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER),
		  CUDA_SUCCESS);
	ASSERT_EQ(cu().cuStreamSynchronize(stream_), CUDA_SUCCESS);
	EXPECT_EQ(flag.word(0).load(std::memory_order_acquire), 2u);

	EXPECT_EQ(cu().cuStreamWriteValue64(stream_, flag.device_word(0), 1, 7), CUDA_ERROR_INVALID_VALUE);
	EXPECT_EQ(cu().cuStreamWriteValue64(stream_, flag.device_word(0) + 4, 1, 0), CUDA_ERROR_INVALID_VALUE);
	EXPECT_EQ(cu().cuStreamWriteValue64(stream_, 0, 1, 0), CUDA_ERROR_INVALID_VALUE);
	free_vmm(buffer);
}

TEST_F(Sim, DestroyReturnsAtOnceAndQueuedWorkStillRuns)
{
	HostPage gate;
	VmmBuffer buffer = make_vmm(granularity);
	Pinned result(4096, 0);
	CUstream stream;
	ASSERT_EQ(cu().cuStreamCreate(&stream, CU_STREAM_DEFAULT), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuMemsetD8Async(buffer.va, 0x11, result.size(), stream), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuStreamWaitValue64(stream, gate.device_word(0), 1, CU_STREAM_WAIT_VALUE_EQ), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuMemcpyDtoHAsync(result.data(), buffer.va, result.size(), stream), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuStreamWriteValue64(stream, gate.device_word(1), 1, 0), CUDA_SUCCESS);

	auto start = std::chrono::steady_clock::now();
	ASSERT_EQ(cu().cuStreamDestroy(stream), CUDA_SUCCESS);
	EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(100));
	// The destroyed handle dangles in the real driver: naming it again stops the process.
	GTEST_FLAG_SET(death_test_style, "threadsafe");
	EXPECT_DEATH(cu().cuStreamQuery(stream), "cudasim: cuStreamQuery.*the stream was destroyed");
	EXPECT_DEATH(cu().cuStreamSynchronize(stream), "the stream was destroyed");
	EXPECT_DEATH(cu().cuStreamDestroy(stream), "the stream was destroyed");
	EXPECT_DEATH(cu().cuMemsetD8Async(buffer.va, 0, 1, stream), "the stream was destroyed");
	EXPECT_EQ(cu().cuStreamDestroy(nullptr), CUDA_ERROR_INVALID_HANDLE);

	gate.word(0).store(1, std::memory_order_release);
	ASSERT_EQ(cu().cuCtxSynchronize(), CUDA_SUCCESS); // includes streams still draining
	EXPECT_EQ(gate.word(1).load(std::memory_order_acquire), 1u);
	EXPECT_TRUE(all_equal(result.data(), result.size(), 0x11));
	free_vmm(buffer);
}

TEST_F(Sim, TheDefaultStreamIsAsynchronousAndCtxSynchronizeWaitsForEveryStream)
{
	HostPage gate;
	ASSERT_EQ(cu().cuStreamWaitValue64(nullptr, gate.device_word(0), 1, CU_STREAM_WAIT_VALUE_EQ), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuStreamWriteValue64(CU_STREAM_LEGACY, gate.device_word(1), 1, 0), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuStreamQuery(CU_STREAM_LEGACY), CUDA_ERROR_NOT_READY); // the same stream

	// stream_ is non-blocking: it does not wait for the legacy stream (see
	// test_cudasim_streams.cpp for the streams that do).
	ASSERT_EQ(cu().cuStreamWriteValue64(stream_, gate.device_word(2), 1, 0), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuStreamSynchronize(stream_), CUDA_SUCCESS);
	EXPECT_EQ(gate.word(2).load(std::memory_order_acquire), 1u);
	EXPECT_EQ(gate.word(1).load(std::memory_order_acquire), 0u);

	std::thread writer([&] {
		std::this_thread::sleep_for(std::chrono::milliseconds(20));
		gate.word(0).store(1, std::memory_order_release);
	});
	EXPECT_EQ(cu().cuCtxSynchronize(), CUDA_SUCCESS);
	writer.join();
	EXPECT_EQ(gate.word(1).load(std::memory_order_acquire), 1u);
	EXPECT_EQ(cu().cuStreamSynchronize(nullptr), CUDA_SUCCESS);
}

TEST_F(Sim, EventsCompleteWhenTheirStreamReachesThem)
{
	CUevent event;
	EXPECT_EQ(cu().cuEventCreate(&event, 0x40), CUDA_ERROR_INVALID_VALUE);
	EXPECT_EQ(cu().cuEventCreate(&event, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING),
		  CUDA_ERROR_NOT_SUPPORTED);
	EXPECT_EQ(cu().cuEventCreate(nullptr, 0), CUDA_ERROR_INVALID_VALUE);
	ASSERT_EQ(cu().cuEventCreate(&event, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuEventQuery(event), CUDA_SUCCESS); // never recorded
	EXPECT_EQ(cu().cuEventSynchronize(event), CUDA_SUCCESS);

	// Late: after ten operations of up to 2 ms each, the event is not reached yet.
	VmmBuffer buffer = make_vmm(granularity);
	for (int i = 0; i < 10; i++)
		ASSERT_EQ(cu().cuMemsetD8Async(buffer.va, static_cast<unsigned char>(i), 4096, stream_), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuEventRecord(event, stream_), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuEventQuery(event), CUDA_ERROR_NOT_READY);
	ASSERT_EQ(cu().cuEventSynchronize(event), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuEventQuery(event), CUDA_SUCCESS);

	// Held by a wait: not ready until the word is written, whatever the time.
	HostPage gate;
	ASSERT_EQ(cu().cuStreamWaitValue64(stream_, gate.device_word(0), 1, CU_STREAM_WAIT_VALUE_EQ), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuEventRecord(event, stream_), CUDA_SUCCESS); // moves the event
	ASSERT_EQ(cu().cuStreamWriteValue64(stream_, gate.device_word(1), 1, 0), CUDA_SUCCESS);
	std::this_thread::sleep_for(std::chrono::milliseconds(30));
	EXPECT_EQ(cu().cuEventQuery(event), CUDA_ERROR_NOT_READY);
	gate.word(0).store(1, std::memory_order_release);
	ASSERT_EQ(cu().cuEventSynchronize(event), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuEventQuery(event), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuStreamSynchronize(stream_), CUDA_SUCCESS);
	EXPECT_EQ(gate.word(1).load(std::memory_order_acquire), 1u);

	// On the default stream too.
	ASSERT_EQ(cu().cuEventRecord(event, nullptr), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuEventSynchronize(event), CUDA_SUCCESS);

	// An event records only on a stream of its own context.
	CUcontext created;
	CUstream theirs;
	ASSERT_EQ(cu().cuCtxCreate_v2(&created, 0, 0), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuStreamCreate(&theirs, 0), CUDA_SUCCESS);
	testing::internal::CaptureStderr();
	EXPECT_EQ(cu().cuEventRecord(event, theirs), CUDA_ERROR_INVALID_HANDLE);
	std::string err = testing::internal::GetCapturedStderr();
	EXPECT_NE(err.find("cudasim: cuEventRecord: event "), std::string::npos) << err;
	EXPECT_EQ(cu().cuCtxDestroy(created), CUDA_SUCCESS);

	// Destroying returns at once, even before the event completes.
	gate.word(0).store(0, std::memory_order_release);
	ASSERT_EQ(cu().cuStreamWaitValue64(stream_, gate.device_word(0), 1, CU_STREAM_WAIT_VALUE_EQ), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuEventRecord(event, stream_), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuEventDestroy(event), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuEventQuery(event), CUDA_ERROR_INVALID_HANDLE);
	EXPECT_EQ(cu().cuEventSynchronize(event), CUDA_ERROR_INVALID_HANDLE);
	EXPECT_EQ(cu().cuEventRecord(event, stream_), CUDA_ERROR_INVALID_HANDLE);
	EXPECT_EQ(cu().cuEventDestroy(event), CUDA_ERROR_INVALID_HANDLE);
	gate.word(0).store(1, std::memory_order_release);
	ASSERT_EQ(cu().cuStreamSynchronize(stream_), CUDA_SUCCESS);
	free_vmm(buffer);
}

TEST_F(Sim, StreamWaitEventHoldsLaterWorkUntilTheRecordCompletes)
{
	CUstream other;
	CUevent event;
	ASSERT_EQ(cu().cuStreamCreate(&other, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuEventCreate(&event, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
	// Never recorded: no wait.
	ASSERT_EQ(cu().cuStreamWaitEvent(other, event, 0), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuStreamSynchronize(other), CUDA_SUCCESS);

	HostPage gate;
	ASSERT_EQ(cu().cuStreamWaitValue64(stream_, gate.device_word(0), 1, CU_STREAM_WAIT_VALUE_EQ), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuEventRecord(event, stream_), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuStreamWaitEvent(other, event, CU_EVENT_WAIT_DEFAULT), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuStreamWriteValue64(other, gate.device_word(1), 1, 0), CUDA_SUCCESS);
	// A record made after the wait was queued does not move what OTHER waits for.
	ASSERT_EQ(cu().cuEventRecord(event, stream_), CUDA_SUCCESS);
	std::this_thread::sleep_for(std::chrono::milliseconds(30));
	EXPECT_EQ(cu().cuStreamQuery(other), CUDA_ERROR_NOT_READY);
	EXPECT_EQ(gate.word(1).load(std::memory_order_acquire), 0u);
	gate.word(0).store(1, std::memory_order_release);
	ASSERT_EQ(cu().cuStreamSynchronize(other), CUDA_SUCCESS);
	EXPECT_EQ(gate.word(1).load(std::memory_order_acquire), 1u);

	// An event of another context is waited for all the same.
	CUcontext created;
	CUstream theirs;
	CUevent their_event;
	gate.word(0).store(0, std::memory_order_release);
	gate.word(1).store(0, std::memory_order_release);
	ASSERT_EQ(cu().cuCtxCreate_v2(&created, 0, 0), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuStreamCreate(&theirs, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuEventCreate(&their_event, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuStreamWaitValue64(theirs, gate.device_word(0), 1, CU_STREAM_WAIT_VALUE_EQ), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuEventRecord(their_event, theirs), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuCtxPopCurrent(nullptr), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuStreamWaitEvent(stream_, their_event, 0), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuStreamWriteValue64(stream_, gate.device_word(1), 1, 0), CUDA_SUCCESS);
	std::this_thread::sleep_for(std::chrono::milliseconds(30));
	EXPECT_EQ(gate.word(1).load(std::memory_order_acquire), 0u);
	gate.word(0).store(1, std::memory_order_release);
	ASSERT_EQ(cu().cuStreamSynchronize(stream_), CUDA_SUCCESS);
	EXPECT_EQ(gate.word(1).load(std::memory_order_acquire), 1u);
	EXPECT_EQ(cu().cuEventDestroy(their_event), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuCtxDestroy(created), CUDA_SUCCESS);

	EXPECT_EQ(cu().cuStreamWaitEvent(other, event, 0x4), CUDA_ERROR_INVALID_VALUE);
	EXPECT_EQ(cu().cuEventDestroy(event), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuStreamWaitEvent(other, event, 0), CUDA_ERROR_INVALID_HANDLE);
	EXPECT_EQ(cu().cuStreamDestroy(other), CUDA_SUCCESS);
}

// --- copies ----------------------------------------------------------------------------

TEST_F(Sim, Memcpy2DHonoursPitchesAndOffsets)
{
	VmmBuffer buffer = make_vmm(granularity);
	constexpr size_t width = 100, height = 10, host_pitch = 128, device_pitch = 256;
	std::vector<unsigned char> source(host_pitch * (height + 1));
	for (size_t i = 0; i < source.size(); i++)
		source[i] = static_cast<unsigned char>(i * 7 + 1);
	std::vector<unsigned char> result(host_pitch * height, 0);
	ASSERT_EQ(cu().cuMemsetD8Async(buffer.va, 0, granularity, stream_), CUDA_SUCCESS);

	CUDA_MEMCPY2D up = {};
	up.srcMemoryType = CU_MEMORYTYPE_HOST;
	up.srcHost = source.data();
	up.srcPitch = host_pitch;
	up.srcXInBytes = 4;
	up.srcY = 1;
	up.dstMemoryType = CU_MEMORYTYPE_DEVICE;
	up.dstDevice = buffer.va;
	up.dstPitch = device_pitch;
	up.dstXInBytes = 8;
	up.dstY = 2;
	up.WidthInBytes = width;
	up.Height = height;
	ASSERT_EQ(cu().cuMemcpy2DAsync(&up, stream_), CUDA_SUCCESS);

	// Back again with both sides UNIFIED: looked up, device and host.
	CUDA_MEMCPY2D down = {};
	down.srcMemoryType = CU_MEMORYTYPE_UNIFIED;
	down.srcDevice = buffer.va;
	down.srcPitch = device_pitch;
	down.srcXInBytes = 8;
	down.srcY = 2;
	down.dstMemoryType = CU_MEMORYTYPE_UNIFIED;
	down.dstDevice = reinterpret_cast<CUdeviceptr>(result.data());
	down.dstPitch = host_pitch;
	down.WidthInBytes = width;
	down.Height = height;
	ASSERT_EQ(cu().cuMemcpy2DAsync(&down, stream_), CUDA_SUCCESS);

	// The bytes left of the rectangle on the device stayed zero.
	std::vector<unsigned char> margin(8, 0xff);
	ASSERT_EQ(cu().cuMemcpyDtoHAsync(margin.data(), buffer.va + 2 * device_pitch, margin.size(), stream_),
		  CUDA_SUCCESS);
	ASSERT_EQ(cu().cuStreamSynchronize(stream_), CUDA_SUCCESS);

	for (size_t y = 0; y < height; y++) {
		for (size_t x = 0; x < host_pitch; x++) {
			unsigned char want = x < width ? source[(y + 1) * host_pitch + 4 + x] : 0;
			ASSERT_EQ(result[y * host_pitch + x], want) << "x " << x << " y " << y;
		}
	}
	EXPECT_TRUE(all_equal(margin.data(), margin.size(), 0));

	CUDA_MEMCPY2D bad = up;
	bad.srcMemoryType = CU_MEMORYTYPE_ARRAY;
	EXPECT_EQ(cu().cuMemcpy2DAsync(&bad, stream_), CUDA_ERROR_NOT_SUPPORTED);
	bad = up;
	bad.WidthInBytes = host_pitch + 1;
	bad.srcXInBytes = 0;
	EXPECT_EQ(cu().cuMemcpy2DAsync(&bad, stream_), CUDA_ERROR_INVALID_VALUE); // wider than the pitch
	bad = up;
	bad.srcXInBytes = host_pitch - width + 1;
	EXPECT_EQ(cu().cuMemcpy2DAsync(&bad, stream_), CUDA_ERROR_INVALID_VALUE); // X + width past the pitch
	bad = up;
	bad.dstPitch = size_t(1) << 31;
	EXPECT_EQ(cu().cuMemcpy2DAsync(&bad, stream_), CUDA_ERROR_INVALID_VALUE); // over MAX_PITCH
	EXPECT_EQ(cu().cuMemcpy2DAsync(nullptr, stream_), CUDA_ERROR_INVALID_VALUE);
	free_vmm(buffer);
}

TEST_F(Sim, MemAllocAndMemsets)
{
	CUdeviceptr a = 0, b = 0, c = 0;
	ASSERT_EQ(cu().cuMemAlloc(&a, 1000), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuMemAlloc(&b, 1000), CUDA_SUCCESS);
	EXPECT_NE(a, b);
	EXPECT_EQ(cu().cuMemAlloc(&c, 0), CUDA_ERROR_INVALID_VALUE);
	EXPECT_EQ(cu().cuMemAlloc(nullptr, 1), CUDA_ERROR_INVALID_VALUE);
	EXPECT_EQ(cu().cuMemAlloc(&c, 65 * MiB), CUDA_ERROR_OUT_OF_MEMORY);

	EXPECT_EQ(cu().cuMemsetD32Async(a + 2, 0, 1, stream_), CUDA_ERROR_INVALID_VALUE); // misaligned
	ASSERT_EQ(cu().cuMemsetD32Async(a, 0xdeadbeef, 250, stream_), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuMemcpyDtoDAsync(b, a, 1000, stream_), CUDA_SUCCESS);
	std::vector<uint32_t> result(250, 0);
	ASSERT_EQ(cu().cuMemcpyDtoHAsync(result.data(), b, 1000, stream_), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuStreamSynchronize(stream_), CUDA_SUCCESS);
	EXPECT_TRUE(std::all_of(result.begin(), result.end(), [](uint32_t w) { return w == 0xdeadbeef; }));

	EXPECT_EQ(cu().cuMemFree(a), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuMemFree(a), CUDA_ERROR_INVALID_VALUE);
	EXPECT_EQ(cu().cuMemFree(b + 8), CUDA_ERROR_INVALID_VALUE);
	EXPECT_EQ(cu().cuMemFree(b), CUDA_SUCCESS);
}

TEST_F(Sim, MemsetD2DWritesItsRowsAndLeavesThePadding)
{
	constexpr size_t pitch = 64, rows = 4;
	CUdeviceptr a = 0;
	ASSERT_EQ(cu().cuMemAlloc(&a, pitch * rows), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuMemsetD8Async(a, 0xee, pitch * rows, stream_), CUDA_SUCCESS);
	// 8 units of 4 bytes a row: 32 of each 64 bytes written, the rest untouched.
	ASSERT_EQ(cu().cuMemsetD2D32Async(a, pitch, 0x11223344, 8, rows, stream_), CUDA_SUCCESS);
	// 16-bit units from byte 40 of rows 1 and 2.
	ASSERT_EQ(cu().cuMemsetD2D16Async(a + pitch + 40, pitch, 0xabcd, 4, 2, stream_), CUDA_SUCCESS);
	std::vector<unsigned char> out(pitch * rows);
	ASSERT_EQ(cu().cuMemcpyDtoHAsync(out.data(), a, out.size(), stream_), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuStreamSynchronize(stream_), CUDA_SUCCESS);
	for (size_t y = 0; y < rows; y++) {
		for (size_t x = 0; x < pitch; x++) {
			unsigned char want = 0xee;
			if (x < 32)
				want = static_cast<unsigned char>(0x11223344u >> (8 * (x % 4)));
			else if (y >= 1 && y <= 2 && x >= 40 && x < 48)
				want = x % 2 ? 0xab : 0xcd;
			ASSERT_EQ(out[y * pitch + x], want) << "row " << y << " byte " << x;
		}
	}

	// The synchronous form runs on the legacy stream, after the work queued there.
	ASSERT_EQ(cu().cuMemsetD2D8(a, pitch, 0x5a, pitch, rows), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuCtxSynchronize(), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuMemcpyDtoH(out.data(), a, out.size()), CUDA_SUCCESS);
	EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](unsigned char c) { return c == 0x5a; }));

	// The driver's rules: address and pitch aligned to the unit, rows within the pitch.
	EXPECT_EQ(cu().cuMemsetD2D32Async(a + 2, pitch, 0, 1, 2, stream_), CUDA_ERROR_INVALID_VALUE);
	EXPECT_EQ(cu().cuMemsetD2D16Async(a, 63, 0, 1, 2, stream_), CUDA_ERROR_INVALID_VALUE);
	EXPECT_EQ(cu().cuMemsetD2D32Async(a, pitch, 0, 17, 2, stream_), CUDA_ERROR_INVALID_VALUE);
	EXPECT_EQ(cu().cuMemsetD2D32Async(a, pitch, 0, 0, 2, stream_), CUDA_SUCCESS); // nothing to do

	// Past the allocation: an illegal address when it runs, as every other write.
	EXPECT_EQ(cu().cuMemFree(a), CUDA_SUCCESS);
}

TEST_F(Sim, MemAllocPitchIsDeviceMemoryWithPaddedRows)
{
	GTEST_FLAG_SET(death_test_style, "threadsafe");
	constexpr size_t width = 320, rows = 360;
	CUdeviceptr plane = 0;
	size_t pitch = 0;
	EXPECT_EQ(cu().cuMemAllocPitch(&plane, &pitch, width, rows, 3), CUDA_ERROR_INVALID_VALUE);
	EXPECT_EQ(cu().cuMemAllocPitch(&plane, &pitch, 0, rows, 16), CUDA_ERROR_INVALID_VALUE);
	EXPECT_EQ(cu().cuMemAllocPitch(&plane, &pitch, width, 0, 16), CUDA_ERROR_INVALID_VALUE);
	EXPECT_EQ(cu().cuMemAllocPitch(&plane, nullptr, width, rows, 16), CUDA_ERROR_INVALID_VALUE);
	EXPECT_EQ(cu().cuMemAllocPitch(&plane, &pitch, size_t(1) << 31, 1, 16), CUDA_ERROR_INVALID_VALUE);
	EXPECT_EQ(cu().cuMemAllocPitch(&plane, &pitch, 8192, 8193, 4), CUDA_ERROR_OUT_OF_MEMORY); // 64 MiB device
	ASSERT_EQ(cu().cuMemAllocPitch(&plane, &pitch, width, rows, 16), CUDA_SUCCESS);
	EXPECT_EQ(pitch, 512u); // rows are padded, as on a GPU
	size_t small_pitch = 0;
	CUdeviceptr small = 0;
	ASSERT_EQ(cu().cuMemAllocPitch(&small, &small_pitch, 512, 1, 4), CUDA_SUCCESS);
	EXPECT_EQ(small_pitch, 512u);
	EXPECT_EQ(cu().cuMemFree(small), CUDA_SUCCESS);

	EXPECT_EXIT(touch(plane), testing::ExitedWithCode(segv_exit), "");
	EXPECT_EXIT(touch(plane + pitch * rows - 1), testing::ExitedWithCode(segv_exit), "");

	// Host -> device -> host through cuMemcpy2D: each call returns with its copy done, so
	// the bytes are there with no synchronization. The way back lands in page-locked
	// memory, which the CPU reads directly.
	std::vector<unsigned char> source(width * rows);
	for (size_t i = 0; i < source.size(); i++)
		source[i] = static_cast<unsigned char>(i * 13 + i / width);
	void *staging = nullptr;
	ASSERT_EQ(cu().cuMemAllocHost(&staging, pitch * rows), CUDA_SUCCESS);
	std::memset(staging, 0xee, pitch * rows);
	CUDA_MEMCPY2D up = plane_copy(CU_MEMORYTYPE_DEVICE, plane, pitch, CU_MEMORYTYPE_HOST,
				      reinterpret_cast<uintptr_t>(source.data()), width, width, rows);
	CUDA_MEMCPY2D down = plane_copy(CU_MEMORYTYPE_HOST, reinterpret_cast<uintptr_t>(staging), pitch,
					CU_MEMORYTYPE_DEVICE, plane, pitch, width, rows);
	ASSERT_EQ(cu().cuMemcpy2D(&up), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuMemcpy2D(&down), CUDA_SUCCESS);
	const auto *back = static_cast<const unsigned char *>(staging);
	for (size_t y = 0; y < rows; y++) {
		ASSERT_EQ(std::memcmp(back + y * pitch, source.data() + y * width, width), 0) << "row " << y;
		ASSERT_TRUE(all_equal(back + y * pitch + width, pitch - width, 0xee)) << "row " << y;
	}

	// Page-locked memory is a host source too.
	std::vector<unsigned char> result(width * rows, 0);
	CUDA_MEMCPY2D again = plane_copy(CU_MEMORYTYPE_DEVICE, plane, pitch, CU_MEMORYTYPE_UNIFIED,
					 reinterpret_cast<uintptr_t>(staging), pitch, width, rows);
	ASSERT_EQ(cu().cuMemcpy2D(&again), CUDA_SUCCESS);
	CUDA_MEMCPY2D read = plane_copy(CU_MEMORYTYPE_HOST, reinterpret_cast<uintptr_t>(result.data()), width,
					CU_MEMORYTYPE_DEVICE, plane, pitch, width, rows);
	ASSERT_EQ(cu().cuMemcpy2D(&read), CUDA_SUCCESS);
	EXPECT_EQ(result, source);

	CUDA_MEMCPY2D bad = up;
	bad.WidthInBytes = pitch + 1;
	bad.srcPitch = pitch + 1;
	EXPECT_EQ(cu().cuMemcpy2D(&bad), CUDA_ERROR_INVALID_VALUE); // wider than the device pitch
	bad = up;
	bad.srcMemoryType = CU_MEMORYTYPE_ARRAY;
	EXPECT_EQ(cu().cuMemcpy2D(&bad), CUDA_ERROR_NOT_SUPPORTED);
	EXPECT_EQ(cu().cuMemcpy2D(nullptr), CUDA_ERROR_INVALID_VALUE);

	// Page-locked memory is not also registered host memory, and freeing it unmaps it.
	EXPECT_EQ(cu().cuMemHostRegister(staging, 4096, 0), CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
	EXPECT_EQ(cu().cuMemFreeHost(static_cast<char *>(staging) + 1), CUDA_ERROR_INVALID_VALUE); // not the base
	EXPECT_EQ(cu().cuMemFreeHost(source.data()), CUDA_ERROR_INVALID_VALUE);
	EXPECT_EQ(cu().cuMemFreeHost(staging), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuMemFreeHost(staging), CUDA_ERROR_INVALID_VALUE);
	EXPECT_EXIT(touch(reinterpret_cast<uintptr_t>(staging)), testing::ExitedWithCode(segv_exit), "");
	void *none = nullptr;
	EXPECT_EQ(cu().cuMemAllocHost(&none, 0), CUDA_ERROR_INVALID_VALUE);
	EXPECT_EQ(cu().cuMemAllocHost(nullptr, 4096), CUDA_ERROR_INVALID_VALUE);

	// A synchronous copy that touches freed memory reports the sticky error at once.
	EXPECT_EQ(cu().cuMemFree(plane), CUDA_SUCCESS);
	expect_illegal("cuMemcpy2D", [&] { EXPECT_EQ(cu().cuMemcpy2D(&read), CUDA_ERROR_ILLEGAL_ADDRESS); });
}

TEST_F(Sim, Memcpy2DRunsAfterWorkOnTheDefaultStream)
{
	HostPage gate;
	CUdeviceptr plane = 0;
	size_t pitch = 0;
	constexpr size_t width = 100, rows = 8;
	ASSERT_EQ(cu().cuMemAllocPitch(&plane, &pitch, width, rows, 4), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuStreamWaitValue64(nullptr, gate.device_word(0), 1, CU_STREAM_WAIT_VALUE_EQ), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuMemsetD8Async(plane, 0x5a, pitch * rows, CU_STREAM_LEGACY), CUDA_SUCCESS);

	std::vector<unsigned char> result(width * rows, 0);
	std::atomic<bool> returned{ false };
	std::thread copier([&] {
		ASSERT_EQ(cu().cuCtxPushCurrent(ctx_), CUDA_SUCCESS);
		CUDA_MEMCPY2D down = plane_copy(CU_MEMORYTYPE_HOST, reinterpret_cast<uintptr_t>(result.data()), width,
						CU_MEMORYTYPE_DEVICE, plane, pitch, width, rows);
		EXPECT_EQ(cu().cuMemcpy2D(&down), CUDA_SUCCESS);
		returned.store(true, std::memory_order_release);
		EXPECT_EQ(cu().cuCtxPopCurrent(nullptr), CUDA_SUCCESS);
	});
	std::this_thread::sleep_for(std::chrono::milliseconds(30));
	EXPECT_FALSE(returned.load(std::memory_order_acquire)); // held behind the wait
	gate.word(0).store(1, std::memory_order_release);
	copier.join();
	EXPECT_TRUE(all_equal(result.data(), result.size(), 0x5a));
	EXPECT_EQ(cu().cuMemFree(plane), CUDA_SUCCESS);
}

TEST_F(Sim, SynchronousCopiesReturnAfterTheirCopyExceptDeviceToDevice)
{
	HostPage gate;
	CUdeviceptr a = 0, b = 0;
	constexpr size_t size = 4096;
	ASSERT_EQ(cu().cuMemAlloc(&a, size), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuMemAlloc(&b, size), CUDA_SUCCESS);

	// On the default stream, after the work queued there.
	std::vector<unsigned char> source(size, 0x11);
	ASSERT_EQ(cu().cuStreamWaitValue64(nullptr, gate.device_word(0), 1, CU_STREAM_WAIT_VALUE_EQ), CUDA_SUCCESS);
	std::atomic<bool> returned{ false };
	std::thread copier([&] {
		ASSERT_EQ(cu().cuCtxPushCurrent(ctx_), CUDA_SUCCESS);
		EXPECT_EQ(cu().cuMemcpyHtoD(a, source.data(), size), CUDA_SUCCESS);
		returned.store(true, std::memory_order_release);
		EXPECT_EQ(cu().cuCtxPopCurrent(nullptr), CUDA_SUCCESS);
	});
	std::this_thread::sleep_for(std::chrono::milliseconds(30));
	EXPECT_FALSE(returned.load(std::memory_order_acquire)); // held behind the wait
	gate.word(0).store(1, std::memory_order_release);
	copier.join();
	std::fill(source.begin(), source.end(), 0x22); // copied already: this does not land

	std::vector<unsigned char> result(size, 0);
	EXPECT_EQ(cu().cuMemcpyDtoH(result.data(), a, size), CUDA_SUCCESS);
	EXPECT_TRUE(all_equal(result.data(), size, 0x11)); // no synchronize needed

	// Device to device: no host-side synchronization, as cuda.h documents.
	ASSERT_EQ(cu().cuStreamWaitValue64(nullptr, gate.device_word(0), 2, CU_STREAM_WAIT_VALUE_EQ), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuMemcpyDtoD(b, a, size), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuMemcpy(b + 1, a, 1), CUDA_SUCCESS); // both sides device: the same
	EXPECT_EQ(cu().cuStreamQuery(nullptr), CUDA_ERROR_NOT_READY);
	gate.word(0).store(2, std::memory_order_release);

	// cuMemcpy looks each side up: host to device, and device to host, are synchronous.
	std::fill(result.begin(), result.end(), 0);
	EXPECT_EQ(cu().cuMemcpy(reinterpret_cast<CUdeviceptr>(result.data()), b, size), CUDA_SUCCESS);
	EXPECT_TRUE(all_equal(result.data(), size, 0x11));
	EXPECT_EQ(cu().cuMemcpy(b, reinterpret_cast<CUdeviceptr>(source.data()), size), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuMemcpyDtoH(result.data(), b, size), CUDA_SUCCESS);
	EXPECT_TRUE(all_equal(result.data(), size, 0x22));
	EXPECT_EQ(cu().cuMemcpy(reinterpret_cast<CUdeviceptr>(result.data()),
				reinterpret_cast<CUdeviceptr>(source.data()), 0),
		  CUDA_SUCCESS);
	EXPECT_EQ(cu().cuMemcpyHtoD(0, source.data(), 1), CUDA_ERROR_INVALID_VALUE);

	// One that touches freed memory reports the sticky error at once: from page-locked
	// memory, since from pageable memory it returns once its source is staged.
	EXPECT_EQ(cu().cuMemFree(a), CUDA_SUCCESS);
	Pinned pinned(1);
	expect_illegal("cuMemcpyHtoD",
		       [&] { EXPECT_EQ(cu().cuMemcpyHtoD(a, pinned.data(), 1), CUDA_ERROR_ILLEGAL_ADDRESS); });
}

TEST_F(Sim, MemcpyAsyncLooksUpEachSideAsItRuns)
{
	CUdeviceptr a = 0, b = 0;
	constexpr size_t size = 4096;
	ASSERT_EQ(cu().cuMemAlloc(&a, size), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuMemAlloc(&b, size), CUDA_SUCCESS);
	Pinned source(size, 0x33), result(size, 0); // pageable memory would make the copies wait
	ASSERT_EQ(cu().cuMemcpyAsync(a, reinterpret_cast<CUdeviceptr>(source.data()), size, stream_), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuMemcpyAsync(b, a, size, stream_), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(result.data()), b, size, stream_), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuStreamQuery(stream_), CUDA_ERROR_NOT_READY);
	ASSERT_EQ(cu().cuStreamSynchronize(stream_), CUDA_SUCCESS);
	EXPECT_TRUE(all_equal(result.data(), size, 0x33));
	EXPECT_EQ(cu().cuMemcpyAsync(0, a, size, stream_), CUDA_ERROR_INVALID_VALUE);
	EXPECT_EQ(cu().cuMemFree(a), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuMemFree(b), CUDA_SUCCESS);
}

// --- host callbacks ----------------------------------------------------------------------

struct CallbackRecord {
	std::atomic<int> calls{ 0 };
	std::atomic<CUstream> stream{ nullptr };
	std::atomic<CUresult> status{ CUDA_ERROR_UNKNOWN };
	uint64_t word_seen = 0; // the gate page's word 1 as the callback saw it
	HostPage *page = nullptr;
};

void CUDA_CB record_callback(CUstream stream, CUresult status, void *user)
{
	auto *record = static_cast<CallbackRecord *>(user);
	if (record->page) {
		// Later work on the stream waits for this: word 1 is not written yet.
		std::this_thread::sleep_for(std::chrono::milliseconds(20));
		record->word_seen = record->page->word(1).load(std::memory_order_acquire);
	}
	record->stream.store(stream);
	record->status.store(status);
	record->calls.fetch_add(1, std::memory_order_release);
}

TEST_F(Sim, StreamCallbacksRunInOrderAndHearOfAFault)
{
	HostPage gate;
	CallbackRecord record;
	record.page = &gate;
	ASSERT_EQ(cu().cuStreamWaitValue64(stream_, gate.device_word(0), 1, CU_STREAM_WAIT_VALUE_EQ), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuStreamAddCallback(stream_, record_callback, &record, 0), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuStreamWriteValue64(stream_, gate.device_word(1), 5, 0), CUDA_SUCCESS);
	std::this_thread::sleep_for(std::chrono::milliseconds(20));
	EXPECT_EQ(record.calls.load(std::memory_order_acquire), 0); // held behind the wait
	gate.word(0).store(1, std::memory_order_release);
	ASSERT_EQ(cu().cuStreamSynchronize(stream_), CUDA_SUCCESS);
	EXPECT_EQ(record.calls.load(std::memory_order_acquire), 1);
	EXPECT_EQ(record.stream.load(), stream_);
	EXPECT_EQ(record.status.load(), CUDA_SUCCESS);
	EXPECT_EQ(record.word_seen, 0u);
	EXPECT_EQ(gate.word(1).load(std::memory_order_acquire), 5u);

	EXPECT_EQ(cu().cuStreamAddCallback(stream_, nullptr, &record, 0), CUDA_ERROR_INVALID_VALUE);
	EXPECT_EQ(cu().cuStreamAddCallback(stream_, record_callback, &record, 1), CUDA_ERROR_INVALID_VALUE);

	// After an illegal access the callback still runs, and is told.
	CallbackRecord faulted;
	CUdeviceptr freed;
	ASSERT_EQ(cu().cuMemAlloc(&freed, 4096), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuMemFree(freed), CUDA_SUCCESS);
	expect_illegal("cuMemsetD8Async", [&] {
		ASSERT_EQ(cu().cuMemsetD8Async(freed, 0, 1, stream_), CUDA_SUCCESS);
		ASSERT_EQ(cu().cuStreamAddCallback(stream_, record_callback, &faulted, 0), CUDA_SUCCESS);
		// The stream's thread calls it after the fault, while a synchronize may already
		// return the sticky error: waited for here, before expect_illegal() resets the
		// context (a slow machine, ThreadSanitizer, took longer than the synchronize).
		for (int i = 0; i < 10000 && faulted.calls.load(std::memory_order_acquire) == 0; i++)
			std::this_thread::sleep_for(std::chrono::milliseconds(1));
	});
	EXPECT_EQ(faulted.calls.load(std::memory_order_acquire), 1);
	EXPECT_EQ(faulted.status.load(), CUDA_ERROR_ILLEGAL_ADDRESS);
}

// --- host registration -----------------------------------------------------------------

TEST_F(Sim, HostRegistrationRules)
{
	constexpr size_t size = 3 * 4096;
	void *mem = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ASSERT_NE(mem, MAP_FAILED);
	char *p = static_cast<char *>(mem);

	ASSERT_EQ(cu().cuMemHostRegister(p + 104, 5000, CU_MEMHOSTREGISTER_DEVICEMAP), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuMemHostRegister(p + 4096, 10, 0), CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
	EXPECT_EQ(cu().cuMemHostRegister(p, 200, 0), CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
	ASSERT_EQ(cu().cuMemHostRegister(p + 5104, 100, 0), CUDA_SUCCESS); // adjacent, not overlapping
	EXPECT_EQ(cu().cuMemHostUnregister(p + 105), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
	EXPECT_EQ(cu().cuMemHostUnregister(p), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);

	CUdeviceptr d = 0, interior = 0, none = 0;
	ASSERT_EQ(cu().cuMemHostGetDevicePointer(&d, p + 104, 0), CUDA_SUCCESS);
	EXPECT_NE(d, reinterpret_cast<CUdeviceptr>(p + 104));
	EXPECT_EQ(d % 8, reinterpret_cast<uintptr_t>(p + 104) % 8);
	ASSERT_EQ(cu().cuMemHostGetDevicePointer(&interior, p + 112, 0), CUDA_SUCCESS);
	EXPECT_EQ(interior, d + 8);
	EXPECT_EQ(cu().cuMemHostGetDevicePointer(&none, p, 0), CUDA_ERROR_INVALID_VALUE);
	EXPECT_EQ(cu().cuMemHostGetDevicePointer(&none, p + 104, 1), CUDA_ERROR_INVALID_VALUE);

	// Device operations reach registered memory through its device address; copies take
	// host pointers, registered or pageable.
	VmmBuffer buffer = make_vmm(granularity);
	std::memset(p + 104, 'h', 64);
	ASSERT_EQ(cu().cuMemcpyDtoDAsync(buffer.va, d, 64, stream_), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuMemcpyDtoHAsync(p + 5104, buffer.va, 64, stream_), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuStreamSynchronize(stream_), CUDA_SUCCESS);
	EXPECT_TRUE(all_equal(p + 5104, 64, 'h'));

	void *hole = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	munmap(hole, 4096);
	EXPECT_EQ(cu().cuMemHostRegister(hole, 4096, 0), CUDA_ERROR_INVALID_VALUE);
	EXPECT_EQ(cu().cuMemHostRegister(reinterpret_cast<void *>(buffer.va), 4096, 0), CUDA_ERROR_INVALID_VALUE);
	EXPECT_EQ(cu().cuMemHostRegister(p + 8192, 8, CU_MEMHOSTREGISTER_IOMEMORY), CUDA_ERROR_NOT_SUPPORTED);
	EXPECT_EQ(cu().cuMemHostRegister(p + 8192, 8, 0x100), CUDA_ERROR_INVALID_VALUE);
	EXPECT_EQ(cu().cuMemHostRegister(nullptr, 8, 0), CUDA_ERROR_INVALID_VALUE);

	EXPECT_EQ(cu().cuMemHostUnregister(p + 104), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuMemHostUnregister(p + 5104), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuMemHostUnregister(p + 104), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
	free_vmm(buffer);
	munmap(mem, size);
}

// --- export and import -----------------------------------------------------------------

TEST_F(Sim, AnExportedFdImportsAsTheSameMemory)
{
	VmmBuffer a = make_vmm(2 * granularity);
	int fd = -1;
	ASSERT_EQ(cu().cuMemExportToShareableHandle(&fd, a.handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
		  CUDA_SUCCESS);
	ASSERT_GE(fd, 0);
	EXPECT_TRUE(fcntl(fd, F_GETFD) & FD_CLOEXEC);

	CUmemGenericAllocationHandle imported = 0;
	ASSERT_EQ(cu().cuMemImportFromShareableHandle(&imported, reinterpret_cast<void *>(uintptr_t(fd)),
						      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
		  CUDA_SUCCESS);
	EXPECT_NE(imported, a.handle);
	EXPECT_GE(fcntl(fd, F_GETFD), 0); // the caller still owns its fd
	close(fd); // and the import holds its own reference

	CUdeviceptr b = map_fresh(imported, a.size);
	const char hello[] = "hello through two mappings";
	char result[sizeof(hello)] = {};
	ASSERT_EQ(cu().cuMemcpyHtoDAsync(a.va + granularity + 100, hello, sizeof(hello), stream_), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuMemcpyDtoHAsync(result, b + granularity + 100, sizeof(result), stream_), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuStreamSynchronize(stream_), CUDA_SUCCESS);
	EXPECT_STREQ(result, hello);

	EXPECT_EQ(cu().cuMemExportToShareableHandle(&fd, a.handle, CU_MEM_HANDLE_TYPE_FABRIC, 0),
		  CUDA_ERROR_NOT_SUPPORTED);
	EXPECT_EQ(cu().cuMemExportToShareableHandle(&fd, a.handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 1),
		  CUDA_ERROR_INVALID_VALUE);
	EXPECT_EQ(cu().cuMemExportToShareableHandle(&fd, a.handle + 999, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
		  CUDA_ERROR_INVALID_VALUE);

	// An allocation created without the handle type cannot be exported.
	CUmemAllocationProp local = device_prop(0, false);
	CUmemGenericAllocationHandle h;
	ASSERT_EQ(cu().cuMemCreate(&h, granularity, &local, 0), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
		  CUDA_ERROR_INVALID_VALUE);
	EXPECT_EQ(cu().cuMemRelease(h), CUDA_SUCCESS);

	unmap_fresh(b, a.size);
	EXPECT_EQ(cu().cuMemRelease(imported), CUDA_SUCCESS);
	free_vmm(a);
}

TEST_F(Sim, ImportAcceptsOnlyExportedAllocations)
{
	auto import = [](int fd) {
		CUmemGenericAllocationHandle h = 0;
		CUresult r = cu().cuMemImportFromShareableHandle(&h, reinterpret_cast<void *>(uintptr_t(fd)),
								 CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
		if (r == CUDA_SUCCESS)
			cu().cuMemRelease(h);
		return r;
	};

	int pipefd[2];
	ASSERT_EQ(pipe2(pipefd, O_CLOEXEC), 0);
	EXPECT_EQ(import(pipefd[0]), CUDA_ERROR_INVALID_VALUE);
	close(pipefd[0]);
	close(pipefd[1]);

	int file = open("/tmp", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
	if (file >= 0) {
		EXPECT_EQ(ftruncate(file, off_t(granularity)), 0);
		EXPECT_EQ(import(file), CUDA_ERROR_INVALID_VALUE);
		close(file);
	}

	int plain = memfd_create("plain", MFD_CLOEXEC);
	ASSERT_GE(plain, 0);
	EXPECT_EQ(ftruncate(plain, off_t(granularity)), 0);
	EXPECT_EQ(import(plain), CUDA_ERROR_INVALID_VALUE);
	close(plain);

	// The right name with the wrong size.
	int impostor = memfd_create("cudasim:dev0:2097152", MFD_CLOEXEC);
	ASSERT_GE(impostor, 0);
	EXPECT_EQ(import(impostor), CUDA_ERROR_INVALID_VALUE);
	close(impostor);

	EXPECT_EQ(import(-1), CUDA_ERROR_INVALID_VALUE);
	EXPECT_EQ(import(impostor), CUDA_ERROR_INVALID_VALUE); // closed

	CUmemGenericAllocationHandle h;
	EXPECT_EQ(cu().cuMemImportFromShareableHandle(&h, reinterpret_cast<void *>(uintptr_t(0)),
						      CU_MEM_HANDLE_TYPE_WIN32),
		  CUDA_ERROR_NOT_SUPPORTED);
}

TEST_F(Sim, AnExportedFdWorksInAnotherProcess)
{
	VmmBuffer buffer = make_vmm(granularity);
	std::vector<unsigned char> first(4096);
	Pinned second(4096, 0); // the copy into it waits behind the child's word
	for (size_t i = 0; i < first.size(); i++)
		first[i] = static_cast<unsigned char>(i * 7);
	ASSERT_EQ(cu().cuMemcpyHtoDAsync(buffer.va, first.data(), first.size(), stream_), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuMemsetD8Async(buffer.va + 4096, 0, 4096 + 8, stream_), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuStreamSynchronize(stream_), CUDA_SUCCESS);

	// The child writes its bytes, then the word this stream waits for.
	ASSERT_EQ(cu().cuStreamWaitValue64(stream_, buffer.va + 8192, 42, CU_STREAM_WAIT_VALUE_EQ), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuMemcpyDtoHAsync(second.data(), buffer.va + 4096, second.size(), stream_), CUDA_SUCCESS);

	int fd = -1;
	ASSERT_EQ(cu().cuMemExportToShareableHandle(&fd, buffer.handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
		  CUDA_SUCCESS);
	int sv[2];
	ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
	std::thread sender([&] {
		EXPECT_TRUE(send_fd(sv[0], fd));
		close(fd);
	});
	ChildResult child = run_child("ImportOverSocket", { "CUDASIM_SELFTEST_SOCKET=3" }, sv[1]);
	sender.join();
	close(sv[0]);
	close(sv[1]);

	if (!exited_cleanly(child)) {
		ADD_FAILURE() << "child:\n" << child.output;
		// Unblock the stream so the test can end.
		CUstream other;
		ASSERT_EQ(cu().cuStreamCreate(&other, 0), CUDA_SUCCESS);
		ASSERT_EQ(cu().cuStreamWriteValue64(other, buffer.va + 8192, 42, 0), CUDA_SUCCESS);
		ASSERT_EQ(cu().cuStreamDestroy(other), CUDA_SUCCESS);
	}
	ASSERT_EQ(cu().cuStreamSynchronize(stream_), CUDA_SUCCESS);
	for (size_t i = 0; i < second.size(); i++)
		ASSERT_EQ(second.data()[i], static_cast<unsigned char>(i * 13)) << i;
	free_vmm(buffer);
}

TEST(DISABLED_Child, ImportOverSocket)
{
	const char *sock = std::getenv("CUDASIM_SELFTEST_SOCKET");
	ASSERT_NE(sock, nullptr);
	CUcontext ctx;
	CUstream stream;
	ASSERT_EQ(cu().cuInit(0), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuCtxPushCurrent(ctx), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuStreamCreate(&stream, 0), CUDA_SUCCESS);

	int fd = receive_fd(std::atoi(sock));
	ASSERT_GE(fd, 0);
	CUmemGenericAllocationHandle handle;
	ASSERT_EQ(cu().cuMemImportFromShareableHandle(&handle, reinterpret_cast<void *>(uintptr_t(fd)),
						      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
		  CUDA_SUCCESS);
	close(fd);
	CUdeviceptr va = map_fresh(handle, granularity);

	std::vector<unsigned char> first(4096, 0), second(4096);
	ASSERT_EQ(cu().cuMemcpyDtoHAsync(first.data(), va, first.size(), stream), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuStreamSynchronize(stream), CUDA_SUCCESS);
	for (size_t i = 0; i < first.size(); i++)
		ASSERT_EQ(first[i], static_cast<unsigned char>(i * 7)) << i;

	for (size_t i = 0; i < second.size(); i++)
		second[i] = static_cast<unsigned char>(i * 13);
	ASSERT_EQ(cu().cuMemcpyHtoDAsync(va + 4096, second.data(), second.size(), stream), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuStreamWriteValue64(stream, va + 8192, 42, CU_STREAM_WRITE_VALUE_DEFAULT), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuStreamSynchronize(stream), CUDA_SUCCESS);

	unmap_fresh(va, granularity);
	EXPECT_EQ(cu().cuMemRelease(handle), CUDA_SUCCESS);
}

// --- illegal accesses ------------------------------------------------------------------

TEST_F(Sim, IllegalAccessHostPointerInAStreamMemoryOperation)
{
	HostPage page;
	expect_illegal("cuStreamWriteValue64", [&] {
		// The host pointer of registered memory, not its device address.
		ASSERT_EQ(cu().cuStreamWriteValue64(stream_, reinterpret_cast<CUdeviceptr>(page.data()), 1, 0),
			  CUDA_SUCCESS);
	});
	expect_illegal("cuStreamWaitValue64", [&] {
		uint64_t unregistered = 1;
		ASSERT_EQ(cu().cuStreamWaitValue64(stream_, reinterpret_cast<CUdeviceptr>(&unregistered), 1, 0),
			  CUDA_SUCCESS);
	});
}

TEST_F(Sim, IllegalAccessMappedWithoutAccess)
{
	VmmBuffer buffer = make_vmm(granularity, false);
	char byte = 1;
	expect_illegal("cuMemcpyHtoDAsync",
		       [&] { ASSERT_EQ(cu().cuMemcpyHtoDAsync(buffer.va, &byte, 1, stream_), CUDA_SUCCESS); });

	// Read-only access: reads work, writes fault.
	CUmemAccessDesc read_only = access_for(0, CU_MEM_ACCESS_FLAGS_PROT_READ);
	ASSERT_EQ(cu().cuMemSetAccess(buffer.va, buffer.size, &read_only, 1), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuMemcpyDtoHAsync(&byte, buffer.va, 1, stream_), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuStreamSynchronize(stream_), CUDA_SUCCESS);
	expect_illegal("cuMemsetD8Async",
		       [&] { ASSERT_EQ(cu().cuMemsetD8Async(buffer.va, 0, 1, stream_), CUDA_SUCCESS); });

	// No device reaches another's memory: access for device 1 is refused, and
	// taking device 0's away leaves no one.
	CUmemAccessDesc other = access_for(1);
	CUmemAccessDesc none = access_for(0, CU_MEM_ACCESS_FLAGS_PROT_NONE);
	EXPECT_EQ(cu().cuMemSetAccess(buffer.va, buffer.size, &other, 1), CUDA_ERROR_INVALID_DEVICE);
	ASSERT_EQ(cu().cuMemSetAccess(buffer.va, buffer.size, &none, 1), CUDA_SUCCESS);
	Pinned pinned(1);
	expect_illegal("cuMemcpyDtoHAsync",
		       [&] { ASSERT_EQ(cu().cuMemcpyDtoHAsync(pinned.data(), buffer.va, 1, stream_), CUDA_SUCCESS); });
	// Into pageable memory the call returns once the copy has executed, so it reports
	// the fault itself.
	expect_illegal("cuMemcpyDtoHAsync", [&] {
		EXPECT_EQ(cu().cuMemcpyDtoHAsync(&byte, buffer.va, 1, stream_), CUDA_ERROR_ILLEGAL_ADDRESS);
	});
	free_vmm(buffer);
}

TEST_F(Sim, IllegalAccessPastTheEndOfAMapping)
{
	CUmemAllocationProp prop = device_prop();
	CUmemGenericAllocationHandle handle;
	CUdeviceptr va;
	ASSERT_EQ(cu().cuMemCreate(&handle, granularity, &prop, 0), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuMemAddressReserve(&va, 2 * granularity, 0, 0, 0), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuMemMap(va, granularity, 0, handle, 0), CUDA_SUCCESS);
	CUmemAccessDesc rw = access_for(0);
	ASSERT_EQ(cu().cuMemSetAccess(va, granularity, &rw, 1), CUDA_SUCCESS);
	char bytes[16] = {};
	expect_illegal("cuMemcpyHtoDAsync", [&] {
		ASSERT_EQ(cu().cuMemcpyHtoDAsync(va + granularity - 8, bytes, sizeof(bytes), stream_), CUDA_SUCCESS);
	});

	CUdeviceptr small;
	ASSERT_EQ(cu().cuMemAlloc(&small, 100), CUDA_SUCCESS);
	expect_illegal("cuMemsetD8Async",
		       [&] { ASSERT_EQ(cu().cuMemsetD8Async(small, 0, 101, stream_), CUDA_SUCCESS); });

	EXPECT_EQ(cu().cuMemUnmap(va, granularity), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuMemAddressFree(va, 2 * granularity), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuMemRelease(handle), CUDA_SUCCESS);
}

TEST_F(Sim, IllegalAccessWorkQueuedBeforeAnUnmapOrFree)
{
	HostPage gate;
	VmmBuffer buffer = make_vmm(granularity);
	Pinned byte(1, 1); // from pageable memory the copy would wait for the gate
	expect_illegal("cuMemcpyHtoDAsync", [&] {
		// Valid when enqueued; the unmap comes before it executes.
		ASSERT_EQ(cu().cuStreamWaitValue64(stream_, gate.device_word(0), 1, 0), CUDA_SUCCESS);
		ASSERT_EQ(cu().cuMemcpyHtoDAsync(buffer.va, byte.data(), 1, stream_), CUDA_SUCCESS);
		ASSERT_EQ(cu().cuMemUnmap(buffer.va, buffer.size), CUDA_SUCCESS);
		gate.word(0).store(1, std::memory_order_release);
	});
	EXPECT_EQ(cu().cuMemAddressFree(buffer.va, buffer.size), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuMemRelease(buffer.handle), CUDA_SUCCESS);

	HostPage gate2; // the reset dropped the first page's registration
	CUdeviceptr plain;
	ASSERT_EQ(cu().cuMemAlloc(&plain, 4096), CUDA_SUCCESS);
	expect_illegal("cuMemsetD32Async", [&] {
		ASSERT_EQ(cu().cuStreamWaitValue64(stream_, gate2.device_word(0), 1, 0), CUDA_SUCCESS);
		ASSERT_EQ(cu().cuMemsetD32Async(plain, 0, 4, stream_), CUDA_SUCCESS);
		ASSERT_EQ(cu().cuMemFree(plain), CUDA_SUCCESS); // no implicit synchronization
		gate2.word(0).store(1, std::memory_order_release);
	});
}

TEST_F(Sim, IllegalAccessDeviceAddressAsAHostPointer)
{
	VmmBuffer a = make_vmm(granularity);
	VmmBuffer b = make_vmm(granularity);
	// Not page-locked memory, so the call stages the source itself and reports the fault.
	expect_illegal("cuMemcpyHtoDAsync", [&] {
		EXPECT_EQ(cu().cuMemcpyHtoDAsync(a.va, reinterpret_cast<const void *>(b.va), 64, stream_),
			  CUDA_ERROR_ILLEGAL_ADDRESS);
	});
	free_vmm(a);
	free_vmm(b);
}

// --- what GStreamer's CUDA elements need ------------------------------------------------

TEST(GStreamer, EveryEntryPointGstCudaLoadsIsExported)
{
	// libgstcuda-1.0 (1.22, and 1.26 with the last group) refuses a driver that lacks
	// any of these.
	const char *gst_cuda[] = {
		"cuCtxCreate_v2",
		"cuCtxDestroy_v2",
		"cuCtxDisablePeerAccess",
		"cuCtxEnablePeerAccess",
		"cuCtxPopCurrent_v2",
		"cuCtxPushCurrent_v2",
		"cuDeviceCanAccessPeer",
		"cuDeviceGet",
		"cuDeviceGetAttribute",
		"cuDeviceGetCount",
		"cuDeviceGetName",
		"cuDriverGetVersion",
		"cuGLGetDevices_v2",
		"cuGetErrorName",
		"cuGetErrorString",
		"cuGraphicsGLRegisterBuffer",
		"cuGraphicsGLRegisterImage",
		"cuGraphicsMapResources",
		"cuGraphicsResourceGetMappedPointer_v2",
		"cuGraphicsResourceSetMapFlags_v2",
		"cuGraphicsSubResourceGetMappedArray",
		"cuGraphicsUnmapResources",
		"cuGraphicsUnregisterResource",
		"cuInit",
		"cuLaunchKernel",
		"cuMemAllocHost_v2",
		"cuMemAllocPitch_v2",
		"cuMemAlloc_v2",
		"cuMemFreeHost",
		"cuMemFree_v2",
		"cuMemcpy2DAsync_v2",
		"cuMemcpy2D_v2",
		"cuModuleGetFunction",
		"cuModuleLoadData",
		"cuModuleUnload",
		"cuStreamCreate",
		"cuStreamDestroy",
		"cuStreamSynchronize",
		"cuTexObjectCreate",
		"cuTexObjectDestroy",
		// 1.26 adds these.
		"cuCtxGetLimit",
		"cuCtxSynchronize",
		"cuMemsetD2D8_v2",
		"cuMemsetD2D16_v2",
		"cuMemsetD2D32_v2",
		"cuMemsetD2D8Async",
		"cuMemsetD2D16Async",
		"cuMemsetD2D32Async",
		"cuEventCreate",
		"cuEventDestroy_v2",
		"cuEventRecord",
		"cuEventSynchronize",
		"cuIpcGetEventHandle",
		"cuIpcOpenEventHandle",
		"cuIpcGetMemHandle",
		"cuIpcOpenMemHandle", // the first ABI's name, not _v2
		"cuIpcCloseMemHandle",
	};
	void *driver = dlopen(driver_path().c_str(), RTLD_NOW | RTLD_LOCAL);
	ASSERT_NE(driver, nullptr) << dlerror();
	for (const char *name : gst_cuda)
		EXPECT_NE(dlsym(driver, name), nullptr) << name;
	// The unversioned cuStreamDestroy is the same call as cuStreamDestroy_v2.
	ASSERT_EQ(cu().cuInit(0), CUDA_SUCCESS);
	using Destroy = CUresult (*)(CUstream);
	auto destroy_v1 = reinterpret_cast<Destroy>(dlsym(driver, "cuStreamDestroy"));
	ASSERT_NE(destroy_v1, nullptr);
	on_fresh_thread([&] {
		CUcontext ctx;
		CUstream stream;
		ASSERT_EQ(cu().cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS);
		ASSERT_EQ(cu().cuCtxPushCurrent(ctx), CUDA_SUCCESS);
		ASSERT_EQ(cu().cuStreamCreate(&stream, 0), CUDA_SUCCESS);
		EXPECT_EQ(destroy_v1(stream), CUDA_SUCCESS);
		// Gone: cuStreamDestroy_v2 would stop the process on it (a dangling handle).
		EXPECT_DEATH(cu().cuStreamDestroy(stream), "the stream was destroyed");
		EXPECT_EQ(cu().cuCtxPopCurrent(nullptr), CUDA_SUCCESS);
		EXPECT_EQ(cu().cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
	});
	dlclose(driver);
}

TEST(GStreamer, TheNvdecStubLoadsAndDecodesNothing)
{
	// nvcodec registers cudaupload and cudadownload only when NVDEC (or NVENC) loads.
	std::string path = driver_path();
	path = path.substr(0, path.rfind('/')) + "/libnvcuvid.so.1";
	void *nvcuvid = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
	ASSERT_NE(nvcuvid, nullptr) << dlerror();
	for (const char *name :
	     { "cuvidCtxLockCreate", "cuvidCtxLockDestroy", "cuvidCtxLock", "cuvidCtxUnlock", "cuvidCreateDecoder",
	       "cuvidDestroyDecoder", "cuvidDecodePicture", "cuvidCreateVideoParser", "cuvidParseVideoData",
	       "cuvidDestroyVideoParser", "cuvidMapVideoFrame64", "cuvidUnmapVideoFrame64", "cuvidGetDecoderCaps" })
		EXPECT_NE(dlsym(nvcuvid, name), nullptr) << name;

	using Caps = CUresult (*)(void *);
	using Create = CUresult (*)(void *, void *);
	auto caps = reinterpret_cast<Caps>(dlsym(nvcuvid, "cuvidGetDecoderCaps"));
	auto create = reinterpret_cast<Create>(dlsym(nvcuvid, "cuvidCreateDecoder"));
	ASSERT_TRUE(caps && create);
	char scratch[256] = {};
	testing::internal::CaptureStderr();
	EXPECT_EQ(caps(scratch), CUDA_ERROR_NOT_SUPPORTED); // quietly: no codec here
	EXPECT_EQ(create(scratch, scratch), CUDA_ERROR_NOT_SUPPORTED);
	std::string err = testing::internal::GetCapturedStderr();
	EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
	EXPECT_NE(err.find("cudasim: cuvidCreateDecoder -> CUDA_ERROR_NOT_SUPPORTED"), std::string::npos) << err;
	dlclose(nvcuvid);
}

// --- what FFmpeg's loader needs ---------------------------------------------------------

TEST(Ffmpeg, EveryEntryPointFfnvcodecLoadsIsExported)
{
	// ffnvcodec's cuda_load_functions and cuvid_load_functions (Debian 12's
	// libffmpeg-nvenc-dev, and Debian 13's with the last group) refuse a library that
	// lacks any of these.
	const char *ffnvcodec_cuda[] = {
		"cuInit",
		"cuDeviceGetCount",
		"cuDeviceGet",
		"cuDeviceGetAttribute",
		"cuDeviceGetName",
		"cuDeviceComputeCapability",
		"cuCtxCreate_v2",
		"cuCtxSetLimit",
		"cuCtxPushCurrent_v2",
		"cuCtxPopCurrent_v2",
		"cuCtxDestroy_v2",
		"cuMemAlloc_v2",
		"cuMemAllocPitch_v2",
		"cuMemAllocManaged",
		"cuMemsetD8Async",
		"cuMemFree_v2",
		"cuMemcpy",
		"cuMemcpyAsync",
		"cuMemcpy2D_v2",
		"cuMemcpy2DAsync_v2",
		"cuMemcpyHtoD_v2",
		"cuMemcpyHtoDAsync_v2",
		"cuMemcpyDtoH_v2",
		"cuMemcpyDtoHAsync_v2",
		"cuMemcpyDtoD_v2",
		"cuMemcpyDtoDAsync_v2",
		"cuGetErrorName",
		"cuGetErrorString",
		"cuCtxGetDevice",
		"cuDevicePrimaryCtxRetain",
		"cuDevicePrimaryCtxRelease",
		"cuDevicePrimaryCtxSetFlags",
		"cuDevicePrimaryCtxGetState",
		"cuDevicePrimaryCtxReset",
		"cuStreamCreate",
		"cuStreamQuery",
		"cuStreamSynchronize",
		"cuStreamDestroy_v2",
		"cuStreamAddCallback",
		"cuEventCreate",
		"cuEventDestroy_v2",
		"cuEventSynchronize",
		"cuEventQuery",
		"cuEventRecord",
		"cuLaunchKernel",
		"cuLinkCreate",
		"cuLinkAddData",
		"cuLinkComplete",
		"cuLinkDestroy",
		"cuModuleLoadData",
		"cuModuleUnload",
		"cuModuleGetFunction",
		"cuModuleGetGlobal",
		"cuTexObjectCreate",
		"cuTexObjectDestroy",
		"cuGLGetDevices_v2",
		"cuGraphicsGLRegisterImage",
		"cuGraphicsUnregisterResource",
		"cuGraphicsMapResources",
		"cuGraphicsUnmapResources",
		"cuGraphicsSubResourceGetMappedArray",
		"cuGraphicsResourceGetMappedPointer_v2",
		"cuArray3DCreate_v2",
		"cuArrayDestroy",
		// Debian 13's (ffnvcodec 13) adds these.
		"cuArrayCreate_v2",
		"cuCtxGetCurrent",
		"cuDriverGetVersion",
		"cuStreamWaitEvent",
	};
	const char *ffnvcodec_cuvid[] = {
		"cuvidCreateDecoder",
		"cuvidDestroyDecoder",
		"cuvidDecodePicture",
		"cuvidGetDecodeStatus",
		"cuvidReconfigureDecoder",
		"cuvidMapVideoFrame64",
		"cuvidUnmapVideoFrame64",
		"cuvidCtxLockCreate",
		"cuvidCtxLockDestroy",
		"cuvidCtxLock",
		"cuvidCtxUnlock",
		"cuvidCreateVideoSource",
		"cuvidCreateVideoSourceW",
		"cuvidDestroyVideoSource",
		"cuvidSetVideoSourceState",
		"cuvidGetVideoSourceState",
		"cuvidGetSourceVideoFormat",
		"cuvidGetSourceAudioFormat",
		"cuvidCreateVideoParser",
		"cuvidParseVideoData",
		"cuvidDestroyVideoParser",
		"cuvidGetDecoderCaps", // optional there, but what a decoder asks first
	};
	std::string path = driver_path();
	void *driver = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
	ASSERT_NE(driver, nullptr) << dlerror();
	for (const char *name : ffnvcodec_cuda)
		EXPECT_NE(dlsym(driver, name), nullptr) << name;
	void *nvcuvid = dlopen((path.substr(0, path.rfind('/')) + "/libnvcuvid.so.1").c_str(), RTLD_NOW | RTLD_LOCAL);
	ASSERT_NE(nvcuvid, nullptr) << dlerror();
	for (const char *name : ffnvcodec_cuvid)
		EXPECT_NE(dlsym(nvcuvid, name), nullptr) << name;

	// Linking, globals, arrays and managed memory fail, each with a line on stderr.
	ASSERT_EQ(cu().cuInit(0), CUDA_SUCCESS);
	using LinkCreate = CUresult (*)(unsigned, CUjit_option *, void **, CUlinkState *);
	using GetGlobal = CUresult (*)(unsigned *, unsigned *, CUmodule, const char *);
	auto link_create = reinterpret_cast<LinkCreate>(dlsym(driver, "cuLinkCreate"));
	auto get_global = reinterpret_cast<GetGlobal>(dlsym(driver, "cuModuleGetGlobal"));
	ASSERT_TRUE(link_create && get_global);
	CUlinkState link = nullptr;
	unsigned global = 0, bytes = 0;
	CUarray array = nullptr;
	CUDA_ARRAY3D_DESCRIPTOR array_desc = {};
	CUdeviceptr managed = 0;
	testing::internal::CaptureStderr();
	EXPECT_EQ(link_create(0, nullptr, nullptr, &link), CUDA_ERROR_NOT_SUPPORTED);
	EXPECT_EQ(get_global(&global, &bytes, nullptr, "x"), CUDA_ERROR_INVALID_HANDLE);
	EXPECT_EQ(cu().cuArray3DCreate(&array, &array_desc), CUDA_ERROR_NOT_SUPPORTED);
	EXPECT_EQ(cu().cuMemAllocManaged(&managed, 4096, CU_MEM_ATTACH_GLOBAL), CUDA_ERROR_NOT_SUPPORTED);
	std::string err = testing::internal::GetCapturedStderr();
	EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 4) << err;
	EXPECT_NE(err.find("cudasim: cuMemAllocManaged -> CUDA_ERROR_NOT_SUPPORTED: not simulated: the simulator "
			   "has no unified memory"),
		  std::string::npos)
		<< err;

	// The stub's further calls fail too, each saying so.
	using Status = CUresult (*)(void *, int, void *);
	using SourceState = int (*)(void *);
	auto decode_status = reinterpret_cast<Status>(dlsym(nvcuvid, "cuvidGetDecodeStatus"));
	auto source_state = reinterpret_cast<SourceState>(dlsym(nvcuvid, "cuvidGetVideoSourceState"));
	ASSERT_TRUE(decode_status && source_state);
	char scratch[256] = {};
	testing::internal::CaptureStderr();
	EXPECT_EQ(decode_status(scratch, 0, scratch), CUDA_ERROR_NOT_SUPPORTED);
	EXPECT_EQ(source_state(scratch), -1); // cudaVideoState_Error
	err = testing::internal::GetCapturedStderr();
	EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 2) << err;
	EXPECT_NE(err.find("cudasim: cuvidGetDecodeStatus -> CUDA_ERROR_NOT_SUPPORTED"), std::string::npos) << err;
	dlclose(nvcuvid);
	dlclose(driver);
}

TEST_F(Sim, KernelsTexturesAndGraphicsAreNotSimulated)
{
	CUmodule module = nullptr;
	CUtexObject texture = 0;
	CUDA_RESOURCE_DESC resource = {};
	CUDA_TEXTURE_DESC texture_desc = {};
	CUgraphicsResource graphics = nullptr;
	testing::internal::CaptureStderr();
	EXPECT_EQ(cu().cuModuleLoadData(&module, "not a cubin"), CUDA_ERROR_NOT_SUPPORTED);
	EXPECT_EQ(cu().cuLaunchKernel(nullptr, 1, 1, 1, 1, 1, 1, 0, stream_, nullptr, nullptr),
		  CUDA_ERROR_INVALID_HANDLE);
	EXPECT_EQ(cu().cuTexObjectCreate(&texture, &resource, &texture_desc, nullptr), CUDA_ERROR_NOT_SUPPORTED);
	EXPECT_EQ(cu().cuGraphicsMapResources(1, &graphics, stream_), CUDA_ERROR_INVALID_HANDLE);
	// Interprocess events (legacy IPC of memory is simulated: test_cudasim_ipc.cpp).
	CUipcEventHandle ipc = {};
	CUevent event = nullptr;
	EXPECT_EQ(cu().cuEventCreate(&event, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuIpcGetEventHandle(&ipc, event), CUDA_ERROR_NOT_SUPPORTED);
	EXPECT_EQ(cu().cuIpcOpenEventHandle(&event, ipc), CUDA_ERROR_NOT_SUPPORTED);
	EXPECT_EQ(cu().cuEventDestroy(event), CUDA_SUCCESS);
	std::string err = testing::internal::GetCapturedStderr();
	EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 6) << err;
	EXPECT_NE(err.find("cudasim: cuIpcGetEventHandle -> CUDA_ERROR_NOT_SUPPORTED: not simulated: the simulator "
			   "has no interprocess events"),
		  std::string::npos)
		<< err;
	EXPECT_NE(err.find("cudasim: cuModuleLoadData -> CUDA_ERROR_NOT_SUPPORTED: not simulated: the simulator "
			   "runs no kernels"),
		  std::string::npos)
		<< err;
	EXPECT_NE(err.find("cudasim: cuGraphicsMapResources -> CUDA_ERROR_INVALID_HANDLE: not simulated: the "
			   "simulator has no graphics interop"),
		  std::string::npos)
		<< err;
	// Nothing sticks: the context still works.
	EXPECT_EQ(cu().cuStreamSynchronize(stream_), CUDA_SUCCESS);
}

// --- CUDA_VISIBLE_DEVICES and UUIDs ------------------------------------------------------

std::string uuid_text(const CUuuid &uuid)
{
	static constexpr char hex[] = "0123456789abcdef";
	std::string s = "GPU-";
	for (int i = 0; i < 16; i++) {
		if (i == 4 || i == 6 || i == 8 || i == 10)
			s += '-';
		auto byte = static_cast<unsigned char>(uuid.bytes[i]);
		s += hex[byte >> 4];
		s += hex[byte & 0xf];
	}
	return s;
}

std::string uuid_of(CUdevice dev)
{
	CUuuid uuid{};
	EXPECT_EQ(cu().cuDeviceGetUuid(&uuid, dev), CUDA_SUCCESS);
	return uuid_text(uuid);
}

TEST_F(Sim, EachDeviceHasItsOwnUuid)
{
	EXPECT_NE(uuid_of(0), uuid_of(1));
	EXPECT_EQ(uuid_of(0).size(), 40u) << uuid_of(0);
	CUuuid uuid;
	EXPECT_EQ(cu().cuDeviceGetUuid(&uuid, 2), CUDA_ERROR_INVALID_DEVICE);
	EXPECT_EQ(cu().cuDeviceGetUuid(nullptr, 0), CUDA_ERROR_INVALID_VALUE);
	// The first version, which the real driver still exports, says the same.
	void *module = dlopen(driver_path().c_str(), RTLD_NOW | RTLD_NOLOAD);
	ASSERT_NE(module, nullptr);
	auto v1 = reinterpret_cast<CUresult(CUDAAPI *)(CUuuid *, CUdevice)>(dlsym(module, "cuDeviceGetUuid"));
	ASSERT_NE(v1, nullptr);
	ASSERT_EQ(v1(&uuid, 1), CUDA_SUCCESS);
	EXPECT_EQ(uuid_text(uuid), uuid_of(1));
	dlclose(module);
}

// CUDA_VISIBLE_DEVICES as the real driver reads it: indices or UUIDs, in the order
// given; the list ends at an entry naming no device or one already listed. A child
// with the given list must see the machine's devices in CUDASIM_SELFTEST_SEES order.
TEST(Visibility, CudaVisibleDevicesPicksAndOrdersTheDevices)
{
	// This process sees both devices of the machine, in order: its UUIDs are the machine's.
	ASSERT_EQ(cu().cuInit(0), CUDA_SUCCESS);
	std::string uuids = uuid_of(0) + "," + uuid_of(1);
	struct Case {
		std::string visible;
		std::string sees;
	} cases[] = {
		{ "1", "1" },
		{ "1,0", "1,0" },
		{ uuid_of(1) + ",0", "1,0" },
		{ uuid_of(1).substr(0, 20), "" }, // a prefix both UUIDs share names no one device
		{ "0,7,1", "0" },
		{ "1,1,0", "1" },
		{ "", "" },
		{ "x", "" },
	};
	for (const Case &c : cases) {
		ChildResult child =
			run_child("Visible", { "CUDA_VISIBLE_DEVICES=" + c.visible, "CUDASIM_SELFTEST_SEES=" + c.sees,
					       "CUDASIM_SELFTEST_UUIDS=" + uuids });
		EXPECT_TRUE(exited_cleanly(child)) << "CUDA_VISIBLE_DEVICES=" << c.visible << ":\n" << child.output;
	}
	// Without XMEM_CUDASIM_DEVICES the machine is the default one, and a
	// CUDA_VISIBLE_DEVICES meant for real GPUs does not hide it.
	ChildResult child = run_child("Visible", { "XMEM_CUDASIM_DEVICES=", "CUDA_VISIBLE_DEVICES=1",
						   "CUDASIM_SELFTEST_SEES=0", "CUDASIM_SELFTEST_UUIDS=" + uuids });
	EXPECT_TRUE(exited_cleanly(child)) << child.output;
}

TEST(DISABLED_Child, Visible)
{
	std::vector<std::string> sees, uuids;
	for (auto [var, out] : { std::pair{ "CUDASIM_SELFTEST_SEES", &sees }, { "CUDASIM_SELFTEST_UUIDS", &uuids } }) {
		std::string list = std::getenv(var);
		for (size_t start = 0; start < list.size();) {
			size_t comma = std::min(list.find(',', start), list.size());
			out->push_back(list.substr(start, comma - start));
			start = comma + 1;
		}
	}
	if (sees.empty()) {
		EXPECT_EQ(cu().cuInit(0), CUDA_ERROR_NO_DEVICE);
		return;
	}
	ASSERT_EQ(cu().cuInit(0), CUDA_SUCCESS);
	int count = 0;
	ASSERT_EQ(cu().cuDeviceGetCount(&count), CUDA_SUCCESS);
	ASSERT_EQ(size_t(count), sees.size());
	for (int ordinal = 0; ordinal < count; ordinal++) {
		size_t physical = std::stoul(sees[size_t(ordinal)]);
		char name[64];
		ASSERT_EQ(cu().cuDeviceGetName(name, sizeof(name), ordinal), CUDA_SUCCESS);
		EXPECT_EQ(std::string(name), "xmem cudasim device " + sees[size_t(ordinal)]) << "ordinal " << ordinal;
		ASSERT_LT(physical, uuids.size());
		EXPECT_EQ(uuid_of(ordinal), uuids[physical]) << "ordinal " << ordinal;
	}
}

// Memory exported from one device is imported, in a process that sees the machine's
// devices in another order, as memory of that device under its ordinal there; memory
// of a device that process does not see is refused.
TEST_F(Sim, MemoryFollowsItsDeviceAcrossVisibilities)
{
	std::vector<int> fds;
	std::vector<CUmemGenericAllocationHandle> handles;
	for (int device : { 0, 1 }) {
		CUmemAllocationProp prop = device_prop(device);
		CUmemGenericAllocationHandle handle;
		ASSERT_EQ(cu().cuMemCreate(&handle, granularity, &prop, 0), CUDA_SUCCESS);
		int fd = -1;
		ASSERT_EQ(cu().cuMemExportToShareableHandle(&fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
			  CUDA_SUCCESS);
		handles.push_back(handle);
		fds.push_back(fd);
	}
	int sv[2];
	ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
	std::thread sender([&] {
		for (int fd : fds) {
			EXPECT_TRUE(send_fd(sv[0], fd));
			close(fd);
		}
	});
	ChildResult child =
		run_child("ImportVisible", { "CUDA_VISIBLE_DEVICES=1", "CUDASIM_SELFTEST_SOCKET=3" }, sv[1]);
	sender.join();
	close(sv[0]);
	close(sv[1]);
	EXPECT_TRUE(exited_cleanly(child)) << child.output;
	for (auto handle : handles)
		EXPECT_EQ(cu().cuMemRelease(handle), CUDA_SUCCESS);
}

TEST(DISABLED_Child, ImportVisible)
{
	int sock = std::atoi(std::getenv("CUDASIM_SELFTEST_SOCKET"));
	ASSERT_EQ(cu().cuInit(0), CUDA_SUCCESS);
	CUcontext ctx;
	CUstream stream;
	ASSERT_EQ(cu().cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuCtxPushCurrent(ctx), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuStreamCreate(&stream, 0), CUDA_SUCCESS);
	int of_first = receive_fd(sock), of_second = receive_fd(sock);
	ASSERT_GE(of_first, 0);
	ASSERT_GE(of_second, 0);
	CUmemGenericAllocationHandle handle;
	EXPECT_EQ(cu().cuMemImportFromShareableHandle(&handle, reinterpret_cast<void *>(uintptr_t(of_first)),
						      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
		  CUDA_ERROR_INVALID_DEVICE)
		<< "memory of a device this process does not see";
	ASSERT_EQ(cu().cuMemImportFromShareableHandle(&handle, reinterpret_cast<void *>(uintptr_t(of_second)),
						      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
		  CUDA_SUCCESS);
	close(of_first);
	close(of_second);
	// The machine's second device is this process's device 0: it reaches the memory.
	CUdeviceptr va = map_fresh(handle, granularity);
	uint32_t word = 0;
	ASSERT_EQ(cu().cuMemsetD32Async(va, 0x5eed, 1, stream), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuMemcpyDtoHAsync(&word, va, sizeof(word), stream), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuStreamSynchronize(stream), CUDA_SUCCESS);
	EXPECT_EQ(word, 0x5eedu);
	unmap_fresh(va, granularity);
	EXPECT_EQ(cu().cuMemRelease(handle), CUDA_SUCCESS);
}

// --- settings and XMEM_CUDASIM_FAIL ------------------------------------------------------

TEST(Settings, EachFailWordChangesWhatTheDriverSays)
{
	for (const char *word :
	     { "init", "no_vmm", "no_posix_fd", "no_memops", "no_host_register", "alloc", "prohibited" }) {
		ChildResult child = run_child("FailSwitch", { std::string("XMEM_CUDASIM_FAIL=") + word });
		EXPECT_TRUE(exited_cleanly(child)) << word << ":\n" << child.output;
	}
}

TEST(Settings, AMistypedSettingAborts)
{
	ChildResult child = run_child("InitOnly", { "XMEM_CUDASIM_FAIL=no_vmm,nosuchword" });
	EXPECT_TRUE(WIFSIGNALED(child.status) && WTERMSIG(child.status) == SIGABRT) << child.output;
	EXPECT_NE(child.output.find("nosuchword"), std::string::npos) << child.output;

	child = run_child("InitOnly", { "XMEM_CUDASIM_MEMORY=12Q" });
	EXPECT_TRUE(WIFSIGNALED(child.status) && WTERMSIG(child.status) == SIGABRT) << child.output;
	EXPECT_NE(child.output.find("XMEM_CUDASIM_MEMORY"), std::string::npos) << child.output;

	child = run_child("InitOnly", { "XMEM_CUDASIM_PEER=some" });
	EXPECT_TRUE(WIFSIGNALED(child.status) && WTERMSIG(child.status) == SIGABRT) << child.output;
	EXPECT_NE(child.output.find("XMEM_CUDASIM_PEER"), std::string::npos) << child.output;
}

// XMEM_CUDASIM_PEER=all: the two devices are peers, which lets cuMemSetAccess give one
// access to the other's VMM memory and cuCtxEnablePeerAccess reach another context's
// cuMemAlloc memory; neither happens by itself (DISABLED_Child.Peers).
TEST(Settings, PeersReachEachOthersMemoryOnlyWhereAccessIsGiven)
{
	ChildResult child = run_child("Peers", { "XMEM_CUDASIM_PEER=all" });
	EXPECT_TRUE(exited_cleanly(child)) << child.output;
}

TEST(Settings, DevicesMemoryGranularityAndVerbose)
{
	ChildResult child = run_child("Settings", { "XMEM_CUDASIM_DEVICES=1", "XMEM_CUDASIM_MEMORY=1M",
						    "XMEM_CUDASIM_GRANULARITY=65536", "XMEM_CUDASIM_VERBOSE=1",
						    "XMEM_CUDASIM_SEED=7" });
	EXPECT_TRUE(exited_cleanly(child)) << child.output;
	EXPECT_NE(child.output.find("seed 7"), std::string::npos) << child.output;
	EXPECT_NE(child.output.find("cudasim: cuMemCreate -> CUDA_ERROR_OUT_OF_MEMORY"), std::string::npos)
		<< child.output;

	child = run_child("NoDevice", { "XMEM_CUDASIM_DEVICES=0" });
	EXPECT_TRUE(exited_cleanly(child)) << child.output;
}

TEST(DISABLED_Child, BeforeInit)
{
	int count;
	CUdevice dev;
	CUcontext ctx;
	CUdeviceptr p;
	EXPECT_EQ(cu().cuDeviceGetCount(&count), CUDA_ERROR_NOT_INITIALIZED);
	EXPECT_EQ(cu().cuDeviceGet(&dev, 0), CUDA_ERROR_NOT_INITIALIZED);
	EXPECT_EQ(cu().cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_ERROR_NOT_INITIALIZED);
	EXPECT_EQ(cu().cuCtxGetCurrent(&ctx), CUDA_ERROR_NOT_INITIALIZED);
	EXPECT_EQ(cu().cuMemAlloc(&p, 4096), CUDA_ERROR_NOT_INITIALIZED);
	EXPECT_EQ(cu().cuStreamSynchronize(nullptr), CUDA_ERROR_NOT_INITIALIZED);
	EXPECT_EQ(cu().cuMemAddressReserve(&p, granularity, 0, 0, 0), CUDA_ERROR_NOT_INITIALIZED);
	EXPECT_EQ(cu().cuCtxCreate_v2(&ctx, 0, 0), CUDA_ERROR_NOT_INITIALIZED);
	EXPECT_EQ(cu().cuEventQuery(nullptr), CUDA_ERROR_NOT_INITIALIZED);
	CUmodule module;
	EXPECT_EQ(cu().cuModuleLoadData(&module, "x"), CUDA_ERROR_NOT_INITIALIZED);

	// As in the real driver, these work before cuInit.
	int version = 0;
	const char *name = nullptr;
	EXPECT_EQ(cu().cuDriverGetVersion(&version), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuGetErrorName(CUDA_ERROR_NOT_INITIALIZED, &name), CUDA_SUCCESS);

	EXPECT_EQ(cu().cuInit(1), CUDA_ERROR_INVALID_VALUE);
	EXPECT_EQ(cu().cuInit(0), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuDeviceGetCount(&count), CUDA_SUCCESS);
}

TEST(DISABLED_Child, InitOnly)
{
	cu().cuInit(0);
}

TEST(DISABLED_Child, NoDevice)
{
	int count;
	EXPECT_EQ(cu().cuInit(0), CUDA_ERROR_NO_DEVICE);
	EXPECT_EQ(cu().cuDeviceGetCount(&count), CUDA_ERROR_NOT_INITIALIZED);
}

TEST(DISABLED_Child, Settings)
{
	ASSERT_EQ(cu().cuInit(0), CUDA_SUCCESS);
	int count = 0;
	size_t total = 0, g = 0;
	EXPECT_EQ(cu().cuDeviceGetCount(&count), CUDA_SUCCESS);
	EXPECT_EQ(count, 1);
	EXPECT_EQ(cu().cuDeviceTotalMem(&total, 0), CUDA_SUCCESS);
	EXPECT_EQ(total, MiB);

	CUcontext ctx;
	ASSERT_EQ(cu().cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuCtxPushCurrent(ctx), CUDA_SUCCESS);
	CUmemAllocationProp prop = device_prop();
	EXPECT_EQ(cu().cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), CUDA_SUCCESS);
	EXPECT_EQ(g, 65536u);

	std::vector<CUmemGenericAllocationHandle> handles(16);
	for (auto &h : handles)
		EXPECT_EQ(cu().cuMemCreate(&h, 65536, &prop, 0), CUDA_SUCCESS);
	CUmemGenericAllocationHandle h;
	EXPECT_EQ(cu().cuMemCreate(&h, 65536, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
	for (auto handle : handles)
		EXPECT_EQ(cu().cuMemRelease(handle), CUDA_SUCCESS);
}

TEST(DISABLED_Child, Peers)
{
	ASSERT_EQ(cu().cuInit(0), CUDA_SUCCESS);
	int can = -1;
	EXPECT_EQ(cu().cuDeviceCanAccessPeer(&can, 0, 1), CUDA_SUCCESS);
	EXPECT_EQ(can, 1);
	EXPECT_EQ(cu().cuDeviceCanAccessPeer(&can, 1, 0), CUDA_SUCCESS);
	EXPECT_EQ(can, 1);
	EXPECT_EQ(cu().cuDeviceCanAccessPeer(&can, 1, 1), CUDA_SUCCESS);
	EXPECT_EQ(can, 0); // never its own peer

	CUcontext ctx0, ctx1;
	ASSERT_EQ(cu().cuDevicePrimaryCtxRetain(&ctx0, 0), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuDevicePrimaryCtxRetain(&ctx1, 1), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuCtxPushCurrent(ctx0), CUDA_SUCCESS);
	CUstream stream0;
	ASSERT_EQ(cu().cuStreamCreate(&stream0, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	VmmBuffer buffer = make_vmm(granularity); // device 0's, access for device 0
	CUdeviceptr plain;
	ASSERT_EQ(cu().cuMemAlloc(&plain, 4096), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuMemsetD8Async(buffer.va, 0x44, 64, stream0), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuMemsetD8Async(plain, 0x55, 64, stream0), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuStreamSynchronize(stream0), CUDA_SUCCESS);
	// Device 1 may be given access to device 0's memory.
	CUmemAccessDesc both[] = { access_for(0), access_for(1, CU_MEM_ACCESS_FLAGS_PROT_READ) };
	ASSERT_EQ(cu().cuMemSetAccess(buffer.va, buffer.size, both, 2), CUDA_SUCCESS);

	CUcontext popped;
	ASSERT_EQ(cu().cuCtxPushCurrent(ctx1), CUDA_SUCCESS);
	CUstream stream1;
	ASSERT_EQ(cu().cuStreamCreate(&stream1, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	std::vector<unsigned char> bytes(64);
	ASSERT_EQ(cu().cuMemcpyDtoHAsync(bytes.data(), buffer.va, 64, stream1), CUDA_SUCCESS);
	EXPECT_TRUE(all_equal(bytes.data(), bytes.size(), 0x44));

	// Peer access between the contexts reaches cuMemAlloc memory, one way, until disabled.
	EXPECT_EQ(cu().cuCtxEnablePeerAccess(ctx0, 0), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuCtxEnablePeerAccess(ctx0, 0), CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
	ASSERT_EQ(cu().cuMemcpyDtoHAsync(bytes.data(), plain, 64, stream1), CUDA_SUCCESS);
	EXPECT_TRUE(all_equal(bytes.data(), bytes.size(), 0x55));
	EXPECT_EQ(cu().cuCtxDisablePeerAccess(ctx0), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuCtxDisablePeerAccess(ctx0), CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);

	// Enabled peer access does not reach VMM memory: only cuMemSetAccess does.
	EXPECT_EQ(cu().cuCtxEnablePeerAccess(ctx0, 0), CUDA_SUCCESS);
	CUmemAccessDesc none = access_for(1, CU_MEM_ACCESS_FLAGS_PROT_NONE);
	ASSERT_EQ(cu().cuMemSetAccess(buffer.va, buffer.size, &none, 1), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuMemcpyDtoHAsync(bytes.data(), buffer.va, 64, stream1), CUDA_ERROR_ILLEGAL_ADDRESS);
	EXPECT_EQ(cu().cuStreamSynchronize(stream1), CUDA_ERROR_ILLEGAL_ADDRESS);
	ASSERT_EQ(cu().cuCtxPopCurrent(&popped), CUDA_SUCCESS);
	// The last release of device 1's context ends its peer access and its sticky error.
	EXPECT_EQ(cu().cuDevicePrimaryCtxRelease(1), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuDevicePrimaryCtxRetain(&ctx1, 1), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuCtxPushCurrent(ctx1), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuCtxDisablePeerAccess(ctx0), CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
	ASSERT_EQ(cu().cuCtxPopCurrent(&popped), CUDA_SUCCESS);

	EXPECT_EQ(cu().cuMemFree(plain), CUDA_SUCCESS);
	free_vmm(buffer);
	cu().cuStreamDestroy(stream0);
	EXPECT_EQ(cu().cuDevicePrimaryCtxRelease(1), CUDA_SUCCESS);
}

TEST(DISABLED_Child, FailSwitch)
{
	const std::string word = std::getenv("XMEM_CUDASIM_FAIL");
	if (word == "init") {
		int count;
		EXPECT_EQ(cu().cuInit(0), CUDA_ERROR_UNKNOWN);
		EXPECT_EQ(cu().cuInit(0), CUDA_ERROR_UNKNOWN);
		EXPECT_EQ(cu().cuDeviceGetCount(&count), CUDA_ERROR_NOT_INITIALIZED);
		return;
	}
	ASSERT_EQ(cu().cuInit(0), CUDA_SUCCESS);
	auto attribute = [](CUdevice_attribute a) {
		int value = -1;
		EXPECT_EQ(cu().cuDeviceGetAttribute(&value, a, 0), CUDA_SUCCESS);
		return value;
	};

	CUcontext ctx;
	if (word == "prohibited") {
		EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_MODE), CU_COMPUTEMODE_PROHIBITED);
		EXPECT_EQ(cu().cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_ERROR_DEVICE_UNAVAILABLE);
		EXPECT_EQ(cu().cuCtxCreate_v2(&ctx, 0, 0), CUDA_ERROR_DEVICE_UNAVAILABLE);
		return;
	}
	EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_MODE), CU_COMPUTEMODE_DEFAULT);
	EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED), word != "no_vmm");
	EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED), word != "no_posix_fd");
	EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS), word != "no_memops");
	EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS_V1), word != "no_memops");
	EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED), word != "no_host_register");

	CUstream stream;
	ASSERT_EQ(cu().cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuCtxPushCurrent(ctx), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuStreamCreate(&stream, 0), CUDA_SUCCESS);

	CUmemAllocationProp prop = device_prop();
	CUmemGenericAllocationHandle h;
	CUresult created = cu().cuMemCreate(&h, granularity, &prop, 0);
	EXPECT_EQ(created, word == "no_vmm"  ? CUDA_ERROR_NOT_SUPPORTED
			   : word == "alloc" ? CUDA_ERROR_OUT_OF_MEMORY
					     : CUDA_SUCCESS);
	if (created == CUDA_SUCCESS) {
		int fd = -1;
		CUresult exported =
			cu().cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
		EXPECT_EQ(exported, word == "no_posix_fd" ? CUDA_ERROR_NOT_SUPPORTED : CUDA_SUCCESS);
		if (exported == CUDA_SUCCESS)
			close(fd);
		EXPECT_EQ(cu().cuMemRelease(h), CUDA_SUCCESS);
	}

	CUdeviceptr plain = 0;
	CUresult allocated = cu().cuMemAlloc(&plain, 4096);
	EXPECT_EQ(allocated, word == "alloc" ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS);
	CUdeviceptr pitched = 0;
	size_t pitch = 0;
	CUresult pitch_allocated = cu().cuMemAllocPitch(&pitched, &pitch, 64, 4, 4);
	EXPECT_EQ(pitch_allocated, word == "alloc" ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS);
	if (pitch_allocated == CUDA_SUCCESS) {
		EXPECT_EQ(cu().cuMemFree(pitched), CUDA_SUCCESS);
	}

	uint64_t host[2] = {};
	CUresult registered = cu().cuMemHostRegister(host, sizeof(host), 0);
	EXPECT_EQ(registered, word == "no_host_register" ? CUDA_ERROR_NOT_SUPPORTED : CUDA_SUCCESS);
	CUdeviceptr word_address = plain;
	if (registered == CUDA_SUCCESS) {
		ASSERT_EQ(cu().cuMemHostGetDevicePointer(&word_address, host, 0), CUDA_SUCCESS);
	}

	CUresult memops = word == "no_memops" ? CUDA_ERROR_NOT_SUPPORTED : CUDA_SUCCESS;
	EXPECT_EQ(cu().cuStreamWriteValue64(stream, word_address, 1, 0), memops);
	EXPECT_EQ(cu().cuStreamWaitValue64(stream, word_address, 1, 0), memops);
	EXPECT_EQ(cu().cuStreamSynchronize(stream), CUDA_SUCCESS);

	if (registered == CUDA_SUCCESS) {
		EXPECT_EQ(cu().cuMemHostUnregister(host), CUDA_SUCCESS);
	}
	if (allocated == CUDA_SUCCESS) {
		EXPECT_EQ(cu().cuMemFree(plain), CUDA_SUCCESS);
	}
}

} // namespace
