/* gstxmemsink.cpp - xmemsink: owns an xmem pool, proposes its slots upstream so
 * frames are decoded straight into shared memory, and publishes them. */

/**
 * SECTION:element-xmemsink
 * @title: xmemsink
 *
 * Publishes every buffer into a named xmem pool: preallocated, reference-counted
 * slots in shared memory that any number of processes attach to with xmemsrc (or
 * the xmem library), without copying. Upstream gets the pool in the ALLOCATION
 * query, so a decoder or test source writes into shared memory directly; buffers
 * from elsewhere are copied in once. Caps, timestamps, buffer flags, the
 * GstVideoMeta layout and the buffer's other metas (within a 4096-byte budget per
 * frame, see gstxmemmeta.h; `stats` counts metas-sent and metas-dropped) travel with
 * each frame; a caps change reaches consumers
 * before the first frame in the new format. A consumer that crashes gives its
 * frames back; going to NULL never waits for consumers. A frame waiting for a free
 * slot (consumers hold every one) waits through PAUSED and is published once
 * PLAYING again; a flush or going to READY drops it.
 *
 * wait-for-consumers=N holds the first frame until N consumers are attached. An EOS
 * sent to the pipeline (Ctrl-C in `gst-launch-1.0 -e`) goes to the sources, whose
 * thread is the one held: set wait-timeout, after which the sink posts a warning and
 * publishes without them, and the EOS follows. An EOS sent to the sink itself, a
 * flush or a state change to READY ends the wait at once; PAUSED holds it.
 *
 * With memory=auto (the default) the pool lives in CUDA device memory when
 * upstream negotiates video/x-raw(memory:CUDAMemory) (nvh264dec, cudaupload, ...),
 * and in system memory otherwise; memory=cuda and memory=system force it. CUDA
 * input is copied once, device to device, on the sink's stream, which publishes
 * the frame when the copy is done, without a CPU wait (GStreamer 1.22 cannot hand
 * its decoders the pool's memory); system input into a device pool is uploaded
 * once, CUDA input into a system pool downloaded once. The sink shares GStreamer's
 * CUDA context with its neighbours. `stats` counts zero-copy, copied and
 * device-copied frames.
 *
 * ## Example launch lines
 * |[
 * gst-launch-1.0 videotestsrc is-live=true ! video/x-raw,format=NV12,width=1280,height=720 ! xmemsink pool-name=cam0
 * ]|
 * |[
 * gst-launch-1.0 filesrc location=movie.mp4 ! decodebin ! videoconvert ! xmemsink pool-name=movie wait-for-consumers=1
 * ]|
 * |[
 * gst-launch-1.0 filesrc location=movie.mp4 ! parsebin ! nvh264dec ! xmemsink pool-name=gpu0
 * ]|
 * Then, in another terminal: `gst-launch-1.0 xmemsrc pool-name=cam0 ! videoconvert ! autovideosink`
 */
#include "gstxmemsink.h"

#include "gstxmemcuda.h"
#include "gstxmemelement.h"
#include "gstxmemmemory.h"
#include "gstxmemmeta.h"
#include "gstxmemnothrow.h"

#include <xmem/xmem.hpp>

#include <gst/video/video.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include <grp.h>

GST_DEBUG_CATEGORY_STATIC(gst_xmem_sink_debug);
#define GST_CAT_DEFAULT gst_xmem_sink_debug

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
/* Upstream buffers kept for device copies still in flight before the sink waits. */
#define MAX_HELD_INPUT 4
/* Device slots are sized for rows and planes on this alignment; the layout then uses
 * the pool's own pitch alignment, which is smaller on every known device. */
#define DEVICE_SIZE_ALIGNMENT 512

enum {
	PROP_0,
	PROP_POOL_NAME,
	PROP_BUFFERS,
	PROP_POLICY,
	PROP_BLOCK_TIMEOUT,
	PROP_WAIT_FOR_CONSUMERS,
	PROP_WAIT_TIMEOUT,
	PROP_MAX_CONSUMERS,
	PROP_PERMS,
	PROP_GROUP,
	PROP_MEMORY,
	PROP_CUDA_DEVICE_ID,
	PROP_SPILL_SIZE,
	PROP_MEMORY_CAP,
	PROP_STATS,
};

namespace {

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

} // namespace

struct _GstXmemSink {
	GstBaseSink parent;
	SinkState *state;
};

#define gst_xmem_sink_parent_class parent_class
G_DEFINE_TYPE_WITH_CODE(GstXmemSink, gst_xmem_sink, GST_TYPE_BASE_SINK,
			GST_DEBUG_CATEGORY_INIT(gst_xmem_sink_debug, "xmemsink", 0, "xmem sink"))
GST_ELEMENT_REGISTER_DEFINE(xmemsink, "xmemsink", GST_RANK_NONE, GST_TYPE_XMEM_SINK)

/* Raw video in CUDA or system memory; the pad also takes any other caps (see
 * get_caps), which a template cannot say next to these. */
static GstStaticPadTemplate sink_template =
	GST_STATIC_PAD_TEMPLATE("sink", GST_PAD_SINK, GST_PAD_ALWAYS,
				GST_STATIC_CAPS("video/x-raw(" GST_XMEM_CAPS_FEATURE_CUDA "); video/x-raw"));

GType gst_xmem_policy_get_type(void)
{
	static GType type = 0;
	static const GEnumValue values[] = {
		{ XMEM_POLICY_BLOCK, "Wait for the consumer, up to block-timeout, then drop its oldest frame",
		  "block" },
		{ XMEM_POLICY_FIFO, "Every frame: as block", "fifo" },
		{ XMEM_POLICY_DROP_OLDEST, "Drop the consumer's oldest queued frame", "drop-oldest" },
		{ XMEM_POLICY_DROP_NEW, "Do not queue the new frame for that consumer", "drop-new" },
		{ XMEM_POLICY_LATEST, "A mailbox of one: a newer frame replaces the queued one", "latest" },
		{ XMEM_POLICY_FIFO_SPILL,
		  "Every frame, never waited for: frames queued for the consumer move to the spill tier "
		  "(spill-size) when the producer needs their slots",
		  "fifo-spill" },
		{ 0, nullptr, nullptr },
	};
	if (g_once_init_enter(&type))
		g_once_init_leave(&type, g_enum_register_static("GstXmemPolicy", values));
	return type;
}

GType gst_xmem_memory_kind_get_type(void)
{
	static GType type = 0;
	static const GEnumValue values[] = {
		{ GST_XMEM_MEMORY_AUTO,
		  "CUDA device memory when upstream negotiates memory:CUDAMemory, system memory otherwise", "auto" },
		{ GST_XMEM_MEMORY_SYSTEM, "Shared system memory (memfd); CUDA input is downloaded once", "system" },
		{ GST_XMEM_MEMORY_CUDA, "CUDA device memory; system-memory input is uploaded once", "cuda" },
		{ 0, nullptr, nullptr },
	};
	if (g_once_init_enter(&type))
		g_once_init_leave(&type, g_enum_register_static("GstXmemMemoryKind", values));
	return type;
}

