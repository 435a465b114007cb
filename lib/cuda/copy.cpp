// copy.cpp - private device copies of frames (copy-on-write and the copy_to_* calls),
// each on the target device's primary context; another device's memory directly where this
// process's mapping of it gives the target device access (a peer: PoolImpl::reach), else
// through host memory.
#include "../device_sync.hpp"
#include "contexts.hpp"
#include "driver.hpp"

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <new>

namespace xmem {

using cuda::ContextScope;
using cuda::cuda_error;
using cuda::Driver;
using cuda::PrimaryContext;

namespace {

// DEVICE's primary context, retained once for the process: copies and queries run per
// frame, and checking the device and retaining its context each time costs driver calls.
Result<std::shared_ptr<PrimaryContext>> primary(uint32_t device, const std::string &where)
{
	// Guards the map; a leaf lock (nothing else is taken under it).
	static std::mutex lock;
	// Never destroyed: releasing at exit would race the driver's own teardown.
	static auto *contexts = new std::map<uint32_t, std::shared_ptr<PrimaryContext>>;
	std::lock_guard guard(lock);
	if (auto it = contexts->find(device); it != contexts->end())
		return it->second;
	auto ctx = PrimaryContext::retain(device, where);
	if (ctx)
		contexts->emplace(device, ctx.value());
	return ctx;
}

// A stream or an event made for one copy, destroyed after it: a stream while the context
// it was made in is still current (work still queued on it runs to the end), an event once
// what waits for it has been queued.
struct StreamDestroyer {
	void operator()(CUstream stream) const { cuda::driver().value()->cuStreamDestroy(stream); }
};
using OwnedStream = std::unique_ptr<CUstream_st, StreamDestroyer>;
struct EventDestroyer {
	void operator()(CUevent event) const { cuda::driver().value()->cuEventDestroy(event); }
};
using OwnedEvent = std::unique_ptr<CUevent_st, EventDestroyer>;

// Whether cuMemSetAccess let streams on DEVICE read the VMM mapping at ADDRESS: false where
// it did not, and where cuMemGetAccess fails (memory that is no VMM mapping). A device
// reaches a VMM mapping only where it was given access (CUDA Programming Guide, "Virtual
// Memory Management": mapping an allocation does not make it accessible, access is set per
// device; peer access enabled between contexts does not reach it), and the slots' and the
// private copies' mappings give it to their own device alone.
bool granted(const Driver &d, CUdeviceptr address, CUdevice device)
{
	CUmemLocation location{};
	location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	location.id = device;
	unsigned long long flags = CU_MEM_ACCESS_FLAGS_PROT_NONE;
	return d.cuMemGetAccess(&flags, &location, address) == CUDA_SUCCESS && flags != CU_MEM_ACCESS_FLAGS_PROT_NONE;
}

// The device ordinal of the VMM allocation mapped at ADDRESS (any address of a range cuMemMap
// mapped), or -1 for memory that is no VMM mapping. Three calls, none of which waits.
int vmm_device(const Driver &d, CUdeviceptr address)
{
	CUmemGenericAllocationHandle handle = 0;
	if (d.cuMemRetainAllocationHandle(&handle, reinterpret_cast<void *>(uintptr_t(address))) != CUDA_SUCCESS)
		return -1;
	CUmemAllocationProp prop{};
	CUresult r = d.cuMemGetAllocationPropertiesFromHandle(&prop, handle);
	d.cuMemRelease(handle); // the reference cuMemRetainAllocationHandle took
	if (r != CUDA_SUCCESS || prop.location.type != CU_MEM_LOCATION_TYPE_DEVICE)
		return -1;
	return prop.location.id;
}

// One half of a copy through host memory, on CTX's device and complete on return: COPY
// queues it on the stream it is given, the primary context's legacy stream for a
// stream-less copy, or (NAMED) a new non-blocking one of the primary context that first
// waits for AFTER (nullptr: nothing), so the copy waits for nobody else's work.
template<typename Copy>
Result<void> copy_half(const PrimaryContext &ctx, bool named, CUevent after, const std::string &where, const char *call,
		       Copy copy)
{
	const Driver *d = cuda::driver().value();
	ContextScope scope(ctx);
	OwnedStream owned; // destroyed before SCOPE lets the context go
	CUstream stream = nullptr;
	if (named) {
		if (CUresult r = d->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING); r != CUDA_SUCCESS)
			return cuda_error(where, "cuStreamCreate", r);
		owned.reset(stream);
	}
	if (after) {
		if (CUresult r = d->cuStreamWaitEvent(stream, after, CU_EVENT_WAIT_DEFAULT); r != CUDA_SUCCESS)
			return cuda_error(where, "cuStreamWaitEvent", r);
	}
	if (CUresult r = copy(stream); r != CUDA_SUCCESS)
		return cuda_error(where, call, r);
	// With pageable memory on the host side an Async copy "might be synchronous" (the
	// driver API's "API synchronization behavior"), so nothing says it is done on return:
	// the staging buffer is read or freed only after this.
	if (CUresult r = d->cuStreamSynchronize(stream); r != CUDA_SUCCESS)
		return cuda_error(where, "cuStreamSynchronize", r);
	return {};
}

// A copy of BYTES from SRC, device memory of FROM's device that TO's device may not reach,
// to DST on TO's device. It works whether or not the two devices are peers: each device
// touches only its own memory, through host memory that the CPU owns. (cuMemcpyPeerAsync is
// documented for memory "in one context" and another, not for VMM mappings, whose access
// is per device.) The read follows STREAM's earlier work, through an event of its
// context (TO's primary context for a default stream, as ContextScope picks), and the copy
// is complete on return, so STREAM's later work sees it; without a stream, both halves run
// on the primary contexts' legacy streams, as same-device copies do.
Result<void> copy_through_host(const PrimaryContext &to, CUdeviceptr dst, const PrimaryContext &from, CUdeviceptr src,
			       uint64_t bytes, CUstream stream, const std::string &where)
{
	const Driver *d = cuda::driver().value();
	std::unique_ptr<std::byte[]> staging(new (std::nothrow) std::byte[std::max<uint64_t>(bytes, 1)]);
	if (!staging)
		return make_error(Errc::no_memory,
				  where + ": no host memory to stage " + std::to_string(bytes) + " bytes");
	OwnedEvent before;
	if (stream) {
		ContextScope scope(to, stream);
		CUevent event = nullptr;
		if (CUresult r = d->cuEventCreate(&event, CU_EVENT_DISABLE_TIMING); r != CUDA_SUCCESS)
			return cuda_error(where, "cuEventCreate", r);
		before.reset(event);
		if (CUresult r = d->cuEventRecord(event, stream); r != CUDA_SUCCESS)
			return cuda_error(where, "cuEventRecord", r);
	}
	auto read = copy_half(from, stream != nullptr, before.get(), where, "cuMemcpyDtoHAsync",
			      [&](CUstream s) { return d->cuMemcpyDtoHAsync(staging.get(), src, bytes, s); });
	if (!read)
		return read;
	return copy_half(to, stream != nullptr, nullptr, where, "cuMemcpyHtoDAsync",
			 [&](CUstream s) { return d->cuMemcpyHtoDAsync(dst, staging.get(), bytes, s); });
}

} // namespace

