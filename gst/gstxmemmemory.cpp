/* gstxmemmemory.cpp - slots as GstMemory (read-only unless this process may write
 * in place), and the buffer pool that lets upstream decode straight into slots. */
#include "gstxmemmemory.h"

#include "gstxmemnothrow.h"

#include <algorithm>
#include <cstring>
#include <utility>

GST_DEBUG_CATEGORY_STATIC(gst_xmem_memory_debug);
#define GST_CAT_DEFAULT gst_xmem_memory_debug

namespace {

struct XmemMemory {
	GstMemory mem;
	/* Owned; null in a sub-memory made by share(), which maps its root's data. */
	xmem::BufferGuard *guard;
};

XmemMemory *root_of(GstMemory *mem)
{
	while (mem->parent)
		mem = mem->parent;
	return reinterpret_cast<XmemMemory *>(mem);
}

} // namespace

struct _GstXmemAllocator {
	GstAllocator parent;
};

G_DEFINE_TYPE_WITH_CODE(GstXmemAllocator, gst_xmem_allocator, GST_TYPE_ALLOCATOR,
			GST_DEBUG_CATEGORY_INIT(gst_xmem_memory_debug, "xmemmemory", 0, "xmem memory"))

static GstMemory *gst_xmem_allocator_alloc(GstAllocator *, gsize, GstAllocationParams *)
{
	/* Slots come from a pool, never from gst_allocator_alloc(). */
	return nullptr;
}

static void gst_xmem_allocator_free(GstAllocator *, GstMemory *mem)
{
	auto *m = reinterpret_cast<XmemMemory *>(mem);
	delete m->guard;
	g_free(m);
}

static gpointer xmem_mem_map(GstMemory *mem, gsize, GstMapFlags flags)
{
	XmemMemory *root = root_of(mem);
	if (!root->guard || !root->guard->valid())
		return nullptr;
	if (flags & GST_MAP_WRITE) {
		/* Decided now, not when the frame arrived: the owner or other consumers
		 * may have let go of it since. */
		if (!root->guard->writable() && !root->guard->try_make_writable())
			return nullptr;
		auto bytes = root->guard->data_mut();
		return bytes ? bytes->data() : nullptr;
	}
	return const_cast<std::byte *>(root->guard->data().data());
}

static void xmem_mem_unmap(GstMemory *)
{
}

/* Copy-on-write ends here: a write to a read-only slot maps a system-memory copy. */
static GstMemory *xmem_mem_copy(GstMemory *mem, gssize offset, gssize size)
{
	if (size < 0)
		size = gssize(mem->size) - offset;
	g_autoptr(GstMemory) copy = gst_allocator_alloc(nullptr, gsize(size), nullptr);
	if (!copy)
		return nullptr;
	GstMapInfo src, dst;
	if (!gst_memory_map(mem, &src, GST_MAP_READ))
		return nullptr;
	if (!gst_memory_map(copy, &dst, GST_MAP_WRITE)) {
		gst_memory_unmap(mem, &src);
		return nullptr;
	}
	std::memcpy(dst.data, src.data + offset, gsize(size));
	gst_memory_unmap(copy, &dst);
	gst_memory_unmap(mem, &src);
	return std::exchange(copy, nullptr);
}

static GstMemory *xmem_mem_share(GstMemory *mem, gssize offset, gssize size)
{
	if (size < 0)
		size = gssize(mem->size) - offset;
	auto *sub = static_cast<XmemMemory *>(g_malloc0(sizeof(XmemMemory)));
	GstMemory *parent = mem->parent ? mem->parent : mem;
	gst_memory_init(&sub->mem,
			GstMemoryFlags(GST_MINI_OBJECT_FLAGS(parent) | int(GST_MINI_OBJECT_FLAG_LOCK_READONLY) |
				       int(GST_MEMORY_FLAG_READONLY)),
			mem->allocator, parent, mem->maxsize, mem->align, mem->offset + gsize(offset), gsize(size));
	return &sub->mem;
}

static gboolean xmem_mem_is_span(GstMemory *, GstMemory *, gsize *)
{
	return FALSE;
}

static void gst_xmem_allocator_class_init(GstXmemAllocatorClass *klass)
{
	GstAllocatorClass *alloc = GST_ALLOCATOR_CLASS(klass);
	alloc->alloc = gst_xmem_allocator_alloc;
	alloc->free = gst_xmem_allocator_free;
}