static void post_pool_error(GstXmemSink *self, const xmem::Error &error)
{
	if (error.code == xmem::Errc::permission_denied)
		GST_ELEMENT_ERROR(self, RESOURCE, OPEN_WRITE, ("Cannot create the xmem pool."),
				  ("%s", error.message.c_str()));
	else if (error.code == xmem::Errc::owner_alive || error.code == xmem::Errc::bad_name)
		GST_ELEMENT_ERROR(self, RESOURCE, SETTINGS, ("Cannot create the xmem pool."),
				  ("%s", error.message.c_str()));
	else
		GST_ELEMENT_ERROR(self, RESOURCE, FAILED, ("xmem pool failure."), ("%s", error.message.c_str()));
}

/* The gid the group property names: a number, or a group's name. */
static xmem::Result<guint32> resolve_group(const std::string &group)
{
	char *end = nullptr;
	guint64 gid = g_ascii_strtoull(group.c_str(), &end, 10);
	if (end && *end == '\0' && end != group.c_str() && gid < G_MAXUINT32)
		return guint32(gid);
	std::vector<char> buf(16384);
	struct group entry {
	};
	struct group *found = nullptr;
	if (getgrnam_r(group.c_str(), &entry, buf.data(), buf.size(), &found) != 0 || !found)
		return xmem::Error{ xmem::Errc::bad_name, "group '" + group + "': no such group" };
	return guint32(found->gr_gid);
}

/* Makes sure a pool with slots of at least FRAME_SIZE bytes publishes CAPS_STRING.
 * A larger frame than the slots hold gets a size class of its own in the same pool
 * (`buffers` slots of its size): consumers stay attached and import the class with
 * its first frame. Frames in another memory, or a pool with no room left for a class
 * (32 classes, or PoolConfig::max_slots records), mean a new pool under the same name:
 * consumers see the old one close and reattach (xmemsrc does so by itself). */
static std::shared_ptr<xmem::BufferPool> ensure_pool(GstXmemSink *self, gsize frame_size)
{
	SinkState *s = self->state;
	std::unique_lock lock(s->lock);
	bool same_memory = s->pool && s->pool->storage() == s->storage && s->pool->device() == s->device;
	xmem::GrowthStats growth = s->pool ? s->pool->growth_stats() : xmem::GrowthStats{};
	guint64 cap = s->storage == xmem::Storage::system ? growth.memory_cap : growth.device_memory_cap;
	if (same_memory && frame_size > s->slot_limit && cap >= frame_size) {
		/* A pool that grows makes slots of the new size as frames need them, within its
		 * cap; those of the old size go back once unused. */
		GST_INFO_OBJECT(self, "frames of %" G_GSIZE_FORMAT " bytes: slots made on demand in pool '%s'",
				frame_size, s->pool_name.c_str());
		s->slot_limit = frame_size;
	} else if (same_memory && frame_size > s->slot_limit) {
		auto added = s->pool->preallocate(frame_size, s->buffers, s->storage, s->device);
		if (added) {
			GST_INFO_OBJECT(self,
					"frames of %" G_GSIZE_FORMAT " bytes: size class %u of pool '%s', %u slots",
					frame_size, *added, s->pool_name.c_str(), s->buffers);
			auto classes = s->pool->classes();
			s->slot_limit = std::max<guint64>(frame_size, classes.at(*added).slot_size);
		} else if (added.code() == xmem::Errc::full) {
			GST_INFO_OBJECT(self, "no room for a size class of %" G_GSIZE_FORMAT " bytes: %s", frame_size,
					added.error().message.c_str());
			same_memory = false;
		} else {
			lock.unlock();
			post_pool_error(self, added.error());
			return nullptr;
		}
	}
	if (same_memory) {
		if (s->pool->format() != s->caps_string) {
			auto r = s->pool->set_format(s->caps_string);
			if (!r) {
				lock.unlock();
				post_pool_error(self, r.error());
				return nullptr;
			}
		}
		return s->pool;
	}
	if (s->pool) {
		GST_INFO_OBJECT(
			self, "frames of %" G_GSIZE_FORMAT " bytes in %s memory need new slots: recreating pool '%s'",
			frame_size, s->storage == xmem::Storage::cuda ? "CUDA" : "system", s->pool_name.c_str());
		/* Consumers of the old pool reattach to the new one: wait for them (a
		 * little) before publishing into it, or its first frames go to nobody. */
		s->rejoin = s->pool->stats().consumers;
		s->waited = false;
		s->recreated++;
		s->pool->close();
		s->pool.reset();
	}
	xmem::PoolConfig config;
	config.slot_count = s->buffers;
	config.slot_size = std::max<gsize>(frame_size, 1);
	config.max_consumers = s->max_consumers;
	config.policy = xmem::Policy(s->policy);
	config.block_timeout = std::chrono::nanoseconds(s->block_timeout);
	config.spill_bytes = s->spill_size;
	/* The cap is on the pool's memory: system memory, or its CUDA device's. */
	if (s->storage == xmem::Storage::cuda)
		config.device_memory_cap = s->memory_cap;
	else
		config.memory_cap = s->memory_cap;
	config.mode = s->perms;
	if (!s->group.empty()) {
		auto gid = resolve_group(s->group);
		if (!gid) {
			lock.unlock();
			post_pool_error(self, gid.error());
			return nullptr;
		}
		config.group = *gid;
	}
	config.format = s->caps_string;
	config.producer = "xmemsink";
	config.storage = s->storage;
	config.device = s->device;
	auto pool = xmem::BufferPool::create(s->pool_name, config);
	if (!pool) {
		lock.unlock();
		post_pool_error(self, pool.error());
		return nullptr;
	}
	GST_INFO_OBJECT(self, "created pool '%s' at %s: %u slots of %" G_GUINT64_FORMAT " bytes in %s memory",
			s->pool_name.c_str(), (*pool)->path().c_str(), config.slot_count, config.slot_size,
			config.storage == xmem::Storage::cuda ? "CUDA" : "system");
	s->pool = pool.value();
	s->slot_limit = s->pool->slot_size();
	return s->pool;
}

static gboolean gst_xmem_sink_start(GstBaseSink *sink)
{
	auto *self = GST_XMEM_SINK(sink);
	SinkState *s = self->state;
	GstXmemMemoryKind memory;
	gint cuda_device;
	std::string pool_name;
	{
		std::lock_guard lock(s->lock);
		memory = s->memory;
		cuda_device = s->cuda_device;
		pool_name = s->pool_name;
	}
	if (memory == GST_XMEM_MEMORY_CUDA) {
		/* Fail now, naming the cause, rather than at the first caps. */
		auto name = xmem::cuda_check_device(guint(std::max(cuda_device, 0)));
		if (!name) {
			GST_ELEMENT_ERROR(self, RESOURCE, NOT_FOUND, ("memory=cuda: no usable CUDA device."),
					  ("%s", name.error().message.c_str()));
			return FALSE;
		}
		GST_INFO_OBJECT(self, "memory=cuda on %s", name->c_str());
	}
	auto path = xmem::socket_path(pool_name);
	if (!path) {
		GST_ELEMENT_ERROR(self, RESOURCE, SETTINGS, ("Invalid pool-name."),
				  ("%s", path.error().message.c_str()));
		return FALSE;
	}
	std::lock_guard lock(s->lock);
	s->waited = false;
	s->rejoin = 0;
	s->unlocked = false;
	s->eos_requested = false;
	return TRUE;
}

