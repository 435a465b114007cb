// nvcuvid.cpp - libnvcuvid.so.1 for tests: an NVDEC library with no codec, built beside the
// CUDA driver simulator so that GStreamer's nvcodec plugin registers on it.
//
// nvcodec registers nothing, not even cudaupload and cudadownload, unless NVDEC or NVENC
// loads. This stub loads, for nvcodec and for FFmpeg's loader (ffnvcodec), and answers that
// the device decodes no codec, so no decoder registers; every other call fails with
// CUDA_ERROR_NOT_SUPPORTED and says so on stderr.
// The parameter types are opaque here: nvcuvid's headers are not part of the CUDA toolkit.

#include <cuda.h>

#include <cstdio>

namespace {

constexpr const char *stub = "not simulated: libnvcuvid.so.1 is a stub that decodes nothing";

CUresult unsupported(const char *call)
{
	std::fprintf(stderr, "cudasim: %s -> CUDA_ERROR_NOT_SUPPORTED: %s\n", call, stub);
	return CUDA_ERROR_NOT_SUPPORTED;
}

// cudaVideoState_Error in nvcuvid.h: what cuvidGetVideoSourceState returns for a source
// that failed.
constexpr int video_state_error = -1;

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

// The rest of what FFmpeg's loader (ffnvcodec's cuvid_load_functions) requires before it
// accepts a libnvcuvid.so.1, and the 32-bit map calls the real library exports too.

CUresult CUDAAPI cuvidGetDecodeStatus(void *, int, void *)
{
	return unsupported("cuvidGetDecodeStatus");
}

CUresult CUDAAPI cuvidReconfigureDecoder(void *, void *)
{
	return unsupported("cuvidReconfigureDecoder");
}

CUresult CUDAAPI cuvidMapVideoFrame(void *, int, unsigned int *, unsigned int *, void *)
{
	return unsupported("cuvidMapVideoFrame");
}

CUresult CUDAAPI cuvidUnmapVideoFrame(void *, unsigned int)
{
	return unsupported("cuvidUnmapVideoFrame");
}

CUresult CUDAAPI cuvidCreateVideoSource(void *, const char *, void *)
{
	return unsupported("cuvidCreateVideoSource");
}

CUresult CUDAAPI cuvidCreateVideoSourceW(void *, const wchar_t *, void *)
{
	return unsupported("cuvidCreateVideoSourceW");
}

CUresult CUDAAPI cuvidDestroyVideoSource(void *)
{
	return unsupported("cuvidDestroyVideoSource");
}

CUresult CUDAAPI cuvidSetVideoSourceState(void *, int)
{
	return unsupported("cuvidSetVideoSourceState");
}

// Returns a state, not a CUresult: no source was ever made, so every one has failed.
int CUDAAPI cuvidGetVideoSourceState(void *)
{
	std::fprintf(stderr, "cudasim: cuvidGetVideoSourceState -> cudaVideoState_Error: %s\n", stub);
	return video_state_error;
}

CUresult CUDAAPI cuvidGetSourceVideoFormat(void *, void *, unsigned int)
{
	return unsupported("cuvidGetSourceVideoFormat");
}

CUresult CUDAAPI cuvidGetSourceAudioFormat(void *, void *, unsigned int)
{
	return unsupported("cuvidGetSourceAudioFormat");
}
}
#pragma GCC visibility pop
