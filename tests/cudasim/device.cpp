// device.cpp - cuInit, devices, their attributes, primary and created contexts, the
// per-thread context stack and (absent) peer access of the CUDA driver simulator.

#include "cudasim.hpp"

#include <cerrno>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

namespace cudasim {

namespace {

// Serializes cuInit; the result of the first call is the result of every later one.
std::mutex init_lock;
bool init_attempted = false; // guarded by init_lock
CUresult init_result = CUDA_ERROR_NOT_INITIALIZED; // guarded by init_lock

// Published once by cuInit, never freed.
std::atomic<State *> global_state{ nullptr };

// The calling thread's context stack. A fixed array, so no TLS destructor runs in a
// module that might be unloaded.
constexpr int max_stack_depth = 32;
thread_local Context *context_stack[max_stack_depth];
thread_local int context_depth = 0;

// The context a handle names: a primary context, destroyed or not, or a created context
// that cuCtxDestroy has not destroyed. Caller holds State::lock.
// A destroyed created context's handle is a dangling pointer in the real driver:
// cuCtxPushCurrent takes it and returns CUDA_SUCCESS, and the next call made in it
// crashes (seen on an H200, driver 580.159.04, 2026-11-27). The simulator stops the
// process there, with the call named, so no test can pass on an answer the driver
// never gives. (A destroyed context still current to a thread is another case: calls
// in it fail with CUDA_ERROR_CONTEXT_IS_DESTROYED, as documented.)
Context *find_context_locked(State &s, CUcontext handle, const char *call)
{
	for (const auto &ctx : s.contexts) {
		if (reinterpret_cast<CUcontext>(ctx.get()) == handle)
			return ctx.get();
	}
	for (const auto &ctx : s.created) {
		if (reinterpret_cast<CUcontext>(ctx.get()) != handle)
			continue;
		if (!ctx->refs) {
			std::fprintf(stderr,
				     "cudasim: %s(%p): the context was destroyed; the real driver takes the "
				     "dangling handle and crashes in the next call\n",
				     call, static_cast<void *>(handle));
			std::abort();
		}
		return ctx.get();
	}
	return nullptr;
}

Context *find_context(State &s, CUcontext handle, const char *call)
{
	std::lock_guard<std::mutex> guard(s.lock);
	return find_context_locked(s, handle, call);
}

// The compute mode of the device of ordinal dev.
CUcomputemode compute_mode(const Config &config, CUdevice dev)
{
	if (config.fail.prohibited)
		return CU_COMPUTEMODE_PROHIBITED;
	return config.machine[size_t(config.visible[size_t(dev)])].compute_mode;
}

// This process's contexts on a device, and (EXCLUSIVE_PROCESS) its hold on the device's lock.
// "Only one CUDA context may be created on the device across all processes in the system"
// (CUDA C++ Programming Guide, "Compute Modes"): a lock file per device of the machine under
// the state directory, flock()ed while this process has its one context there; the kernel
// drops the lock when the process dies.
struct DeviceHold {
	unsigned contexts = 0; // live contexts: a retained primary context, each created one
	int lock_fd = -1;
};
std::vector<DeviceHold> device_holds; // per ordinal; sized by cuInit, guarded by State::lock

// Before a new context on dev (a primary context's first retain, or cuCtxCreate): refuses
// what the device's compute mode forbids. Caller holds State::lock.
CUresult enter_device(const char *call, State &s, CUdevice dev)
{
	CUcomputemode mode = compute_mode(s.config, dev);
	if (mode == CU_COMPUTEMODE_PROHIBITED)
		return fail(CUDA_ERROR_DEVICE_UNAVAILABLE, call, "device %d is in compute mode prohibited%s", dev,
			    s.config.fail.prohibited ? " (XMEM_CUDASIM_FAIL=prohibited)" : "");
	DeviceHold &hold = device_holds[size_t(dev)];
	if (mode == CU_COMPUTEMODE_EXCLUSIVE_PROCESS) {
		if (hold.contexts)
			return fail(CUDA_ERROR_DEVICE_UNAVAILABLE, call,
				    "device %d is in EXCLUSIVE_PROCESS compute mode and this process has a context "
				    "on it already",
				    dev);
		::mkdir(s.config.state_dir.c_str(), 0700);
		std::string path = s.config.state_dir + "/exclusive-" +
				   machine_uuid_text(s.config.machine[size_t(s.config.visible[size_t(dev)])]) + ".lock";
		int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
		if (fd < 0)
			return fail(CUDA_ERROR_OPERATING_SYSTEM, call, "%s: %s", path.c_str(), std::strerror(errno));
		if (::flock(fd, LOCK_EX | LOCK_NB) < 0) {
			int why = errno;
			::close(fd);
			return fail(CUDA_ERROR_DEVICE_UNAVAILABLE, call,
				    "device %d is in EXCLUSIVE_PROCESS compute mode and another process has a "
				    "context on it (%s: %s)",
				    dev, path.c_str(), std::strerror(why));
		}
		hold.lock_fd = fd;
	}
	hold.contexts++;
	return CUDA_SUCCESS;
}

// A context on dev is gone. Caller holds State::lock.
void leave_device(CUdevice dev)
{
	DeviceHold &hold = device_holds[size_t(dev)];
	if (hold.contexts && --hold.contexts == 0 && hold.lock_fd >= 0) {
		::close(hold.lock_fd);
		hold.lock_fd = -1;
	}
}

CUresult initialized(const char *call, State **out)
{
	State *s = state();
	if (!s)
		return fail(CUDA_ERROR_NOT_INITIALIZED, call, "cuInit has not succeeded");
	*out = s;
	return CUDA_SUCCESS;
}

CUresult valid_device(const char *call, State &s, CUdevice dev)
{
	if (dev < 0 || dev >= s.config.devices)
		return fail(CUDA_ERROR_INVALID_DEVICE, call, "device %d of %d", dev, s.config.devices);
	return CUDA_SUCCESS;
}

// The attribute's value on this simulated device (an H100-like one), or false when the
// simulator does not know it.
bool attribute_value(const Config &config, CUdevice_attribute attribute, CUdevice dev, int *value)
{
	const FailSwitches &fail = config.fail;
	switch (attribute) {
	case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
		*value = !fail.no_vmm;
		return true;
	case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
		*value = !fail.no_posix_fd;
		return true;
	case CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS:
	case CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1:
	case CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS_V1:
		*value = !fail.no_memops;
		return true;
	case CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR:
	case CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR_V1:
		*value = !fail.no_memops && !fail.no_wait_nor;
		return true;
	case CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES:
		*value = !fail.no_memops && !fail.no_flush;
		return true;
	case CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED:
		*value = !fail.no_host_register;
		return true;
	case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY:
	case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
	case CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED:
		*value = 1;
		return true;
	case CU_DEVICE_ATTRIBUTE_COMPUTE_MODE:
		*value = compute_mode(config, dev);
		return true;
	case CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT:
		*value = 32;
		return true;
	case CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT:
		*value = 512;
		return true;
	case CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM:
		// Strict: a device operation must use cuMemHostGetDevicePointer's address.
		*value = 0;
		return true;
	case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID:
		*value = 0x10 + config.machine[size_t(config.visible[size_t(dev)])].gpu; // a MIG device's GPU's
		return true;
	case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID:
	case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID:
		*value = 0;
		return true;
	case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
		*value = 9;
		return true;
	case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
		*value = 0;
		return true;
	case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
		*value = 132;
		return true;
	case CU_DEVICE_ATTRIBUTE_MAX_PITCH:
		*value = 2147483647;
		return true;
	case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY:
		// No unified memory: cuMemAllocManaged fails.
		*value = 0;
		return true;
	default:
		return false;
	}
}

// A context's last reference is gone: as the real driver, destroy what it owns (its
// streams and events, plain allocations, host allocations and host registrations) and
// forget a sticky error. VMM handles, reservations and mappings are process-wide and stay.
// Caller holds State::lock.
void destroy_context(State &s, Context &ctx, std::vector<std::shared_ptr<Backing>> &dead)
{
	abandon_streams(s, ctx);
	release_context_memory(s, ctx, dead);
	// Peer access ends with either context.
	ctx.peers.clear();
	for (const auto &other : s.contexts)
		other->peers.erase(&ctx);
	for (const auto &other : s.created)
		other->peers.erase(&ctx);
	ctx.sticky.store(false, std::memory_order_release);
	ctx.reported.store(false, std::memory_order_relaxed);
	verbose("%s destroyed", describe(ctx).c_str());
}

// Context flags as cuCtxCreate and cuDevicePrimaryCtxSetFlags take them: known bits, and
// at most one scheduling mode.
bool valid_context_flags(unsigned flags)
{
	unsigned sched = flags & CU_CTX_SCHED_MASK;
	return !(flags & ~unsigned(CU_CTX_FLAGS_MASK)) && sched != 3 && sched <= CU_CTX_SCHED_BLOCKING_SYNC;
}

// cuCtxCreate, in any of its ABI versions: a new context on dev, pushed onto the calling
// thread's stack.
CUresult create_context(const char *call, CUcontext *pctx, unsigned flags, CUdevice dev)
{
	State *s = nullptr;
	if (CUresult r = initialized(call, &s))
		return r;
	if (!pctx || !valid_context_flags(flags))
		return fail(CUDA_ERROR_INVALID_VALUE, call, "null pctx or flags 0x%x", flags);
	if (CUresult r = valid_device(call, *s, dev))
		return r;
	if (context_depth == max_stack_depth)
		return fail(CUDA_ERROR_OUT_OF_MEMORY, call, "context stack deeper than %d", max_stack_depth);

	auto ctx = std::make_unique<Context>();
	ctx->device = dev;
	ctx->primary = false;
	ctx->refs = 1;
	ctx->flags = flags;
	Context *created = ctx.get();
	{
		std::lock_guard<std::mutex> guard(s->lock);
		if (CUresult r = enter_device(call, *s, dev))
			return r;
		s->created.push_back(std::move(ctx));
	}
	context_stack[context_depth++] = created;
	*pctx = reinterpret_cast<CUcontext>(created);
	verbose("%s made and pushed", describe(*created).c_str());
	return CUDA_SUCCESS;
}

// cuDevicePrimaryCtxSetFlags: the _v2 sets them at any time; the unversioned v1 refuses
// while the context is active, as the real driver's v1 does.
CUresult set_primary_flags(const char *call, CUdevice dev, unsigned flags, bool refuse_active)
{
	State *s = nullptr;
	if (CUresult r = initialized(call, &s))
		return r;
	if (CUresult r = valid_device(call, *s, dev))
		return r;
	if (!valid_context_flags(flags))
		return fail(CUDA_ERROR_INVALID_VALUE, call, "flags 0x%x", flags);
	Context *ctx = s->contexts[size_t(dev)].get();
	std::lock_guard<std::mutex> guard(s->lock);
	if (refuse_active && ctx->refs)
		return fail(CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE, call,
			    "%s is retained: only the _v2 changes an active context's flags", describe(*ctx).c_str());
	ctx->flags = flags;
	return CUDA_SUCCESS;
}

} // namespace

State *state()
{
	return global_state.load(std::memory_order_acquire);
}

size_t page_size()
{
	static const size_t size = size_t(sysconf(_SC_PAGESIZE));
	return size;
}

void verbose(const char *fmt, ...)
{
	State *s = state();
	if (!s || !s->config.verbose)
		return;
	char line[512];
	va_list args;
	va_start(args, fmt);
	std::vsnprintf(line, sizeof(line), fmt, args);
	va_end(args);
	std::fprintf(stderr, "cudasim: %s\n", line);
}

CUresult fail(CUresult err, const char *call, const char *fmt, ...)
{
	State *s = state();
	if (!s || !s->config.verbose)
		return err;
	const char *name = "?";
	cuGetErrorName(err, &name);
	char line[512];
	va_list args;
	va_start(args, fmt);
	std::vsnprintf(line, sizeof(line), fmt, args);
	va_end(args);
	std::fprintf(stderr, "cudasim: %s -> %s: %s\n", call, name, line);
	return err;
}

CUresult check_wait_flags(const char *call, unsigned flags)
{
	const FailSwitches &fail_switch = state()->config.fail;
	unsigned condition = flags & ~unsigned(CU_STREAM_WAIT_VALUE_FLUSH);
	if (condition > CU_STREAM_WAIT_VALUE_NOR)
		return fail(CUDA_ERROR_INVALID_VALUE, call, "flags 0x%x: not CUstreamWaitValue_flags", flags);
	// Each needs its device attribute (cuda.h, "Stream Memory Operations"); the driver's
	// code for one the device lacks is not documented.
	if (condition == CU_STREAM_WAIT_VALUE_NOR && fail_switch.no_wait_nor)
		return fail(CUDA_ERROR_NOT_SUPPORTED, call,
			    "CU_STREAM_WAIT_VALUE_NOR, and CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR is 0");
	if ((flags & CU_STREAM_WAIT_VALUE_FLUSH) && fail_switch.no_flush)
		return fail(CUDA_ERROR_NOT_SUPPORTED, call,
			    "CU_STREAM_WAIT_VALUE_FLUSH, and CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES is 0");
	return CUDA_SUCCESS;
}

CUresult check_write_flags(const char *call, unsigned flags)
{
	if (flags != CU_STREAM_WRITE_VALUE_DEFAULT && flags != CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER)
		return fail(CUDA_ERROR_INVALID_VALUE, call, "flags 0x%x: not CUstreamWriteValue_flags", flags);
	return CUDA_SUCCESS;
}

std::string describe(const Context &ctx)
{
	char text[96];
	std::snprintf(text, sizeof(text), "%s context %p of device %d", ctx.primary ? "primary" : "created",
		      static_cast<const void *>(&ctx), ctx.device);
	return text;
}

CUresult current_context(const char *call, Context **out, bool honour_sticky)
{
	State *s = nullptr;
	if (CUresult r = initialized(call, &s))
		return r;
	if (context_depth == 0)
		return fail(CUDA_ERROR_INVALID_CONTEXT, call, "no current context on this thread");

	Context *ctx = context_stack[context_depth - 1];
	{
		std::lock_guard<std::mutex> guard(s->lock);
		if (ctx->refs == 0)
			return fail(CUDA_ERROR_CONTEXT_IS_DESTROYED, call, "the current context, %s, is destroyed",
				    describe(*ctx).c_str());
	}
	if (honour_sticky && ctx->sticky.load(std::memory_order_acquire))
		return fail(CUDA_ERROR_ILLEGAL_ADDRESS, call, "sticky error of device %d", ctx->device);
	*out = ctx;
	return CUDA_SUCCESS;
}

} // namespace cudasim

