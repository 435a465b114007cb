// errors.cpp - cuGetErrorName and cuGetErrorString, with the real driver's names and
// strings for every code the simulator returns (and the common others).

#include "cudasim.hpp"

namespace {

struct ErrorText {
	CUresult code;
	const char *name;
	const char *string;
};

#define CUDASIM_ERROR(code, string) { code, #code, string }

constexpr ErrorText error_texts[] = {
	CUDASIM_ERROR(CUDA_SUCCESS, "no error"),
	CUDASIM_ERROR(CUDA_ERROR_INVALID_VALUE, "invalid argument"),
	CUDASIM_ERROR(CUDA_ERROR_OUT_OF_MEMORY, "out of memory"),
	CUDASIM_ERROR(CUDA_ERROR_NOT_INITIALIZED, "initialization error"),
	CUDASIM_ERROR(CUDA_ERROR_DEINITIALIZED, "driver shutting down"),
	CUDASIM_ERROR(CUDA_ERROR_STUB_LIBRARY, "CUDA driver is a stub library"),
	CUDASIM_ERROR(CUDA_ERROR_DEVICE_UNAVAILABLE, "CUDA-capable device(s) is/are busy or unavailable"),
	CUDASIM_ERROR(CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected"),
	CUDASIM_ERROR(CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal"),
	CUDASIM_ERROR(CUDA_ERROR_INVALID_CONTEXT, "invalid device context"),
	CUDASIM_ERROR(CUDA_ERROR_CONTEXT_ALREADY_CURRENT, "context already current"),
	CUDASIM_ERROR(CUDA_ERROR_MAP_FAILED, "mapping of buffer object failed"),
	CUDASIM_ERROR(CUDA_ERROR_UNMAP_FAILED, "unmapping of buffer object failed"),
	CUDASIM_ERROR(CUDA_ERROR_ALREADY_MAPPED, "resource already mapped"),
	CUDASIM_ERROR(CUDA_ERROR_NOT_MAPPED, "resource not mapped"),
	CUDASIM_ERROR(CUDA_ERROR_OPERATING_SYSTEM, "OS call failed or operation not supported on this OS"),
	CUDASIM_ERROR(CUDA_ERROR_INVALID_HANDLE, "invalid resource handle"),
	CUDASIM_ERROR(CUDA_ERROR_ILLEGAL_STATE, "the operation cannot be performed in the present state"),
	CUDASIM_ERROR(CUDA_ERROR_NOT_FOUND, "named symbol not found"),
	CUDASIM_ERROR(CUDA_ERROR_NOT_READY, "device not ready"),
	CUDASIM_ERROR(CUDA_ERROR_ILLEGAL_ADDRESS, "an illegal memory access was encountered"),
	CUDASIM_ERROR(CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE, "primary context active"),
	CUDASIM_ERROR(CUDA_ERROR_CONTEXT_IS_DESTROYED, "context is destroyed"),
	CUDASIM_ERROR(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
		      "part or all of the requested memory range is already mapped"),
	CUDASIM_ERROR(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
		      "pointer does not correspond to a registered memory region"),
	CUDASIM_ERROR(CUDA_ERROR_MISALIGNED_ADDRESS, "misaligned address"),
	CUDASIM_ERROR(CUDA_ERROR_LAUNCH_FAILED, "unspecified launch failure"),
	CUDASIM_ERROR(CUDA_ERROR_NOT_PERMITTED, "operation not permitted"),
	CUDASIM_ERROR(CUDA_ERROR_NOT_SUPPORTED, "operation not supported"),
	CUDASIM_ERROR(CUDA_ERROR_TIMEOUT, "wait operation timed out"),
	CUDASIM_ERROR(CUDA_ERROR_UNKNOWN, "unknown error"),
};

#undef CUDASIM_ERROR

const ErrorText *find_error(CUresult code)
{
	for (const ErrorText &text : error_texts) {
		if (text.code == code)
			return &text;
	}
	return nullptr;
}

} // namespace

// Both work before cuInit, as in the real driver.
CUresult CUDAAPI cuGetErrorName(CUresult error, const char **pStr)
{
	if (!pStr)
		return CUDA_ERROR_INVALID_VALUE;
	const ErrorText *text = find_error(error);
	*pStr = text ? text->name : nullptr;
	return text ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuGetErrorString(CUresult error, const char **pStr)
{
	if (!pStr)
		return CUDA_ERROR_INVALID_VALUE;
	const ErrorText *text = find_error(error);
	*pStr = text ? text->string : nullptr;
	return text ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
