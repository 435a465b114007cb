/* gstcudastream.h - what xmem uses of GStreamer 1.24's CUDA stream, declared as 1.24
 * declares it, so that the 1.24 code path compiles in a check on 1.22 (see
 * gst/meson.build). Never used by a real build. */
#pragma once

#include <gst/cuda/cuda-prelude.h>
#include <gst/cuda/gstcudacontext.h>
#include <gst/gst.h>

#include <cuda.h>

G_BEGIN_DECLS

#define GST_CUDA_STREAM(obj) ((GstCudaStream *)obj)

typedef struct _GstCudaStream GstCudaStream;

GST_CUDA_API GstCudaStream *gst_cuda_stream_new(GstCudaContext *context) G_GNUC_WARN_UNUSED_RESULT;
GST_CUDA_API CUstream gst_cuda_stream_get_handle(GstCudaStream *stream);
GST_CUDA_API GstCudaStream *gst_cuda_stream_ref(GstCudaStream *stream);
GST_CUDA_API void gst_cuda_stream_unref(GstCudaStream *stream);

G_END_DECLS