Result<std::shared_ptr<void>> device_allocate(uint32_t device, uint64_t bytes, uint64_t *address, void *stream_arg)
{
	std::string where = "device copy on CUDA device " + std::to_string(device);
	auto ctx = primary(device, where);
	if (!ctx)
		return ctx.error();
	const Driver *d = cuda::driver().value();
	ContextScope scope(**ctx);
	// Virtual memory management, not cuMemAlloc: cuMemAlloc's memory belongs to the
	// context that made it, and a caller's stream of another context (GStreamer's, a
	// framework's) reaches it only through peer access. A mapping whose access is set
	// for the device is reachable from every context on it, as the slots are.
	CUmemAllocationProp prop{};
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = (*ctx)->device();
	size_t granularity = 0;
	if (CUresult r = d->cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
	    r != CUDA_SUCCESS || granularity == 0)
		return cuda_error(where, "cuMemGetAllocationGranularity",
				  r == CUDA_SUCCESS ? CUDA_ERROR_INVALID_VALUE : r);
	uint64_t size = (std::max<uint64_t>(bytes, 1) + granularity - 1) / granularity * granularity;
	auto failed = [&](const char *call, CUresult r) {
		return cuda_error(where + " of " + std::to_string(bytes) + " bytes", call, r);
	};
	CUmemGenericAllocationHandle handle = 0;
	if (CUresult r = d->cuMemCreate(&handle, size, &prop, 0); r != CUDA_SUCCESS)
		return failed("cuMemCreate", r);
	CUdeviceptr p = 0;
	if (CUresult r = d->cuMemAddressReserve(&p, size, granularity, 0, 0); r != CUDA_SUCCESS) {
		d->cuMemRelease(handle);
		return failed("cuMemAddressReserve", r);
	}
	CUresult r = d->cuMemMap(p, size, 0, handle, 0);
	// The mapping keeps the memory: the handle is not needed past this point.
	d->cuMemRelease(handle);
	if (r != CUDA_SUCCESS) {
		d->cuMemAddressFree(p, size);
		return failed("cuMemMap", r);
	}
	CUmemAccessDesc access{};
	access.location = prop.location;
	access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	if (r = d->cuMemSetAccess(p, size, &access, 1); r != CUDA_SUCCESS) {
		d->cuMemUnmap(p, size);
		d->cuMemAddressFree(p, size);
		return failed("cuMemSetAccess", r);
	}
	*address = p;
	std::shared_ptr<PrimaryContext> keep = ctx.value();
	// Freed once the work the CPU can wait for is done: the primary and current
	// contexts', and that of STREAM, the stream the copy was made on (which must live
	// as long as the copy: xmem keeps no context, see contexts.hpp).
	auto stream = static_cast<CUstream>(stream_arg);
	return std::shared_ptr<void>(reinterpret_cast<void *>(uintptr_t(p)), [keep, d, size, stream](void *q) {
		ContextScope inner(*keep);
		cuda::synchronize_contexts(*keep, stream);
		auto at = CUdeviceptr(reinterpret_cast<uintptr_t>(q));
		d->cuMemUnmap(at, size);
		d->cuMemAddressFree(at, size);
	});
}

