/* gstcudamemory.h - GStreamer 1.22's CUDA memory header, plus what xmem uses of 1.24's,
 * declared as 1.24 declares it, for the compile check of the 1.24 path (see
 * gst/meson.build). Never used by a real build. */
#pragma once
/* For #include_next, a GCC extension -Wpedantic would refuse. */
#pragma GCC system_header

#include_next <gst/cuda/gstcudamemory.h>

#include <gst/cuda/gstcudastream.h>

G_BEGIN_DECLS

#define GST_CUDA_MEMORY_TRANSFER_NEED_SYNC (GST_MEMORY_FLAG_LAST << 2)

GST_CUDA_API GstMemory *gst_cuda_allocator_alloc_wrapped(GstCudaAllocator *allocator, GstCudaContext *context,
							 GstCudaStream *stream, const GstVideoInfo *info,
							 CUdeviceptr dev_ptr, gpointer user_data,
							 GDestroyNotify notify);
GST_CUDA_API GstCudaStream *gst_cuda_memory_get_stream(GstCudaMemory *mem);
GST_CUDA_API void gst_cuda_memory_sync(GstCudaMemory *mem);

G_END_DECLS
