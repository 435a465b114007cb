// unsupported.cpp - entry points the simulator exports but does not simulate: kernels,
// modules, linking, texture objects, CUDA arrays, managed memory, OpenGL interop and
// interprocess events. Each says so on stderr and fails.
//
// GStreamer's CUDA library and FFmpeg's loader (ffnvcodec) refuse to load a driver that
// lacks any of them; they use them only for kernels, GL memory, CUDA arrays and events
// shared between processes, never on their upload, download, decode-copy and IPC paths.

#include "cudasim.hpp"

#include <cstdio>

// cudaGL.h's calls, declared with their GL types spelled out (GLuint and GLenum are
// unsigned int, CUGLDeviceList an enum) so that the simulator needs no OpenGL headers.
#pragma GCC visibility push(default)
extern "C" {
CUresult CUDAAPI cuGLGetDevices_v2(unsigned int *pCudaDeviceCount, CUdevice *pCudaDevices, unsigned int cudaDeviceCount,
				   int deviceList);
CUresult CUDAAPI cuGraphicsGLRegisterBuffer(CUgraphicsResource *pCudaResource, unsigned int buffer, unsigned int Flags);
CUresult CUDAAPI cuGraphicsGLRegisterImage(CUgraphicsResource *pCudaResource, unsigned int image, unsigned int target,
					   unsigned int Flags);

// ffnvcodec loads these by their unversioned names, which cuda.h renames to _v2: the v1
// ABI (cuModuleGetGlobal's with 32-bit pointer and size), which the real driver exports.
CUresult CUDAAPI cuLinkCreate_v1(unsigned int numOptions, CUjit_option *options, void **optionValues,
				 CUlinkState *stateOut) __asm__("cuLinkCreate");
CUresult CUDAAPI cuLinkAddData_v1(CUlinkState state, CUjitInputType type, void *data, size_t size, const char *name,
				  unsigned int numOptions, CUjit_option *options,
				  void **optionValues) __asm__("cuLinkAddData");
CUresult CUDAAPI cuModuleGetGlobal_v1(unsigned int *dptr, unsigned int *bytes, CUmodule hmod,
				      const char *name) __asm__("cuModuleGetGlobal");
}
#pragma GCC visibility pop

namespace {

constexpr const char *no_kernels = "the simulator runs no kernels";
constexpr const char *no_textures = "the simulator has no texture objects (no kernels read them)";
constexpr const char *no_graphics = "the simulator has no graphics interop";
constexpr const char *no_arrays = "the simulator has no CUDA arrays";
constexpr const char *no_ipc_events =
	"the simulator has no interprocess events (cuEventCreate refuses CU_EVENT_INTERPROCESS)";
constexpr const char *no_managed = "the simulator has no unified memory (CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY is 0)";

// Always said, like an unknown attribute: a caller that reaches one of these on a path
// under test must notice that the simulator cannot test it. Before cuInit, the calls fail
// as every other call does.
CUresult unsupported(const char *call, const char *why, CUresult err = CUDA_ERROR_NOT_SUPPORTED)
{
	if (!cudasim::state())
		return CUDA_ERROR_NOT_INITIALIZED;
	const char *name = "?";
	cuGetErrorName(err, &name);
	std::fprintf(stderr, "cudasim: %s -> %s: not simulated: %s\n", call, name, why);
	return err;
}

} // namespace

// Creating calls fail with CUDA_ERROR_NOT_SUPPORTED. Calls that take a module, function,
// link state, texture object, array or graphics resource fail with
// CUDA_ERROR_INVALID_HANDLE, as the real driver does for a handle it never made: the
// simulator never makes one.

CUresult CUDAAPI cuModuleLoadData(CUmodule *, const void *)
{
	return unsupported("cuModuleLoadData", no_kernels);
}

CUresult CUDAAPI cuModuleGetFunction(CUfunction *, CUmodule, const char *)
{
	return unsupported("cuModuleGetFunction", no_kernels, CUDA_ERROR_INVALID_HANDLE);
}

CUresult CUDAAPI cuModuleUnload(CUmodule)
{
	return unsupported("cuModuleUnload", no_kernels, CUDA_ERROR_INVALID_HANDLE);
}

CUresult CUDAAPI cuModuleGetGlobal_v1(unsigned int *, unsigned int *, CUmodule, const char *)
{
	return unsupported("cuModuleGetGlobal", no_kernels, CUDA_ERROR_INVALID_HANDLE);
}

CUresult CUDAAPI cuLinkCreate_v1(unsigned int, CUjit_option *, void **, CUlinkState *)
{
	return unsupported("cuLinkCreate", no_kernels);
}

CUresult CUDAAPI cuLinkAddData_v1(CUlinkState, CUjitInputType, void *, size_t, const char *, unsigned int,
				  CUjit_option *, void **)
{
	return unsupported("cuLinkAddData", no_kernels, CUDA_ERROR_INVALID_HANDLE);
}

