// test_cudasim_ipc.cpp - self-test of the simulator's legacy CUDA IPC (README.md): a
// cuIpcGetMemHandle handle opens in another process as the same memory, and every refusal.
// Part of cudasim-selftest: test_cudasim.cpp's settings (two devices, 2 ms delays) apply.
// The other process is this binary again, running one DISABLED_IpcChild test, and the
// handle travels in its environment as hex: no fd is passed.

#include <cuda.h>

#include <gtest/gtest.h>

#include "selftest_driver.hpp"

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <dlfcn.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

// cuda.h 13 renames cuCtxCreate to cuCtxCreate_v4; GStreamer 1.22 loads the flags-only v2.
extern "C" CUresult CUDAAPI cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);

// test_cudasim.cpp's: failure messages name CUresult values.
void PrintTo(CUresult result, std::ostream *os);

namespace {

#define IPC_ENTRY_POINTS(X)                                                                                            \
	X(cuInit)                                                                                                      \
	X(cuDevicePrimaryCtxRetain)                                                                                    \
	X(cuDevicePrimaryCtxRelease)                                                                                   \
	X(cuCtxPushCurrent)                                                                                            \
	X(cuCtxPopCurrent)                                                                                             \
	X(cuCtxCreate_v2)                                                                                              \
	X(cuCtxDestroy)                                                                                                \
	X(cuCtxSynchronize)                                                                                            \
	X(cuMemAlloc)                                                                                                  \
	X(cuMemFree)                                                                                                   \
	X(cuMemcpyHtoD)                                                                                                \
	X(cuMemcpyDtoH)                                                                                                \
	X(cuMemCreate)                                                                                                 \
	X(cuMemRelease)                                                                                                \
	X(cuMemAddressReserve)                                                                                         \
	X(cuMemAddressFree)                                                                                            \
	X(cuMemMap)                                                                                                    \
	X(cuMemUnmap)                                                                                                  \
	X(cuIpcGetMemHandle)                                                                                           \
	X(cuIpcOpenMemHandle)                                                                                          \
	X(cuIpcCloseMemHandle)

#define IPC_STRING(name) #name
#define IPC_ABI_NAME(name) IPC_STRING(name)

struct Driver {
#define IPC_DECLARE(fn) decltype(&::fn) fn = nullptr;
	IPC_ENTRY_POINTS(IPC_DECLARE)
#undef IPC_DECLARE
	// The first ABI of cuIpcOpenMemHandle, which GStreamer's CUDA library loads by that name.
	decltype(&::cuIpcOpenMemHandle) cuIpcOpenMemHandle_v1 = nullptr;
};

Driver load_driver()
{
	const cudasim_selftest::Module module = cudasim_selftest::open_driver();
	Driver driver;
#define IPC_LOAD(fn) driver.fn = cudasim_selftest::entry_point<decltype(driver.fn)>(module, IPC_ABI_NAME(fn));
	IPC_ENTRY_POINTS(IPC_LOAD)
#undef IPC_LOAD
	driver.cuIpcOpenMemHandle_v1 =
		cudasim_selftest::entry_point<decltype(driver.cuIpcOpenMemHandle_v1)>(module, "cuIpcOpenMemHandle");
	return driver;
}

const Driver &cu()
{
	static const Driver driver = load_driver();
	return driver;
}

constexpr unsigned lazy = CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS;
// Not a whole number of pages: the importer sees exactly the allocation's bytes.
constexpr size_t alloc_size = 3 * 4096 + 100;

std::vector<unsigned char> pattern(size_t size, unsigned factor)
{
	std::vector<unsigned char> bytes(size);
	for (size_t i = 0; i < size; i++)
		bytes[i] = static_cast<unsigned char>(i * factor + (i >> 12));
	return bytes;
}

std::string to_hex(const CUipcMemHandle &handle)
{
	static constexpr char digits[] = "0123456789abcdef";
	std::string out;
	for (char c : handle.reserved) {
		auto b = static_cast<unsigned char>(c);
		out += digits[b >> 4];
		out += digits[b & 0xf];
	}
	return out;
}

CUipcMemHandle from_hex(const std::string &hex)
{
	CUipcMemHandle handle = {};
	for (size_t i = 0; i < sizeof(handle.reserved) && 2 * i + 1 < hex.size(); i++)
		handle.reserved[i] = static_cast<char>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
	return handle;
}

// The handle in environment variable NAME (set by the parent).
CUipcMemHandle handle_from_env(const char *name)
{
	const char *hex = std::getenv(name);
	EXPECT_NE(hex, nullptr) << name;
	return from_hex(hex ? hex : "");
}

// The permissions of the mapping that holds address, as /proc/self/maps shows them.
std::string cpu_permissions(CUdeviceptr address)
{
	std::ifstream maps("/proc/self/maps");
	for (std::string line; std::getline(maps, line);) {
		unsigned long lo = 0, hi = 0;
		char perms[5] = {};
		if (std::sscanf(line.c_str(), "%lx-%lx %4s", &lo, &hi, perms) == 3 && address >= lo && address < hi)
			return perms;
	}
	return "unmapped";
}

using cudasim_selftest::ChildResult;
using cudasim_selftest::exited_cleanly;

// Runs DISABLED_IpcChild.<test> in a new process of this binary, with extra environment
// entries ("NAME=value").
ChildResult run_child(const std::string &test, const std::vector<std::string> &extra_env)
{
	return cudasim_selftest::run_child("DISABLED_IpcChild", test, "CUDASIM_SELFTEST_CHILD=1", extra_env);
}

// A primary context of DEVICE, current on the calling thread while it lives.
class CurrentPrimary
{
public:
	explicit CurrentPrimary(CUdevice device = 0) : device_(device)
	{
		EXPECT_EQ(cu().cuInit(0), CUDA_SUCCESS);
		EXPECT_EQ(cu().cuDevicePrimaryCtxRetain(&ctx_, device), CUDA_SUCCESS);
		EXPECT_EQ(cu().cuCtxPushCurrent(ctx_), CUDA_SUCCESS);
	}
	~CurrentPrimary()
	{
		CUcontext popped = nullptr;
		cu().cuCtxPopCurrent(&popped);
		cu().cuDevicePrimaryCtxRelease(device_);
	}
	CurrentPrimary(const CurrentPrimary &) = delete;
	CurrentPrimary &operator=(const CurrentPrimary &) = delete;

private:
	CUdevice device_;
	CUcontext ctx_ = nullptr;
};

// cuMemAlloc memory of the current context holding pattern(alloc_size, factor).
CUdeviceptr filled_allocation(unsigned factor)
{
	CUdeviceptr dptr = 0;
	EXPECT_EQ(cu().cuMemAlloc(&dptr, alloc_size), CUDA_SUCCESS);
	auto bytes = pattern(alloc_size, factor);
	EXPECT_EQ(cu().cuMemcpyHtoD(dptr, bytes.data(), bytes.size()), CUDA_SUCCESS);
	// A copy from pageable memory may return before it lands: another process reads it next.
	EXPECT_EQ(cu().cuCtxSynchronize(), CUDA_SUCCESS);
	return dptr;
}

std::vector<unsigned char> read_back(CUdeviceptr dptr, size_t size = alloc_size)
{
	std::vector<unsigned char> bytes(size);
	EXPECT_EQ(cu().cuMemcpyDtoH(bytes.data(), dptr, size), CUDA_SUCCESS);
	return bytes;
}

} // namespace

