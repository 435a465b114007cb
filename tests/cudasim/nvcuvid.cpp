// nvcuvid.cpp - libnvcuvid.so.1 for tests: an NVDEC library with no codec, built beside the
// CUDA driver simulator so that GStreamer's nvcodec plugin registers on it.
//
// nvcodec registers nothing, not even cudaupload and cudadownload, unless NVDEC or NVENC
// loads. This stub loads and answers that the device decodes no codec, so no decoder
// registers; every other call fails with CUDA_ERROR_NOT_SUPPORTED and says so on stderr.
// The parameter types are opaque here: nvcuvid's headers are not part of the CUDA toolkit.

#include <cuda.h>

#include <cstdio>

namespace {

CUresult unsupported(const char *call)
{
	std::fprintf(stderr,
		     "cudasim: %s -> CUDA_ERROR_NOT_SUPPORTED: not simulated: libnvcuvid.so.1 is a stub "
		     "that decodes nothing\n",
		     call);
	return CUDA_ERROR_NOT_SUPPORTED;
}

} // namespace

#pragma GCC visibility push(default)
extern "C" {

// Called once per codec, chroma format and bit depth while the plugin registers: failing
// quietly is the answer "this device cannot decode it".
CUresult CUDAAPI cuvidGetDecoderCaps(void *)
{
	return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult CUDAAPI cuvidCtxLockCreate(void *, CUcontext)
{
	return unsupported("cuvidCtxLockCreate");
}

CUresult CUDAAPI cuvidCtxLockDestroy(void *)
{
	return unsupported("cuvidCtxLockDestroy");
}

CUresult CUDAAPI cuvidCtxLock(void *, unsigned int)
{
	return unsupported("cuvidCtxLock");
}

CUresult CUDAAPI cuvidCtxUnlock(void *, unsigned int)
{
	return unsupported("cuvidCtxUnlock");
}

CUresult CUDAAPI cuvidCreateDecoder(void *, void *)
{
	return unsupported("cuvidCreateDecoder");
}

CUresult CUDAAPI cuvidDestroyDecoder(void *)
{
	return unsupported("cuvidDestroyDecoder");
}

CUresult CUDAAPI cuvidDecodePicture(void *, void *)
{
	return unsupported("cuvidDecodePicture");
}

CUresult CUDAAPI cuvidCreateVideoParser(void *, void *)
{
	return unsupported("cuvidCreateVideoParser");
}

CUresult CUDAAPI cuvidParseVideoData(void *, void *)
{
	return unsupported("cuvidParseVideoData");
}

CUresult CUDAAPI cuvidDestroyVideoParser(void *)
{
	return unsupported("cuvidDestroyVideoParser");
}

CUresult CUDAAPI cuvidMapVideoFrame64(void *, int, unsigned long long *, unsigned int *, void *)
{
	return unsupported("cuvidMapVideoFrame64");
}

CUresult CUDAAPI cuvidUnmapVideoFrame64(void *, unsigned long long)
{
	return unsupported("cuvidUnmapVideoFrame64");
}
}
#pragma GCC visibility pop