static gboolean gst_xmem_sink_stop(GstBaseSink *sink)
{
	auto *self = GST_XMEM_SINK(sink);
	SinkState *s = self->state;
	std::shared_ptr<xmem::BufferPool> pool;
	{
		std::lock_guard lock(s->lock);
		pool = std::move(s->pool);
		s->caps_string.clear();
	}
	/* Never waits: frames consumers hold stay mapped in their processes (limbo). */
	if (pool)
		pool->close();
	s->cuda.reset();
	return TRUE;
}

static gboolean gst_xmem_sink_set_caps(GstBaseSink *sink, GstCaps *caps)
{
	auto *self = GST_XMEM_SINK(sink);
	SinkState *s = self->state;
	gsize size = 0;
	bool input_cuda = gst_xmem_caps_is_cuda(caps);
	GstXmemMemoryKind memory;
	gint wanted_device;
	{
		std::lock_guard lock(s->lock);
		memory = s->memory;
		wanted_device = s->cuda_device;
	}
	/* CUDA input is read on its own context, which upstream shares with us. */
	if (std::string why; input_cuda && !s->cuda.ensure(wanted_device, &why)) {
		GST_ELEMENT_ERROR(self, RESOURCE, NOT_FOUND, ("Cannot read CUDA memory."), ("%s", why.c_str()));
		return FALSE;
	}
	{
		/* Errors are posted with the lock released (see SinkState). */
		std::unique_lock lock(s->lock);
		/* The pool's format has no memory feature: where frames live is the pool's
		 * storage, and consumers choose their own memory. */
		g_autoptr(GstCaps) plain = gst_xmem_caps_without_features(caps);
		g_autofree gchar *str = gst_caps_to_string(plain);
		s->caps_string = str;
		if (gsize length = s->caps_string.size(); length >= XMEM_FORMAT_MAX) {
			lock.unlock();
			GST_ELEMENT_ERROR(self, STREAM, FORMAT, ("Caps too long for an xmem pool."),
					  ("%zu bytes, at most %d", length, XMEM_FORMAT_MAX - 1));
			return FALSE;
		}
		s->is_video = gst_video_info_from_caps(&s->info, caps);
		s->input_cuda = input_cuda;
		bool device_pool = memory == GST_XMEM_MEMORY_CUDA || (memory == GST_XMEM_MEMORY_AUTO && input_cuda);
		s->storage = device_pool ? xmem::Storage::cuda : xmem::Storage::system;
		s->device = guint(input_cuda && wanted_device < 0 ? std::max(s->cuda.device(), 0)
								  : std::max(wanted_device, 0));
		s->slot_info = s->info;
		if (device_pool && !s->is_video) {
			lock.unlock();
			GST_ELEMENT_ERROR(self, STREAM, FORMAT, ("CUDA pools take raw video only."),
					  ("caps %" GST_PTR_FORMAT " are not raw video", static_cast<gpointer>(caps)));
			return FALSE;
		}
		if (device_pool) {
			GstVideoInfo bound;
			if (!gst_xmem_aligned_info(s->info, DEVICE_SIZE_ALIGNMENT, &bound)) {
				GstVideoFormat format = GST_VIDEO_INFO_FORMAT(&s->info);
				lock.unlock();
				GST_ELEMENT_ERROR(self, STREAM, FORMAT, ("Cannot lay out the frames in device memory."),
						  ("format %s cannot be aligned to %d bytes",
						   gst_video_format_to_string(format), DEVICE_SIZE_ALIGNMENT));
				return FALSE;
			}
			size = bound.size;
		} else if (s->is_video) {
			size = s->info.size;
		} else if (!s->pool) {
			return TRUE; /* size known with the first buffer */
		}
	}
	GST_DEBUG_OBJECT(self, "caps %" GST_PTR_FORMAT, static_cast<gpointer>(caps));
	auto pool = ensure_pool(self, size);
	if (!pool)
		return FALSE;
	if (pool->storage() == xmem::Storage::cuda) {
		std::unique_lock lock(s->lock);
		if (!gst_xmem_aligned_info(s->info, pool->pitch_alignment(), &s->slot_info) ||
		    s->slot_info.size > s->slot_limit) {
			guint device = s->device;
			lock.unlock();
			GST_ELEMENT_ERROR(self, STREAM, FORMAT, ("Cannot lay out the frames in device memory."),
					  ("pitch alignment %u of CUDA device %u", pool->pitch_alignment(), device));
			return FALSE;
		}
	}
	return TRUE;
}

/* Caps queries: anything, with the memory the pool will use first, so upstream that
 * can output either (a decoder) picks it. */
static GstCaps *gst_xmem_sink_get_caps(GstBaseSink *sink, GstCaps *filter)
{
	SinkState *s = GST_XMEM_SINK(sink)->state;
	if (!filter)
		return gst_caps_new_any();
	bool prefer_cuda;
	{
		std::lock_guard lock(s->lock);
		prefer_cuda = gst_xmem_have_gst_cuda() && s->memory != GST_XMEM_MEMORY_SYSTEM;
	}
	GstCaps *first = gst_caps_new_empty();
	GstCaps *rest = gst_caps_new_empty();
	for (guint i = 0; i < gst_caps_get_size(filter); i++) {
		GstCapsFeatures *f = gst_caps_get_features(filter, i);
		bool cuda =
			f && !gst_caps_features_is_any(f) && gst_caps_features_contains(f, GST_XMEM_CAPS_FEATURE_CUDA);
		gst_caps_append_structure_full(cuda == prefer_cuda ? first : rest,
					       gst_structure_copy(gst_caps_get_structure(filter, i)),
					       f ? gst_caps_features_copy(f) : nullptr);
	}
	return gst_caps_merge(first, rest);
}

static gboolean gst_xmem_sink_propose_allocation(GstBaseSink *sink, GstQuery *query)
{
	auto *self = GST_XMEM_SINK(sink);
	SinkState *s = self->state;
	GstCaps *caps;
	gboolean need_pool;
	gst_query_parse_allocation(query, &caps, &need_pool);
	GstVideoInfo info;
	if (!caps || !gst_video_info_from_caps(&info, caps))
		return TRUE; /* not raw video: upstream allocates, render() copies */
	std::shared_ptr<xmem::BufferPool> core;
	{
		std::lock_guard lock(s->lock);
		core = s->pool;
	}
	/* Device slots are not CPU memory: upstream allocates, render() copies. */
	if (!core || core->storage() != xmem::Storage::system)
		return TRUE;

	g_autoptr(GstBufferPool) pool = gst_xmem_buffer_pool_new(core);
	GstStructure *config = gst_buffer_pool_get_config(pool);
	gst_buffer_pool_config_set_params(config, caps, guint(info.size), 0, 0);
	gst_buffer_pool_config_add_option(config, GST_BUFFER_POOL_OPTION_VIDEO_META);
	if (!gst_buffer_pool_set_config(pool, config))
		return TRUE;
	gst_query_add_allocation_pool(query, pool, guint(info.size), 0, 0);
	gst_query_add_allocation_meta(query, GST_VIDEO_META_API_TYPE, nullptr);
	return TRUE;
}

