// test_ffnvcodec.cpp - FFmpeg's loaders (ffnvcodec, Debian's libffmpeg-nvenc-dev) accept the
// simulator and the NVDEC stub, as examples/nvdec_producer.cpp needs.
//
// A program of its own: ffnvcodec declares its own CUDA types, and compiles its CUDA loader
// only where cuda.h is not included. It opens libcuda.so.1 and libnvcuvid.so.1 by name, so
// meson runs it with LD_LIBRARY_PATH set to the simulator's folder.

#include <ffnvcodec/dynlink_loader.h>

#include <gtest/gtest.h>

#include <dlfcn.h>

#include <string>

TEST(Ffnvcodec, BothLoadersAcceptTheSimulatorAndTheStub)
{
	// Each refuses a library that lacks any symbol it requires, and names it on stderr.
	CudaFunctions *cu = nullptr;
	CuvidFunctions *cuvid = nullptr;
	ASSERT_EQ(cuda_load_functions(&cu, nullptr), 0);
	ASSERT_EQ(cuvid_load_functions(&cuvid, nullptr), 0);

	// The libraries found are the simulator and its stub, not a driver installed here.
	ASSERT_EQ(cu->cuInit(0), CUDA_SUCCESS);
	char name[64] = {};
	ASSERT_EQ(cu->cuDeviceGetName(name, sizeof(name), 0), CUDA_SUCCESS);
	EXPECT_EQ(std::string(name), "xmem cudasim device 0");
	int major = -1, minor = -1;
	EXPECT_EQ(cu->cuDeviceComputeCapability(&major, &minor, 0), CUDA_SUCCESS);
	EXPECT_EQ(major, 9);
	EXPECT_EQ(minor, 0);

	// What a decoder asks first: the stub decodes no codec.
	ASSERT_NE(cuvid->cuvidGetDecoderCaps, nullptr);
	CUVIDDECODECAPS caps = {};
	caps.eCodecType = cudaVideoCodec_H264;
	caps.eChromaFormat = cudaVideoChromaFormat_420;
	caps.nBitDepthMinus8 = 0;
	// ffnvcodec's CUresult has no CUDA_ERROR_NOT_SUPPORTED: ask the driver its name.
	const char *error = nullptr;
	EXPECT_EQ(cu->cuGetErrorName(cuvid->cuvidGetDecoderCaps(&caps), &error), CUDA_SUCCESS);
	EXPECT_EQ(std::string(error ? error : "(none)"), "CUDA_ERROR_NOT_SUPPORTED");

	// The loaders' free calls dlclose the libraries: keep them loaded, or the
	// simulator's state (reachable only from its own globals) would count as leaked.
	for (const char *lib : { "libcuda.so.1", "libnvcuvid.so.1" })
		EXPECT_NE(dlopen(lib, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE), nullptr) << lib;
	cuvid_free_functions(&cuvid);
	cuda_free_functions(&cu);
	EXPECT_EQ(cuvid, nullptr);
	EXPECT_EQ(cu, nullptr);
}