static void gst_xmem_allocator_init(GstXmemAllocator *self)
{
	GstAllocator *alloc = GST_ALLOCATOR(self);
	alloc->mem_type = GST_XMEM_MEMORY_TYPE;
	/* Runs C++ code: no exception may unwind into GStreamer (gstxmemnothrow.h). */
	alloc->mem_map = GST_XMEM_NO_THROW(xmem_mem_map);
	alloc->mem_unmap = xmem_mem_unmap;
	alloc->mem_copy = xmem_mem_copy;
	alloc->mem_share = xmem_mem_share;
	alloc->mem_is_span = xmem_mem_is_span;
	GST_OBJECT_FLAG_SET(self, GST_ALLOCATOR_FLAG_CUSTOM_ALLOC);
}

GstAllocator *gst_xmem_allocator_get()
{
	static GstAllocator *allocator = [] {
		auto *a = GST_ALLOCATOR(g_object_new(GST_TYPE_XMEM_ALLOCATOR, nullptr));
		gst_object_ref_sink(a);
		GST_OBJECT_FLAG_SET(a, GST_OBJECT_FLAG_MAY_BE_LEAKED);
		return a;
	}();
	return allocator;
}

GstMemory *gst_xmem_memory_wrap(xmem::BufferGuard &&guard, gsize size, bool copy_on_write)
{
	gsize maxsize = gsize(guard.capacity());
	size = std::min(size, maxsize);
	int flags = 0;
	if (!guard.writable() && !copy_on_write)
		flags |= int(GST_MEMORY_FLAG_READONLY) | int(GST_MINI_OBJECT_FLAG_LOCK_READONLY);
	/* The guard first: it may throw (out of memory), g_malloc0() does not return. */
	auto *owned = new xmem::BufferGuard(std::move(guard));
	auto *m = static_cast<XmemMemory *>(g_malloc0(sizeof(XmemMemory)));
	m->guard = owned;
	gst_memory_init(&m->mem, GstMemoryFlags(flags), gst_xmem_allocator_get(), nullptr, maxsize, 0, 0, size);
	return &m->mem;
}

gboolean gst_is_xmem_memory(GstMemory *mem)
{
	return mem && gst_memory_is_type(mem, GST_XMEM_MEMORY_TYPE);
}

xmem::BufferGuard *gst_xmem_memory_guard(GstMemory *mem)
{
	if (!gst_is_xmem_memory(mem) || mem->parent)
		return nullptr;
	return reinterpret_cast<XmemMemory *>(mem)->guard;
}

/* GstXmemBufferPool */

struct _GstXmemBufferPool {
	GstBufferPool parent;
	/* C++ state outside the zero-filled GObject instance (set in _new). */
	std::shared_ptr<xmem::BufferPool> *core;
	GstVideoInfo info;
	gboolean is_video;
	gboolean video_meta;
	gsize size;
};

G_DEFINE_TYPE(GstXmemBufferPool, gst_xmem_buffer_pool, GST_TYPE_BUFFER_POOL)

static const gchar **gst_xmem_buffer_pool_get_options(GstBufferPool *)
{
	static const gchar *options[] = { GST_BUFFER_POOL_OPTION_VIDEO_META, nullptr };
	return options;
}

static gboolean gst_xmem_buffer_pool_set_config(GstBufferPool *pool, GstStructure *config)
{
	auto *self = GST_XMEM_BUFFER_POOL(pool);
	GstCaps *caps = nullptr;
	guint size, min, max;
	if (!gst_buffer_pool_config_get_params(config, &caps, &size, &min, &max) || !caps)
		return FALSE;
	self->is_video = gst_video_info_from_caps(&self->info, caps);
	self->size = self->is_video ? self->info.size : size;
	guint64 largest = 0;
	for (const xmem::SizeClass &c : (*self->core)->classes())
		largest = std::max(largest, c.slot_size);
	/* A pool that grows makes slots of its memory up to its cap. */
	xmem::GrowthStats growth = (*self->core)->growth_stats();
	largest = std::max(largest, (*self->core)->storage() == xmem::Storage::system ? growth.memory_cap
										      : growth.device_memory_cap);
	if (self->size > largest) {
		GST_WARNING_OBJECT(pool, "frames of %" G_GSIZE_FORMAT " bytes do not fit slots of %" G_GUINT64_FORMAT,
				   self->size, largest);
		return FALSE;
	}
	self->video_meta = gst_buffer_pool_config_has_option(config, GST_BUFFER_POOL_OPTION_VIDEO_META);
	return GST_BUFFER_POOL_CLASS(gst_xmem_buffer_pool_parent_class)->set_config(pool, config);
}

