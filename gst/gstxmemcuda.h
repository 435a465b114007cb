/* gstxmemcuda.h - what xmemsink and xmemsrc need of CUDA: video planes copied
 * between host and device memory (through libxmem's driver, so no GPU library is
 * linked), and, when GStreamer's CUDA library was found at build time, the shared
 * GstCudaContext, a stream on it, and access to memory:CUDAMemory buffers. */
#pragma once

#include <xmem/xmem.hpp>

#include <gst/gst.h>
#include <gst/video/video.h>

#include <deque>
#include <string>

#define GST_XMEM_CAPS_FEATURE_CUDA "memory:CUDAMemory"

/* Where one side of a frame copy is: its base address (host pointer or device
 * address) and its planes' offsets and strides. */
struct GstXmemPlanes {
	guint64 base = 0;
	bool device = false;
	guint n_planes = 0;
	gsize offset[GST_VIDEO_MAX_PLANES] = {};
	gint stride[GST_VIDEO_MAX_PLANES] = {};
};

/* Copies every plane of a frame of INFO from SRC to DST (at least one side on the
 * device) through libxmem, one 2D copy a plane, queued on STREAM (complete on return
 * without one). Returns the error, if any. */
xmem::Result<void> gst_xmem_copy_planes(const GstVideoInfo &info, const GstXmemPlanes &dst, const GstXmemPlanes &src,
					guint device, xmem::CudaStream stream);

/* The layout of INFO with every row and plane aligned to ALIGNMENT bytes (a power
 * of two): what a device slot holds. False when INFO cannot be aligned so. */
bool gst_xmem_aligned_info(const GstVideoInfo &info, guint alignment, GstVideoInfo *out);

/* CAPS without memory features: the format a pool publishes, whatever memory the
 * frames came in. Transfer full. */
GstCaps *gst_xmem_caps_without_features(const GstCaps *caps);
/* Whether the first structure of CAPS has the memory:CUDAMemory feature. */
bool gst_xmem_caps_is_cuda(const GstCaps *caps);

/* Whether this build can take and give memory:CUDAMemory buffers. */
bool gst_xmem_have_gst_cuda();

/* One element's link to GStreamer's CUDA: the context it shares with its
 * neighbours, a stream on it, and the device. Streaming thread (and stop, once it
 * has ended), except handle_context_query() and set_context(), which any thread
 * may call. The element's object lock guards context_ and ensuring_; it is taken
 * after the element's own lock, and nothing is called with it held but GObject
 * reference counting. */
class GstXmemCuda
{
public:
	/* WRAPS: the element hands out device memory it wraps (xmemsrc), whose users must
	 * be able to wait for its stream: with GStreamer 1.24 and later that stream is a
	 * GstCudaStream. Otherwise (xmemsink) the stream is a non-blocking one of ours. */
	GstXmemCuda(GstElement *element, bool wraps) : element_(element), wraps_(wraps) {}
	~GstXmemCuda();
	GstXmemCuda(const GstXmemCuda &) = delete;
	GstXmemCuda &operator=(const GstXmemCuda &) = delete;

	/* Finds or makes the context for DEVICE (-1: any, a neighbour's first) and a
	 * stream on it; false, with the cause in WHY, when there is none. */
	bool ensure(gint device, std::string *why);
	/* The context's device, -1 without one. */
	gint device() const;
	/* The stream's handle, nullptr without one. */
	xmem::CudaStream stream() const { return stream_; }
	/* Drops the stream and the context (stop). */
	void reset();

	/* GstElement::set_context and the CONTEXT query: share ours. */
	void set_context(GstContext *context);
	bool handle_context_query(GstQuery *query);

	/* Whether MEM is memory:CUDAMemory that this build can map for its device address. */
	static bool is_cuda_memory(GstMemory *mem);
	/* The device address of a CUDA memory mapped with FLAGS (GST_MAP_READ or
	 * GST_MAP_WRITE); unmap with gst_memory_unmap(). */
	static bool map_device(GstMemory *mem, GstMapInfo *info, GstMapFlags flags);
	/* map_device() for reading on our stream: with GStreamer 1.24 and later, CUDA
	 * memory may still be written on a stream of its own when it arrives (mapping does
	 * not wait for that), so our stream is made to wait for it, on the GPU. */
	bool map_input(GstMemory *mem, GstMapInfo *info);
	/* The layout of a CUDA memory's frame (its own strides and offsets). */
	static bool memory_layout(GstMemory *mem, GstVideoInfo *info);
	/* Whether this GStreamer wraps foreign device memory as CUDA memory (1.24 and
	 * later): xmemsrc then hands out the slot itself instead of a copy. */
	static bool can_wrap();
	/* FRAME, a device slot, as CUDA memory laid out as LAYOUT, without a copy: on our
	 * stream, which waited (on the GPU) for the producer's writes, so users of the
	 * memory wait for it. The slot goes back when the memory is freed, once every
	 * stream of the context is done. nullptr where it cannot be wrapped. */
	GstMemory *wrap(xmem::BufferGuard &&frame, const GstVideoInfo &layout);
	/* A buffer pool of CUDA memory on this context for CAPS (frames of SIZE bytes),
	 * active; nullptr without a context. Transfer full. */
	GstBufferPool *new_buffer_pool(GstCaps *caps, guint size);

	/* Keeps BUFFER (a reference is taken) until the work queued on the stream so
	 * far is done: upstream must not rewrite it under a copy still reading it. */
	void hold_until_done(GstBuffer *buffer);
	/* Drops the buffers whose copies are done; past LIMIT held, waits for them. */
	void release_done(gsize limit);

private:
	/* context_, referenced, read under the object lock; nullptr without one. */
	GstObject *context_ref() const;

	GstElement *element_;
	/* See the constructor; used only where GStreamer can wrap (1.24 and later). */
	[[maybe_unused]] bool wraps_;
	/* A GstCudaContext when built with GStreamer's CUDA library. Set once (from
	 * null) by ensure() or set_context(), cleared by reset(); object lock. */
	GstObject *context_ = nullptr;
	/* While ensure() asks the neighbours for their context: where that call looks
	 * for an answer (its own local), and the thread it runs on; object lock. */
	GstObject **ensuring_ = nullptr;
	GThread *ensuring_thread_ = nullptr;
	xmem::CudaStream stream_ = nullptr;
	/* The GstCudaStream that owns stream_ (GStreamer 1.24 and later; unused,
	 * and so marked for clang's -Wunused-private-field, before). */
	[[maybe_unused]] gpointer gst_stream_ = nullptr;
	/* context_'s device, read on first use; streaming thread. */
	mutable gint device_ = -1;
	/* Streaming thread only. */
	std::deque<GstBuffer *> held_;
};
