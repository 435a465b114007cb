/* gstxmemcuda.cpp - plane copies through libxmem, and GStreamer's CUDA context,
 * stream and memory when its CUDA library (gstreamer-cuda-1.0) was found. */
#include "gstxmemcuda.h"

#include <algorithm>
#include <exception>
#include <utility>

#ifdef XMEM_HAVE_GST_CUDA
#define GST_USE_UNSTABLE_API
#include <gst/cuda/cuda-gst.h>
#include <gst/cuda/gstcudabufferpool.h>
#include <gst/cuda/gstcudacontext.h>
#include <gst/cuda/gstcudaloader.h>
#include <gst/cuda/gstcudamemory.h>
#include <gst/cuda/gstcudautils.h>
/* 1.24 wraps foreign device memory (gst_cuda_allocator_alloc_wrapped) and gives CUDA
 * memory a stream. XMEM_CHECK_GST_CUDA_WRAP compiles that code against newer headers
 * on an older GStreamer, for a compile check only. */
#if GST_CHECK_VERSION(1, 24, 0) || defined(XMEM_CHECK_GST_CUDA_WRAP)
#define XMEM_GST_CUDA_WRAP 1
#include <gst/cuda/gstcudastream.h>
#endif
#endif

GST_DEBUG_CATEGORY_STATIC(gst_xmem_cuda_debug);
#define GST_CAT_DEFAULT gst_xmem_cuda_debug

static void init_debug()
{
	static gsize done = 0;
	if (g_once_init_enter(&done)) {
		GST_DEBUG_CATEGORY_INIT(gst_xmem_cuda_debug, "xmemcuda", 0, "xmem CUDA memory");
		g_once_init_leave(&done, 1);
	}
}

/* Bytes of plane P's rows that hold pixels: its first component's width times its
 * pixel stride, or (for formats without one, such as tiled or packed 10-bit) the
 * default stride. */
static gsize row_bytes(const GstVideoInfo &info, guint plane)
{
	gint comp[GST_VIDEO_MAX_COMPONENTS];
	gst_video_format_info_component(info.finfo, plane, comp);
	if (comp[0] >= 0) {
		gint pstride = GST_VIDEO_INFO_COMP_PSTRIDE(&info, comp[0]);
		if (pstride > 0)
			return gsize(GST_VIDEO_INFO_COMP_WIDTH(&info, comp[0])) * gsize(pstride);
	}
	return gsize(GST_VIDEO_INFO_PLANE_STRIDE(&info, plane));
}

static guint plane_rows(const GstVideoInfo &info, guint plane)
{
	gint comp[GST_VIDEO_MAX_COMPONENTS];
	gst_video_format_info_component(info.finfo, plane, comp);
	return guint(GST_VIDEO_INFO_COMP_HEIGHT(&info, comp[0] >= 0 ? comp[0] : 0));
}

xmem::Result<void> gst_xmem_copy_planes(const GstVideoInfo &info, const GstXmemPlanes &dst, const GstXmemPlanes &src,
					guint device, xmem::CudaStream stream)
{
	guint n = GST_VIDEO_INFO_N_PLANES(&info);
	if (dst.n_planes < n || src.n_planes < n)
		return xmem::Error{ xmem::Errc::invalid_argument,
				    "frame copy: " + std::to_string(n) + " planes, but the layouts have " +
					    std::to_string(std::min(dst.n_planes, src.n_planes)) };
	for (guint p = 0; p < n; p++) {
		if (dst.stride[p] <= 0 || src.stride[p] <= 0)
			return xmem::Error{ xmem::Errc::invalid_argument,
					    "frame copy: plane " + std::to_string(p) + " has no stride" };
		gsize width = std::min({ row_bytes(info, p), gsize(dst.stride[p]), gsize(src.stride[p]) });
		xmem::Region2D to{ dst.base + dst.offset[p], guint64(dst.stride[p]), dst.device };
		xmem::Region2D from{ src.base + src.offset[p], guint64(src.stride[p]), src.device };
		if (auto r = xmem::cuda_copy_2d(to, from, width, plane_rows(info, p), device, stream); !r)
			return r;
	}
	return {};
}