// The success path: a handle of a cuMemAlloc allocation, the same each time it is asked
// for, opens in another process as the same bytes, both ways; there the address is
// device memory the CPU cannot touch, opens again in the same context as the same address
// with one more reference, and is gone after the last cuIpcCloseMemHandle
// (DISABLED_IpcChild.OpenReadWriteClose).
TEST(Ipc, AHandleOpensInAnotherProcessAsTheSameMemory)
{
	CurrentPrimary primary;
	CUdeviceptr dptr = filled_allocation(7);
	CUipcMemHandle handle = {}, again = {};
	ASSERT_EQ(cu().cuIpcGetMemHandle(&handle, dptr), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuIpcGetMemHandle(&again, dptr), CUDA_SUCCESS);
	EXPECT_EQ(std::memcmp(&handle, &again, sizeof(handle)), 0) << "a second call gives another handle";

	ChildResult child = run_child("OpenReadWriteClose", { "CUDASIM_IPC_HANDLE=" + to_hex(handle) });
	EXPECT_TRUE(exited_cleanly(child)) << child.output;
	EXPECT_EQ(read_back(dptr), pattern(alloc_size, 13)) << "the other process's writes are not here";
	EXPECT_EQ(cu().cuMemFree(dptr), CUDA_SUCCESS);
}

