// test_cudasim_driver_rules.cpp - self-test of the simulator's rules where the real driver
// refuses: host registration, stream memory operation flags, VMM alignment, compute modes, MIG.

#include <cuda.h>

#include <gtest/gtest.h>

#include "selftest_driver.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
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

// cuda.h 13 renames cuCtxCreate to cuCtxCreate_v4; the flags-only v2 is the simpler call.
extern "C" CUresult CUDAAPI cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);

namespace {

// The entry points these tests use, by the names cuda.h gives them (which expand to their
// ABI names, cuMemHostRegister -> cuMemHostRegister_v2).
#define RULES_ENTRY_POINTS(X)                                                                                          \
	X(cuInit)                                                                                                      \
	X(cuGetErrorName)                                                                                              \
	X(cuDeviceGetCount)                                                                                            \
	X(cuDeviceGet)                                                                                                 \
	X(cuDeviceGetName)                                                                                             \
	X(cuDeviceGetUuid)                                                                                             \
	X(cuDeviceGetAttribute)                                                                                        \
	X(cuDevicePrimaryCtxRetain)                                                                                    \
	X(cuDevicePrimaryCtxRelease)                                                                                   \
	X(cuCtxPushCurrent)                                                                                            \
	X(cuCtxPopCurrent)                                                                                             \
	X(cuCtxCreate_v2)                                                                                              \
	X(cuCtxDestroy)                                                                                                \
	X(cuMemGetAllocationGranularity)                                                                               \
	X(cuMemCreate)                                                                                                 \
	X(cuMemRelease)                                                                                                \
	X(cuMemAddressReserve)                                                                                         \
	X(cuMemAddressFree)                                                                                            \
	X(cuMemMap)                                                                                                    \
	X(cuMemUnmap)                                                                                                  \
	X(cuMemSetAccess)                                                                                              \
	X(cuMemExportToShareableHandle)                                                                                \
	X(cuMemImportFromShareableHandle)                                                                              \
	X(cuMemHostRegister)                                                                                           \
	X(cuMemHostUnregister)                                                                                         \
	X(cuMemHostGetDevicePointer)                                                                                   \
	X(cuMemAllocHost)                                                                                              \
	X(cuMemFreeHost)                                                                                               \
	X(cuStreamCreate)                                                                                              \
	X(cuStreamDestroy)                                                                                             \
	X(cuStreamSynchronize)                                                                                         \
	X(cuStreamWaitValue64)                                                                                         \
	X(cuStreamWriteValue64)

#define RULES_STRING(name) #name
#define RULES_ABI_NAME(name) RULES_STRING(name)

struct Driver {
#define RULES_DECLARE(fn) decltype(&::fn) fn = nullptr;
	RULES_ENTRY_POINTS(RULES_DECLARE)
#undef RULES_DECLARE
	// The first cuDeviceGetUuid, which the real driver still exports by its unversioned name.
	CUresult(CUDAAPI *cuDeviceGetUuid_v1)(CUuuid *uuid, CUdevice dev) = nullptr;
};

constexpr size_t MiB = size_t(1) << 20;
constexpr size_t granularity = 2 * MiB; // the simulator's default

// This process runs on the default machine with short delays; children inherit that and
// add their own settings.
bool apply_settings()
{
	if (std::getenv("CUDASIM_RULES_CHILD"))
		return false;
	for (const char *name :
	     { "XMEM_CUDASIM_DEVICES", "XMEM_CUDASIM_MEMORY", "XMEM_CUDASIM_GRANULARITY", "XMEM_CUDASIM_FAIL",
	       "XMEM_CUDASIM_VERBOSE", "XMEM_CUDASIM_HOST_PIN_LIMIT", "CUDA_VISIBLE_DEVICES" })
		unsetenv(name);
	setenv("XMEM_CUDASIM_DELAY_US", "200", 1);
	return true;
}

[[maybe_unused]] const bool settings_applied = apply_settings();

Driver load_driver()
{
	const cudasim_selftest::Module module = cudasim_selftest::open_driver();
	Driver driver;
#define RULES_LOAD(fn) driver.fn = cudasim_selftest::entry_point<decltype(driver.fn)>(module, RULES_ABI_NAME(fn));
	RULES_ENTRY_POINTS(RULES_LOAD)
#undef RULES_LOAD
	driver.cuDeviceGetUuid_v1 =
		cudasim_selftest::entry_point<decltype(driver.cuDeviceGetUuid_v1)>(module, "cuDeviceGetUuid");
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

// --- child processes -----------------------------------------------------------------

using cudasim_selftest::ChildResult;
using cudasim_selftest::exited_cleanly;

// Runs the test DISABLED_Child.<test> in a new process of this binary, with extra
// environment entries ("NAME=value"; "NAME" alone removes it).
ChildResult run_child(const std::string &test, const std::vector<std::string> &extra_env)
{
	return cudasim_selftest::run_child("DISABLED_Child", test, "CUDASIM_RULES_CHILD=1", extra_env);
}

// The primary context of device 0, current on the test's thread for the fixture's life.
class Rules : public ::testing::Test
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
		if (stream_) {
			EXPECT_EQ(cu().cuStreamSynchronize(stream_), CUDA_SUCCESS);
			EXPECT_EQ(cu().cuStreamDestroy(stream_), CUDA_SUCCESS);
		}
		CUcontext popped;
		cu().cuCtxPopCurrent(&popped);
		cu().cuDevicePrimaryCtxRelease(0);
	}