/* Nothing to preallocate: the slots already exist in shared memory. */
static gboolean gst_xmem_buffer_pool_start(GstBufferPool *)
{
	return TRUE;
}

static GstFlowReturn gst_xmem_buffer_pool_acquire_buffer(GstBufferPool *pool, GstBuffer **buffer,
							 GstBufferPoolAcquireParams *params)
{
	auto *self = GST_XMEM_BUFFER_POOL(pool);
	for (;;) {
		if (GST_BUFFER_POOL_IS_FLUSHING(pool))
			return GST_FLOW_FLUSHING;
		/* Short waits, so that flushing is noticed while every slot is held. A slot
		 * of the smallest size class that fits the frames. */
		auto slot = (*self->core)->acquire(self->size, std::chrono::milliseconds(50));
		if (!slot) {
			if (slot.code() == xmem::Errc::timed_out) {
				if (params && (params->flags & GST_BUFFER_POOL_ACQUIRE_FLAG_DONTWAIT))
					return GST_FLOW_EOS;
				continue;
			}
			GST_WARNING_OBJECT(pool, "%s", slot.error().message.c_str());
			return slot.code() == xmem::Errc::closed ? GST_FLOW_FLUSHING : GST_FLOW_ERROR;
		}
		GstBuffer *buf = gst_buffer_new();
		gst_buffer_append_memory(buf, gst_xmem_memory_wrap(std::move(*slot), self->size));
		if (self->is_video && self->video_meta) {
			GstVideoInfo info = self->info;
			gst_buffer_add_video_meta_full(buf, GST_VIDEO_FRAME_FLAG_NONE, GST_VIDEO_INFO_FORMAT(&info),
						       GST_VIDEO_INFO_WIDTH(&info), GST_VIDEO_INFO_HEIGHT(&info),
						       GST_VIDEO_INFO_N_PLANES(&info), info.offset, info.stride);
		}
		*buffer = buf;
		return GST_FLOW_OK;
	}
}

/* Buffers are not recycled: each one is a slot reference, returned to the core
 * pool (free again, or still published) when the buffer goes. */
static void gst_xmem_buffer_pool_release_buffer(GstBufferPool *, GstBuffer *buffer)
{
	gst_buffer_unref(buffer);
}

static void gst_xmem_buffer_pool_finalize(GObject *object)
{
	auto *self = GST_XMEM_BUFFER_POOL(object);
	delete self->core;
	G_OBJECT_CLASS(gst_xmem_buffer_pool_parent_class)->finalize(object);
}

static void gst_xmem_buffer_pool_class_init(GstXmemBufferPoolClass *klass)
{
	GObjectClass *gobject = G_OBJECT_CLASS(klass);
	GstBufferPoolClass *pool = GST_BUFFER_POOL_CLASS(klass);
	gobject->finalize = gst_xmem_buffer_pool_finalize;
	pool->get_options = gst_xmem_buffer_pool_get_options;
	/* Those that run C++ code: no exception may unwind into GStreamer. */
	pool->set_config = GST_XMEM_NO_THROW(gst_xmem_buffer_pool_set_config);
	pool->start = gst_xmem_buffer_pool_start;
	pool->acquire_buffer = GST_XMEM_NO_THROW(gst_xmem_buffer_pool_acquire_buffer);
	pool->release_buffer = gst_xmem_buffer_pool_release_buffer;
}

static void gst_xmem_buffer_pool_init(GstXmemBufferPool *)
{
}

GstBufferPool *gst_xmem_buffer_pool_new(std::shared_ptr<xmem::BufferPool> core)
{
	/* The C++ part first: it may throw (out of memory), leaving nothing to free. */
	auto *owned = new std::shared_ptr<xmem::BufferPool>(std::move(core));
	auto *self = GST_XMEM_BUFFER_POOL(g_object_new(GST_TYPE_XMEM_BUFFER_POOL, nullptr));
	gst_object_ref_sink(self);
	self->core = owned;
	return GST_BUFFER_POOL(self);
}