Result<void> device_copy(uint32_t device, uint64_t dst, bool dst_device, uint64_t src, bool src_device, uint64_t bytes,
			 void *stream_arg)
{
	std::string where = "copy on CUDA device " + std::to_string(device);
	auto ctx = primary(device, where);
	if (!ctx)
		return ctx.error();
	const Driver *d = cuda::driver().value();
	CUstream stream = static_cast<CUstream>(stream_arg);
	ContextScope scope(**ctx, stream);
	CUresult r;
	const char *call;
	if (dst_device && src_device && !granted(*d, src, (*ctx)->device())) {
		// Another device's memory that this one may not read (copy_to_cuda of a frame on
		// another GPU): through host memory. Anything else is left to the copy below.
		if (int owner = vmm_device(*d, src); owner >= 0 && owner != (*ctx)->device()) {
			std::string across =
				where + " from CUDA device " + std::to_string(owner) + " through host memory";
			auto from = primary(uint32_t(owner), across);
			if (!from)
				return from.error();
			return copy_through_host(**ctx, dst, **from, src, bytes, stream, across);
		}
	}
	if (dst_device && src_device) {
		call = "cuMemcpyDtoDAsync";
		r = d->cuMemcpyDtoDAsync(dst, src, bytes, stream);
	} else if (dst_device) {
		call = "cuMemcpyHtoDAsync";
		r = d->cuMemcpyHtoDAsync(dst, reinterpret_cast<const void *>(uintptr_t(src)), bytes, stream);
	} else if (src_device) {
		call = "cuMemcpyDtoHAsync";
		r = d->cuMemcpyDtoHAsync(reinterpret_cast<void *>(uintptr_t(dst)), src, bytes, stream);
	} else {
		return make_error(Errc::invalid_argument, where + ": both sides are host memory");
	}
	if (r != CUDA_SUCCESS)
		return cuda_error(where, call, r);
	if (!stream && (r = d->cuStreamSynchronize(nullptr)) != CUDA_SUCCESS)
		return cuda_error(where, "cuStreamSynchronize", r);
	return {};
}