using namespace cudasim;

CUresult CUDAAPI cuInit(unsigned int Flags)
{
	return guarded([&] {
		if (Flags != 0)
			return CUDA_ERROR_INVALID_VALUE;

		std::lock_guard<std::mutex> guard(init_lock);
		if (init_attempted)
			return init_result;
		init_attempted = true;

		Config config = read_config();
		if (config.fail.init) {
			init_result = CUDA_ERROR_UNKNOWN;
			return init_result;
		}
		if (config.devices == 0) {
			init_result = CUDA_ERROR_NO_DEVICE;
			return init_result;
		}

		auto *s = new State;
		s->config = config;
		s->usage = std::make_unique<std::atomic<uint64_t>[]>(size_t(config.devices));
		for (int dev = 0; dev < config.devices; dev++) {
			auto ctx = std::make_unique<Context>();
			ctx->device = dev;
			s->contexts.push_back(std::move(ctx));
		}
		device_holds.resize(size_t(config.devices));
		global_state.store(s, std::memory_order_release);
		init_result = CUDA_SUCCESS;

		verbose("%d of %d device(s) visible, %" PRIu64 " bytes each, granularity %" PRIu64
			" (recommended %" PRIu64 "), delay 0..%" PRIu64 " us, seed %" PRIu64 ", peers: %s",
			config.devices, config.physical, config.memory, config.granularity,
			config.recommended_granularity, config.delay_us, config.seed, config.peer ? "all" : "none");
		return init_result;
	});
}