enum class WaitEnd {
	attached, /* the consumers are there */
	timed_out, /* the deadline passed first */
	flushing, /* flushing, or going to READY */
	eos, /* an EOS was sent to the element */
};

/* Waits until WANTED consumers are attached, or until DEADLINE (monotonic µs). In
 * render(), with the preroll lock held: going to PAUSED unlocks it, and the wait
 * goes on once PLAYING again (gst_base_sink_wait_preroll). */
static WaitEnd wait_for_consumers(GstXmemSink *self, xmem::BufferPool &pool, guint wanted, gint64 deadline)
{
	SinkState *s = self->state;
	if (wanted)
		GST_INFO_OBJECT(self, "waiting for %u consumer(s) of pool '%s'", wanted, pool.name().c_str());
	/* A startup wait only: polling every few ms costs nothing per frame. */
	for (;;) {
		if (pool.stats().consumers >= wanted)
			return WaitEnd::attached;
		if (s->eos_requested.load())
			return WaitEnd::eos;
		if (s->unlocked.load() && gst_base_sink_wait_preroll(GST_BASE_SINK(self)) != GST_FLOW_OK)
			return WaitEnd::flushing;
		if (g_get_monotonic_time() >= deadline)
			return WaitEnd::timed_out;
		std::this_thread::sleep_for(std::chrono::milliseconds(5));
	}
}

/* The monotonic time (µs) TIMEOUT ns from now; G_MAXINT64 for 0 (forever). */
static gint64 deadline_after(guint64 timeout)
{
	gint64 now = g_get_monotonic_time();
	guint64 us = timeout / 1000;
	if (timeout == 0 || us >= guint64(G_MAXINT64 - now))
		return G_MAXINT64;
	return now + gint64(us);
}

/* A writable slot, waiting while consumers hold every one. In render(), with the
 * preroll lock held: unlocked by PLAYING -> PAUSED, it waits in PAUSED and goes on
 * waiting for a slot once PLAYING again (gst_base_sink_wait_preroll), so the frame
 * and upstream's task survive a pause; flushing or stopping, it ends with *FLOW
 * saying so. *FLOW is GST_FLOW_OK otherwise. */
static xmem::Result<xmem::BufferGuard> acquire_slot(GstXmemSink *self, xmem::BufferPool &pool, gsize size,
						    GstFlowReturn *flow, xmem::CudaStream stream = nullptr)
{
	*flow = GST_FLOW_OK;
	for (;;) {
		auto slot = pool.acquire(size, std::chrono::milliseconds(50), stream);
		if (slot || slot.code() != xmem::Errc::timed_out)
			return slot;
		if (self->state->unlocked.load() &&
		    (*flow = gst_base_sink_wait_preroll(GST_BASE_SINK(self))) != GST_FLOW_OK)
			return slot;
	}
}

/* Copies BUFFER into SLOT in the pool's layout (the caps' default strides). */
static bool copy_into(GstXmemSink *self, GstBuffer *buffer, xmem::BufferGuard &slot, gsize &size)
{
	SinkState *s = self->state;
	auto bytes = slot.data_mut().value();
	if (!s->is_video) {
		size = std::min<gsize>(gst_buffer_get_size(buffer), bytes.size());
		gst_buffer_extract(buffer, 0, bytes.data(), size);
		return true;
	}
	GstVideoFrame in, out;
	if (!gst_video_frame_map(&in, &s->info, buffer, GST_MAP_READ))
		return false;
	/* Map the slot through a temporary buffer, then take the slot back. */
	g_autoptr(GstBuffer) tmp = gst_buffer_new();
	GstMemory *mem = gst_xmem_memory_wrap(std::move(slot), s->info.size);
	gst_buffer_append_memory(tmp, mem);
	bool ok = gst_video_frame_map(&out, &s->info, tmp, GST_MAP_WRITE);
	if (ok) {
		ok = gst_video_frame_copy(&out, &in);
		gst_video_frame_unmap(&out);
	}
	slot = std::move(*gst_xmem_memory_guard(mem));
	gst_video_frame_unmap(&in);
	size = s->info.size;
	return ok;
}

/* LAYOUT: the frame's layout in the slot, or nullptr when upstream wrote the slot in
 * place (its GstVideoMeta says how). BUFFER's other metas go in the side data. */
static void fill_meta(GstXmemSink *self, GstBuffer *buffer, xmem::BufferGuard &slot, gsize size,
		      const GstVideoInfo *layout)
{
	SinkState *s = self->state;
	GstBaseSink *sink = GST_BASE_SINK(self);
	gst_xmem_metas_write(GST_ELEMENT(self), buffer, slot, s->metas);
	xmem::FrameMeta &m = *slot.meta_mut().value();
	m.size = size;
	m.pts = GST_BUFFER_PTS(buffer);
	m.dts = GST_BUFFER_DTS(buffer);
	m.duration = GST_BUFFER_DURATION(buffer);
	m.flags = GST_BUFFER_FLAGS(buffer);
	m.dtype = XMEM_DTYPE_U8;
	/* Both sides run on the monotonic system clock: publish the frame's clock time,
	 * which xmemsrc turns back into a timestamp in its own pipeline. */
	m.timestamp = 0;
	GstClockTime pts = GST_BUFFER_PTS(buffer);
	if (GST_CLOCK_TIME_IS_VALID(pts)) {
		GstClockTime running = gst_segment_to_running_time(&sink->segment, GST_FORMAT_TIME, pts);
		g_autoptr(GstClock) clock = gst_element_get_clock(GST_ELEMENT(self));
		if (clock && GST_CLOCK_TIME_IS_VALID(running))
			m.timestamp = gst_element_get_base_time(GST_ELEMENT(self)) + running;
	}
	std::strncpy(m.content_type, s->is_video ? "video/x-raw" : "application/octet-stream",
		     sizeof(m.content_type) - 1);
	m.n_planes = 0;
	if (!s->is_video)
		return;
	const GstVideoMeta *vmeta = layout ? nullptr : gst_buffer_get_video_meta(buffer);
	if (!layout)
		layout = &s->info;
	m.n_planes = vmeta ? vmeta->n_planes : GST_VIDEO_INFO_N_PLANES(layout);
	for (guint p = 0; p < m.n_planes && p < XMEM_MAX_PLANES; p++) {
		m.plane_offset[p] = vmeta ? vmeta->offset[p] : layout->offset[p];
		m.plane_stride[p] = guint32(vmeta ? vmeta->stride[p] : layout->stride[p]);
	}
	/* The first plane as a (rows, columns, channels) tensor of bytes: the channels of
	 * its pixels (RGBA 4, YUY2 2, NV12's luma 1), none shared with another pixel or
	 * plane, so readers find no more elements than bytes (lib/frame_check.cpp). */
	const GstVideoFormatInfo *finfo = s->info.finfo;
	guint channels = 0;
	for (guint c = 0; c < GST_VIDEO_FORMAT_INFO_N_COMPONENTS(finfo); c++)
		channels += GST_VIDEO_FORMAT_INFO_PLANE(finfo, c) == 0;
	gint pstride = GST_VIDEO_INFO_COMP_PSTRIDE(&s->info, 0);
	m.ndim = 3;
	m.shape[0] = GST_VIDEO_INFO_HEIGHT(&s->info);
	m.shape[1] = GST_VIDEO_INFO_WIDTH(&s->info);
	m.shape[2] = pstride > 0 ? std::min<guint>(channels, guint(pstride)) : 1;
	m.strides[0] = m.plane_stride[0];
	m.strides[1] = guint64(std::max(pstride, 0));
	m.strides[2] = 1;
}