bool gst_xmem_aligned_info(const GstVideoInfo &info, guint alignment, GstVideoInfo *out)
{
	*out = info;
	if (alignment <= 1)
		return true;
	GstVideoAlignment align;
	gst_video_alignment_reset(&align);
	for (guint p = 0; p < GST_VIDEO_MAX_PLANES; p++)
		align.stride_align[p] = alignment - 1;
	if (!gst_video_info_align(out, &align))
		return false;
	/* Planes start on the alignment too: CUDA textures and NVENC want it. */
	for (guint p = 0; p < GST_VIDEO_INFO_N_PLANES(out); p++)
		if (out->offset[p] % alignment)
			return false;
	return true;
}

GstCaps *gst_xmem_caps_without_features(const GstCaps *caps)
{
	GstCaps *plain = gst_caps_copy(caps);
	for (guint i = 0; i < gst_caps_get_size(plain); i++)
		gst_caps_set_features(plain, i, nullptr);
	return plain;
}

bool gst_xmem_caps_is_cuda(const GstCaps *caps)
{
	if (!caps || gst_caps_is_any(caps) || gst_caps_get_size(caps) == 0)
		return false;
	GstCapsFeatures *features = gst_caps_get_features(caps, 0);
	return features && gst_caps_features_contains(features, GST_XMEM_CAPS_FEATURE_CUDA);
}

GstXmemCuda::~GstXmemCuda()
{
	reset();
}

GstObject *GstXmemCuda::context_ref() const
{
	GST_OBJECT_LOCK(element_);
	GstObject *ctx = context_ ? static_cast<GstObject *>(gst_object_ref(context_)) : nullptr;
	GST_OBJECT_UNLOCK(element_);
	return ctx;
}

#ifdef XMEM_HAVE_GST_CUDA

bool gst_xmem_have_gst_cuda()
{
	return true;
}

static GstCudaContext *cuda_context(GstObject *object)
{
	return object ? GST_CUDA_CONTEXT(object) : nullptr;
}

bool GstXmemCuda::ensure(gint device, std::string *why)
{
	init_debug();
	g_autoptr(GstObject) have = context_ref();
	if (have && stream_ && (device < 0 || this->device() == device))
		return true;
	if (have && device >= 0 && this->device() != device) {
		*why = "the shared CUDA context is on device " + std::to_string(this->device()) + ", not " +
		       std::to_string(device);
		return false;
	}
	/* nvcodec loads GStreamer's CUDA library in its plugin_init; in a pipeline with
	 * no nvcodec element nobody has, and its calls would abort. */
	if (!gst_cuda_load_library()) {
		*why = "GStreamer's CUDA library cannot load the CUDA driver (libcuda.so.1)";
		return false;
	}
	gst_cuda_memory_init_once(); /* the CUDA allocator, for our buffer pool */
	if (!have) {
		/* The call fills a local, not context_, which other threads read under the
		 * lock: a neighbour's context arrives through set_context() on this thread
		 * while it runs, which fills the local too (ensuring_), so the call sees it
		 * and shares it instead of making a context of its own. */
		GstCudaContext *found = nullptr;
		GST_OBJECT_LOCK(element_);
		ensuring_ = reinterpret_cast<GstObject **>(&found);
		ensuring_thread_ = g_thread_self();
		GST_OBJECT_UNLOCK(element_);
		bool ok = gst_cuda_ensure_element_context(element_, device, &found);
		GST_OBJECT_LOCK(element_);
		ensuring_ = nullptr;
		ensuring_thread_ = nullptr;
		/* Another thread's set_context() may have come first: that one stays. */
		if (ok && found && !context_)
			context_ = GST_OBJECT(gst_object_ref(found));
		GST_OBJECT_UNLOCK(element_);
		if (found)
			gst_object_unref(found);
		if (!ok) {
			*why = "GStreamer's CUDA library has no context for CUDA device " + std::to_string(device) +
			       " (no driver, no GPU, or libcuda.so.1 failed to load)";
			return false;
		}
		have = context_ref();
	}
	GstCudaContext *ctx = cuda_context(have);
#ifdef XMEM_GST_CUDA_WRAP
	if (wraps_) {
		/* A GstCudaStream, so the memory we wrap can say which stream it is ready on.
		 * It is a blocking stream (gst_cuda_stream_new takes no flags), so legacy-stream
		 * work of the context waits behind what it waits for: on xmemsrc's, only the
		 * producer's writes of the frames being received, never a consumer's hold. */
		GstCudaStream *owner = gst_cuda_stream_new(ctx);
		if (!owner) {
			*why = "gst_cuda_stream_new failed";
			return false;
		}
		gst_stream_ = owner;
		stream_ = gst_cuda_stream_get_handle(owner);
		GST_INFO_OBJECT(element_, "CUDA context on device %d, GstCudaStream %p", this->device(), stream_);
		return true;
	}
#endif
	if (!gst_cuda_context_push(ctx)) {
		*why = "cannot make GStreamer's CUDA context current (cuCtxPushCurrent failed)";
		return false;
	}
	/* Non-blocking: our stream waits on the GPU for consumers (their done words), and a
	 * blocking stream would hold every legacy-stream call of the shared context behind
	 * those waits (GStreamer's synchronous copies, its CPU maps of CUDA memory). Nothing
	 * of ours relies on the legacy stream's implicit synchronization: GStreamer 1.22's
	 * CUDA memory is complete when it is pushed, and we synchronize ours before we push. */
	CUstream stream = nullptr;
	CUresult r = CuStreamCreate(&stream, CU_STREAM_NON_BLOCKING);
	gst_cuda_context_pop(nullptr);
	if (r != CUDA_SUCCESS) {
		const char *name = nullptr;
		CuGetErrorName(r, &name);
		*why = std::string("cuStreamCreate failed: ") + (name ? name : "unknown error");
		return false;
	}
	stream_ = stream;
	GST_INFO_OBJECT(element_, "CUDA context on device %d, stream %p", this->device(), stream_);
	return true;
}