Result<std::shared_ptr<void>> device_pin(uint32_t device, std::span<std::byte> memory)
{
	std::string where =
		"page-locking " + std::to_string(memory.size()) + " bytes for CUDA device " + std::to_string(device);
	auto ctx = primary(device, where);
	if (!ctx)
		return ctx.error();
	const Driver *d = cuda::driver().value();
	ContextScope scope(**ctx);
	if (CUresult r = d->cuMemHostRegister(memory.data(), memory.size(), CU_MEMHOSTREGISTER_PORTABLE);
	    r != CUDA_SUCCESS)
		return cuda_error(where, "cuMemHostRegister", r);
	std::shared_ptr<PrimaryContext> keep = ctx.value();
	return std::shared_ptr<void>(memory.data(), [keep, d](void *p) {
		ContextScope inner(*keep);
		cuda::synchronize_contexts(*keep);
		d->cuMemHostUnregister(p);
	});
}

Result<void> device_synchronize(uint32_t device, void *stream)
{
	std::string where = "CUDA device " + std::to_string(device);
	auto ctx = primary(device, where);
	if (!ctx)
		return ctx.error();
	const Driver *d = cuda::driver().value();
	ContextScope scope(**ctx, static_cast<CUstream>(stream));
	if (stream) {
		if (CUresult r = d->cuStreamSynchronize(static_cast<CUstream>(stream)); r != CUDA_SUCCESS)
			return cuda_error(where, "cuStreamSynchronize", r);
		return {};
	}
	const char *call = "cuCtxSynchronize";
	if (CUresult r = cuda::synchronize_contexts(**ctx, nullptr, &call); r != CUDA_SUCCESS)
		return cuda_error(where, call, r);
	return {};
}

Result<void> cuda_copy_2d(const Region2D &dst, const Region2D &src, uint64_t width_bytes, uint64_t height,
			  uint32_t device, CudaStream stream_arg)
{
	std::string where = "2D copy on CUDA device " + std::to_string(device);
	if (!dst.address || !src.address)
		return make_error(Errc::invalid_argument, where + ": null address");
	if (width_bytes > dst.pitch || width_bytes > src.pitch)
		return make_error(Errc::invalid_argument,
				  where + ": rows of " + std::to_string(width_bytes) + " bytes exceed a pitch (" +
					  std::to_string(dst.pitch) + " and " + std::to_string(src.pitch) + ")");
	if (!dst.device && !src.device)
		return make_error(Errc::invalid_argument, where + ": both sides are host memory");
	if (width_bytes == 0 || height == 0)
		return {};
	auto ctx = primary(device, where);
	if (!ctx)
		return ctx.error();
	const Driver *d = cuda::driver().value();
	CUstream stream = static_cast<CUstream>(stream_arg);
	ContextScope scope(**ctx, stream);
	CUDA_MEMCPY2D copy{};
	auto side = [](const Region2D &r, CUmemorytype &type, const void *&host, CUdeviceptr &dev, size_t &pitch) {
		type = r.device ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
		if (r.device)
			dev = r.address;
		else
			host = reinterpret_cast<const void *>(uintptr_t(r.address));
		pitch = r.pitch;
	};
	const void *dst_host = nullptr;
	side(src, copy.srcMemoryType, copy.srcHost, copy.srcDevice, copy.srcPitch);
	side(dst, copy.dstMemoryType, dst_host, copy.dstDevice, copy.dstPitch);
	copy.dstHost = const_cast<void *>(dst_host);
	copy.WidthInBytes = width_bytes;
	copy.Height = height;
	if (CUresult r = d->cuMemcpy2DAsync(&copy, stream); r != CUDA_SUCCESS)
		return cuda_error(where, "cuMemcpy2DAsync", r);
	if (!stream) {
		if (CUresult r = d->cuStreamSynchronize(nullptr); r != CUDA_SUCCESS)
			return cuda_error(where, "cuStreamSynchronize", r);
	}
	return {};
}

