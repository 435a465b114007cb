// cudasim.hpp - internal state of the CUDA driver simulator (libcuda.so.1 for tests).
// A strict test double that proves xmem's logic, not the real driver's behaviour.
#pragma once

// Every cu* function defined by the simulator matches a declaration in cuda.h, which also
// renames it to its ABI name (cuMemHostRegister -> cuMemHostRegister_v2). Declaring them
// with default visibility in a module built with hidden visibility exports exactly those.
#pragma GCC visibility push(default)
#include <cuda.h>

// cuda.h 13 renames cuCtxCreate to cuCtxCreate_v4 and no longer declares the flags-only
// cuCtxCreate_v2, which callers built against older headers (GStreamer 1.22) load by name.
extern "C" CUresult CUDAAPI cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
// The same callers load cuStreamDestroy by its unversioned name, which cuda.h renames
// wherever it appears: the symbol is defined under another C++ name.
extern "C" CUresult CUDAAPI cuStreamDestroy_v1(CUstream hStream) __asm__("cuStreamDestroy");
// FFmpeg's loader (ffnvcodec) loads these three by their unversioned names too: the v1 ABI,
// which the real driver still exports beside the _v2 that cuda.h names.
extern "C" CUresult CUDAAPI cuDevicePrimaryCtxRelease_v1(CUdevice dev) __asm__("cuDevicePrimaryCtxRelease");
extern "C" CUresult CUDAAPI cuDevicePrimaryCtxSetFlags_v1(CUdevice dev,
							  unsigned int flags) __asm__("cuDevicePrimaryCtxSetFlags");
extern "C" CUresult CUDAAPI cuDevicePrimaryCtxReset_v1(CUdevice dev) __asm__("cuDevicePrimaryCtxReset");
// cuda.h maps cuDeviceGetUuid to _v2; the real driver still exports the first version.
extern "C" CUresult CUDAAPI cuDeviceGetUuid_v1(CUuuid *uuid, CUdevice dev) __asm__("cuDeviceGetUuid");
// cuIpcOpenMemHandle's first ABI, which GStreamer's CUDA library loads by that name; cuda.h
// renames the call to _v2, which takes its arguments the same way.
extern "C" CUresult CUDAAPI cuIpcOpenMemHandle_v1(CUdeviceptr *pdptr, CUipcMemHandle handle,
						  unsigned int Flags) __asm__("cuIpcOpenMemHandle");
#pragma GCC visibility pop

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <set>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

