// copies.cpp - every copy and memset entry point of the driver, with how each one is
// counted: direction and bytes from its arguments, one wrapper per ABI name (legacy,
// _v2, per-thread _ptds/_ptsz), and cuGetProcAddress handing those wrappers out.
#include "copies.hpp"
#include "counters.hpp"
#include "driver.hpp"
#include "exports.hpp"

#include <cudaTypedefs.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <string_view>
#include <tuple>
#include <utility>

namespace xmem::cudacount {

namespace {

// The legacy (CUDA 2.x, 32-bit device pointer) entry points the driver still exports:
// cuda.h declares them only for the driver's own build (__CUDA_API_VERSION_INTERNAL),
// so their layouts are copied here from its declarations.
using DevicePtrV1 = unsigned int;
struct Memcpy2DV1 {
	unsigned int srcXInBytes, srcY;
	CUmemorytype srcMemoryType;
	const void *srcHost;
	DevicePtrV1 srcDevice;
	CUarray srcArray;
	unsigned int srcPitch;
	unsigned int dstXInBytes, dstY;
	CUmemorytype dstMemoryType;
	void *dstHost;
	DevicePtrV1 dstDevice;
	CUarray dstArray;
	unsigned int dstPitch;
	unsigned int WidthInBytes, Height;
};
struct Memcpy3DV1 {
	unsigned int srcXInBytes, srcY, srcZ, srcLOD;
	CUmemorytype srcMemoryType;
	const void *srcHost;
	DevicePtrV1 srcDevice;
	CUarray srcArray;
	void *reserved0;
	unsigned int srcPitch, srcHeight;
	unsigned int dstXInBytes, dstY, dstZ, dstLOD;
	CUmemorytype dstMemoryType;
	void *dstHost;
	DevicePtrV1 dstDevice;
	CUarray dstArray;
	void *reserved1;
	unsigned int dstPitch, dstHeight;
	unsigned int WidthInBytes, Height, Depth;
};
using V1HtoD = CUresult (*)(DevicePtrV1, const void *, unsigned int);
using V1DtoH = CUresult (*)(void *, DevicePtrV1, unsigned int);
using V1DtoD = CUresult (*)(DevicePtrV1, DevicePtrV1, unsigned int);
using V1DtoA = CUresult (*)(CUarray, unsigned int, DevicePtrV1, unsigned int);
using V1AtoD = CUresult (*)(DevicePtrV1, CUarray, unsigned int, unsigned int);
using V1HtoA = CUresult (*)(CUarray, unsigned int, const void *, unsigned int);
using V1AtoH = CUresult (*)(void *, CUarray, unsigned int, unsigned int);
using V1AtoA = CUresult (*)(CUarray, unsigned int, CUarray, unsigned int, unsigned int);
using V1HtoDAsync = CUresult (*)(DevicePtrV1, const void *, unsigned int, CUstream);
using V1DtoHAsync = CUresult (*)(void *, DevicePtrV1, unsigned int, CUstream);
using V1DtoDAsync = CUresult (*)(DevicePtrV1, DevicePtrV1, unsigned int, CUstream);
using V1HtoAAsync = CUresult (*)(CUarray, unsigned int, const void *, unsigned int, CUstream);
using V1AtoHAsync = CUresult (*)(void *, CUarray, unsigned int, unsigned int, CUstream);
using V1Copy2D = CUresult (*)(const Memcpy2DV1 *);
using V1Copy2DAsync = CUresult (*)(const Memcpy2DV1 *, CUstream);
using V1Copy3D = CUresult (*)(const Memcpy3DV1 *);
using V1Copy3DAsync = CUresult (*)(const Memcpy3DV1 *, CUstream);
using V1MemsetD8 = CUresult (*)(DevicePtrV1, unsigned char, unsigned int);
using V1MemsetD16 = CUresult (*)(DevicePtrV1, unsigned short, unsigned int);
using V1MemsetD32 = CUresult (*)(DevicePtrV1, unsigned int, unsigned int);
using V1MemsetD2D8 = CUresult (*)(DevicePtrV1, unsigned int, unsigned char, unsigned int, unsigned int);
using V1MemsetD2D16 = CUresult (*)(DevicePtrV1, unsigned int, unsigned short, unsigned int, unsigned int);
using V1MemsetD2D32 = CUresult (*)(DevicePtrV1, unsigned int, unsigned int, unsigned int, unsigned int);

// How a call is counted. A copy's direction comes from its name or, for 2D and 3D copies,
// from the memory types it is given. A CUDA array is device memory; so is unified memory
// (cuMemcpy, cuMemcpyAsync, CU_MEMORYTYPE_UNIFIED): the shim does not ask the driver
// where a pointer lives, which would add calls to the process it measures.

// A linear copy of the byte count in argument BytesAt.
template<Direction D, std::size_t BytesAt>
struct Linear {
	template<typename... Args>
	static void count(bool ok, const Args &...args)
	{
		if (ok)
			count_copy(D, static_cast<std::uint64_t>(std::get<BytesAt>(std::tie(args...))));
		else
			count_failed_copy();
	}
};
using HostToDevice = Linear<Direction::HtoD, 2>; // (dst, src, bytes...)
using DeviceToHost = Linear<Direction::DtoH, 2>; // (dst, src, bytes...)
using DeviceToDevice = Linear<Direction::DtoD, 2>; // (dst, src, bytes...): unified too
using HostToArray = Linear<Direction::HtoD, 3>; // (array, offset, host, bytes...)
using ArrayToHost = Linear<Direction::DtoH, 3>; // (host, array, offset, bytes...)
using ArrayAndDevice = Linear<Direction::DtoD, 3>; // (array, offset, dptr, bytes) or (dptr, array, offset, bytes)
using ArrayToArray = Linear<Direction::DtoD, 4>; // (array, offset, array, offset, bytes)
using Peer = Linear<Direction::DtoD, 4>; // (dst, dst context, src, src context, bytes...)

constexpr bool on_host(CUmemorytype type)
{
	return type == CU_MEMORYTYPE_HOST;
}

// A 2D or 3D copy described by a struct (CUDA_MEMCPY2D, CUDA_MEMCPY3D, _PEER, legacy).
struct Shaped {
	template<typename Copy, typename... Rest>
	static void count(bool ok, const Copy *copy, const Rest &...)
	{
		if (!ok || !copy) {
			count_failed_copy();
			return;
		}
		const bool from_host = on_host(copy->srcMemoryType);
		const bool to_host = on_host(copy->dstMemoryType);
		const Direction direction = from_host ? (to_host ? Direction::HtoH : Direction::HtoD)
						      : (to_host ? Direction::DtoH : Direction::DtoD);
		std::uint64_t bytes = std::uint64_t(copy->WidthInBytes) * copy->Height;
		if constexpr (requires { copy->Depth; })
			bytes *= copy->Depth;
		count_copy(direction, bytes);
	}
};

// cuMemcpyBatchAsync: `count` copies between pointers, each counted as one.
struct Batch {
	template<typename... Rest>
	static void count(bool ok, CUdeviceptr *, CUdeviceptr *, size_t *sizes, size_t n, const Rest &...)
	{
		if (!ok) {
			count_failed_copy();
			return;
		}
		for (size_t i = 0; sizes && i < n; ++i)
			count_copy(Direction::DtoD, sizes[i]);
	}
};

// cuMemcpy3DBatchAsync: each operation counted as one copy of width × height × depth
// (bytes between pointers; elements where a CUDA array is involved).
struct Batch3D {
	template<typename... Rest>
	static void count(bool ok, size_t n, CUDA_MEMCPY3D_BATCH_OP *ops, const Rest &...)
	{
		if (!ok) {
			count_failed_copy();
			return;
		}
		for (size_t i = 0; ops && i < n; ++i)
			count_copy(Direction::DtoD,
				   std::uint64_t(ops[i].extent.width) * ops[i].extent.height * ops[i].extent.depth);
	}
};

// cuMemsetD8/16/32: (dptr, value, elements...); the 2D ones: (dptr, pitch, value, width, height...).
template<std::size_t ElementBytes>
struct Memset1D {
	template<typename... Args>
	static void count(bool ok, const Args &...args)
	{
		if (ok)
			count_memset(std::uint64_t(std::get<2>(std::tie(args...))) * ElementBytes);
		else
			count_failed_memset();
	}
};
template<std::size_t ElementBytes>
struct Memset2D {
	template<typename... Args>
	static void count(bool ok, const Args &...args)
	{
		const auto &arguments = std::tie(args...);
		if (ok)
			count_memset(std::uint64_t(std::get<3>(arguments)) * std::get<4>(arguments) * ElementBytes);
		else
			count_failed_memset();
	}
};

// Every counted entry point: its ABI name; the name cuGetProcAddress is asked for; the
// cudaVersion from which cuGetProcAddress returns this one (cudaTypedefs.h's PFN_*_vNNNN,
// 0 for the legacy ones); whether it is the per-thread default stream variant; its type;
// how it is counted.
#define XMEM_CUDACOUNT_COUNTED(X)                                                                                      \
	X(cuMemcpyHtoD, cuMemcpyHtoD, 0, false, V1HtoD, HostToDevice)                                                  \
	X(cuMemcpyHtoD_v2, cuMemcpyHtoD, 3020, false, PFN_cuMemcpyHtoD_v3020, HostToDevice)                            \
	X(cuMemcpyHtoD_v2_ptds, cuMemcpyHtoD, 7000, true, PFN_cuMemcpyHtoD_v7000_ptds, HostToDevice)                   \
	X(cuMemcpyDtoH, cuMemcpyDtoH, 0, false, V1DtoH, DeviceToHost)                                                  \
	X(cuMemcpyDtoH_v2, cuMemcpyDtoH, 3020, false, PFN_cuMemcpyDtoH_v3020, DeviceToHost)                            \
	X(cuMemcpyDtoH_v2_ptds, cuMemcpyDtoH, 7000, true, PFN_cuMemcpyDtoH_v7000_ptds, DeviceToHost)                   \
	X(cuMemcpyDtoD, cuMemcpyDtoD, 0, false, V1DtoD, DeviceToDevice)                                                \
	X(cuMemcpyDtoD_v2, cuMemcpyDtoD, 3020, false, PFN_cuMemcpyDtoD_v3020, DeviceToDevice)                          \
	X(cuMemcpyDtoD_v2_ptds, cuMemcpyDtoD, 7000, true, PFN_cuMemcpyDtoD_v7000_ptds, DeviceToDevice)                 \
	X(cuMemcpyDtoA, cuMemcpyDtoA, 0, false, V1DtoA, ArrayAndDevice)                                                \
	X(cuMemcpyDtoA_v2, cuMemcpyDtoA, 3020, false, PFN_cuMemcpyDtoA_v3020, ArrayAndDevice)                          \
	X(cuMemcpyDtoA_v2_ptds, cuMemcpyDtoA, 7000, true, PFN_cuMemcpyDtoA_v7000_ptds, ArrayAndDevice)                 \
	X(cuMemcpyAtoD, cuMemcpyAtoD, 0, false, V1AtoD, ArrayAndDevice)                                                \
	X(cuMemcpyAtoD_v2, cuMemcpyAtoD, 3020, false, PFN_cuMemcpyAtoD_v3020, ArrayAndDevice)                          \
	X(cuMemcpyAtoD_v2_ptds, cuMemcpyAtoD, 7000, true, PFN_cuMemcpyAtoD_v7000_ptds, ArrayAndDevice)                 \
	X(cuMemcpyHtoA, cuMemcpyHtoA, 0, false, V1HtoA, HostToArray)                                                   \
	X(cuMemcpyHtoA_v2, cuMemcpyHtoA, 3020, false, PFN_cuMemcpyHtoA_v3020, HostToArray)                             \
	X(cuMemcpyHtoA_v2_ptds, cuMemcpyHtoA, 7000, true, PFN_cuMemcpyHtoA_v7000_ptds, HostToArray)                    \
	X(cuMemcpyAtoH, cuMemcpyAtoH, 0, false, V1AtoH, ArrayToHost)                                                   \
	X(cuMemcpyAtoH_v2, cuMemcpyAtoH, 3020, false, PFN_cuMemcpyAtoH_v3020, ArrayToHost)                             \
	X(cuMemcpyAtoH_v2_ptds, cuMemcpyAtoH, 7000, true, PFN_cuMemcpyAtoH_v7000_ptds, ArrayToHost)                    \
	X(cuMemcpyAtoA, cuMemcpyAtoA, 0, false, V1AtoA, ArrayToArray)                                                  \
	X(cuMemcpyAtoA_v2, cuMemcpyAtoA, 3020, false, PFN_cuMemcpyAtoA_v3020, ArrayToArray)                            \
	X(cuMemcpyAtoA_v2_ptds, cuMemcpyAtoA, 7000, true, PFN_cuMemcpyAtoA_v7000_ptds, ArrayToArray)                   \
	X(cuMemcpyHtoDAsync, cuMemcpyHtoDAsync, 0, false, V1HtoDAsync, HostToDevice)                                   \
	X(cuMemcpyHtoDAsync_v2, cuMemcpyHtoDAsync, 3020, false, PFN_cuMemcpyHtoDAsync_v3020, HostToDevice)             \
	X(cuMemcpyHtoDAsync_v2_ptsz, cuMemcpyHtoDAsync, 7000, true, PFN_cuMemcpyHtoDAsync_v7000_ptsz, HostToDevice)    \
	X(cuMemcpyDtoHAsync, cuMemcpyDtoHAsync, 0, false, V1DtoHAsync, DeviceToHost)                                   \
	X(cuMemcpyDtoHAsync_v2, cuMemcpyDtoHAsync, 3020, false, PFN_cuMemcpyDtoHAsync_v3020, DeviceToHost)             \
	X(cuMemcpyDtoHAsync_v2_ptsz, cuMemcpyDtoHAsync, 7000, true, PFN_cuMemcpyDtoHAsync_v7000_ptsz, DeviceToHost)    \
	X(cuMemcpyDtoDAsync, cuMemcpyDtoDAsync, 0, false, V1DtoDAsync, DeviceToDevice)                                 \
	X(cuMemcpyDtoDAsync_v2, cuMemcpyDtoDAsync, 3020, false, PFN_cuMemcpyDtoDAsync_v3020, DeviceToDevice)           \
	X(cuMemcpyDtoDAsync_v2_ptsz, cuMemcpyDtoDAsync, 7000, true, PFN_cuMemcpyDtoDAsync_v7000_ptsz, DeviceToDevice)  \
	X(cuMemcpyHtoAAsync, cuMemcpyHtoAAsync, 0, false, V1HtoAAsync, HostToArray)                                    \
	X(cuMemcpyHtoAAsync_v2, cuMemcpyHtoAAsync, 3020, false, PFN_cuMemcpyHtoAAsync_v3020, HostToArray)              \
	X(cuMemcpyHtoAAsync_v2_ptsz, cuMemcpyHtoAAsync, 7000, true, PFN_cuMemcpyHtoAAsync_v7000_ptsz, HostToArray)     \
	X(cuMemcpyAtoHAsync, cuMemcpyAtoHAsync, 0, false, V1AtoHAsync, ArrayToHost)                                    \
	X(cuMemcpyAtoHAsync_v2, cuMemcpyAtoHAsync, 3020, false, PFN_cuMemcpyAtoHAsync_v3020, ArrayToHost)              \
	X(cuMemcpyAtoHAsync_v2_ptsz, cuMemcpyAtoHAsync, 7000, true, PFN_cuMemcpyAtoHAsync_v7000_ptsz, ArrayToHost)     \
	X(cuMemcpy, cuMemcpy, 4000, false, PFN_cuMemcpy_v4000, DeviceToDevice)                                         \
	X(cuMemcpy_ptds, cuMemcpy, 7000, true, PFN_cuMemcpy_v7000_ptds, DeviceToDevice)                                \
	X(cuMemcpyAsync, cuMemcpyAsync, 4000, false, PFN_cuMemcpyAsync_v4000, DeviceToDevice)                          \
	X(cuMemcpyAsync_ptsz, cuMemcpyAsync, 7000, true, PFN_cuMemcpyAsync_v7000_ptsz, DeviceToDevice)                 \
	X(cuMemcpyPeer, cuMemcpyPeer, 4000, false, PFN_cuMemcpyPeer_v4000, Peer)                                       \
	X(cuMemcpyPeer_ptds, cuMemcpyPeer, 7000, true, PFN_cuMemcpyPeer_v7000_ptds, Peer)                              \
	X(cuMemcpyPeerAsync, cuMemcpyPeerAsync, 4000, false, PFN_cuMemcpyPeerAsync_v4000, Peer)                        \
	X(cuMemcpyPeerAsync_ptsz, cuMemcpyPeerAsync, 7000, true, PFN_cuMemcpyPeerAsync_v7000_ptsz, Peer)               \
	X(cuMemcpy2D, cuMemcpy2D, 0, false, V1Copy2D, Shaped)                                                          \
	X(cuMemcpy2D_v2, cuMemcpy2D, 3020, false, PFN_cuMemcpy2D_v3020, Shaped)                                        \
	X(cuMemcpy2D_v2_ptds, cuMemcpy2D, 7000, true, PFN_cuMemcpy2D_v7000_ptds, Shaped)                               \
	X(cuMemcpy2DUnaligned, cuMemcpy2DUnaligned, 0, false, V1Copy2D, Shaped)                                        \
	X(cuMemcpy2DUnaligned_v2, cuMemcpy2DUnaligned, 3020, false, PFN_cuMemcpy2DUnaligned_v3020, Shaped)             \
	X(cuMemcpy2DUnaligned_v2_ptds, cuMemcpy2DUnaligned, 7000, true, PFN_cuMemcpy2DUnaligned_v7000_ptds, Shaped)    \
	X(cuMemcpy2DAsync, cuMemcpy2DAsync, 0, false, V1Copy2DAsync, Shaped)                                           \
	X(cuMemcpy2DAsync_v2, cuMemcpy2DAsync, 3020, false, PFN_cuMemcpy2DAsync_v3020, Shaped)                         \
	X(cuMemcpy2DAsync_v2_ptsz, cuMemcpy2DAsync, 7000, true, PFN_cuMemcpy2DAsync_v7000_ptsz, Shaped)                \
	X(cuMemcpy3D, cuMemcpy3D, 0, false, V1Copy3D, Shaped)                                                          \
	X(cuMemcpy3D_v2, cuMemcpy3D, 3020, false, PFN_cuMemcpy3D_v3020, Shaped)                                        \
	X(cuMemcpy3D_v2_ptds, cuMemcpy3D, 7000, true, PFN_cuMemcpy3D_v7000_ptds, Shaped)                               \
	X(cuMemcpy3DAsync, cuMemcpy3DAsync, 0, false, V1Copy3DAsync, Shaped)                                           \
	X(cuMemcpy3DAsync_v2, cuMemcpy3DAsync, 3020, false, PFN_cuMemcpy3DAsync_v3020, Shaped)                         \
	X(cuMemcpy3DAsync_v2_ptsz, cuMemcpy3DAsync, 7000, true, PFN_cuMemcpy3DAsync_v7000_ptsz, Shaped)                \
	X(cuMemcpy3DPeer, cuMemcpy3DPeer, 4000, false, PFN_cuMemcpy3DPeer_v4000, Shaped)                               \
	X(cuMemcpy3DPeer_ptds, cuMemcpy3DPeer, 7000, true, PFN_cuMemcpy3DPeer_v7000_ptds, Shaped)                      \
	X(cuMemcpy3DPeerAsync, cuMemcpy3DPeerAsync, 4000, false, PFN_cuMemcpy3DPeerAsync_v4000, Shaped)                \
	X(cuMemcpy3DPeerAsync_ptsz, cuMemcpy3DPeerAsync, 7000, true, PFN_cuMemcpy3DPeerAsync_v7000_ptsz, Shaped)       \
	X(cuMemcpyBatchAsync, cuMemcpyBatchAsync, 12080, false, PFN_cuMemcpyBatchAsync_v12080, Batch)                  \
	X(cuMemcpyBatchAsync_ptsz, cuMemcpyBatchAsync, 12080, true, PFN_cuMemcpyBatchAsync_v12080_ptsz, Batch)         \
	X(cuMemcpyBatchAsync_v2, cuMemcpyBatchAsync, 13000, false, PFN_cuMemcpyBatchAsync_v13000, Batch)               \
	X(cuMemcpyBatchAsync_v2_ptsz, cuMemcpyBatchAsync, 13000, true, PFN_cuMemcpyBatchAsync_v13000_ptsz, Batch)      \
	X(cuMemcpy3DBatchAsync, cuMemcpy3DBatchAsync, 12080, false, PFN_cuMemcpy3DBatchAsync_v12080, Batch3D)          \
	X(cuMemcpy3DBatchAsync_ptsz, cuMemcpy3DBatchAsync, 12080, true, PFN_cuMemcpy3DBatchAsync_v12080_ptsz, Batch3D) \
	X(cuMemcpy3DBatchAsync_v2, cuMemcpy3DBatchAsync, 13000, false, PFN_cuMemcpy3DBatchAsync_v13000, Batch3D)       \
	X(cuMemcpy3DBatchAsync_v2_ptsz, cuMemcpy3DBatchAsync, 13000, true, PFN_cuMemcpy3DBatchAsync_v13000_ptsz,       \
	  Batch3D)                                                                                                     \
	X(cuMemsetD8, cuMemsetD8, 0, false, V1MemsetD8, Memset1D<1>)                                                   \
	X(cuMemsetD8_v2, cuMemsetD8, 3020, false, PFN_cuMemsetD8_v3020, Memset1D<1>)                                   \
	X(cuMemsetD8_v2_ptds, cuMemsetD8, 7000, true, PFN_cuMemsetD8_v7000_ptds, Memset1D<1>)                          \
	X(cuMemsetD16, cuMemsetD16, 0, false, V1MemsetD16, Memset1D<2>)                                                \
	X(cuMemsetD16_v2, cuMemsetD16, 3020, false, PFN_cuMemsetD16_v3020, Memset1D<2>)                                \
	X(cuMemsetD16_v2_ptds, cuMemsetD16, 7000, true, PFN_cuMemsetD16_v7000_ptds, Memset1D<2>)                       \
	X(cuMemsetD32, cuMemsetD32, 0, false, V1MemsetD32, Memset1D<4>)                                                \
	X(cuMemsetD32_v2, cuMemsetD32, 3020, false, PFN_cuMemsetD32_v3020, Memset1D<4>)                                \
	X(cuMemsetD32_v2_ptds, cuMemsetD32, 7000, true, PFN_cuMemsetD32_v7000_ptds, Memset1D<4>)                       \
	X(cuMemsetD8Async, cuMemsetD8Async, 3020, false, PFN_cuMemsetD8Async_v3020, Memset1D<1>)                       \
	X(cuMemsetD8Async_ptsz, cuMemsetD8Async, 7000, true, PFN_cuMemsetD8Async_v7000_ptsz, Memset1D<1>)              \
	X(cuMemsetD16Async, cuMemsetD16Async, 3020, false, PFN_cuMemsetD16Async_v3020, Memset1D<2>)                    \
	X(cuMemsetD16Async_ptsz, cuMemsetD16Async, 7000, true, PFN_cuMemsetD16Async_v7000_ptsz, Memset1D<2>)           \
	X(cuMemsetD32Async, cuMemsetD32Async, 3020, false, PFN_cuMemsetD32Async_v3020, Memset1D<4>)                    \
	X(cuMemsetD32Async_ptsz, cuMemsetD32Async, 7000, true, PFN_cuMemsetD32Async_v7000_ptsz, Memset1D<4>)           \
	X(cuMemsetD2D8, cuMemsetD2D8, 0, false, V1MemsetD2D8, Memset2D<1>)                                             \
	X(cuMemsetD2D8_v2, cuMemsetD2D8, 3020, false, PFN_cuMemsetD2D8_v3020, Memset2D<1>)                             \
	X(cuMemsetD2D8_v2_ptds, cuMemsetD2D8, 7000, true, PFN_cuMemsetD2D8_v7000_ptds, Memset2D<1>)                    \
	X(cuMemsetD2D16, cuMemsetD2D16, 0, false, V1MemsetD2D16, Memset2D<2>)                                          \
	X(cuMemsetD2D16_v2, cuMemsetD2D16, 3020, false, PFN_cuMemsetD2D16_v3020, Memset2D<2>)                          \
	X(cuMemsetD2D16_v2_ptds, cuMemsetD2D16, 7000, true, PFN_cuMemsetD2D16_v7000_ptds, Memset2D<2>)                 \
	X(cuMemsetD2D32, cuMemsetD2D32, 0, false, V1MemsetD2D32, Memset2D<4>)                                          \
	X(cuMemsetD2D32_v2, cuMemsetD2D32, 3020, false, PFN_cuMemsetD2D32_v3020, Memset2D<4>)                          \
	X(cuMemsetD2D32_v2_ptds, cuMemsetD2D32, 7000, true, PFN_cuMemsetD2D32_v7000_ptds, Memset2D<4>)                 \
	X(cuMemsetD2D8Async, cuMemsetD2D8Async, 3020, false, PFN_cuMemsetD2D8Async_v3020, Memset2D<1>)                 \
	X(cuMemsetD2D8Async_ptsz, cuMemsetD2D8Async, 7000, true, PFN_cuMemsetD2D8Async_v7000_ptsz, Memset2D<1>)        \
	X(cuMemsetD2D16Async, cuMemsetD2D16Async, 3020, false, PFN_cuMemsetD2D16Async_v3020, Memset2D<2>)              \
	X(cuMemsetD2D16Async_ptsz, cuMemsetD2D16Async, 7000, true, PFN_cuMemsetD2D16Async_v7000_ptsz, Memset2D<2>)     \
	X(cuMemsetD2D32Async, cuMemsetD2D32Async, 3020, false, PFN_cuMemsetD2D32Async_v3020, Memset2D<4>)              \
	X(cuMemsetD2D32Async_ptsz, cuMemsetD2D32Async, 7000, true, PFN_cuMemsetD2D32Async_v7000_ptsz, Memset2D<4>)

enum Index : std::size_t {
#define XMEM_CUDACOUNT_INDEX(abi, base, since, per_thread, type, policy) index_##abi,
	XMEM_CUDACOUNT_COUNTED(XMEM_CUDACOUNT_INDEX)
#undef XMEM_CUDACOUNT_INDEX
		counted_count
};

// What each wrapper calls: the driver's function of that name (or the stub for one it
// lacks), set by install_counters() while the shim loads. cuGetProcAddress may later put
// the pointer the driver handed out where the driver exported no such name.
std::array<std::atomic<Entry>, counted_count> real_entries{};

template<std::size_t I, typename Policy, typename Function>
struct Counted;

template<std::size_t I, typename Policy, typename... Args>
struct Counted<I, Policy, CUresult (*)(Args...)> {
	static CUresult call(Args... args)
	{
		const auto real = entry_as<CUresult (*)(Args...)>(real_entries[I].load(std::memory_order_acquire));
		const CUresult result = real(args...);
		Policy::count(result == CUDA_SUCCESS, args...);
		return result;
	}
};

struct CountedEntry {
	std::string_view abi_name;
	std::string_view base_name;
	int since;
	bool per_thread;
};

constexpr std::array<CountedEntry, counted_count> counted = { {
#define XMEM_CUDACOUNT_ENTRY(abi, base, since, per_thread, type, policy) { #abi, #base, since, per_thread },
	XMEM_CUDACOUNT_COUNTED(XMEM_CUDACOUNT_ENTRY)
#undef XMEM_CUDACOUNT_ENTRY
} };

// A function rather than a table: a table of casts would be initialized dynamically, maybe
// after the shim's constructor has read it.
Entry wrapper_of(std::size_t i)
{
	switch (i) {
#define XMEM_CUDACOUNT_CASE(abi, base, since, per_thread, type, policy)                                                \
	case index_##abi:                                                                                              \
		return as_entry(&Counted<index_##abi, policy, type>::call);
		XMEM_CUDACOUNT_COUNTED(XMEM_CUDACOUNT_CASE)
#undef XMEM_CUDACOUNT_CASE
	default:
		return nullptr;
	}
}

constexpr std::string_view exported_names[] = {
#define XMEM_CUDACOUNT_EXPORT(name) #name,
#include "driver_symbols.def"
#undef XMEM_CUDACOUNT_EXPORT
};

// Nothing copies uncounted: every exported copy or memset name has its wrapper, and every
// wrapper stands behind an exported name.
constexpr bool every_copy_is_counted()
{
	for (std::string_view name : exported_names) {
		if (!name.starts_with("cuMemcpy") && !name.starts_with("cuMemset"))
			continue;
		if (std::none_of(counted.begin(), counted.end(),
				 [&](const CountedEntry &e) { return e.abi_name == name; }))
			return false;
	}
	return std::all_of(counted.begin(), counted.end(), [](const CountedEntry &e) {
		return std::find(std::begin(exported_names), std::end(exported_names), e.abi_name) !=
		       std::end(exported_names);
	});
}
static_assert(every_copy_is_counted(), "a cuMemcpy*/cuMemset* export without its wrapper, or the reverse");

// cuGetProcAddress (CUDA 11.3) and cuGetProcAddress_v2 (12.0, with the query result).
std::atomic<Entry> real_get_proc_address{ nullptr };
std::atomic<Entry> real_get_proc_address_v2{ nullptr };

CUresult get_proc_address(const char *symbol, void **pfn, int version, cuuint64_t flags);
CUresult get_proc_address_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
			     CUdriverProcAddressQueryResult *status);

bool is_stub(Entry e)
{
	return e == &missing_in_driver || e == &no_driver || e == &before_load;
}

// The entry point cuGetProcAddress means for (symbol, version, flags), by cudaTypedefs.h's
// versions: the newest one not newer than `version`, per-thread if asked (and if there is
// one that old).
const CountedEntry *pick(std::string_view symbol, int version, bool per_thread)
{
	const CountedEntry *best = nullptr;
	for (const CountedEntry &e : counted) {
		if (e.base_name == symbol && e.per_thread == per_thread && e.since <= version &&
		    (!best || e.since > best->since))
			best = &e;
	}
	if (!best && per_thread)
		return pick(symbol, version, false);
	return best;
}

// What the caller gets instead of the driver's answer `found`.
void *substitute(const char *symbol, void *found, int version, cuuint64_t flags)
{
	const auto entry = reinterpret_cast<Entry>(found);
	const std::string_view name(symbol ? symbol : "");
	// One of the functions the driver exports under a counted name: its wrapper. Those of
	// the name asked for first, should the driver export one function under two names.
	for (const bool same_name : { true, false }) {
		for (std::size_t i = 0; i < counted_count; ++i) {
			if ((counted[i].base_name == name) == same_name &&
			    real_entries[i].load(std::memory_order_acquire) == entry)
				return reinterpret_cast<void *>(wrapper_of(i));
		}
	}
	if (name == "cuGetProcAddress") {
		return version >= 12000 ? reinterpret_cast<void *>(&get_proc_address_v2)
					: reinterpret_cast<void *>(&get_proc_address);
	}
	// A pointer the driver exports under no name: the wrapper of the entry point the
	// version and flags select, which calls the driver's export of that name, or this
	// pointer where the driver exports none.
	const CountedEntry *e = pick(name, version, (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0);
	if (!e)
		return found;
	const auto i = static_cast<std::size_t>(e - counted.data());
	std::atomic<Entry> &real = real_entries[i];
	Entry current = real.load(std::memory_order_acquire);
	if (is_stub(current))
		real.compare_exchange_strong(current, entry, std::memory_order_acq_rel);
	return reinterpret_cast<void *>(wrapper_of(i));
}

CUresult get_proc_address(const char *symbol, void **pfn, int version, cuuint64_t flags)
{
	const auto real = entry_as<PFN_cuGetProcAddress_v11030>(real_get_proc_address.load());
	const CUresult result = real(symbol, pfn, version, flags);
	if (result == CUDA_SUCCESS && pfn && *pfn)
		*pfn = substitute(symbol, *pfn, version, flags);
	return result;
}

CUresult get_proc_address_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
			     CUdriverProcAddressQueryResult *status)
{
	const auto real = entry_as<PFN_cuGetProcAddress_v12000>(real_get_proc_address_v2.load());
	const CUresult result = real(symbol, pfn, version, flags, status);
	if (result == CUDA_SUCCESS && pfn && *pfn)
		*pfn = substitute(symbol, *pfn, version, flags);
	return result;
}

void interpose(std::string_view name, std::atomic<Entry> &real, Entry wrapper)
{
	Entry *slot = find_slot(name);
	// Both lists are checked against each other at compile time.
	if (!slot)
		return;
	real.store(*slot, std::memory_order_release);
	*slot = wrapper;
}

} // namespace

void install_counters()
{
	for (std::size_t i = 0; i < counted_count; ++i)
		interpose(counted[i].abi_name, real_entries[i], wrapper_of(i));
	interpose("cuGetProcAddress", real_get_proc_address, as_entry(&get_proc_address));
	interpose("cuGetProcAddress_v2", real_get_proc_address_v2, as_entry(&get_proc_address_v2));
}

} // namespace xmem::cudacount