Result<std::string> cuda_check_device(uint32_t device)
{
	auto info = cuda::check_device(device, "CUDA device " + std::to_string(device));
	if (!info)
		return info.error();
	return info->name;
}

Result<bool> cuda_stream_done(uint32_t device, CudaStream stream)
{
	std::string where = "stream query on CUDA device " + std::to_string(device);
	auto ctx = primary(device, where);
	if (!ctx)
		return ctx.error();
	const Driver *d = cuda::driver().value();
	ContextScope scope(**ctx, static_cast<CUstream>(stream));
	CUresult r = d->cuStreamQuery(static_cast<CUstream>(stream));
	if (r == CUDA_SUCCESS)
		return true;
	if (r == CUDA_ERROR_NOT_READY)
		return false;
	return cuda_error(where, "cuStreamQuery", r);
}

Result<void> cuda_synchronize(uint32_t device, CudaStream stream)
{
	return device_synchronize(device, stream);
}

Result<void> cuda_synchronize_context(void *context)
{
	if (!context)
		return make_error(Errc::invalid_argument, "synchronize: no CUDA context");
	auto d = cuda::driver();
	if (!d)
		return d.error();
	CUcontext ctx = static_cast<CUcontext>(context);
	if (CUresult r = (*d)->cuCtxPushCurrent(ctx); r != CUDA_SUCCESS)
		return cuda_error("synchronize", "cuCtxPushCurrent", r);
	CUresult r = (*d)->cuCtxSynchronize();
	CUcontext popped;
	(*d)->cuCtxPopCurrent(&popped);
	if (r != CUDA_SUCCESS)
		return cuda_error("synchronize", "cuCtxSynchronize", r);
	return {};
}

Result<void> cuda_stream_wait(CudaStream waiter, CudaStream producer)
{
	const char *where = "stream wait";
	auto *w = static_cast<CUstream>(waiter);
	auto *p = static_cast<CUstream>(producer);
	if (!w || !p || w == CU_STREAM_LEGACY || p == CU_STREAM_LEGACY || w == CU_STREAM_PER_THREAD ||
	    p == CU_STREAM_PER_THREAD)
		return make_error(Errc::invalid_argument,
				  "stream wait: both streams must be named, not default streams");
	if (w == p)
		return {};
	auto d = cuda::driver();
	if (!d)
		return d.error();
	const Driver *drv = *d;
	CUcontext theirs = nullptr, ours = nullptr;
	if (CUresult r = drv->cuStreamGetCtx(p, &theirs); r != CUDA_SUCCESS)
		return cuda_error(where, "cuStreamGetCtx", r);
	if (CUresult r = drv->cuStreamGetCtx(w, &ours); r != CUDA_SUCCESS)
		return cuda_error(where, "cuStreamGetCtx", r);
	CUcontext popped;
	// The event is of the producer's context, as its record must be; the waiter's
	// context is current for the wait. Destroying the event leaves the wait in place.
	CUevent event = nullptr;
	if (CUresult r = drv->cuCtxPushCurrent(theirs); r != CUDA_SUCCESS)
		return cuda_error(where, "cuCtxPushCurrent", r);
	CUresult r = drv->cuEventCreate(&event, CU_EVENT_DISABLE_TIMING);
	const char *call = "cuEventCreate";
	if (r == CUDA_SUCCESS) {
		r = drv->cuEventRecord(event, p);
		call = "cuEventRecord";
	}
	drv->cuCtxPopCurrent(&popped);
	if (r == CUDA_SUCCESS) {
		if (CUresult pushed = drv->cuCtxPushCurrent(ours); pushed != CUDA_SUCCESS) {
			r = pushed;
			call = "cuCtxPushCurrent";
		} else {
			r = drv->cuStreamWaitEvent(w, event, CU_EVENT_WAIT_DEFAULT);
			call = "cuStreamWaitEvent";
			drv->cuCtxPopCurrent(&popped);
		}
	}
	if (event)
		drv->cuEventDestroy(event);
	if (r != CUDA_SUCCESS)
		return cuda_error(where, call, r);
	return {};
}

} // namespace xmem
