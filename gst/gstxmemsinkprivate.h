/* gstxmemsinkprivate.h - xmemsink's C++ state, shared by the element's three files:
 * gstxmemsink.cpp (the element), gstxmemsinkpool.cpp (its pool), gstxmemsinkrender.cpp. */
#pragma once

#include "gstxmemcuda.h"
#include "gstxmemelement.h"
#include "gstxmemmeta.h"
#include "gstxmemsink.h"

#include <xmem/xmem.hpp>

#include <gst/video/video.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

GST_DEBUG_CATEGORY_EXTERN(gst_xmem_sink_debug);

#define DEFAULT_BUFFERS 8
#define DEFAULT_POLICY XMEM_POLICY_DROP_OLDEST
#define DEFAULT_BLOCK_TIMEOUT (GST_SECOND)
#define DEFAULT_WAIT_FOR_CONSUMERS 0
/* Forever: wait-for-consumers promises that no frame goes to nobody, and a consumer
 * started by hand may come minutes later. */
#define DEFAULT_WAIT_TIMEOUT 0
#define DEFAULT_MAX_CONSUMERS 64
#define DEFAULT_PERMS 0600
#define DEFAULT_MEMORY GST_XMEM_MEMORY_AUTO
#define DEFAULT_CUDA_DEVICE_ID (-1)

/* Locks, in the order they are taken: the sink pad's stream lock and basesink's
 * preroll lock (both held around set_caps, render and event), then `lock` below,
 * then the element's object lock (GstXmemCuda's context) and the core's own locks.
 * None is held while posting a message (a bus sync handler may call back into the
 * element), while waiting for consumers or a slot, or while calling another
 * element. */
struct SinkState {
	explicit SinkState(GstElement *element) : cuda(element, false) {}

	/* Guards the properties (set_property, get_property: any thread) and `pool`,
	 * `caps_string`, `waited`, `rejoin` (also read by stats, stop and the allocation query).
	 * The fields between them (info ... slot_info) are written under it by set_caps
	 * and read without it by the streaming thread, their only writer. */
	std::mutex lock;
	std::string pool_name = GST_XMEM_DEFAULT_POOL_NAME;
	guint buffers = DEFAULT_BUFFERS;
	xmem_policy policy = DEFAULT_POLICY;
	guint64 block_timeout = DEFAULT_BLOCK_TIMEOUT;
	guint64 spill_size = 0;
	guint64 memory_cap = 0; /* growth on demand (PoolConfig::memory_cap); 0: none */
	guint wait_for_consumers = DEFAULT_WAIT_FOR_CONSUMERS;
	guint64 wait_timeout = DEFAULT_WAIT_TIMEOUT;
	guint max_consumers = DEFAULT_MAX_CONSUMERS;
	guint perms = DEFAULT_PERMS;
	std::string group; /* a group name or gid; empty: the process's group */
	GstXmemMemoryKind memory = DEFAULT_MEMORY;
	gint cuda_device = DEFAULT_CUDA_DEVICE_ID;

	std::shared_ptr<xmem::BufferPool> pool;
	std::string caps_string;
	GstVideoInfo info{};
	bool is_video = false;
	/* The negotiated caps carry memory:CUDAMemory. */
	bool input_cuda = false;
	/* Where the pool's slots live for these caps, and on which device. */
	xmem::Storage storage = xmem::Storage::system;
	guint device = 0;
	/* The frame layout inside a slot: info itself for system memory, pitched rows
	 * and planes for device memory. */
	GstVideoInfo slot_info{};
	/* GStreamer's CUDA context and the stream device copies run on (streaming
	 * thread; its context part takes the object lock). */
	GstXmemCuda cuda;
	bool waited = false;
	/* The largest slot of the pool's size classes (under `lock`). */
	guint64 slot_limit = 0;
	/* Consumers the previous pool had, when it was recreated for frames of another
	 * memory, or larger ones with no room left for a size class. */
	guint rejoin = 0;
	/* Pools replaced that way (under `lock`). */
	guint64 recreated = 0;
	/* Frames published in place / copied in (streaming thread writes). */
	std::atomic<guint64> zero_copy{ 0 };
	std::atomic<guint64> copied{ 0 };
	/* Frames copied device to device into device slots. */
	std::atomic<guint64> device_copied{ 0 };
	/* The frames' GstMetas sent and left out (gstxmemmeta.h). */
	GstXmemMetaCounts metas;

	/* Set by unlock() to cut waits short; streaming thread reads it. */
	std::atomic<bool> unlocked{ false };
	/* Set by an EOS sent to the element: the wait for consumers ends in EOS. */
	std::atomic<bool> eos_requested{ false };
};

struct _GstXmemSink {
	GstBaseSink parent;
	SinkState *state;
};

/* gstxmemsinkpool.cpp: the pool behind the sink. */

/* Posts ERROR, from the pool, on the bus. */
void post_pool_error(GstXmemSink *self, const xmem::Error &error);
/* Makes sure a pool with slots of at least FRAME_SIZE bytes publishes the caps;
 * nullptr, with an error posted, when there can be none. */
std::shared_ptr<xmem::BufferPool> ensure_pool(GstXmemSink *self, gsize frame_size);

/* gstxmemsinkrender.cpp: GstBaseSink::render. */
GstFlowReturn gst_xmem_sink_render(GstBaseSink *sink, GstBuffer *buffer);