/* The planes of LAYOUT at BASE. */
static GstXmemPlanes planes_of(const GstVideoInfo &layout, guint64 base, bool device)
{
	GstXmemPlanes planes;
	planes.base = base;
	planes.device = device;
	planes.n_planes = GST_VIDEO_INFO_N_PLANES(&layout);
	for (guint p = 0; p < planes.n_planes; p++) {
		planes.offset[p] = layout.offset[p];
		planes.stride[p] = layout.stride[p];
	}
	return planes;
}

/* Maps a buffer of one CUDA memory for its device address, for reading on CUDA's
 * stream: its planes from its GstVideoMeta, or from the memory's own layout. False for
 * anything else. */
static bool map_cuda_input(GstXmemCuda &cuda, GstBuffer *buffer, GstMemory **mem, GstMapInfo *map,
			   GstXmemPlanes *planes)
{
	if (gst_buffer_n_memory(buffer) != 1)
		return false;
	GstMemory *m = gst_buffer_peek_memory(buffer, 0);
	GstVideoInfo layout;
	if (!GstXmemCuda::memory_layout(m, &layout) || !cuda.map_input(m, map))
		return false;
	*planes = planes_of(layout, guint64(uintptr_t(map->data)), true);
	if (const GstVideoMeta *vmeta = gst_buffer_get_video_meta(buffer)) {
		planes->n_planes = vmeta->n_planes;
		for (guint p = 0; p < vmeta->n_planes; p++) {
			planes->offset[p] = vmeta->offset[p];
			planes->stride[p] = vmeta->stride[p];
		}
	}
	*mem = m;
	return true;
}

/* FLOW: what acquire_slot() said of the flushing state. */
static GstFlowReturn slot_error(GstXmemSink *self, GstFlowReturn flow, const xmem::Error &error)
{
	if (flow != GST_FLOW_OK)
		return flow;
	if (self->state->unlocked.load())
		return GST_FLOW_FLUSHING;
	post_pool_error(self, error);
	return GST_FLOW_ERROR;
}

static GstFlowReturn copy_error(GstXmemSink *self, const char *what, const xmem::Error &error)
{
	GST_ELEMENT_ERROR(self, STREAM, FAILED, ("%s", what), ("%s", error.message.c_str()));
	return GST_FLOW_ERROR;
}

/* How many of upstream's buffers may stay held for copies still queued on our stream:
 * MAX_HELD_INPUT, and never the last buffer of a bounded pool, which upstream would
 * wait for forever (held buffers go back only in a later render()). */
static gsize held_input_limit(GstBuffer *buffer)
{
	gsize limit = MAX_HELD_INPUT;
	if (GstBufferPool *from = buffer->pool) {
		GstStructure *config = gst_buffer_pool_get_config(from);
		guint max = 0;
		if (gst_buffer_pool_config_get_params(config, nullptr, nullptr, nullptr, &max) && max > 0)
			limit = std::min<gsize>(limit, max - 1);
		gst_structure_free(config);
	}
	return limit;
}

/* A device pool: CUDA input is copied device to device on the sink's stream, which
 * publishes the slot once the copy is done (no CPU wait); system input is uploaded. */
static GstFlowReturn render_device(GstXmemSink *self, xmem::BufferPool &pool, GstBuffer *buffer)
{
	SinkState *s = self->state;
	GstMemory *mem = nullptr;
	GstMapInfo map;
	GstXmemPlanes src;
	/* CUDA memory is read on its own context's stream, which set_caps() made when the
	 * caps said CUDA; without one it is mapped for the CPU and uploaded like the rest. */
	bool device_input = s->cuda.stream() && map_cuda_input(s->cuda, buffer, &mem, &map, &src);
	xmem::CudaStream stream = device_input ? s->cuda.stream() : nullptr;
	GstFlowReturn flow;
	auto slot = acquire_slot(self, pool, s->slot_info.size, &flow, stream);
	if (!slot) {
		if (device_input)
			gst_memory_unmap(mem, &map);
		return slot_error(self, flow, slot.error());
	}
	GstXmemPlanes dst = planes_of(s->slot_info, slot->device_ptr(), true);
	xmem::Result<void> copied;
	if (device_input) {
		copied = gst_xmem_copy_planes(s->info, dst, src, s->device, stream);
		gst_memory_unmap(mem, &map);
	} else {
		GstVideoFrame in;
		if (!gst_video_frame_map(&in, &s->info, buffer, GST_MAP_READ))
			return copy_error(
				self, "Cannot read the frame.",
				{ xmem::Errc::invalid_argument, "the buffer does not match the negotiated caps" });
		GstXmemPlanes host = planes_of(in.info, 0, false);
		for (guint p = 0; p < host.n_planes; p++)
			host.offset[p] = gsize(uintptr_t(in.data[p]));
		copied = gst_xmem_copy_planes(s->info, dst, host, s->device, nullptr);
		gst_video_frame_unmap(&in);
	}
	if (!copied)
		return copy_error(self, "Cannot copy the frame into device memory.", copied.error());
	fill_meta(self, buffer, *slot, s->slot_info.size, &s->slot_info);
	if (auto r = pool.publish(std::move(*slot), stream); !r) {
		post_pool_error(self, r.error());
		return GST_FLOW_ERROR;
	}
	if (device_input) {
		/* Upstream may rewrite its buffer once we let go: keep it until our copy ran. */
		s->cuda.hold_until_done(buffer);
		s->cuda.release_done(held_input_limit(buffer));
		s->device_copied++;
	} else {
		s->copied++;
	}
	return GST_FLOW_OK;
}

/* A system pool and CUDA input: one download straight into the slot. False when the
 * buffer is not CUDA memory this build can map (the CPU copy path takes it then). */
