/* gstxmemmemory.h - GstMemory that wraps one reference to an xmem slot, and the
 * GstBufferPool xmemsink proposes upstream so frames are written into slots. */
#pragma once

#include <xmem/xmem.hpp>

#include <gst/gst.h>
#include <gst/video/video.h>

#include <memory>

G_BEGIN_DECLS

#define GST_XMEM_MEMORY_TYPE "XmemMemory"

#define GST_TYPE_XMEM_ALLOCATOR (gst_xmem_allocator_get_type())
G_DECLARE_FINAL_TYPE(GstXmemAllocator, gst_xmem_allocator, GST, XMEM_ALLOCATOR, GstAllocator)

#define GST_TYPE_XMEM_BUFFER_POOL (gst_xmem_buffer_pool_get_type())
G_DECLARE_FINAL_TYPE(GstXmemBufferPool, gst_xmem_buffer_pool, GST, XMEM_BUFFER_POOL, GstBufferPool)

G_END_DECLS

/* The process-wide allocator for xmem memories (not owned by the caller). */
GstAllocator *gst_xmem_allocator_get();

/* Wraps GUARD (moved in) as a memory of SIZE bytes; the slot reference goes when
 * the memory is freed. A read-only guard gives a read-only memory, unless
 * COPY_ON_WRITE: then a write map succeeds in place when this process is by then
 * the frame's only holder, and fails otherwise, so GStreamer maps a copy instead. */
GstMemory *gst_xmem_memory_wrap(xmem::BufferGuard &&guard, gsize size, bool copy_on_write = false);

gboolean gst_is_xmem_memory(GstMemory *mem);

/* The guard inside an xmem memory (NULL for a sub-memory made by share). */
xmem::BufferGuard *gst_xmem_memory_guard(GstMemory *mem);

/* A pool that hands out buffers backed by fresh slots of POOL, with GstVideoMeta. */
GstBufferPool *gst_xmem_buffer_pool_new(std::shared_ptr<xmem::BufferPool> pool);