namespace cudasim {

// XMEM_CUDASIM_FAIL words: each makes one capability missing or one call fail.
struct FailSwitches {
	bool init = false;
	bool no_vmm = false;
	bool no_posix_fd = false;
	bool no_memops = false;
	bool no_flush = false; // CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES is 0
	bool no_wait_nor = false; // CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR is 0
	bool no_host_register = false;
	bool alloc = false;
	bool prohibited = false;
};

// One device of the simulated machine, as XMEM_CUDASIM_DEVICES describes it and nvidia-smi -L
// would list it: a GPU, or a MIG device (a compute instance of a GPU instance) of a GPU in
// MIG mode.
struct MachineDevice {
	int gpu = 0; // the GPU's number on the machine, nvidia-smi's index
	int mig = -1; // the MIG device's index on its GPU; -1 for the GPU itself
	int gpu_instance = 0; // a MIG device's GI and CI ids (MIG-GPU-<uuid>/<gi>/<ci>)
	int compute_instance = 0;
	int mig_devices = 0; // a GPU in MIG mode: how many MIG devices it has (CUDA uses only those)
	CUcomputemode compute_mode = CU_COMPUTEMODE_DEFAULT;
};

struct Config {
	// The simulated machine's GPUs (XMEM_CUDASIM_DEVICES), numbered 0..physical-1 as
	// nvidia-smi would; its devices, the GPUs first, then the MIG devices; the ones this
	// process sees (indices into machine), in its ordinal order (CUDA_VISIBLE_DEVICES,
	// honoured when XMEM_CUDASIM_DEVICES is set); their count.
	int physical = 1;
	std::vector<MachineDevice> machine{ MachineDevice{} };
	std::vector<int> visible{ 0 };
	int devices = 1;
	// Where processes of the simulated machine meet: the lock files of devices in
	// EXCLUSIVE_PROCESS compute mode (XMEM_CUDASIM_STATE_DIR).
	std::string state_dir;
	uint64_t memory = uint64_t(1) << 30;
	uint64_t granularity = uint64_t(2) << 20; // CU_MEM_ALLOC_GRANULARITY_MINIMUM
	// CU_MEM_ALLOC_GRANULARITY_RECOMMENDED (XMEM_CUDASIM_RECOMMENDED_GRANULARITY): a power-of-two
	// multiple of granularity, equal to it unless set.
	uint64_t recommended_granularity = uint64_t(2) << 20;
	uint64_t delay_us = 300;
	uint64_t seed = 0;
	// Host memory the process may page-lock (XMEM_CUDASIM_HOST_PIN_LIMIT): registrations
	// and cuMemAllocHost past it fail with CUDA_ERROR_OUT_OF_MEMORY.
	uint64_t pin_limit = UINT64_MAX;
	// Whether every two GPUs of the machine are peers (XMEM_CUDASIM_PEER=all):
	// cuDeviceCanAccessPeer says 1 for them, and cuMemSetAccess and cuCtxEnablePeerAccess
	// accept a peer. By default (none) no device reaches another's memory.
	bool peer = false;
	bool verbose = false;
	FailSwitches fail;
};

// Reads the XMEM_CUDASIM_* variables. A malformed value or an unknown XMEM_CUDASIM_FAIL
// word prints why and aborts: a typo in a test must not silently test nothing.
Config read_config();

// cuDeviceCanAccessPeer(dev, peer) of ordinals this process sees: only with
// XMEM_CUDASIM_PEER=all, never for a device and itself, nor for a MIG device (NVIDIA's MIG
// user guide: GPU-to-GPU P2P is not supported).
bool can_access_peer(const Config &config, int dev, int peer);

// The UUID of the simulated machine's GPU PHYSICAL: the same in every process, whatever
// ordinal CUDA_VISIBLE_DEVICES gives it there.
CUuuid physical_uuid(int physical);
// A device's UUID (cuDeviceGetUuid_v2): its GPU's, or its own for a MIG device.
CUuuid machine_uuid(const MachineDevice &device);
// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi -L and CUDA_VISIBLE_DEVICES write it.
std::string format_uuid(const CUuuid &uuid, const char *prefix = "GPU-");
// A device's UUID as nvidia-smi -L writes it: "GPU-…", or "MIG-…" for a MIG device.
std::string machine_uuid_text(const MachineDevice &device);

// The bytes of one allocation: a memfd, and the simulator's own read-write alias of it.
// Device addresses are PROT_NONE elsewhere; only the simulator touches the bytes, through
// the alias. Lives as long as a handle or a mapping (or an executing operation) holds it.
class Backing
{
public:
	// Takes ownership of fd. usage, when set, is the device's byte count charged for
	// this allocation and refunded by the destructor.
	Backing(int fd, char *alias, size_t size, int device, unsigned handle_types, std::atomic<uint64_t> *usage);
	~Backing();
	Backing(const Backing &) = delete;
	Backing &operator=(const Backing &) = delete;

	int fd() const { return fd_; }
	char *alias() const { return alias_; }
	size_t size() const { return size_; }
	int device() const { return device_; }
	unsigned handle_types() const { return handle_types_; }

private:
	int fd_;
	char *alias_;
	size_t size_;
	int device_;
	unsigned handle_types_;
	std::atomic<uint64_t> *usage_;
};

// A VMM allocation handle: cuMemCreate's or cuMemImportFromShareableHandle's, or one
// cuMemRetainAllocationHandle brought back. Each of those counts one reference, and each
// cuMemRelease takes one; the handle is gone at zero (its mappings keep the memory).
struct Handle {
	std::shared_ptr<Backing> backing;
	unsigned refs = 1;
};

struct Stream;

// A device's primary context, or one made by cuCtxCreate. The objects live for the whole
// process (a CUcontext handle is never reused); "destroyed" means no references are held.
// A destroyed primary context's handle stays valid; a destroyed created context's does not.
struct Context {
	int device = 0;
	bool primary = true;