static bool render_download(GstXmemSink *self, xmem::BufferPool &pool, GstBuffer *buffer, GstFlowReturn *ret)
{
	SinkState *s = self->state;
	if (!s->is_video || !s->cuda.stream())
		return false;
	GstMemory *mem = nullptr;
	GstMapInfo map;
	GstXmemPlanes src;
	if (!map_cuda_input(s->cuda, buffer, &mem, &map, &src))
		return false;
	GstFlowReturn flow;
	auto slot = acquire_slot(self, pool, s->info.size, &flow);
	if (!slot) {
		gst_memory_unmap(mem, &map);
		*ret = slot_error(self, flow, slot.error());
		return true;
	}
	guint device = guint(std::max(s->cuda.device(), 0));
	GstXmemPlanes dst = planes_of(s->info, guint64(uintptr_t(slot->data_mut().value().data())), false);
	auto copied = gst_xmem_copy_planes(s->info, dst, src, device, s->cuda.stream());
	if (copied)
		copied = xmem::cuda_synchronize(device, s->cuda.stream());
	gst_memory_unmap(mem, &map);
	if (!copied) {
		*ret = copy_error(self, "Cannot copy the frame out of device memory.", copied.error());
		return true;
	}
	fill_meta(self, buffer, *slot, s->info.size, &s->info);
	if (auto r = pool.publish(std::move(*slot)); !r) {
		post_pool_error(self, r.error());
		*ret = GST_FLOW_ERROR;
		return true;
	}
	s->copied++;
	*ret = GST_FLOW_OK;
	return true;
}

static GstFlowReturn gst_xmem_sink_render(GstBaseSink *sink, GstBuffer *buffer)
{
	auto *self = GST_XMEM_SINK(sink);
	SinkState *s = self->state;
	std::shared_ptr<xmem::BufferPool> pool;
	guint64 slot_limit;
	{
		std::lock_guard lock(s->lock);
		pool = s->pool;
		slot_limit = s->slot_limit;
	}
	gsize in_size = gst_buffer_get_size(buffer);
	if (!pool || (!s->is_video && in_size > slot_limit)) {
		pool = ensure_pool(self, in_size);
		if (!pool)
			return GST_FLOW_ERROR;
	}
	guint wanted, rejoin;
	guint64 timeout;
	bool first;
	{
		std::lock_guard lock(s->lock);
		wanted = s->wait_for_consumers;
		timeout = s->wait_timeout;
		rejoin = s->rejoin;
		first = !s->waited;
	}
	if (first) {
		WaitEnd end = wait_for_consumers(self, *pool, wanted, deadline_after(timeout));
		if (end == WaitEnd::timed_out) {
			/* Publishing is what the pipeline is for: nobody asked for an error, and
			 * an EOS stuck behind this frame (gst-launch-1.0 -e) can pass now. */
			GST_ELEMENT_WARNING(self, RESOURCE, NOT_FOUND,
					    ("No consumer attached within %.3g s: publishing without waiting longer.",
					     double(timeout) / GST_SECOND),
					    ("pool '%s': %u of the %u consumer(s) wait-for-consumers asks for",
					     pool->name().c_str(), pool->stats().consumers, wanted));
		}
		/* Reattaching consumers get two seconds: one may have gone for good. */
		if (end != WaitEnd::flushing && end != WaitEnd::eos && rejoin > wanted)
			end = wait_for_consumers(self, *pool, rejoin, deadline_after(2 * GST_SECOND));
		if (end == WaitEnd::flushing)
			return GST_FLOW_FLUSHING;
		if (end == WaitEnd::eos) {
			GST_INFO_OBJECT(self, "EOS while waiting for consumers: the frame is not published");
			return GST_FLOW_EOS;
		}
		std::lock_guard lock(s->lock);
		s->waited = true;
		s->rejoin = 0;
	}

	if (pool->storage() == xmem::Storage::cuda)
		return render_device(self, *pool, buffer);
	if (GstFlowReturn ret; render_download(self, *pool, buffer, &ret))
		return ret;

	/* Zero copy: upstream wrote into a slot from our pool; publish it in place and
	 * keep a read-only reference for as long as the GstBuffer lives. */
	GstMemory *mem = gst_buffer_n_memory(buffer) == 1 ? gst_buffer_peek_memory(buffer, 0) : nullptr;
	xmem::BufferGuard *guard = mem ? gst_xmem_memory_guard(mem) : nullptr;
	if (guard && guard->writable() && !guard->is_copy() && pool->owns(*guard) && mem->offset == 0) {
		auto keep = guard->clone_ref();
		if (keep) {
			fill_meta(self, buffer, *guard, mem->size, nullptr);
			auto r = pool->publish(std::move(*guard));
			*guard = std::move(keep.value());
			GST_MINI_OBJECT_FLAG_SET(mem, GST_MEMORY_FLAG_READONLY);
			if (!r) {
				post_pool_error(self, r.error());
				return GST_FLOW_ERROR;
			}
			s->zero_copy++;
			GST_LOG_OBJECT(self, "published slot %u in place", guard->index());
			return GST_FLOW_OK;
		}
	}

	/* Buffers from elsewhere are copied in once. */
	GstFlowReturn flow;
	auto slot = acquire_slot(self, *pool, s->is_video ? s->info.size : in_size, &flow);
	if (!slot)
		return slot_error(self, flow, slot.error());
	gsize size = 0;
	if (!copy_into(self, buffer, *slot, size)) {
		GST_ELEMENT_ERROR(self, STREAM, FAILED, ("Cannot copy the frame into the pool."),
				  ("the buffer does not match the negotiated caps"));
		return GST_FLOW_ERROR;
	}
	fill_meta(self, buffer, *slot, size, &s->info);
	auto r = pool->publish(std::move(*slot));
	if (!r) {
		post_pool_error(self, r.error());
		return GST_FLOW_ERROR;
	}
	s->copied++;
	GST_LOG_OBJECT(self, "copied a foreign buffer into the pool");
	return GST_FLOW_OK;
}

static gboolean gst_xmem_sink_event(GstBaseSink *sink, GstEvent *event)
{
	auto *self = GST_XMEM_SINK(sink);
	if (GST_EVENT_TYPE(event) == GST_EVENT_EOS) {
		std::shared_ptr<xmem::BufferPool> pool;
		{
			std::lock_guard lock(self->state->lock);
			pool = self->state->pool;
		}
		if (pool) {
			auto r = pool->end_of_stream();
			if (!r)
				GST_WARNING_OBJECT(self, "%s", r.error().message.c_str());
		}
	}
	return GST_BASE_SINK_CLASS(parent_class)->event(sink, event);
}

/* An EOS sent to the element (not the pad) ends a wait for consumers: render()
 * returns EOS, and upstream sends its EOS down. An EOS sent to the pipeline goes
 * to its sources, whose thread is the one waiting here: wait-timeout frees it. */
static gboolean gst_xmem_sink_send_event(GstElement *element, GstEvent *event)
{
	if (GST_EVENT_TYPE(event) == GST_EVENT_EOS) {
		GST_INFO_OBJECT(element, "EOS sent to the element");
		GST_XMEM_SINK(element)->state->eos_requested = true;
	}
	return GST_ELEMENT_CLASS(parent_class)->send_event(element, event);
}