CUresult CUDAAPI cuDriverGetVersion(int *driverVersion)
{
	// Works before cuInit, as in the real driver.
	if (!driverVersion)
		return CUDA_ERROR_INVALID_VALUE;
	*driverVersion = 13000;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetCount(int *count)
{
	State *s = nullptr;
	if (CUresult r = initialized("cuDeviceGetCount", &s))
		return r;
	if (!count)
		return CUDA_ERROR_INVALID_VALUE;
	*count = s->config.devices;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGet(CUdevice *device, int ordinal)
{
	State *s = nullptr;
	if (CUresult r = initialized("cuDeviceGet", &s))
		return r;
	if (!device)
		return CUDA_ERROR_INVALID_VALUE;
	if (CUresult r = valid_device("cuDeviceGet", *s, ordinal))
		return r;
	*device = ordinal;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetName(char *name, int len, CUdevice dev)
{
	State *s = nullptr;
	if (CUresult r = initialized("cuDeviceGetName", &s))
		return r;
	if (!name || len <= 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (CUresult r = valid_device("cuDeviceGetName", *s, dev))
		return r;
	// The machine's number for it, as nvidia-smi would list it, not the ordinal.
	const MachineDevice &device = s->config.machine[size_t(s->config.visible[size_t(dev)])];
	if (device.mig >= 0)
		std::snprintf(name, size_t(len), "xmem cudasim device %d MIG %d", device.gpu, device.mig);
	else
		std::snprintf(name, size_t(len), "xmem cudasim device %d", device.gpu);
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
	State *s = nullptr;
	if (CUresult r = initialized("cuDeviceGetUuid", &s))
		return r;
	if (!uuid)
		return CUDA_ERROR_INVALID_VALUE;
	if (CUresult r = valid_device("cuDeviceGetUuid", *s, dev))
		return r;
	*uuid = machine_uuid(s->config.machine[size_t(s->config.visible[size_t(dev)])]);
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetUuid_v1(CUuuid *uuid, CUdevice dev)
{
	// cuda.h documents only the _v2's MIG UUID "if the device is in MIG mode", the change
	// the _v2 was added for: the first version answers the MIG device's GPU's UUID.
	if (CUresult r = cuDeviceGetUuid(uuid, dev))
		return r;
	const MachineDevice &device = state()->config.machine[size_t(state()->config.visible[size_t(dev)])];
	*uuid = physical_uuid(device.gpu);
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceTotalMem(size_t *bytes, CUdevice dev)
{
	State *s = nullptr;
	if (CUresult r = initialized("cuDeviceTotalMem", &s))
		return r;
	if (!bytes)
		return CUDA_ERROR_INVALID_VALUE;
	if (CUresult r = valid_device("cuDeviceTotalMem", *s, dev))
		return r;
	*bytes = size_t(s->config.memory);
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
	State *s = nullptr;
	if (CUresult r = initialized("cuDeviceGetAttribute", &s))
		return r;
	if (!pi)
		return CUDA_ERROR_INVALID_VALUE;
	if (CUresult r = valid_device("cuDeviceGetAttribute", *s, dev))
		return r;
	if (!attribute_value(s->config, attrib, dev, pi)) {
		// Always said, so a caller relying on an attribute the simulator lacks notices.
		std::fprintf(stderr, "cudasim: cuDeviceGetAttribute: attribute %d is not simulated\n", int(attrib));
		return CUDA_ERROR_INVALID_VALUE;
	}
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceComputeCapability(int *major, int *minor, CUdevice dev)
{
	State *s = nullptr;
	if (CUresult r = initialized("cuDeviceComputeCapability", &s))
		return r;
	if (!major || !minor)
		return CUDA_ERROR_INVALID_VALUE;
	if (CUresult r = valid_device("cuDeviceComputeCapability", *s, dev))
		return r;
	// The same answer as the COMPUTE_CAPABILITY_MAJOR and _MINOR attributes.
	attribute_value(s->config, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev, major);
	attribute_value(s->config, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev, minor);
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
	return guarded([&] {
		State *s = nullptr;
		if (CUresult r = initialized("cuDevicePrimaryCtxRetain", &s))
			return r;
		if (!pctx)
			return CUDA_ERROR_INVALID_VALUE;
		if (CUresult r = valid_device("cuDevicePrimaryCtxRetain", *s, dev))
			return r;
		Context *ctx = s->contexts[size_t(dev)].get();
		std::lock_guard<std::mutex> guard(s->lock);
		// The first retain makes the context; later ones share it.
		if (ctx->refs == 0) {
			if (CUresult r = enter_device("cuDevicePrimaryCtxRetain", *s, dev))
				return r;
		}
		ctx->refs++;
		*pctx = reinterpret_cast<CUcontext>(ctx);
		return CUDA_SUCCESS;
	});
}

CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev)
{
	return guarded([&] {
		State *s = nullptr;
		if (CUresult r = initialized("cuDevicePrimaryCtxRelease", &s))
			return r;
		if (CUresult r = valid_device("cuDevicePrimaryCtxRelease", *s, dev))
			return r;

		Context *ctx = s->contexts[size_t(dev)].get();
		std::vector<std::shared_ptr<Backing>> dead;
		std::lock_guard<std::mutex> guard(s->lock);
		if (ctx->refs == 0)
			return fail(CUDA_ERROR_INVALID_CONTEXT, "cuDevicePrimaryCtxRelease",
				    "primary context of device %d is not retained", dev);
		if (--ctx->refs == 0) {
			destroy_context(*s, *ctx, dead);
			leave_device(dev);
		}
		return CUDA_SUCCESS;
	});
}

CUresult CUDAAPI cuDevicePrimaryCtxRelease_v1(CUdevice dev)
{
	return cuDevicePrimaryCtxRelease(dev);
}

CUresult CUDAAPI cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags)
{
	return guarded([&] { return set_primary_flags("cuDevicePrimaryCtxSetFlags", dev, flags, false); });
}

CUresult CUDAAPI cuDevicePrimaryCtxSetFlags_v1(CUdevice dev, unsigned int flags)
{
	return guarded([&] { return set_primary_flags("cuDevicePrimaryCtxSetFlags (v1)", dev, flags, true); });
}

CUresult CUDAAPI cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
	State *s = nullptr;
	if (CUresult r = initialized("cuDevicePrimaryCtxGetState", &s))
		return r;
	if (!flags || !active)
		return CUDA_ERROR_INVALID_VALUE;
	if (CUresult r = valid_device("cuDevicePrimaryCtxGetState", *s, dev))
		return r;
	const Context *ctx = s->contexts[size_t(dev)].get();
	std::lock_guard<std::mutex> guard(s->lock);
	*flags = ctx->flags;
	*active = ctx->refs > 0;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxReset(CUdevice dev)
{
	return guarded([&] {
		State *s = nullptr;
		if (CUresult r = initialized("cuDevicePrimaryCtxReset", &s))
			return r;
		if (CUresult r = valid_device("cuDevicePrimaryCtxReset", *s, dev))
			return r;
		// Destroys what the context owns, as its last release does. Retains stay: as
		// documented, the holders still release theirs.
		Context *ctx = s->contexts[size_t(dev)].get();
		std::vector<std::shared_ptr<Backing>> dead; // freed after unlocking
		std::lock_guard<std::mutex> guard(s->lock);
		destroy_context(*s, *ctx, dead);
		return CUDA_SUCCESS;
	});
}

CUresult CUDAAPI cuDevicePrimaryCtxReset_v1(CUdevice dev)
{
	return cuDevicePrimaryCtxReset(dev);
}

CUresult CUDAAPI cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
	return guarded([&] { return create_context("cuCtxCreate_v2", pctx, flags, dev); });
}

CUresult CUDAAPI cuCtxCreate(CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags, CUdevice dev)
{
	return guarded([&] {
		const char *call = "cuCtxCreate";
		const CUctxCreateParams *p = ctxCreateParams;
		if (p && (p->execAffinityParams || p->numExecAffinityParams || p->cigParams))
			return fail(CUDA_ERROR_NOT_SUPPORTED, call,
				    "execution affinity and CIG parameters are not simulated");
		return create_context(call, pctx, flags, dev);
	});
}

CUresult CUDAAPI cuCtxDestroy(CUcontext ctx)
{
	return guarded([&] {
		const char *call = "cuCtxDestroy";
		State *s = nullptr;
		if (CUresult r = initialized(call, &s))
			return r;
		if (!ctx)
			return fail(CUDA_ERROR_INVALID_VALUE, call, "null context");
		Context *context = nullptr;
		std::vector<std::shared_ptr<Backing>> dead; // freed after unlocking
		{
			std::lock_guard<std::mutex> guard(s->lock);
			context = find_context_locked(*s, ctx, call);
			if (!context)
				return fail(CUDA_ERROR_INVALID_CONTEXT, call, "unknown or destroyed context %p",
					    static_cast<void *>(ctx));
			if (context->primary)
				return fail(CUDA_ERROR_INVALID_CONTEXT, call,
					    "%s: primary contexts go with cuDevicePrimaryCtxRelease",
					    describe(*context).c_str());
			context->refs = 0;
			destroy_context(*s, *context, dead);
			leave_device(context->device);
		}
		// As documented: popped when current to the calling thread. Other threads keep it
		// current, and their calls fail with CUDA_ERROR_CONTEXT_IS_DESTROYED.
		if (context_depth && context_stack[context_depth - 1] == context)
			context_depth--;
		return CUDA_SUCCESS;
	});
}

CUresult CUDAAPI cuCtxPushCurrent(CUcontext ctx)
{
	State *s = nullptr;
	if (CUresult r = initialized("cuCtxPushCurrent", &s))
		return r;
	if (!ctx)
		return fail(CUDA_ERROR_INVALID_VALUE, "cuCtxPushCurrent", "null context");
	Context *context = find_context(*s, ctx, "cuCtxPushCurrent");
	if (!context)
		return fail(CUDA_ERROR_INVALID_CONTEXT, "cuCtxPushCurrent", "unknown context %p",
			    static_cast<void *>(ctx));
	if (context_depth == max_stack_depth)
		return fail(CUDA_ERROR_OUT_OF_MEMORY, "cuCtxPushCurrent", "context stack deeper than %d",
			    max_stack_depth);
	context_stack[context_depth++] = context;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxPopCurrent(CUcontext *pctx)
{
	State *s = nullptr;
	if (CUresult r = initialized("cuCtxPopCurrent", &s))
		return r;
	if (context_depth == 0)
		return fail(CUDA_ERROR_INVALID_CONTEXT, "cuCtxPopCurrent", "the context stack is empty");
	Context *ctx = context_stack[--context_depth];
	if (pctx)
		*pctx = reinterpret_cast<CUcontext>(ctx);
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxGetCurrent(CUcontext *pctx)
{
	State *s = nullptr;
	if (CUresult r = initialized("cuCtxGetCurrent", &s))
		return r;
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	*pctx = context_depth ? reinterpret_cast<CUcontext>(context_stack[context_depth - 1]) : nullptr;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx)
{
	State *s = nullptr;
	if (CUresult r = initialized("cuCtxSetCurrent", &s))
		return r;
	if (!ctx) {
		// As documented: equivalent to popping, a no-op on an empty stack.
		if (context_depth)
			context_depth--;
		return CUDA_SUCCESS;
	}
	Context *context = find_context(*s, ctx, "cuCtxSetCurrent");
	if (!context)
		return fail(CUDA_ERROR_INVALID_CONTEXT, "cuCtxSetCurrent", "unknown context %p",
			    static_cast<void *>(ctx));
	if (context_depth == 0)
		context_depth = 1;
	context_stack[context_depth - 1] = context;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxGetDevice(CUdevice *device)
{
	Context *ctx = nullptr;
	if (CUresult r = current_context("cuCtxGetDevice", &ctx))
		return r;
	if (!device)
		return CUDA_ERROR_INVALID_VALUE;
	*device = ctx->device;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxSetLimit(CUlimit limit, size_t value)
{
	const char *call = "cuCtxSetLimit";
	Context *ctx = nullptr;
	if (CUresult r = current_context(call, &ctx))
		return r;
	switch (limit) {
	case CU_LIMIT_STACK_SIZE:
	case CU_LIMIT_PRINTF_FIFO_SIZE:
	case CU_LIMIT_MALLOC_HEAP_SIZE:
	case CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT:
	case CU_LIMIT_MAX_L2_FETCH_GRANULARITY:
	case CU_LIMIT_PERSISTING_L2_CACHE_SIZE:
	case CU_LIMIT_CIG_SHMEM_FALLBACK_ENABLED:
		// Limits of kernels, which never run here: remembered for cuCtxGetLimit and
		// otherwise ignored.
		verbose("%s: limit %d set to %zu on %s", call, int(limit), value, describe(*ctx).c_str());
		{
			std::lock_guard<std::mutex> guard(state()->lock);
			ctx->limits[int(limit)] = value;
		}
		return CUDA_SUCCESS;
	case CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH:
		return fail(CUDA_ERROR_UNSUPPORTED_LIMIT, call,
			    "CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH applies below compute capability 9.0 only");
	default:
		// CU_LIMIT_SHMEM_SIZE and CU_LIMIT_CIG_ENABLED can only be queried.
		return fail(CUDA_ERROR_INVALID_VALUE, call, "limit %d cannot be set", int(limit));
	}
}

// The defaults of a compute capability 9.0 device (the one the simulator reports), as
// the driver reports them before cuCtxSetLimit.
CUresult CUDAAPI cuCtxGetLimit(size_t *pvalue, CUlimit limit)
{
	const char *call = "cuCtxGetLimit";
	Context *ctx = nullptr;
	if (CUresult r = current_context(call, &ctx))
		return r;
	if (!pvalue)
		return fail(CUDA_ERROR_INVALID_VALUE, call, "null pvalue");
	size_t value;
	switch (limit) {
	case CU_LIMIT_STACK_SIZE:
		value = 1024;
		break;
	case CU_LIMIT_PRINTF_FIFO_SIZE:
		value = 1048576;
		break;
	case CU_LIMIT_MALLOC_HEAP_SIZE:
		value = 8388608;
		break;
	case CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT:
		value = 2048;
		break;
	case CU_LIMIT_MAX_L2_FETCH_GRANULARITY:
		value = 32;
		break;
	case CU_LIMIT_PERSISTING_L2_CACHE_SIZE:
	case CU_LIMIT_CIG_ENABLED:
	case CU_LIMIT_CIG_SHMEM_FALLBACK_ENABLED:
		value = 0;
		break;
	case CU_LIMIT_SHMEM_SIZE:
		value = 228 * 1024;
		break;
	case CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH:
		return fail(CUDA_ERROR_UNSUPPORTED_LIMIT, call,
			    "CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH applies below compute capability 9.0 only");
	default:
		return fail(CUDA_ERROR_INVALID_VALUE, call, "unknown limit %d", int(limit));
	}
	std::lock_guard<std::mutex> guard(state()->lock);
	auto it = ctx->limits.find(int(limit));
	*pvalue = it == ctx->limits.end() ? value : it->second;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxSynchronize(void)
{
	return guarded([&] {
		Context *ctx = nullptr;
		if (CUresult r = current_context("cuCtxSynchronize", &ctx))
			return r;
		synchronize_context(*state(), *ctx);
		if (ctx->sticky.load(std::memory_order_acquire))
			return fail(CUDA_ERROR_ILLEGAL_ADDRESS, "cuCtxSynchronize", "sticky error of device %d",
				    ctx->device);
		return CUDA_SUCCESS;
	});
}

CUresult CUDAAPI cuDeviceCanAccessPeer(int *canAccessPeer, CUdevice dev, CUdevice peerDev)
{
	State *s = nullptr;
	if (CUresult r = initialized("cuDeviceCanAccessPeer", &s))
		return r;
	if (!canAccessPeer)
		return CUDA_ERROR_INVALID_VALUE;
	if (CUresult r = valid_device("cuDeviceCanAccessPeer", *s, dev))
		return r;
	if (CUresult r = valid_device("cuDeviceCanAccessPeer", *s, peerDev))
		return r;
	// By default no simulated device reaches another's memory, so code that needs peer
	// access takes its fallback; XMEM_CUDASIM_PEER=all makes every two GPUs peers. As in the
	// real driver, a device is never its own peer.
	*canAccessPeer = can_access_peer(s->config, dev, peerDev) ? 1 : 0;
	return CUDA_SUCCESS;
}

// What cuda.h promises: on success, PEERCONTEXT's allocations (cuMemAlloc's, here) are
// reachable from the current context's streams; the access is one-way. VMM mappings are
// governed by cuMemSetAccess alone, so this grants nothing there.
CUresult CUDAAPI cuCtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags)
{
	return guarded([&] {
		const char *call = "cuCtxEnablePeerAccess";
		Context *ctx = nullptr;
		if (CUresult r = current_context(call, &ctx))
			return r;
		if (Flags)
			return fail(CUDA_ERROR_INVALID_VALUE, call, "flags 0x%x", Flags);
		State &s = *state();
		std::lock_guard<std::mutex> guard(s.lock);
		Context *peer = peerContext ? find_context_locked(s, peerContext, call) : nullptr;
		if (!peer || peer == ctx)
			return fail(CUDA_ERROR_INVALID_CONTEXT, call, "peer %p is unknown or the current context",
				    static_cast<void *>(peerContext));
		if (!can_access_peer(s.config, ctx->device, peer->device))
			return fail(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, call, "cuDeviceCanAccessPeer(%d, %d) is 0%s",
				    ctx->device, peer->device, s.config.peer ? "" : " (XMEM_CUDASIM_PEER=none)");
		if (!ctx->peers.insert(peer).second)
			return fail(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, call, "%s already reaches %s",
				    describe(*ctx).c_str(), describe(*peer).c_str());
		return CUDA_SUCCESS;
	});
}

CUresult CUDAAPI cuCtxDisablePeerAccess(CUcontext peerContext)
{
	return guarded([&] {
		const char *call = "cuCtxDisablePeerAccess";
		Context *ctx = nullptr;
		if (CUresult r = current_context(call, &ctx))
			return r;
		State &s = *state();
		std::lock_guard<std::mutex> guard(s.lock);
		Context *peer = peerContext ? find_context_locked(s, peerContext, call) : nullptr;
		if (!peer)
			return fail(CUDA_ERROR_INVALID_CONTEXT, call, "unknown peer %p",
				    static_cast<void *>(peerContext));
		if (!ctx->peers.erase(peer))
			return fail(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, call, "%s does not reach %s",
				    describe(*ctx).c_str(), describe(*peer).c_str());
		return CUDA_SUCCESS;
	});
}