	CUcontext ctx_ = nullptr;
	CUstream stream_ = nullptr;
};

// An anonymous mapping of PAGES pages, unmapped at the end of the scope.
class Pages
{
public:
	explicit Pages(size_t pages, int prot = PROT_READ | PROT_WRITE) : size_(pages * page())
	{
		void *p = mmap(nullptr, size_, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		EXPECT_NE(p, MAP_FAILED);
		data_ = static_cast<char *>(p);
	}
	~Pages() { munmap(data_, size_); }
	Pages(const Pages &) = delete;
	Pages &operator=(const Pages &) = delete;

	static size_t page() { return size_t(sysconf(_SC_PAGESIZE)); }
	char *data() const { return data_; }
	char *at(size_t page_index) const { return data_ + page_index * page(); }

private:
	size_t size_;
	char *data_ = nullptr;
};

// --- host registration ------------------------------------------------------------------

// The driver pins a registration's pages for the device to write them: a mapping the CPU may
// only read registers only with CU_MEMHOSTREGISTER_READ_ONLY, and PROT_NONE never. The old
// simulator asked only that the pages exist (msync), and registered read-only memory.
TEST_F(Rules, HostRegistrationNeedsAWritableMapping)
{
	const unsigned flags = CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE;
	Pages readable(2, PROT_READ);
	EXPECT_EQ(cu().cuMemHostRegister(readable.data(), 2 * Pages::page(), flags), CUDA_ERROR_INVALID_VALUE);
	EXPECT_EQ(cu().cuMemHostRegister(readable.data() + 100, 8, flags), CUDA_ERROR_INVALID_VALUE)
		<< "a word of a read-only page";

	Pages none(1, PROT_NONE);
	EXPECT_EQ(cu().cuMemHostRegister(none.data(), Pages::page(), flags), CUDA_ERROR_INVALID_VALUE);
	EXPECT_EQ(cu().cuMemHostRegister(none.data(), Pages::page(), flags | CU_MEMHOSTREGISTER_READ_ONLY),
		  CUDA_ERROR_INVALID_VALUE);

	// One writable page, then one made read-only: the range as a whole is refused.
	Pages mixed(2);
	ASSERT_EQ(mprotect(mixed.at(1), Pages::page(), PROT_READ), 0);
	EXPECT_EQ(cu().cuMemHostRegister(mixed.data(), 2 * Pages::page(), flags), CUDA_ERROR_INVALID_VALUE);
	ASSERT_EQ(cu().cuMemHostRegister(mixed.data(), Pages::page(), flags), CUDA_SUCCESS) << "the writable page";
	EXPECT_EQ(cu().cuMemHostUnregister(mixed.data()), CUDA_SUCCESS);

	// READ_ONLY (this device has CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED)
	// registers read-only memory, which streams may read and not write.
	int read_only = 0;
	ASSERT_EQ(cu().cuDeviceGetAttribute(&read_only, CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED, 0),
		  CUDA_SUCCESS);
	ASSERT_EQ(read_only, 1);
	ASSERT_EQ(cu().cuMemHostRegister(readable.data(), 2 * Pages::page(), flags | CU_MEMHOSTREGISTER_READ_ONLY),
		  CUDA_SUCCESS);
	CUdeviceptr word = 0;
	ASSERT_EQ(cu().cuMemHostGetDevicePointer(&word, readable.data(), 0), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuStreamWaitValue64(stream_, word, 0, CU_STREAM_WAIT_VALUE_GEQ), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuStreamSynchronize(stream_), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuMemHostUnregister(readable.data()), CUDA_SUCCESS);

	// A file mapped shared and read-only, as a pool segment opened O_RDONLY would be.
	int fd = memfd_create("rules-readonly", MFD_CLOEXEC);
	ASSERT_GE(fd, 0);
	ASSERT_EQ(ftruncate(fd, off_t(Pages::page())), 0);
	void *shared = mmap(nullptr, Pages::page(), PROT_READ, MAP_SHARED, fd, 0);
	ASSERT_NE(shared, MAP_FAILED);
	EXPECT_EQ(cu().cuMemHostRegister(shared, Pages::page(), flags), CUDA_ERROR_INVALID_VALUE);
	munmap(shared, Pages::page());
	shared = mmap(nullptr, Pages::page(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	ASSERT_NE(shared, MAP_FAILED);
	EXPECT_EQ(cu().cuMemHostRegister(shared, Pages::page(), flags), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuMemHostUnregister(shared), CUDA_SUCCESS);
	munmap(shared, Pages::page());
	close(fd);
}

// Pinning can fail (the kernel will not lock more pages): XMEM_CUDASIM_HOST_PIN_LIMIT makes
// registrations and cuMemAllocHost past it fail with CUDA_ERROR_OUT_OF_MEMORY while the
// device still says it supports host registration. The old simulator ignored the setting.
TEST(HostPinning, RegistrationsPastThePinLimitFail)
{
	std::string limit = std::to_string(3 * Pages::page());
	ChildResult child = run_child("PinLimit", { "XMEM_CUDASIM_HOST_PIN_LIMIT=" + limit });
	EXPECT_TRUE(exited_cleanly(child)) << child.output;
	child = run_child("PinNothing", { "XMEM_CUDASIM_HOST_PIN_LIMIT=0" });
	EXPECT_TRUE(exited_cleanly(child)) << child.output;
}

void push_primary()
{
	CUcontext ctx;
	ASSERT_EQ(cu().cuInit(0), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuCtxPushCurrent(ctx), CUDA_SUCCESS);
}

// Three pages may be pinned: registrations count by whole pages, unregistration and the
// context's destruction give them back, cuMemAllocHost counts too.
TEST(DISABLED_Child, PinLimit)
{
	push_primary();
	const size_t page = Pages::page();
	Pages pages(8);
	ASSERT_EQ(cu().cuMemHostRegister(pages.at(0) + 16, 8, 0), CUDA_SUCCESS) << "one page";
	ASSERT_EQ(cu().cuMemHostRegister(pages.at(1), 2 * page, CU_MEMHOSTREGISTER_DEVICEMAP), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuMemHostRegister(pages.at(4), 8, 0), CUDA_ERROR_OUT_OF_MEMORY);
	void *host = nullptr;
	EXPECT_EQ(cu().cuMemAllocHost(&host, 8), CUDA_ERROR_OUT_OF_MEMORY);
	ASSERT_EQ(cu().cuMemHostUnregister(pages.at(1)), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuMemAllocHost(&host, 8), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuMemHostRegister(pages.at(4), page, 0), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuMemHostRegister(pages.at(6), 8, 0), CUDA_ERROR_OUT_OF_MEMORY);
	ASSERT_EQ(cu().cuMemFreeHost(host), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuMemHostRegister(pages.at(6), 8, 0), CUDA_SUCCESS);

	// The primary context's destruction drops its registrations and their pins.
	CUcontext popped;
	ASSERT_EQ(cu().cuCtxPopCurrent(&popped), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
	push_primary();
	EXPECT_EQ(cu().cuMemHostRegister(pages.at(0), 3 * page, 0), CUDA_SUCCESS);
}

TEST(DISABLED_Child, PinNothing)
{
	push_primary();
	int supported = 0;
	ASSERT_EQ(cu().cuDeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED, 0), CUDA_SUCCESS);
	EXPECT_EQ(supported, 1) << "the device supports it; pinning fails";
	Pages pages(1);
	EXPECT_EQ(cu().cuMemHostRegister(pages.data(), 8, CU_MEMHOSTREGISTER_DEVICEMAP), CUDA_ERROR_OUT_OF_MEMORY);
	void *host = nullptr;
	EXPECT_EQ(cu().cuMemAllocHost(&host, 4096), CUDA_ERROR_OUT_OF_MEMORY);
}

// --- registrations seen by several contexts -------------------------------------------

// A registration is one per range, whichever context asks: a second one, from another
// device's context too, is CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED. Without PORTABLE it
// is pinned for its own context only: another context gets no device address and its
// streams fault on the first one's; with PORTABLE every context gets one and uses it.
TEST(HostPinning, RegistrationsAreSharedAcrossContextsOnlyWhenPortable)
{
	ChildResult child = run_child("PortableAcrossDevices", { "XMEM_CUDASIM_DEVICES=2" });
	EXPECT_TRUE(exited_cleanly(child)) << child.output;
}

TEST(DISABLED_Child, PortableAcrossDevices)
{
	ASSERT_EQ(cu().cuInit(0), CUDA_SUCCESS);
	CUcontext ctx[2];
	CUstream stream[2];
	for (int d = 0; d < 2; d++) {
		ASSERT_EQ(cu().cuDevicePrimaryCtxRetain(&ctx[d], d), CUDA_SUCCESS);
		ASSERT_EQ(cu().cuCtxPushCurrent(ctx[d]), CUDA_SUCCESS);
		ASSERT_EQ(cu().cuStreamCreate(&stream[d], CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
		CUcontext popped;
		ASSERT_EQ(cu().cuCtxPopCurrent(&popped), CUDA_SUCCESS);
	}
	auto on = [&](int d, auto f) {
		EXPECT_EQ(cu().cuCtxPushCurrent(ctx[d]), CUDA_SUCCESS);
		f();
		CUcontext popped;
		EXPECT_EQ(cu().cuCtxPopCurrent(&popped), CUDA_SUCCESS);
	};
	Pages plain(1), portable(1);
	auto *plain_word = reinterpret_cast<uint64_t *>(plain.data());
	auto *portable_word = reinterpret_cast<uint64_t *>(portable.data());
	CUdeviceptr plain_dev = 0, portable_dev[2] = {};
	on(0, [&] {
		ASSERT_EQ(cu().cuMemHostRegister(plain.data(), 8, CU_MEMHOSTREGISTER_DEVICEMAP), CUDA_SUCCESS);
		ASSERT_EQ(cu().cuMemHostGetDevicePointer(&plain_dev, plain.data(), 0), CUDA_SUCCESS);
		ASSERT_EQ(cu().cuMemHostRegister(portable.data(), 8,
						 CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE),
			  CUDA_SUCCESS);
		ASSERT_EQ(cu().cuMemHostGetDevicePointer(&portable_dev[0], portable.data(), 0), CUDA_SUCCESS);
	});
	on(1, [&] {
		EXPECT_EQ(cu().cuMemHostRegister(portable.data(), 8,
						 CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE),
			  CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED)
			<< "registered once, for every context";
		CUdeviceptr none = 0;
		EXPECT_EQ(cu().cuMemHostGetDevicePointer(&none, plain.data(), 0), CUDA_ERROR_INVALID_VALUE);
		ASSERT_EQ(cu().cuMemHostGetDevicePointer(&portable_dev[1], portable.data(), 0), CUDA_SUCCESS);
		ASSERT_EQ(cu().cuStreamWriteValue64(stream[1], portable_dev[1], 7, 0), CUDA_SUCCESS);
		ASSERT_EQ(cu().cuStreamSynchronize(stream[1]), CUDA_SUCCESS);
		EXPECT_EQ(*portable_word, 7u) << "device 1's stream wrote the portable word";
		// Device 1's stream on device 0's non-portable registration: an illegal address.
		ASSERT_EQ(cu().cuStreamWriteValue64(stream[1], plain_dev, 7, 0), CUDA_SUCCESS);
		EXPECT_EQ(cu().cuStreamSynchronize(stream[1]), CUDA_ERROR_ILLEGAL_ADDRESS);
		EXPECT_EQ(*plain_word, 0u);
	});
	on(0, [&] {
		ASSERT_EQ(cu().cuStreamWriteValue64(stream[0], plain_dev, 9, 0), CUDA_SUCCESS);
		ASSERT_EQ(cu().cuStreamSynchronize(stream[0]), CUDA_SUCCESS);
		EXPECT_EQ(*plain_word, 9u) << "its own context's stream";
		EXPECT_EQ(cu().cuMemHostUnregister(plain.data()), CUDA_SUCCESS);
		EXPECT_EQ(cu().cuMemHostUnregister(portable.data()), CUDA_SUCCESS);
	});
}

// --- stream memory operation flags -----------------------------------------------------

// A registered page whose first word is 1: every wait condition with value 1 (GEQ, EQ, AND,
// NOR) holds at once, so a wait that is accepted never stalls the stream.
class WordPage
{
public:
	WordPage() : page_(1)
	{
		*reinterpret_cast<uint64_t *>(page_.data()) = 1;
		EXPECT_EQ(cu().cuMemHostRegister(page_.data(), Pages::page(), CU_MEMHOSTREGISTER_DEVICEMAP),
			  CUDA_SUCCESS);
		EXPECT_EQ(cu().cuMemHostGetDevicePointer(&word_, page_.data(), 0), CUDA_SUCCESS);
	}
	~WordPage() { cu().cuMemHostUnregister(page_.data()); }
	CUdeviceptr word() const { return word_; }

private:
	Pages page_;
	CUdeviceptr word_ = 0;
};

// cuda.h 13 defines CUstreamWaitValue_flags (GEQ, EQ, AND, NOR, each optionally with FLUSH)
// and CUstreamWriteValue_flags (DEFAULT, NO_MEMORY_BARRIER); the _v2 entry points refuse
// any other value with CUDA_ERROR_INVALID_VALUE.
TEST_F(Rules, StreamMemoryOperationsTakeOnlyTheFlagsCudaHDefines)
{
	WordPage page;
	std::vector<unsigned> values{ 4, 5, 7, 0x10, 0x100, 0x8000, 1u << 29, 1u << 31, ~0u };
	for (unsigned condition = 0; condition < 4; condition++) {
		values.push_back(condition);
		values.push_back(condition | CU_STREAM_WAIT_VALUE_FLUSH);
		values.push_back(condition | 0x100);
		values.push_back(condition | (1u << 31));
	}
	for (unsigned flags : values) {
		bool known = (flags & ~unsigned(CU_STREAM_WAIT_VALUE_FLUSH)) <= CU_STREAM_WAIT_VALUE_NOR;
		EXPECT_EQ(cu().cuStreamWaitValue64(stream_, page.word(), 1, flags),
			  known ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE)
			<< "wait flags 0x" << std::hex << flags;
		bool write_known =
			flags == CU_STREAM_WRITE_VALUE_DEFAULT || flags == CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER;
		EXPECT_EQ(cu().cuStreamWriteValue64(stream_, page.word(), 1, flags),
			  write_known ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE)
			<< "write flags 0x" << std::hex << flags;
	}
	EXPECT_EQ(cu().cuStreamSynchronize(stream_), CUDA_SUCCESS);

	// Both attributes that say whether NOR is supported answer (the old simulator knew only
	// the current one); this device has NOR and FLUSH.
	for (CUdevice_attribute a :
	     { CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR, CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR_V1,
	       CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES }) {
		int value = -1;
		EXPECT_EQ(cu().cuDeviceGetAttribute(&value, a, 0), CUDA_SUCCESS) << "attribute " << int(a);
		EXPECT_EQ(value, 1) << "attribute " << int(a);
	}
}

// CU_STREAM_WAIT_VALUE_FLUSH and CU_STREAM_WAIT_VALUE_NOR each need their device attribute
// (x86 platforms commonly lack the flush): XMEM_CUDASIM_FAIL=no_flush and no_wait_nor make
// a device without them, where the flag is refused and the other operations still work. The
// old simulator could not describe such a device.
TEST(MemopCapabilities, FlushAndNorNeedTheirAttributes)
{
	for (const char *words : { "no_flush", "no_wait_nor", "no_flush,no_wait_nor" }) {
		ChildResult child = run_child("MemopCapabilities", { std::string("XMEM_CUDASIM_FAIL=") + words });
		EXPECT_TRUE(exited_cleanly(child)) << words << ":\n" << child.output;
	}
}

TEST(DISABLED_Child, MemopCapabilities)
{
	const std::string words = std::getenv("XMEM_CUDASIM_FAIL");
	bool flush = words.find("no_flush") == std::string::npos;
	bool nor = words.find("no_wait_nor") == std::string::npos;
	push_primary();
	auto attribute = [](CUdevice_attribute a) {
		int value = -1;
		EXPECT_EQ(cu().cuDeviceGetAttribute(&value, a, 0), CUDA_SUCCESS);
		return value;
	};
	EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS), 1);
	EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES), int(flush));
	EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR), int(nor));
	EXPECT_EQ(attribute(CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR_V1), int(nor));

	CUstream stream;
	ASSERT_EQ(cu().cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	{
		WordPage page;
		for (unsigned condition : { CU_STREAM_WAIT_VALUE_GEQ, CU_STREAM_WAIT_VALUE_EQ, CU_STREAM_WAIT_VALUE_AND,
					    CU_STREAM_WAIT_VALUE_NOR }) {
			bool supported = condition != CU_STREAM_WAIT_VALUE_NOR || nor;
			EXPECT_EQ(cu().cuStreamWaitValue64(stream, page.word(), 1, condition),
				  supported ? CUDA_SUCCESS : CUDA_ERROR_NOT_SUPPORTED)
				<< "condition " << condition;
			EXPECT_EQ(cu().cuStreamWaitValue64(stream, page.word(), 1,
							   condition | CU_STREAM_WAIT_VALUE_FLUSH),
				  supported && flush ? CUDA_SUCCESS : CUDA_ERROR_NOT_SUPPORTED)
				<< "condition " << condition << " with FLUSH";
		}
		EXPECT_EQ(cu().cuStreamWaitValue64(stream, page.word(), 1, 0x10), CUDA_ERROR_INVALID_VALUE);
		EXPECT_EQ(cu().cuStreamWriteValue64(stream, page.word(), 1, CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER),
			  CUDA_SUCCESS);
		EXPECT_EQ(cu().cuStreamSynchronize(stream), CUDA_SUCCESS);
	}
	EXPECT_EQ(cu().cuStreamDestroy(stream), CUDA_SUCCESS);
}