	// Guarded by State::lock. A created context holds one reference until cuCtxDestroy.
	unsigned refs = 0;
	unsigned flags = 0; // cuCtxCreate's, or cuDevicePrimaryCtxSetFlags'
	// The legacy default stream (0, CU_STREAM_LEGACY) and each thread's per-thread default
	// stream (CU_STREAM_PER_THREAD), made on first use; every stream of the context,
	// these too.
	std::shared_ptr<Stream> legacy_stream;
	std::map<std::thread::id, std::shared_ptr<Stream>> per_thread;
	std::vector<std::weak_ptr<Stream>> streams;
	// cuCtxSetLimit's values, read back by cuCtxGetLimit. Guarded by State::lock.
	std::map<int, size_t> limits;
	// The contexts whose cuMemAlloc memory this one's streams reach: cuCtxEnablePeerAccess,
	// made current here, of each. Guarded by State::lock; dropped with either context.
	std::set<const Context *> peers;

	// Set by a stream worker on an illegal access and read by every call without a lock;
	// cleared when the context is destroyed. reported orders the stderr line before it.
	std::atomic<bool> reported{ false };
	std::atomic<bool> sticky{ false };
};

// One enqueued operation; run() executes on the stream's worker thread.
struct Op {
	const char *name = nullptr;
	std::function<void(Stream &)> run;
	// A host callback runs after an illegal access too, and is told of the error.
	bool runs_after_fault = false;
	// The legacy stream's implicit synchronization, captured when the operation is queued:
	// it starts only once each of these streams has completed the ticket given.
	std::vector<std::pair<std::shared_ptr<Stream>, uint64_t>> after;
};

struct Stream {
	uint64_t id = 0;
	CUstream handle = nullptr;
	Context *ctx = nullptr;
	int device = 0;
	// Blocking streams (made without CU_STREAM_NON_BLOCKING, and the per-thread default
	// streams) synchronize with the context's legacy stream; legacy is that stream.
	bool blocking = true;
	bool legacy = false;

	// Guards the fields below. Never held while an operation runs; taken after
	// State::lock when both are needed.
	std::mutex lock;
	std::condition_variable cv;
	std::deque<Op> queue;
	uint64_t enqueued = 0;
	uint64_t completed = 0;
	bool closing = false;

