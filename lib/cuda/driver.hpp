// driver.hpp - the CUDA driver, loaded at run time: libcuda.so.1 (or the library
// named by XMEM_CUDA_DRIVER) opened once into a table of entry points.
#pragma once

#include "../system.hpp"

#include <cuda.h>

#include <string>

namespace xmem::cuda {

// One member per driver call xmem makes, named as in cuda.h, typed from its
// prototype and looked up by its ABI name (cuda.h maps cuMemHostRegister to
// cuMemHostRegister_v2 and so on).
struct Driver {
#define XMEM_CUDA_CALLS(X)                                                                                             \
	X(cuInit)                                                                                                      \
	X(cuDriverGetVersion)                                                                                          \
	X(cuGetErrorName)                                                                                              \
	X(cuGetErrorString)                                                                                            \
	X(cuDeviceGetCount)                                                                                            \
	X(cuDeviceGet)                                                                                                 \
	X(cuDeviceCanAccessPeer)                                                                                       \
	X(cuDeviceGetAttribute)                                                                                        \
	X(cuDeviceGetName)                                                                                             \
	X(cuDeviceGetUuid)                                                                                             \
	X(cuDeviceTotalMem)                                                                                            \
	X(cuDevicePrimaryCtxRetain)                                                                                    \
	X(cuDevicePrimaryCtxRelease)                                                                                   \
	X(cuCtxPushCurrent)                                                                                            \
	X(cuCtxPopCurrent)                                                                                             \
	X(cuCtxSynchronize)                                                                                            \
	X(cuCtxGetCurrent)                                                                                             \
	X(cuCtxGetDevice)                                                                                              \
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
	X(cuMemGetAccess)                                                                                              \
	X(cuMemRetainAllocationHandle)                                                                                 \
	X(cuMemGetAllocationPropertiesFromHandle)                                                                      \
	X(cuMemAlloc)                                                                                                  \
	X(cuMemFree)                                                                                                   \
	X(cuMemHostRegister)                                                                                           \
	X(cuMemHostUnregister)                                                                                         \
	X(cuMemHostGetDevicePointer)                                                                                   \
	X(cuStreamCreate)                                                                                              \
	X(cuStreamDestroy)                                                                                             \
	X(cuStreamSynchronize)                                                                                         \
	X(cuStreamQuery)                                                                                               \
	X(cuStreamGetCtx)                                                                                              \
	X(cuStreamWaitEvent)                                                                                           \
	X(cuEventCreate)                                                                                               \
	X(cuEventRecord)                                                                                               \
	X(cuEventDestroy)                                                                                              \
	X(cuStreamWaitValue64)                                                                                         \
	X(cuStreamWriteValue64)                                                                                        \
	X(cuMemcpy2DAsync)                                                                                             \
	X(cuMemcpyHtoDAsync)                                                                                           \
	X(cuMemcpyDtoHAsync)                                                                                           \
	X(cuMemcpyDtoDAsync)                                                                                           \
	X(cuMemsetD32Async)
// NAME is an identifier in a declarator: parentheses would not compile.
#define XMEM_CUDA_MEMBER(name) decltype(&::name) name = nullptr; // NOLINT(bugprone-macro-parentheses)
	XMEM_CUDA_CALLS(XMEM_CUDA_MEMBER)
#undef XMEM_CUDA_MEMBER

	// The first cuDeviceGetUuid, which the real driver still exports by its unversioned
	// name (null where it does not): for a MIG device it answers the GPU's UUID where the
	// _v2 above answers the MIG device's own.
	CUresult(CUDAAPI *cuDeviceGetUuid_v1)(CUuuid *uuid, CUdevice dev) = nullptr;

	std::string library; // the path it was loaded from
	int version = 0; // cuDriverGetVersion

	// "CALL failed: CUDA_ERROR_X (its description)".
	std::string describe(const char *call, CUresult r) const;
};

// The driver, loaded and initialised (cuInit) on first use; the same table after.
// Errors name the cause: no library, a missing entry point, cuInit failing.
Result<const Driver *> driver();

// The capabilities xmem needs of a device, checked before a pool is made on it.
struct DeviceInfo {
	CUdevice device = 0;
	std::string name;
	bool stream_mem_ops = false; // 64-bit cuStreamWaitValue64/WriteValue64
	uint32_t pitch_alignment = 256;
};
// Errors for: no driver, no device, ordinal out of range, compute mode prohibited,
// no virtual memory management, no POSIX-fd shareable handles.
Result<DeviceInfo> check_device(uint32_t ordinal, const std::string &where);

// The device's primary context, retained for this object's lifetime and made
// current on the calling thread while a ContextScope lives.
class PrimaryContext
{
public:
	static Result<std::shared_ptr<PrimaryContext>> retain(uint32_t ordinal, const std::string &where);
	~PrimaryContext();
	CUcontext get() const { return ctx_; }
	CUdevice device() const { return device_; }

private:
	PrimaryContext(const Driver *d, CUdevice device, CUcontext ctx) : d_(d), device_(device), ctx_(ctx) {}
	const Driver *d_;
	CUdevice device_;
	CUcontext ctx_;
};

// Makes a context current on the calling thread for its lifetime: STREAM's own
// context when a stream is given (a caller's stream may come from any context on
// the device, GStreamer's for one), the primary context otherwise.
class ContextScope
{
public:
	explicit ContextScope(const PrimaryContext &ctx, CUstream stream = nullptr);
	~ContextScope();
	ContextScope(const ContextScope &) = delete;
	ContextScope &operator=(const ContextScope &) = delete;

private:
	const Driver *d_;
	bool pushed_ = false;
};

// DEVICE's UUID (cuDeviceGetUuid_v2); MIG says whether it is a MIG device's. cuda.h documents
// only that the _v2 answers "its MIG UUID" for a device in MIG mode, the reason the _v2 was
// added: the first version answering another UUID (its GPU's) tells a MIG device. Where the
// first version is missing, a device counts as a GPU. A MIG device is noted
// (note_mig_device), so messages name it "MIG-…".
CUresult read_device_uuid(const Driver &d, CUdevice device, DeviceUuid *uuid, bool *mig);

// An Error for a failed CALL, with Errc::no_memory for out-of-memory.
Error cuda_error(const std::string &where, const char *call, CUresult r);

} // namespace xmem::cuda