CUresult CUDAAPI cuLinkComplete(CUlinkState, void **, size_t *)
{
	return unsupported("cuLinkComplete", no_kernels, CUDA_ERROR_INVALID_HANDLE);
}

CUresult CUDAAPI cuLinkDestroy(CUlinkState)
{
	return unsupported("cuLinkDestroy", no_kernels, CUDA_ERROR_INVALID_HANDLE);
}

CUresult CUDAAPI cuLaunchKernel(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int,
				unsigned int, unsigned int, CUstream, void **, void **)
{
	return unsupported("cuLaunchKernel", no_kernels, CUDA_ERROR_INVALID_HANDLE);
}

CUresult CUDAAPI cuTexObjectCreate(CUtexObject *, const CUDA_RESOURCE_DESC *, const CUDA_TEXTURE_DESC *,
				   const CUDA_RESOURCE_VIEW_DESC *)
{
	return unsupported("cuTexObjectCreate", no_textures);
}

CUresult CUDAAPI cuTexObjectDestroy(CUtexObject)
{
	return unsupported("cuTexObjectDestroy", no_textures, CUDA_ERROR_INVALID_HANDLE);
}

CUresult CUDAAPI cuArray3DCreate(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *)
{
	return unsupported("cuArray3DCreate", no_arrays);
}

CUresult CUDAAPI cuArrayCreate(CUarray *, const CUDA_ARRAY_DESCRIPTOR *)
{
	return unsupported("cuArrayCreate", no_arrays);
}

CUresult CUDAAPI cuArrayDestroy(CUarray)
{
	return unsupported("cuArrayDestroy", no_arrays, CUDA_ERROR_INVALID_HANDLE);
}

CUresult CUDAAPI cuMemAllocManaged(CUdeviceptr *, size_t, unsigned int)
{
	return unsupported("cuMemAllocManaged", no_managed);
}

CUresult CUDAAPI cuGLGetDevices_v2(unsigned int *, CUdevice *, unsigned int, int)
{
	return unsupported("cuGLGetDevices", no_graphics);
}

CUresult CUDAAPI cuGraphicsGLRegisterBuffer(CUgraphicsResource *, unsigned int, unsigned int)
{
	return unsupported("cuGraphicsGLRegisterBuffer", no_graphics);
}

CUresult CUDAAPI cuGraphicsGLRegisterImage(CUgraphicsResource *, unsigned int, unsigned int, unsigned int)
{
	return unsupported("cuGraphicsGLRegisterImage", no_graphics);
}

CUresult CUDAAPI cuGraphicsMapResources(unsigned int, CUgraphicsResource *, CUstream)
{
	return unsupported("cuGraphicsMapResources", no_graphics, CUDA_ERROR_INVALID_HANDLE);
}

CUresult CUDAAPI cuGraphicsUnmapResources(unsigned int, CUgraphicsResource *, CUstream)
{
	return unsupported("cuGraphicsUnmapResources", no_graphics, CUDA_ERROR_INVALID_HANDLE);
}

CUresult CUDAAPI cuGraphicsUnregisterResource(CUgraphicsResource)
{
	return unsupported("cuGraphicsUnregisterResource", no_graphics, CUDA_ERROR_INVALID_HANDLE);
}

CUresult CUDAAPI cuGraphicsResourceGetMappedPointer(CUdeviceptr *, size_t *, CUgraphicsResource)
{
	return unsupported("cuGraphicsResourceGetMappedPointer", no_graphics, CUDA_ERROR_INVALID_HANDLE);
}

CUresult CUDAAPI cuGraphicsResourceSetMapFlags(CUgraphicsResource, unsigned int)
{
	return unsupported("cuGraphicsResourceSetMapFlags", no_graphics, CUDA_ERROR_INVALID_HANDLE);
}

CUresult CUDAAPI cuGraphicsSubResourceGetMappedArray(CUarray *, CUgraphicsResource, unsigned int, unsigned int)
{
	return unsupported("cuGraphicsSubResourceGetMappedArray", no_graphics, CUDA_ERROR_INVALID_HANDLE);
}

// Interprocess events: GStreamer 1.26's CUDA library will not load a driver without these
// (nothing of it calls them; its cudaipcsink and cudaipcsrc share memory only, ipc.cpp). No
// event is interprocess here: cuEventCreate refuses CU_EVENT_INTERPROCESS.

CUresult CUDAAPI cuIpcGetEventHandle(CUipcEventHandle *, CUevent)
{
	return unsupported("cuIpcGetEventHandle", no_ipc_events);
}

CUresult CUDAAPI cuIpcOpenEventHandle(CUevent *, CUipcEventHandle)
{
	return unsupported("cuIpcOpenEventHandle", no_ipc_events);
}