TEST(DISABLED_IpcChild, OpenReadWriteClose)
{
	CurrentPrimary primary;
	CUipcMemHandle handle = handle_from_env("CUDASIM_IPC_HANDLE");
	CUdeviceptr dptr = 0;
	ASSERT_EQ(cu().cuIpcOpenMemHandle(&dptr, handle, lazy), CUDA_SUCCESS);
	ASSERT_NE(dptr, 0u);
	EXPECT_EQ(cpu_permissions(dptr), "---p") << "device memory is CPU-accessible";
	EXPECT_EQ(read_back(dptr), pattern(alloc_size, 7));

	// The same handle in the same context: the same address, one more reference (cuda.h),
	// through the first ABI too.
	CUdeviceptr second = 0;
	ASSERT_EQ(cu().cuIpcOpenMemHandle_v1(&second, handle, lazy), CUDA_SUCCESS);
	EXPECT_EQ(second, dptr);

	// Not this process's allocation: neither freed nor exported here.
	EXPECT_EQ(cu().cuMemFree(dptr), CUDA_ERROR_INVALID_VALUE);
	CUipcMemHandle reexported = {};
	EXPECT_EQ(cu().cuIpcGetMemHandle(&reexported, dptr), CUDA_ERROR_INVALID_VALUE);

	auto bytes = pattern(alloc_size, 13);
	ASSERT_EQ(cu().cuMemcpyHtoD(dptr, bytes.data(), bytes.size()), CUDA_SUCCESS);
	// Landed before the close: a copy from pageable memory may return before.
	ASSERT_EQ(cu().cuCtxSynchronize(), CUDA_SUCCESS);

	EXPECT_EQ(cu().cuIpcCloseMemHandle(dptr), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuIpcCloseMemHandle(dptr), CUDA_SUCCESS) << "the second open's reference";
	EXPECT_EQ(cu().cuIpcCloseMemHandle(dptr), CUDA_ERROR_INVALID_VALUE) << "closed twice, opened twice";
	EXPECT_EQ(cpu_permissions(dptr), "---p") << "a closed address must keep faulting";
	// Closed: the address is gone for the device too (an illegal access, sticky).
	unsigned char byte = 0;
	testing::internal::CaptureStderr();
	EXPECT_EQ(cu().cuMemcpyDtoH(&byte, dptr, 1), CUDA_ERROR_ILLEGAL_ADDRESS);
	std::string err = testing::internal::GetCapturedStderr();
	EXPECT_NE(err.find("freed, unmapped or unregistered memory"), std::string::npos) << err;
}