	// Set when the context is destroyed: remaining work is dropped, waits give up.
	std::atomic<bool> abandoned{ false };
};

// A VA range from cuMemAddressReserve, or (plain) the range behind one cuMemAlloc or one
// cuIpcOpenMemHandle (ipc: closed by cuIpcCloseMemHandle, never by cuMemFree).
struct Reservation {
	size_t size = 0;
	bool plain = false;
	Context *owner = nullptr; // plain allocations die with their context
	bool ipc = false;
};

// A mapped VA range: [va, va + size) shows backing bytes [offset, offset + size).
struct Mapping {
	size_t size = 0;
	size_t offset = 0;
	std::shared_ptr<Backing> backing;
	std::vector<CUmemAccess_flags> access; // per device, set by cuMemSetAccess
	bool plain = false;
	// cuMemAlloc's memory belongs to the context that made it: another context reaches
	// it only through peer access (cuCtxEnablePeerAccess, which needs two devices that are
	// peers: never two contexts of one device). VMM mappings (no owner) are reachable from
	// every context of a device that cuMemSetAccess let in, and from no other, peer access
	// enabled or not.
	Context *owner = nullptr;
	// The handle cuMemMap mapped (VMM only): what cuMemRetainAllocationHandle returns.
	CUmemGenericAllocationHandle handle = 0;
	// A cuMemAlloc allocation's random tag, also in its memfd's name: a legacy IPC handle
	// carries it, and the importer checks that the memfd it opens still has it.
	uint64_t ipc_tag = 0;
};

// Memory another process exported with cuIpcGetMemHandle, opened here by
// cuIpcOpenMemHandle: by the address it returned, in State::ipc_imports.
struct IpcImport {
	Context *ctx = nullptr; // the context that opened it; it must close it
	int exporter = 0; // the exporting process's pid
	int exporter_device = 0; // the machine's number of the memory's device
	uint64_t tag = 0;
	unsigned refs = 1; // one per cuIpcOpenMemHandle of the handle in ctx
};

// The context of the stream whose worker runs on this thread (null on other threads):
// what an executing operation's device addresses are resolved for.
extern thread_local Context *executing_context;

struct HostRegistration {
	size_t size = 0;
	unsigned flags = 0;
	CUdeviceptr dptr = 0; // what cuMemHostGetDevicePointer returns for the base
	uintptr_t alias_base = 0; // the PROT_NONE range that holds dptr
	size_t alias_size = 0;
	Context *owner = nullptr;
};

// The alias VA range of a host registration, keyed by alias_base.
struct HostAlias {
	size_t size = 0;
	uintptr_t host = 0; // key of the registration in State::host_registrations
};

// Page-locked host memory from cuMemAllocHost: plain CPU memory that copies accept as host
// memory, freed with its context.
struct HostAllocation {
	size_t size = 0; // mapped bytes, a whole number of pages
	Context *owner = nullptr;
};

// A cuEventCreate event. It completes when its stream has executed everything enqueued up to
// and including its last cuEventRecord; one never recorded is complete.
struct Event {
	Context *ctx = nullptr;
	unsigned flags = 0;
	std::shared_ptr<Stream> stream; // of the last record, null before the first
	uint64_t ticket = 0; // complete once stream->completed reaches it
};

// Device VA that was freed, unmapped or unregistered. It stays reserved PROT_NONE
// forever, so the kernel never reuses it and a stale pointer keeps faulting.
struct Retired {
	size_t size = 0;
};

// Everything the simulator knows in this process. Created by the first successful cuInit
// and intentionally leaked: no static destructor may join a worker at exit.
struct State {
	Config config;
	std::vector<std::unique_ptr<Context>> contexts; // primary, one per device, fixed after cuInit
	std::unique_ptr<std::atomic<uint64_t>[]> usage; // device bytes allocated here, per device