gint GstXmemCuda::device() const
{
	/* Asked per frame (release_done): read once, the context does not change. */
	if (device_ < 0) {
		g_autoptr(GstObject) ctx = context_ref();
		guint id = 0;
		if (ctx) {
			g_object_get(ctx, "cuda-device-id", &id, nullptr);
			device_ = gint(id);
		}
	}
	return device_;
}

void GstXmemCuda::reset()
{
	g_autoptr(GstObject) have = context_ref();
	GstCudaContext *ctx = cuda_context(have);
	if (ctx && stream_ && gst_cuda_context_push(ctx)) {
		CuStreamSynchronize(CUstream(stream_));
		if (!gst_stream_)
			CuStreamDestroy(CUstream(stream_));
		gst_cuda_context_pop(nullptr);
	}
#ifdef XMEM_GST_CUDA_WRAP
	if (gst_stream_)
		gst_cuda_stream_unref(GST_CUDA_STREAM(gst_stream_));
	gst_stream_ = nullptr;
#endif
	stream_ = nullptr;
	for (GstBuffer *b : held_)
		gst_buffer_unref(b);
	held_.clear();
	GST_OBJECT_LOCK(element_);
	GstObject *old = context_;
	context_ = nullptr;
	device_ = -1;
	GST_OBJECT_UNLOCK(element_);
	if (old)
		gst_object_unref(old);
}

void GstXmemCuda::set_context(GstContext *context)
{
	init_debug();
	GThread *self = g_thread_self();
	GST_OBJECT_LOCK(element_);
	bool have = context_ != nullptr;
	bool answers_ensure = ensuring_ && ensuring_thread_ == self && !*ensuring_;
	GST_OBJECT_UNLOCK(element_);
	if (have && !answers_ensure)
		return; /* keep the one our stream lives on */
	GstCudaContext *ctx = nullptr;
	if (!gst_cuda_handle_set_context(element_, context, -1, &ctx) || !ctx)
		return;
	GST_OBJECT_LOCK(element_);
	/* The neighbour's answer to our ensure(), on its thread: its local sees it. */
	if (ensuring_ && ensuring_thread_ == self && !*ensuring_)
		*ensuring_ = GST_OBJECT(gst_object_ref(ctx));
	GstObject *unused = GST_OBJECT(ctx);
	if (!context_)
		context_ = std::exchange(unused, nullptr);
	GST_OBJECT_UNLOCK(element_);
	if (unused)
		gst_object_unref(unused);
}