// cuIpcGetMemHandle takes the base of a cuMemAlloc allocation and nothing else; a handle
// does not open in the process that made it; cuIpcCloseMemHandle takes only what
// cuIpcOpenMemHandle returned.
TEST(Ipc, OnlyTheBaseOfACuMemAllocAllocationHasAHandle)
{
	CurrentPrimary primary;
	CUdeviceptr dptr = filled_allocation(7);
	CUipcMemHandle handle = {};
	EXPECT_EQ(cu().cuIpcGetMemHandle(nullptr, dptr), CUDA_ERROR_INVALID_VALUE);
	EXPECT_EQ(cu().cuIpcGetMemHandle(&handle, dptr + 4096), CUDA_ERROR_INVALID_VALUE) << "an interior pointer";
	EXPECT_EQ(cu().cuIpcGetMemHandle(&handle, 0x1000), CUDA_ERROR_INVALID_VALUE) << "not device memory";

	// VMM memory is shared with cuMemExportToShareableHandle instead.
	CUmemAllocationProp prop = {};
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = 0;
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	constexpr size_t granularity = size_t(2) << 20;
	CUmemGenericAllocationHandle vmm = 0;
	CUdeviceptr va = 0;
	ASSERT_EQ(cu().cuMemCreate(&vmm, granularity, &prop, 0), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuMemAddressReserve(&va, granularity, 0, 0, 0), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuMemMap(va, granularity, 0, vmm, 0), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuIpcGetMemHandle(&handle, va), CUDA_ERROR_INVALID_VALUE) << "VMM memory";
	EXPECT_EQ(cu().cuMemUnmap(va, granularity), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuMemAddressFree(va, granularity), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuMemRelease(vmm), CUDA_SUCCESS);

	// Without a current context.
	std::thread([&] { EXPECT_EQ(cu().cuIpcGetMemHandle(&handle, dptr), CUDA_ERROR_INVALID_CONTEXT); }).join();

	ASSERT_EQ(cu().cuIpcGetMemHandle(&handle, dptr), CUDA_SUCCESS);
	// Opened in the exporting process: refused, as the driver refuses it.
	CUdeviceptr opened = 0;
	EXPECT_EQ(cu().cuIpcOpenMemHandle(&opened, handle, lazy), CUDA_ERROR_INVALID_CONTEXT);
	EXPECT_EQ(cu().cuIpcOpenMemHandle(nullptr, handle, lazy), CUDA_ERROR_INVALID_VALUE);
	EXPECT_EQ(cu().cuIpcCloseMemHandle(dptr), CUDA_ERROR_INVALID_VALUE) << "cuMemAlloc memory, not opened";

	// Freed memory has no handle, and the next allocation gets a handle of its own ("a
	// unique handle for the new memory"), whatever fd or address it reuses.
	EXPECT_EQ(cu().cuMemFree(dptr), CUDA_SUCCESS);
	CUipcMemHandle freed = {};
	EXPECT_EQ(cu().cuIpcGetMemHandle(&freed, dptr), CUDA_ERROR_INVALID_VALUE);
	CUdeviceptr next = filled_allocation(7);
	CUipcMemHandle fresh = {};
	ASSERT_EQ(cu().cuIpcGetMemHandle(&fresh, next), CUDA_SUCCESS);
	EXPECT_NE(std::memcmp(&fresh, &handle, sizeof(handle)), 0);
	EXPECT_EQ(cu().cuMemFree(next), CUDA_SUCCESS);
}

// What the importer refuses (DISABLED_IpcChild.Refusals): flags other than
// CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS, bytes no cuIpcGetMemHandle wrote, a handle whose
// tag is not its allocation's, no current context, a second context of the device (one
// per device may open one process's handles), a close from another context, and memory of
// a device that is no peer of the context's. Destroying the opening context closes what it
// opened. With every GPU a peer (XMEM_CUDASIM_PEER=all) that memory opens and reads
// (DISABLED_IpcChild.Peer).
TEST(Ipc, TheImporterRefusesWhatCudaHForbids)
{
	CurrentPrimary primary;
	CUdeviceptr dptr = filled_allocation(7);
	CUipcMemHandle handle = {};
	ASSERT_EQ(cu().cuIpcGetMemHandle(&handle, dptr), CUDA_SUCCESS);
	// Device 1's memory, in a context that lives (and keeps it) to the end of the test.
	CUcontext ctx1 = nullptr;
	ASSERT_EQ(cu().cuCtxCreate_v2(&ctx1, 0, 1), CUDA_SUCCESS);
	CUdeviceptr on_device1 = filled_allocation(11);
	CUipcMemHandle device1 = {};
	ASSERT_EQ(cu().cuIpcGetMemHandle(&device1, on_device1), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuCtxPopCurrent(nullptr), CUDA_SUCCESS);
	ChildResult child = run_child(
		"Refusals", { "CUDASIM_IPC_HANDLE=" + to_hex(handle), "CUDASIM_IPC_DEVICE1=" + to_hex(device1) });
	EXPECT_TRUE(exited_cleanly(child)) << child.output;
	child = run_child("Peer", { "XMEM_CUDASIM_PEER=all", "CUDASIM_IPC_DEVICE1=" + to_hex(device1) });
	EXPECT_TRUE(exited_cleanly(child)) << child.output;

	EXPECT_EQ(cu().cuMemFree(dptr), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuCtxDestroy(ctx1), CUDA_SUCCESS);
}