// --- VMM granularity and alignment ------------------------------------------------------

CUmemAllocationProp device_prop()
{
	CUmemAllocationProp prop = {};
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = 0;
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	return prop;
}

// Reservations are aligned as asked (0: to the minimum granularity) and never more, so code
// that leans on the alignment the kernel happens to give fails; an alignment that is not a
// multiple of the minimum granularity is refused (cuda.h says only "a power of two", and
// cuMemMap needs the granularity). The old simulator took 4096 and gave whatever alignment
// mmap gave, often more.
void check_reservations(size_t minimum)
{
	for (size_t alignment : { size_t(0), minimum, 4 * minimum }) {
		size_t want = std::max(alignment, minimum);
		std::vector<CUdeviceptr> reserved;
		for (int i = 0; i < 8; i++) {
			CUdeviceptr va = 0;
			ASSERT_EQ(cu().cuMemAddressReserve(&va, 2 * minimum, alignment, 0, 0), CUDA_SUCCESS);
			EXPECT_EQ(va % want, 0u) << "alignment " << alignment;
			EXPECT_NE(va % (2 * want), 0u) << "alignment " << alignment << ": aligned to twice it";
			reserved.push_back(va);
		}
		for (CUdeviceptr va : reserved)
			EXPECT_EQ(cu().cuMemAddressFree(va, 2 * minimum), CUDA_SUCCESS);
	}
	CUdeviceptr va = 0;
	EXPECT_EQ(cu().cuMemAddressReserve(&va, minimum, 4096, 0, 0), CUDA_ERROR_INVALID_VALUE);
	EXPECT_EQ(cu().cuMemAddressReserve(&va, minimum, minimum / 2, 0, 0), CUDA_ERROR_INVALID_VALUE);
	EXPECT_EQ(cu().cuMemAddressReserve(&va, minimum, 3 * minimum, 0, 0), CUDA_ERROR_INVALID_VALUE);
	EXPECT_EQ(cu().cuMemAddressReserve(&va, minimum + 4096, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
}

TEST_F(Rules, ReservationsAreAlignedAsAskedAndNoMore)
{
	check_reservations(granularity);
}

// The minimum and the recommended granularity differ (XMEM_CUDASIM_RECOMMENDED_GRANULARITY):
// sizes, mapping addresses and offsets need only the minimum. The old simulator answered its
// one granularity for both.
TEST(Granularity, MinimumAndRecommendedDiffer)
{
	ChildResult child = run_child("Granularity",
				      { "XMEM_CUDASIM_GRANULARITY=64k", "XMEM_CUDASIM_RECOMMENDED_GRANULARITY=256k" });
	EXPECT_TRUE(exited_cleanly(child)) << child.output;
}

TEST(DISABLED_Child, Granularity)
{
	constexpr size_t minimum = 64 * 1024, recommended = 256 * 1024;
	push_primary();
	CUmemAllocationProp prop = device_prop();
	size_t g = 0;
	EXPECT_EQ(cu().cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), CUDA_SUCCESS);
	EXPECT_EQ(g, minimum);
	EXPECT_EQ(cu().cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED), CUDA_SUCCESS);
	EXPECT_EQ(g, recommended);
	check_reservations(minimum);

	CUmemGenericAllocationHandle h = 0, bad = 0;
	EXPECT_EQ(cu().cuMemCreate(&bad, minimum + 4096, &prop, 0), CUDA_ERROR_INVALID_VALUE);
	ASSERT_EQ(cu().cuMemCreate(&h, 2 * minimum, &prop, 0), CUDA_SUCCESS) << "a multiple of the minimum";
	CUdeviceptr va = 0;
	ASSERT_EQ(cu().cuMemAddressReserve(&va, 4 * minimum, 0, 0, 0), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuMemMap(va + 4096, minimum, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
	EXPECT_EQ(cu().cuMemMap(va, minimum + 4096, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
	EXPECT_EQ(cu().cuMemMap(va, minimum, 4096, h, 0), CUDA_ERROR_INVALID_VALUE);
	ASSERT_EQ(cu().cuMemMap(va + minimum, 2 * minimum, 0, h, 0), CUDA_SUCCESS);
	CUmemAccessDesc access = {};
	access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	access.location.id = 0;
	access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	EXPECT_EQ(cu().cuMemSetAccess(va + minimum, 2 * minimum, &access, 1), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuMemUnmap(va + minimum, 2 * minimum), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuMemAddressFree(va, 4 * minimum), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuMemRelease(h), CUDA_SUCCESS);
}

// --- compute modes ------------------------------------------------------------------------

// A private directory for the simulated machine's lock files, removed at the end.
class StateDir
{
public:
	StateDir()
	{
		char tmpl[] = "/tmp/cudasim-rules-XXXXXX";
		EXPECT_NE(mkdtemp(tmpl), nullptr);
		path_ = tmpl;
	}
	~StateDir() { std::system(("rm -rf '" + path_ + "'").c_str()); }
	std::string env() const { return "XMEM_CUDASIM_STATE_DIR=" + path_; }

private:
	std::string path_;
};

int compute_mode(CUdevice dev)
{
	int mode = -1;
	EXPECT_EQ(cu().cuDeviceGetAttribute(&mode, CU_DEVICE_ATTRIBUTE_COMPUTE_MODE, dev), CUDA_SUCCESS);
	return mode;
}

// XMEM_CUDASIM_DEVICES gives each device a compute mode. EXCLUSIVE_PROCESS: one context on
// the device in the whole machine (CUDA C++ Programming Guide, "Compute Modes"), so another
// context of this process, or any in another process, is CUDA_ERROR_DEVICE_UNAVAILABLE until
// it goes; PROHIBITED: none at all. The old simulator read only a number of devices.
TEST(ComputeMode, ExclusiveProcessAllowsOneContextOnTheMachine)
{
	StateDir dir;
	ChildResult child = run_child("ExclusiveHolder",
				      { "XMEM_CUDASIM_DEVICES=default,exclusive_process,prohibited", dir.env() });
	EXPECT_TRUE(exited_cleanly(child)) << child.output;
}

// Checks, in a new process, whether the exclusive device 1 is free (CUDASIM_RULES_FREE=1).
void expect_other_process(bool free)
{
	ChildResult other = run_child("ExclusiveOther", { std::string("CUDASIM_RULES_FREE=") + (free ? "1" : "0") });
	EXPECT_TRUE(exited_cleanly(other)) << (free ? "free" : "busy") << ":\n" << other.output;
}

TEST(DISABLED_Child, ExclusiveHolder)
{
	ASSERT_EQ(cu().cuInit(0), CUDA_SUCCESS);
	EXPECT_EQ(compute_mode(0), CU_COMPUTEMODE_DEFAULT);
	EXPECT_EQ(compute_mode(1), CU_COMPUTEMODE_EXCLUSIVE_PROCESS);
	EXPECT_EQ(compute_mode(2), CU_COMPUTEMODE_PROHIBITED);
	CUcontext primary, again, created;
	EXPECT_EQ(cu().cuDevicePrimaryCtxRetain(&primary, 2), CUDA_ERROR_DEVICE_UNAVAILABLE);
	EXPECT_EQ(cu().cuCtxCreate_v2(&created, 0, 2), CUDA_ERROR_DEVICE_UNAVAILABLE);
	expect_other_process(true);

	// The primary context is the one context: retaining it again shares it, a created
	// context would be a second one.
	ASSERT_EQ(cu().cuDevicePrimaryCtxRetain(&primary, 1), CUDA_SUCCESS);
	ASSERT_EQ(cu().cuDevicePrimaryCtxRetain(&again, 1), CUDA_SUCCESS);
	EXPECT_EQ(again, primary);
	EXPECT_EQ(cu().cuCtxCreate_v2(&created, 0, 1), CUDA_ERROR_DEVICE_UNAVAILABLE);
	expect_other_process(false);
	EXPECT_EQ(cu().cuDevicePrimaryCtxRelease(1), CUDA_SUCCESS);
	expect_other_process(false);
	EXPECT_EQ(cu().cuDevicePrimaryCtxRelease(1), CUDA_SUCCESS);
	expect_other_process(true);

	// A created context holds the device the same way, until cuCtxDestroy.
	ASSERT_EQ(cu().cuCtxCreate_v2(&created, 0, 1), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuDevicePrimaryCtxRetain(&primary, 1), CUDA_ERROR_DEVICE_UNAVAILABLE);
	expect_other_process(false);
	EXPECT_EQ(cu().cuCtxDestroy(created), CUDA_SUCCESS);
	expect_other_process(true);

	// Another device is not held.
	ASSERT_EQ(cu().cuCtxCreate_v2(&created, 0, 0), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuDevicePrimaryCtxRetain(&primary, 0), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuCtxDestroy(created), CUDA_SUCCESS);
}

TEST(DISABLED_Child, ExclusiveOther)
{
	bool free = std::string(std::getenv("CUDASIM_RULES_FREE")) == "1";
	ASSERT_EQ(cu().cuInit(0), CUDA_SUCCESS);
	CUcontext ctx;
	CUresult want = free ? CUDA_SUCCESS : CUDA_ERROR_DEVICE_UNAVAILABLE;
	EXPECT_EQ(cu().cuDevicePrimaryCtxRetain(&ctx, 1), want);
	if (free) {
		EXPECT_EQ(cu().cuDevicePrimaryCtxRelease(1), CUDA_SUCCESS);
	}
	CUcontext created;
	EXPECT_EQ(cu().cuCtxCreate_v2(&created, 0, 1), want);
	if (free) {
		EXPECT_EQ(cu().cuCtxDestroy(created), CUDA_SUCCESS);
	}
	// The default device stays usable.
	ASSERT_EQ(cu().cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS);
	EXPECT_EQ(cu().cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
}

// A process that dies holding the device frees it (the kernel drops its lock).
TEST(ComputeMode, AnExclusiveDeviceIsFreedWhenItsHolderDies)
{
	StateDir dir;
	ChildResult child = run_child("ExclusiveDies", { "XMEM_CUDASIM_DEVICES=default,exclusive_process", dir.env() });
	EXPECT_FALSE(exited_cleanly(child)) << child.output;
	child = run_child("ExclusiveOther",
			  { "XMEM_CUDASIM_DEVICES=default,exclusive_process", dir.env(), "CUDASIM_RULES_FREE=1" });
	EXPECT_TRUE(exited_cleanly(child)) << child.output;
}

TEST(DISABLED_Child, ExclusiveDies)
{
	ASSERT_EQ(cu().cuInit(0), CUDA_SUCCESS);
	CUcontext ctx;
	ASSERT_EQ(cu().cuDevicePrimaryCtxRetain(&ctx, 1), CUDA_SUCCESS);
	std::_Exit(3);
}

// --- MIG devices -------------------------------------------------------------------------

std::string hex_uuid(const CUuuid &uuid)
{
	static constexpr char hex[] = "0123456789abcdef";
	std::string s;
	for (int i = 0; i < 16; i++) {
		if (i == 4 || i == 6 || i == 8 || i == 10)
			s += '-';
		auto byte = static_cast<unsigned char>(uuid.bytes[i]);
		s += hex[byte >> 4];
		s += hex[byte & 0xf];
	}
	return s;
}

// What a process sees of the machine default,mig:2,default: per ordinal its name, its UUID
// (cuDeviceGetUuid_v2, without the GPU- or MIG- a tool would print), the first version's
// UUID and its PCI bus.
struct Seen {
	std::string name, uuid, v1;
	int bus = -1;
};

std::vector<Seen> probe(const std::string &visible)
{
	std::vector<std::string> env{ "XMEM_CUDASIM_DEVICES=default,mig:2,default" };
	env.push_back(visible == "unset" ? "CUDA_VISIBLE_DEVICES" : "CUDA_VISIBLE_DEVICES=" + visible);
	ChildResult child = run_child("MigProbe", env);
	EXPECT_TRUE(exited_cleanly(child)) << visible << ":\n" << child.output;
	std::vector<Seen> seen;
	for (size_t at = child.output.find("seen|"); at != std::string::npos; at = child.output.find("seen|", at + 1)) {
		std::string line = child.output.substr(at + 5, child.output.find('\n', at) - at - 5);
		Seen d;
		std::vector<std::string> fields;
		for (size_t start = 0; start <= line.size();) {
			size_t bar = std::min(line.find('|', start), line.size());
			fields.push_back(line.substr(start, bar - start));
			start = bar + 1;
		}
		if (fields.size() == 4) {
			d.name = fields[0];
			d.uuid = fields[1];
			d.v1 = fields[2];
			d.bus = std::atoi(fields[3].c_str());
		}
		seen.push_back(d);
	}
	return seen;
}

std::vector<std::string> names(const std::vector<Seen> &seen)
{
	std::vector<std::string> out;
	for (const Seen &d : seen)
		out.push_back(d.name);
	return out;
}

TEST(DISABLED_Child, MigProbe)
{
	CUresult init = cu().cuInit(0);
	if (init == CUDA_ERROR_NO_DEVICE)
		return;
	ASSERT_EQ(init, CUDA_SUCCESS);
	ASSERT_NE(cu().cuDeviceGetUuid_v1, nullptr) << "the first cuDeviceGetUuid is exported";
	int count = 0;
	ASSERT_EQ(cu().cuDeviceGetCount(&count), CUDA_SUCCESS);
	for (int ordinal = 0; ordinal < count; ordinal++) {
		char name[128] = {};
		CUuuid v2{}, v1{};
		int bus = -1;
		ASSERT_EQ(cu().cuDeviceGetName(name, sizeof(name), ordinal), CUDA_SUCCESS);
		ASSERT_EQ(cu().cuDeviceGetUuid(&v2, ordinal), CUDA_SUCCESS);
		ASSERT_EQ(cu().cuDeviceGetUuid_v1(&v1, ordinal), CUDA_SUCCESS);
		ASSERT_EQ(cu().cuDeviceGetAttribute(&bus, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, ordinal), CUDA_SUCCESS);
		std::printf("seen|%s|%s|%s|%d\n", name, hex_uuid(v2).c_str(), hex_uuid(v1).c_str(), bus);
		// A context works on it.
		CUcontext ctx;
		ASSERT_EQ(cu().cuDevicePrimaryCtxRetain(&ctx, ordinal), CUDA_SUCCESS);
		EXPECT_EQ(cu().cuDevicePrimaryCtxRelease(ordinal), CUDA_SUCCESS);
	}
}

// XMEM_CUDASIM_DEVICES=mig:N puts a GPU in MIG mode with N MIG devices. CUDA sees only MIG
// devices of it, one at most per process and no GPU beside it (NVIDIA's MIG user guide, "CUDA
// Device Enumeration"); cuDeviceGetUuid_v2 answers the MIG device's own UUID ("If the device
// is in MIG mode, returns its MIG UUID", cuda.h), the first version its GPU's. In
// CUDA_VISIBLE_DEVICES, MIG-<uuid> and MIG-GPU-<uuid>/<gi>/<ci> name one; an index or GPU- UUID
// of a GPU in MIG mode names nothing (not documented: strict). The old simulator read only a
// number of devices.
TEST(Mig, MigDevicesAreSeenAsTheDriverShowsThem)
{
	const std::string mig0 = "xmem cudasim device 1 MIG 0", mig1 = "xmem cudasim device 1 MIG 1";
	const std::string gpu0 = "xmem cudasim device 0", gpu2 = "xmem cudasim device 2";

	// Without CUDA_VISIBLE_DEVICES: the first MIG device alone.
	std::vector<Seen> seen = probe("unset");
	ASSERT_EQ(names(seen), std::vector<std::string>{ mig0 });
	std::string mig0_uuid = seen[0].uuid, gpu1_uuid = seen[0].v1;
	EXPECT_NE(mig0_uuid, gpu1_uuid) << "the MIG device's UUID is its own";
	EXPECT_EQ(seen[0].bus, 0x11) << "its GPU's PCI bus";

	// The older form, by the GPU's UUID and the GPU and compute instance ids.
	seen = probe("MIG-GPU-" + gpu1_uuid + "/2/0");
	ASSERT_EQ(names(seen), std::vector<std::string>{ mig1 });
	std::string mig1_uuid = seen[0].uuid;
	EXPECT_EQ(seen[0].v1, gpu1_uuid);

	seen = probe("2,0");
	ASSERT_EQ(names(seen), (std::vector<std::string>{ gpu2, gpu0 }));
	EXPECT_EQ(seen[0].uuid, seen[0].v1) << "a GPU's UUID, both versions";
	std::string gpu0_uuid = seen[1].uuid;

	EXPECT_EQ(names(probe("MIG-" + mig1_uuid)), std::vector<std::string>{ mig1 });
	EXPECT_EQ(names(probe("MIG-" + mig0_uuid)), std::vector<std::string>{ mig0 });
	// No GPU beside a MIG device, and one MIG device at most.
	EXPECT_EQ(names(probe("0,MIG-" + mig1_uuid + ",2")), std::vector<std::string>{ mig1 });
	EXPECT_EQ(names(probe("MIG-" + mig1_uuid + ",MIG-" + mig0_uuid)), std::vector<std::string>{ mig1 });
	// A GPU in MIG mode is no CUDA device: the list ends there.
	EXPECT_TRUE(probe("1").empty());
	EXPECT_EQ(names(probe("0,1,2")), std::vector<std::string>{ gpu0 });
	EXPECT_TRUE(probe("GPU-" + gpu1_uuid).empty());
	EXPECT_EQ(names(probe("GPU-" + gpu0_uuid + ",MIG-" + mig0_uuid)), std::vector<std::string>{ mig0 });
	// A MIG device by its whole UUID only; the older form by the GPU's whole UUID and ids
	// that exist. A MIG UUID is never a GPU's.
	EXPECT_TRUE(probe("MIG-" + mig1_uuid.substr(0, 13)).empty());
	EXPECT_TRUE(probe("MIG-GPU-" + gpu1_uuid.substr(0, 8) + "/2/0").empty());
	EXPECT_TRUE(probe("MIG-GPU-" + gpu1_uuid + "/3/0").empty());
	EXPECT_TRUE(probe("MIG-GPU-" + gpu1_uuid + "/2/0x").empty());
	EXPECT_TRUE(probe("GPU-" + mig1_uuid).empty());
	EXPECT_TRUE(probe("MIG-" + gpu0_uuid).empty());
}

} // namespace