	// Guards everything below. Held only for table look-ups and updates, never while an
	// operation copies bytes or waits on a value; Stream::lock may be taken inside it.
	std::mutex lock;
	CUmemGenericAllocationHandle next_handle = 0xc0da0000;
	std::map<CUmemGenericAllocationHandle, Handle> handles;
	std::map<uintptr_t, Reservation> reservations;
	std::map<uintptr_t, Mapping> mappings;
	std::map<uintptr_t, HostRegistration> host_registrations; // by host address
	std::map<uintptr_t, HostAlias> host_aliases;
	std::map<uintptr_t, Retired> retired;
	std::map<uintptr_t, HostAllocation> host_allocations;
	std::map<uintptr_t, Retired> retired_host; // freed cuMemAllocHost ranges, PROT_NONE
	std::map<uintptr_t, IpcImport> ipc_imports;
	uint64_t next_stream_id = 1;
	std::map<CUstream, std::shared_ptr<Stream>> streams;
	// Handles cuStreamDestroy destroyed: naming one again stops the process (see
	// destroyed_stream() in stream.cpp).
	std::set<CUstream> destroyed_streams;
	uint64_t next_event_id = 1;
	std::map<CUevent, Event> events;
	// cuCtxCreate's contexts, never freed, so a Stream or an allocation may point at one.
	std::vector<std::unique_ptr<Context>> created;
};

// The state after a successful cuInit, nullptr before.
State *state();

// Prints "cudasim: ..." to stderr when XMEM_CUDASIM_VERBOSE=1.
void verbose(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

// Returns err, saying why on stderr when XMEM_CUDASIM_VERBOSE=1.
CUresult fail(CUresult err, const char *call, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

// The flags of cuStreamWaitValue64 and cuStreamWriteValue64: CUDA_ERROR_INVALID_VALUE for a
// bit cuda.h does not define, CUDA_ERROR_NOT_SUPPORTED for CU_STREAM_WAIT_VALUE_FLUSH or
// CU_STREAM_WAIT_VALUE_NOR on a device whose attribute says it lacks them.
CUresult check_wait_flags(const char *call, unsigned flags);
CUresult check_write_flags(const char *call, unsigned flags);

// The current context of a call that needs one: CUDA_ERROR_NOT_INITIALIZED,
// CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_CONTEXT_IS_DESTROYED, or (when honour_sticky)
// CUDA_ERROR_ILLEGAL_ADDRESS once an operation of the context touched a bad address.
CUresult current_context(const char *call, Context **ctx, bool honour_sticky = true);

// "primary context 0x… of device N" or "created context 0x… of device N", for diagnostics.
std::string describe(const Context &ctx);

// Runs an API body, turning an escaping exception into an error code.
template<typename Body>
CUresult guarded(Body &&body) noexcept
{
	try {
		return body();
	} catch (const std::bad_alloc &) {
		return CUDA_ERROR_OUT_OF_MEMORY;
	} catch (const std::system_error &) {
		return CUDA_ERROR_OUT_OF_MEMORY;
	} catch (...) {
		return CUDA_ERROR_UNKNOWN;
	}
}

size_t page_size();

// The entry of a table of disjoint ranges (keyed by start, with a size) that holds addr.
template<typename Table>
auto find_containing(Table &table, uintptr_t addr)
{
	auto it = table.upper_bound(addr);
	if (it == table.begin())
		return table.end();
	--it;
	return addr - it->first < it->second.size ? it : table.end();
}

// --- memory.cpp: what an operation sees when it executes -------------------------------

struct Segment {
	char *data = nullptr;
	size_t size = 0;
	std::shared_ptr<Backing> keep; // keeps the alias mapped while the bytes are touched
};
using Segments = std::vector<Segment>;

struct Fault {
	uintptr_t address = 0;
	std::string why;
};

enum class Access { read, write };

enum class Space {
	device, // must resolve as the device sees it
	host, // a CPU pointer, pageable or registered, that must not be a device address
	unified, // looked up: device if it is in the simulator's device address space
};

// Resolves [addr, addr + size) for an operation executing on device. Caller holds
// State::lock. False with fault set when any byte does not resolve.
bool resolve(State &s, Space space, uintptr_t addr, size_t size, int device, Access access, Segments &out,
	     Fault &fault);

// Whether any byte of [addr, addr + size) is in the simulator's device address space:
// reserved, a host registration's alias, or retired. Caller holds State::lock.
bool in_device_space(const State &s, uintptr_t addr, size_t size);

// A PROT_NONE range of size bytes aligned to align (a power of two, at least a page); with
// exactly, never aligned to twice align. 0 when mmap fails.
uintptr_t reserve_va(size_t size, size_t align, bool exactly = false);

// Keeps a freed device range reserved PROT_NONE forever. Caller holds State::lock.
void retire(State &s, uintptr_t base, size_t size);

// Releases the plain allocations (IPC-opened memory too), host allocations and host
// registrations a destroyed context owned.
// Caller holds State::lock; dead receives the backings to drop after unlocking.
void release_context_memory(State &s, Context &ctx, std::vector<std::shared_ptr<Backing>> &dead);

// --- ipc.cpp ------------------------------------------------------------------------------

// The memfd name of a cuMemAlloc allocation of bytesize bytes on the machine's device
// machine_device, with its random tag: "cudasim-alloc:dev<N>:<bytes>:<tag>". A legacy IPC
// handle's importer checks the memfd it opens against it.
std::string plain_memfd_name(int machine_device, size_t bytesize, uint64_t tag);

// A fresh random tag for an allocation.
uint64_t random_tag();

// --- stream.cpp ---------------------------------------------------------------------------

// Marks the context's streams abandoned and removes them and its events. Caller holds
// State::lock.
void abandon_streams(State &s, Context &ctx);

// Waits for everything enqueued so far on every stream of ctx.
void synchronize_context(State &s, Context &ctx);

// Makes ctx's error sticky after an executing operation touched a bad address, printing
// one line to stderr the first time.
void raise_illegal(Stream &stream, const char *op, const Fault &fault);

} // namespace cudasim