TEST(DISABLED_IpcChild, Refusals)
{
	CurrentPrimary primary;
	CUipcMemHandle handle = handle_from_env("CUDASIM_IPC_HANDLE");
	CUdeviceptr dptr = 0;
	EXPECT_EQ(cu().cuIpcOpenMemHandle(&dptr, handle, 0), CUDA_ERROR_INVALID_VALUE) << "flags 0";
	EXPECT_EQ(cu().cuIpcOpenMemHandle(&dptr, handle, lazy | 2), CUDA_ERROR_INVALID_VALUE) << "an unknown flag";
	CUipcMemHandle garbage = handle;
	garbage.reserved[0] ^= 1;
	EXPECT_EQ(cu().cuIpcOpenMemHandle(&dptr, garbage, lazy), CUDA_ERROR_INVALID_VALUE) << "not a handle";
	garbage = handle;
	garbage.reserved[63] = 1;
	EXPECT_EQ(cu().cuIpcOpenMemHandle(&dptr, garbage, lazy), CUDA_ERROR_INVALID_VALUE) << "its tail is not zero";
	// The same process, fd and size, another tag: another allocation, or one freed.
	garbage = handle;
	garbage.reserved[32] ^= 1;
	testing::internal::CaptureStderr();
	EXPECT_EQ(cu().cuIpcOpenMemHandle(&dptr, garbage, lazy), CUDA_ERROR_INVALID_HANDLE) << "another tag";
	std::string err = testing::internal::GetCapturedStderr();
	EXPECT_NE(err.find("freed the exported allocation"), std::string::npos) << err;
	std::thread([&] {
		EXPECT_EQ(cu().cuIpcOpenMemHandle(&dptr, handle, lazy), CUDA_ERROR_INVALID_CONTEXT);
	}).join();

	CUdeviceptr opened = 0;
	ASSERT_EQ(cu().cuIpcOpenMemHandle(&opened, handle, lazy), CUDA_SUCCESS);
	// "CUipcMemHandles from each CUdevice in a given process may only be opened by one
	// CUcontext per CUdevice per other process."
	CUcontext created = nullptr;
	ASSERT_EQ(cu().cuCtxCreate_v2(&created, 0, 0), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuIpcOpenMemHandle(&dptr, handle, lazy), CUDA_ERROR_INVALID_CONTEXT) << "a second context";
	EXPECT_EQ(cu().cuIpcCloseMemHandle(opened), CUDA_ERROR_INVALID_CONTEXT) << "closed by another context";
	EXPECT_EQ(cu().cuCtxDestroy(created), CUDA_SUCCESS);
	EXPECT_EQ(read_back(opened), pattern(alloc_size, 7));
	EXPECT_EQ(cu().cuIpcCloseMemHandle(opened), CUDA_SUCCESS);

	// Device 1's memory in a context of device 0, which is no peer of it.
	CUipcMemHandle device1 = handle_from_env("CUDASIM_IPC_DEVICE1");
	EXPECT_EQ(cu().cuIpcOpenMemHandle(&dptr, device1, lazy), CUDA_ERROR_PEER_ACCESS_UNSUPPORTED);
	// In device 1's own context it opens; that context's destruction closes it.
	ASSERT_EQ(cu().cuCtxCreate_v2(&created, 0, 1), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuIpcOpenMemHandle(&opened, device1, lazy), CUDA_SUCCESS);
	EXPECT_EQ(read_back(opened), pattern(alloc_size, 11));
	EXPECT_EQ(cu().cuCtxDestroy(created), CUDA_SUCCESS);
	CurrentPrimary primary1(1);
	EXPECT_EQ(cu().cuIpcCloseMemHandle(opened), CUDA_ERROR_INVALID_VALUE) << "its context closed it";
	EXPECT_EQ(cpu_permissions(opened), "---p");
}