bool GstXmemCuda::handle_context_query(GstQuery *query)
{
	g_autoptr(GstObject) ctx = context_ref();
	return ctx && gst_cuda_handle_context_query(element_, query, cuda_context(ctx));
}

bool GstXmemCuda::is_cuda_memory(GstMemory *mem)
{
	return mem && gst_is_cuda_memory(mem);
}

bool GstXmemCuda::map_device(GstMemory *mem, GstMapInfo *info, GstMapFlags flags)
{
	return gst_memory_map(mem, info, GstMapFlags(flags | GST_MAP_CUDA));
}

bool GstXmemCuda::map_input(GstMemory *mem, GstMapInfo *info)
{
	if (!map_device(mem, info, GST_MAP_READ))
		return false;
#ifdef XMEM_GST_CUDA_WRAP
	auto *cmem = GST_CUDA_MEMORY_CAST(mem);
	GstCudaStream *theirs = gst_cuda_memory_get_stream(cmem);
	if (!theirs || !GST_MEMORY_FLAG_IS_SET(mem, GST_CUDA_MEMORY_TRANSFER_NEED_SYNC))
		return true;
	/* Our stream waits for the memory's, on the GPU; the CPU only where that fails. */
	auto handle = xmem::CudaStream(gst_cuda_stream_get_handle(theirs));
	if (auto r = xmem::cuda_stream_wait(stream_, handle); !r) {
		GST_WARNING_OBJECT(element_, "%s: waiting on the CPU for the input's CUDA stream",
				   r.error().message.c_str());
		gst_cuda_memory_sync(cmem);
	}
#endif
	return true;
}

bool GstXmemCuda::memory_layout(GstMemory *mem, GstVideoInfo *info)
{
	if (!is_cuda_memory(mem))
		return false;
	*info = GST_CUDA_MEMORY_CAST(mem)->info;
	return true;
}

#ifdef XMEM_GST_CUDA_WRAP

namespace {

struct WrappedSlot {
	xmem::BufferGuard frame;
	GstCudaContext *context;
	/* The stream the frame was received on: a stream-less release waits for it, so it
	 * lives until the frame is released (xmemsrc's reset() may drop its own ref first). */
	GstCudaStream *stream;
};

void release_wrapped(gpointer data)
{
	auto *w = static_cast<WrappedSlot *>(data);
	/* GStreamer lets go of memory once the work reading it is queued, on whatever
	 * stream of the context: all of it is done before the producer may rewrite it.
	 * Called from GStreamer's C code: nothing may throw out of here. */
	try {
		if (auto r = xmem::cuda_synchronize_context(gst_cuda_context_get_handle(w->context)); !r)
			GST_WARNING("%s", r.error().message.c_str());
	} catch (const std::exception &e) {
		GST_ERROR("%s", e.what());
	}
	GstCudaStream *stream = w->stream;
	GstCudaContext *context = w->context;
	delete w; /* releases the frame: STREAM and the context are still alive */
	gst_cuda_stream_unref(stream);
	gst_object_unref(context);
}

} // namespace

bool GstXmemCuda::can_wrap()
{
	return true;
}

GstMemory *GstXmemCuda::wrap(xmem::BufferGuard &&frame, const GstVideoInfo &layout)
{
	g_autoptr(GstObject) have = context_ref();
	GstCudaContext *ctx = cuda_context(have);
	if (!ctx || !gst_stream_)
		return nullptr;
	CUdeviceptr address = CUdeviceptr(frame.device_ptr());
	bool writable = frame.writable();
	auto *w = new WrappedSlot{ std::move(frame), GST_CUDA_CONTEXT(gst_object_ref(ctx)),
				   gst_cuda_stream_ref(GST_CUDA_STREAM(gst_stream_)) };
	GstMemory *mem = gst_cuda_allocator_alloc_wrapped(nullptr, ctx, GST_CUDA_STREAM(gst_stream_), &layout, address,
							  w, release_wrapped);
	if (!mem) {
		release_wrapped(w);
		return nullptr;
	}
	/* Pushed complete: our stream's wait for the producer's writes is over before the
	 * frame leaves. A pending stream (GST_CUDA_MEMORY_TRANSFER_NEED_SYNC) would be
	 * enough for elements that honour it, but GStreamer's own copy of CUDA memory
	 * (gst_cuda_buffer_copy, cudaipcsink's in 1.24 to 1.26) reads on a stream of its
	 * own without waiting for the memory's, and handed the slot's previous frame on.
	 * The CPU waits only for writes queued before the frame was published. */
	if (auto r = xmem::cuda_synchronize(device(), xmem::CudaStream(stream_)); !r) {
		GST_WARNING_OBJECT(element_, "%s: the frame goes on with its stream pending",
				   r.error().message.c_str());
		GST_MINI_OBJECT_FLAG_SET(mem, GST_CUDA_MEMORY_TRANSFER_NEED_SYNC);
	}
	if (!writable)
		GST_MINI_OBJECT_FLAG_SET(mem, GST_MEMORY_FLAG_READONLY);
	return mem;
}