static gboolean gst_xmem_sink_unlock(GstBaseSink *sink)
{
	GST_XMEM_SINK(sink)->state->unlocked = true;
	return TRUE;
}

static gboolean gst_xmem_sink_unlock_stop(GstBaseSink *sink)
{
	GST_XMEM_SINK(sink)->state->unlocked = false;
	return TRUE;
}

static gboolean gst_xmem_sink_query(GstBaseSink *sink, GstQuery *query)
{
	auto *self = GST_XMEM_SINK(sink);
	if (GST_QUERY_TYPE(query) == GST_QUERY_CONTEXT && self->state->cuda.handle_context_query(query))
		return TRUE;
	return GST_BASE_SINK_CLASS(parent_class)->query(sink, query);
}

static void gst_xmem_sink_set_context(GstElement *element, GstContext *context)
{
	GST_XMEM_SINK(element)->state->cuda.set_context(context);
	GST_ELEMENT_CLASS(parent_class)->set_context(element, context);
}

static GstStructure *make_stats(GstXmemSink *self)
{
	std::shared_ptr<xmem::BufferPool> pool;
	guint64 recreated;
	{
		std::lock_guard lock(self->state->lock);
		pool = self->state->pool;
		recreated = self->state->recreated;
	}
	xmem::PoolStats st{};
	if (pool)
		st = pool->stats();
	GstStructure *stats = gst_structure_new(
		"application/x-xmem-stats", "published", G_TYPE_UINT64, st.published, "dropped", G_TYPE_UINT64,
		st.dropped, "consumers", G_TYPE_UINT, st.consumers, "free-slots", G_TYPE_UINT, st.slots_free, "slots",
		G_TYPE_UINT, st.slots_total, "reaped", G_TYPE_UINT64, st.reaped, "zero-copy", G_TYPE_UINT64,
		self->state->zero_copy.load(), "copied", G_TYPE_UINT64, self->state->copied.load(), "device-copied",
		G_TYPE_UINT64, self->state->device_copied.load(), "classes", G_TYPE_UINT,
		pool ? guint(pool->classes().size()) : 0u, "recreated", G_TYPE_UINT64, recreated, "memory",
		G_TYPE_STRING,
		!pool					 ? "none"
		: pool->storage() == xmem::Storage::cuda ? "cuda"
							 : "system",
		nullptr);
	gst_xmem_metas_add_stats(stats, self->state->metas, true);
	return stats;
}

static void gst_xmem_sink_set_property(GObject *object, guint prop_id, const GValue *value, GParamSpec *pspec)
{
	auto *self = GST_XMEM_SINK(object);
	SinkState *s = self->state;
	std::lock_guard lock(s->lock);
	switch (prop_id) {
	case PROP_POOL_NAME:
		s->pool_name = gst_xmem_pool_name_from_value(value);
		break;
	case PROP_BUFFERS:
		s->buffers = g_value_get_uint(value);
		break;
	case PROP_POLICY:
		s->policy = xmem_policy(g_value_get_enum(value));
		break;
	case PROP_BLOCK_TIMEOUT:
		s->block_timeout = g_value_get_uint64(value);
		break;
	case PROP_WAIT_FOR_CONSUMERS:
		s->wait_for_consumers = g_value_get_uint(value);
		break;
	case PROP_WAIT_TIMEOUT:
		s->wait_timeout = g_value_get_uint64(value);
		break;
	case PROP_MAX_CONSUMERS:
		s->max_consumers = g_value_get_uint(value);
		break;
	case PROP_PERMS:
		s->perms = g_value_get_uint(value);
		break;
	case PROP_GROUP: {
		const gchar *group = g_value_get_string(value);
		s->group = group ? group : "";
		break;
	}
	case PROP_MEMORY:
		s->memory = GstXmemMemoryKind(g_value_get_enum(value));
		break;
	case PROP_CUDA_DEVICE_ID:
		s->cuda_device = g_value_get_int(value);
		break;
	case PROP_SPILL_SIZE:
		s->spill_size = g_value_get_uint64(value);
		break;
	case PROP_MEMORY_CAP:
		s->memory_cap = g_value_get_uint64(value);
		break;
	default:
		G_OBJECT_WARN_INVALID_PROPERTY_ID(object, prop_id, pspec);
		break;
	}
}

static void gst_xmem_sink_get_property(GObject *object, guint prop_id, GValue *value, GParamSpec *pspec)
{
	auto *self = GST_XMEM_SINK(object);
	SinkState *s = self->state;
	if (prop_id == PROP_STATS) {
		g_value_take_boxed(value, make_stats(self));
		return;
	}
	std::lock_guard lock(s->lock);
	switch (prop_id) {
	case PROP_POOL_NAME:
		g_value_set_string(value, s->pool_name.c_str());
		break;
	case PROP_BUFFERS:
		g_value_set_uint(value, s->buffers);
		break;
	case PROP_POLICY:
		g_value_set_enum(value, s->policy);
		break;
	case PROP_BLOCK_TIMEOUT:
		g_value_set_uint64(value, s->block_timeout);
		break;
	case PROP_WAIT_FOR_CONSUMERS:
		g_value_set_uint(value, s->wait_for_consumers);
		break;
	case PROP_WAIT_TIMEOUT:
		g_value_set_uint64(value, s->wait_timeout);
		break;
	case PROP_MAX_CONSUMERS:
		g_value_set_uint(value, s->max_consumers);
		break;
	case PROP_PERMS:
		g_value_set_uint(value, s->perms);
		break;
	case PROP_GROUP:
		g_value_set_string(value, s->group.empty() ? nullptr : s->group.c_str());
		break;
	case PROP_MEMORY:
		g_value_set_enum(value, s->memory);
		break;
	case PROP_CUDA_DEVICE_ID:
		g_value_set_int(value, s->cuda_device);
		break;
	case PROP_SPILL_SIZE:
		g_value_set_uint64(value, s->spill_size);
		break;
	case PROP_MEMORY_CAP:
		g_value_set_uint64(value, s->memory_cap);
		break;
	default:
		G_OBJECT_WARN_INVALID_PROPERTY_ID(object, prop_id, pspec);
		break;
	}
}

static void gst_xmem_sink_finalize(GObject *object)
{
	gst_xmem_state_free(GST_XMEM_SINK(object)->state);
	G_OBJECT_CLASS(parent_class)->finalize(object);
}

static void gst_xmem_sink_init(GstXmemSink *self)
{
	self->state = gst_xmem_state_new<SinkState>("xmemsink", GST_ELEMENT(self));
	/* The last sample would pin a slot for as long as the sink lives: with few
	 * slots, upstream could starve, and no frame would ever be writable in place
	 * for a sole consumer. */
	gst_base_sink_set_last_sample_enabled(GST_BASE_SINK(self), FALSE);
}