TEST(DISABLED_IpcChild, Peer)
{
	CurrentPrimary primary;
	CUipcMemHandle device1 = handle_from_env("CUDASIM_IPC_DEVICE1");
	CUdeviceptr opened = 0;
	ASSERT_EQ(cu().cuIpcOpenMemHandle(&opened, device1, lazy), CUDA_SUCCESS);
	EXPECT_EQ(read_back(opened), pattern(alloc_size, 11));
	EXPECT_EQ(cu().cuIpcCloseMemHandle(opened), CUDA_SUCCESS);
}

// A handle names memory only while its exporter holds it: freed (the fd it named reused by
// the next allocation), or its process gone, the handle opens nothing, and says why.
TEST(Ipc, AHandleOfFreedMemoryOrOfAnExitedProcessOpensNothing)
{
	{
		CurrentPrimary primary;
		CUdeviceptr freed = filled_allocation(7);
		CUipcMemHandle handle = {};
		ASSERT_EQ(cu().cuIpcGetMemHandle(&handle, freed), CUDA_SUCCESS);
		EXPECT_EQ(cu().cuMemFree(freed), CUDA_SUCCESS);
		CUdeviceptr reused = filled_allocation(7);
		ChildResult child = run_child("OpensNothing", { "CUDASIM_IPC_HANDLE=" + to_hex(handle),
								"CUDASIM_IPC_WHY=freed the exported allocation" });
		EXPECT_TRUE(exited_cleanly(child)) << child.output;
		EXPECT_EQ(cu().cuMemFree(reused), CUDA_SUCCESS);
	}

	ChildResult exporter = run_child("ExportAndExit", {});
	ASSERT_TRUE(exited_cleanly(exporter)) << exporter.output;
	auto at = exporter.output.find("CUDASIM_IPC_HANDLE=");
	ASSERT_NE(at, std::string::npos) << exporter.output;
	std::string hex = exporter.output.substr(at + std::strlen("CUDASIM_IPC_HANDLE="), 2 * CU_IPC_HANDLE_SIZE);
	CurrentPrimary primary;
	CUdeviceptr dptr = 0;
	testing::internal::CaptureStderr();
	EXPECT_EQ(cu().cuIpcOpenMemHandle(&dptr, from_hex(hex), lazy), CUDA_ERROR_INVALID_HANDLE);
	std::string err = testing::internal::GetCapturedStderr();
	EXPECT_NE(err.find("which exported the handle, has exited"), std::string::npos) << err;
}

TEST(DISABLED_IpcChild, OpensNothing)
{
	CurrentPrimary primary;
	CUdeviceptr dptr = 0;
	testing::internal::CaptureStderr();
	EXPECT_EQ(cu().cuIpcOpenMemHandle(&dptr, handle_from_env("CUDASIM_IPC_HANDLE"), lazy),
		  CUDA_ERROR_INVALID_HANDLE);
	std::string err = testing::internal::GetCapturedStderr();
	const char *why = std::getenv("CUDASIM_IPC_WHY");
	ASSERT_NE(why, nullptr);
	EXPECT_NE(err.find(why), std::string::npos) << err;
}

TEST(DISABLED_IpcChild, ExportAndExit)
{
	CurrentPrimary primary;
	CUipcMemHandle handle = {};
	ASSERT_EQ(cu().cuIpcGetMemHandle(&handle, filled_allocation(7)), CUDA_SUCCESS);
	std::printf("CUDASIM_IPC_HANDLE=%s\n", to_hex(handle).c_str());
}