#else

bool GstXmemCuda::can_wrap()
{
	return false;
}

GstMemory *GstXmemCuda::wrap(xmem::BufferGuard &&, const GstVideoInfo &)
{
	return nullptr;
}

#endif /* XMEM_GST_CUDA_WRAP */

GstBufferPool *GstXmemCuda::new_buffer_pool(GstCaps *caps, guint size)
{
	g_autoptr(GstObject) have = context_ref();
	GstCudaContext *ctx = cuda_context(have);
	if (!ctx)
		return nullptr;
	g_autoptr(GstBufferPool) pool = gst_cuda_buffer_pool_new(ctx);
	GstStructure *config = gst_buffer_pool_get_config(pool);
	gst_buffer_pool_config_set_params(config, caps, size, 2, 0);
	gst_buffer_pool_config_add_option(config, GST_BUFFER_POOL_OPTION_VIDEO_META);
	if (!gst_buffer_pool_set_config(pool, config) || !gst_buffer_pool_set_active(pool, TRUE))
		return nullptr;
	return std::exchange(pool, nullptr);
}

#else /* !XMEM_HAVE_GST_CUDA */

bool gst_xmem_have_gst_cuda()
{
	return false;
}

bool GstXmemCuda::ensure(gint, std::string *why)
{
	*why = "this xmem plugin was built without GStreamer's CUDA library (gstreamer-cuda-1.0)";
	return false;
}

gint GstXmemCuda::device() const
{
	return -1;
}

void GstXmemCuda::reset()
{
	for (GstBuffer *b : held_)
		gst_buffer_unref(b);
	held_.clear();
}

void GstXmemCuda::set_context(GstContext *)
{
}

bool GstXmemCuda::handle_context_query(GstQuery *)
{
	return false;
}

bool GstXmemCuda::is_cuda_memory(GstMemory *)
{
	return false;
}

bool GstXmemCuda::map_device(GstMemory *, GstMapInfo *, GstMapFlags)
{
	return false;
}

bool GstXmemCuda::map_input(GstMemory *, GstMapInfo *)
{
	return false;
}

bool GstXmemCuda::memory_layout(GstMemory *, GstVideoInfo *)
{
	return false;
}

GstBufferPool *GstXmemCuda::new_buffer_pool(GstCaps *, guint)
{
	return nullptr;
}

bool GstXmemCuda::can_wrap()
{
	return false;
}

GstMemory *GstXmemCuda::wrap(xmem::BufferGuard &&, const GstVideoInfo &)
{
	return nullptr;
}

#endif /* XMEM_HAVE_GST_CUDA */

void GstXmemCuda::hold_until_done(GstBuffer *buffer)
{
	held_.push_back(gst_buffer_ref(buffer));
}

void GstXmemCuda::release_done(gsize limit)
{
	if (held_.empty())
		return;
	guint dev = guint(std::max(device(), 0));
	auto done = xmem::cuda_stream_done(dev, stream_);
	if (done && !*done && held_.size() <= limit)
		return;
	if (!done)
		GST_WARNING_OBJECT(element_, "%s", done.error().message.c_str());
	/* Upstream's pool is small: wait for our copies rather than starve it (and when
	 * the stream cannot be asked, wait anyway before giving its buffers back). */
	if (!done || !*done) {
		if (auto r = xmem::cuda_synchronize(dev, stream_); !r)
			GST_WARNING_OBJECT(element_, "%s", r.error().message.c_str());
	}
	for (GstBuffer *b : held_)
		gst_buffer_unref(b);
	held_.clear();
}