static void gst_xmem_sink_class_init(GstXmemSinkClass *klass)
{
	GObjectClass *gobject = G_OBJECT_CLASS(klass);
	GstElementClass *element = GST_ELEMENT_CLASS(klass);
	GstBaseSinkClass *basesink = GST_BASE_SINK_CLASS(klass);

	/* Each callback that runs C++ code goes through GST_XMEM_NO_THROW: no exception
	 * may unwind into GStreamer (gstxmemnothrow.h). */
	gobject->set_property = GST_XMEM_NO_THROW(gst_xmem_sink_set_property);
	gobject->get_property = GST_XMEM_NO_THROW(gst_xmem_sink_get_property);
	gobject->finalize = gst_xmem_sink_finalize;

	auto flags = GST_XMEM_PARAM_FLAGS;
	gst_xmem_install_pool_name(gobject, PROP_POOL_NAME);
	g_object_class_install_property(gobject, PROP_BUFFERS,
					g_param_spec_uint("buffers", "Buffers", "Slots to preallocate in shared memory",
							  1, XMEM_MAX_SLOTS, DEFAULT_BUFFERS, flags));
	g_object_class_install_property(gobject, PROP_POLICY,
					g_param_spec_enum("policy", "Policy",
							  "What a consumer's full queue does to a new frame",
							  GST_TYPE_XMEM_POLICY, DEFAULT_POLICY, flags));
	g_object_class_install_property(
		gobject, PROP_BLOCK_TIMEOUT,
		g_param_spec_uint64("block-timeout", "Block timeout",
				    "With policy=block: how long (ns) one frame waits for full consumers, in all, "
				    "before each still full loses its oldest frame",
				    0, G_MAXUINT64, DEFAULT_BLOCK_TIMEOUT, flags));
	g_object_class_install_property(gobject, PROP_WAIT_FOR_CONSUMERS,
					g_param_spec_uint("wait-for-consumers", "Wait for consumers",
							  "Hold the first frame until this many consumers are attached "
							  "(see wait-timeout)",
							  0, XMEM_MAX_CONSUMERS, DEFAULT_WAIT_FOR_CONSUMERS, flags));
	g_object_class_install_property(
		gobject, PROP_WAIT_TIMEOUT,
		g_param_spec_uint64("wait-timeout", "Wait timeout",
				    "With wait-for-consumers: how long (ns) the first frame waits for them "
				    "(0 = forever); then the sink posts a warning and publishes without them. "
				    "The waiting frame holds back an EOS sent to the pipeline (gst-launch-1.0 -e), "
				    "so set this to let Ctrl-C end cleanly",
				    0, G_MAXUINT64, DEFAULT_WAIT_TIMEOUT, flags));
	g_object_class_install_property(gobject, PROP_MAX_CONSUMERS,
					g_param_spec_uint("max-consumers", "Max consumers",
							  "Most consumers attached at once", 1, XMEM_MAX_CONSUMERS,
							  DEFAULT_MAX_CONSUMERS, flags));
	g_object_class_install_property(
		gobject, PROP_PERMS,
		g_param_spec_uint("perms", "Permissions",
				  "Who may attach, as file permission bits: the socket's mode, and the rule the "
				  "owner checks each consumer's credentials against (also for an abstract "
				  "pool-name=@name). 0660 lets the group in (see group); must include 0600",
				  0, 0777, DEFAULT_PERMS, flags));
	g_object_class_install_property(
		gobject, PROP_GROUP,
		g_param_spec_string("group", "Group",
				    "The group perms' group bits let in (a name or a gid this process is a member "
				    "of); the socket's group. Unset: the process's group",
				    nullptr, flags));
	g_object_class_install_property(gobject, PROP_MEMORY,
					g_param_spec_enum("memory", "Memory", "Where the pool's slots live",
							  GST_TYPE_XMEM_MEMORY_KIND, DEFAULT_MEMORY, flags));
	g_object_class_install_property(
		gobject, PROP_CUDA_DEVICE_ID,
		g_param_spec_int("cuda-device-id", "CUDA device id",
				 "CUDA device of a device pool (-1: the device of upstream's CUDA memory, else 0)", -1,
				 G_MAXINT, DEFAULT_CUDA_DEVICE_ID, flags));
	g_object_class_install_property(
		gobject, PROP_SPILL_SIZE,
		g_param_spec_uint64("spill-size", "Spill size",
				    "Bytes of host memory for the spill tier of policy=fifo-spill consumers (0: none; "
				    "a device pool's is page-locked at this size while the pool lives)",
				    0, guint64{ 1 } << 44, 0, flags));
	g_object_class_install_property(
		gobject, PROP_MEMORY_CAP,
		g_param_spec_uint64("memory-cap", "Memory cap",
				    "Bytes of memory the pool's slots may hold (system memory, or its CUDA device's): "
				    "frames larger than its slots "
				    "get slots made on demand, whose memory goes back once free and not acquired for "
				    "10 s (0: a size class of `buffers` slots per larger size instead)",
				    0, guint64{ 1 } << 44, 0, flags));
	gst_xmem_install_stats(gobject, PROP_STATS,
			       "Pool statistics: published, dropped, consumers, free-slots, slots, reaped, "
			       "zero-copy (frames published in place), copied (frames copied in from system "
			       "memory, or out of CUDA memory into a system pool), device-copied (frames "
			       "copied device to device into a CUDA pool), memory (the pool's: system, cuda)");

	gst_element_class_add_static_pad_template(element, &sink_template);
	gst_element_class_set_static_metadata(
		element, "xmem sink", "Sink/Video/Network",
		"Publishes frames into a named pool of shared, reference-counted buffers that other processes "
		"read without copying (xmemsrc).\n"
		"Example: gst-launch-1.0 videotestsrc ! video/x-raw,format=NV12,width=1280,height=720 ! "
		"xmemsink pool-name=cam0",
		"xmem developers");

	basesink->start = GST_XMEM_NO_THROW(gst_xmem_sink_start);
	basesink->stop = GST_XMEM_NO_THROW(gst_xmem_sink_stop);
	basesink->set_caps = GST_XMEM_NO_THROW(gst_xmem_sink_set_caps);
	basesink->get_caps = GST_XMEM_NO_THROW(gst_xmem_sink_get_caps);
	basesink->query = GST_XMEM_NO_THROW(gst_xmem_sink_query);
	element->set_context = GST_XMEM_NO_THROW(gst_xmem_sink_set_context);
	element->send_event = GST_DEBUG_FUNCPTR(gst_xmem_sink_send_event);
	basesink->propose_allocation = GST_XMEM_NO_THROW(gst_xmem_sink_propose_allocation);
	basesink->render = GST_XMEM_NO_THROW(gst_xmem_sink_render);
	basesink->event = GST_XMEM_NO_THROW(gst_xmem_sink_event);
	basesink->unlock = GST_DEBUG_FUNCPTR(gst_xmem_sink_unlock);
	basesink->unlock_stop = GST_DEBUG_FUNCPTR(gst_xmem_sink_unlock_stop);

	gst_type_mark_as_plugin_api(GST_TYPE_XMEM_POLICY, GstPluginAPIFlags(0));
	gst_type_mark_as_plugin_api(GST_TYPE_XMEM_MEMORY_KIND, GstPluginAPIFlags(0));
}
