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
 * from elsewhere are copied in once. Caps, timestamps, buffer flags and the
 * GstVideoMeta layout travel with each frame; a caps change reaches consumers
 * before the first frame in the new format. A consumer that crashes gives its
 * frames back; going to NULL never waits for consumers.
 *
 * ## Example launch lines
 * |[
 * gst-launch-1.0 videotestsrc is-live=true ! video/x-raw,format=NV12,width=1280,height=720 ! xmemsink pool-name=cam0
 * ]|
 * |[
 * gst-launch-1.0 filesrc location=movie.mp4 ! decodebin ! videoconvert ! xmemsink pool-name=movie wait-for-consumers=1
 * ]|
 * Then, in another terminal: `gst-launch-1.0 xmemsrc pool-name=cam0 ! videoconvert ! autovideosink`
 */
#include "gstxmemsink.h"

#include "gstxmemmemory.h"

#include <xmem/xmem.hpp>

#include <gst/video/video.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <thread>

GST_DEBUG_CATEGORY_STATIC(gst_xmem_sink_debug);
#define GST_CAT_DEFAULT gst_xmem_sink_debug

#define DEFAULT_POOL_NAME "xmem"
#define DEFAULT_BUFFERS 8
#define DEFAULT_POLICY XMEM_POLICY_DROP_OLDEST
#define DEFAULT_BLOCK_TIMEOUT (GST_SECOND)
#define DEFAULT_WAIT_FOR_CONSUMERS 0
#define DEFAULT_MAX_CONSUMERS 64
#define DEFAULT_PERMS 0600
#define DEFAULT_MEMORY GST_XMEM_MEMORY_AUTO

enum {
	PROP_0,
	PROP_POOL_NAME,
	PROP_BUFFERS,
	PROP_POLICY,
	PROP_BLOCK_TIMEOUT,
	PROP_WAIT_FOR_CONSUMERS,
	PROP_MAX_CONSUMERS,
	PROP_PERMS,
	PROP_MEMORY,
	PROP_STATS,
};

namespace {

struct SinkState {
	/* Guards every field below. Lock order: before the core's locks; never held
	 * while waiting for consumers or a slot. */
	std::mutex lock;
	std::string pool_name = DEFAULT_POOL_NAME;
	guint buffers = DEFAULT_BUFFERS;
	xmem_policy policy = DEFAULT_POLICY;
	guint64 block_timeout = DEFAULT_BLOCK_TIMEOUT;
	guint wait_for_consumers = DEFAULT_WAIT_FOR_CONSUMERS;
	guint max_consumers = DEFAULT_MAX_CONSUMERS;
	guint perms = DEFAULT_PERMS;
	GstXmemMemoryKind memory = DEFAULT_MEMORY;

	std::shared_ptr<xmem::BufferPool> pool;
	std::string caps_string;
	GstVideoInfo info{};
	bool is_video = false;
	bool waited = false;
	/* Consumers the previous pool had, when it was recreated for larger frames. */
	guint rejoin = 0;
	/* Frames published in place / copied in (streaming thread writes). */
	std::atomic<guint64> zero_copy{ 0 };
	std::atomic<guint64> copied{ 0 };

	/* Set by unlock() to cut waits short; streaming thread reads it. */
	std::atomic<bool> unlocked{ false };
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

static GstStaticPadTemplate sink_template =
	GST_STATIC_PAD_TEMPLATE("sink", GST_PAD_SINK, GST_PAD_ALWAYS, GST_STATIC_CAPS_ANY);

GType gst_xmem_policy_get_type(void)
{
	static GType type = 0;
	static const GEnumValue values[] = {
		{ XMEM_POLICY_BLOCK, "Wait for the consumer, up to block-timeout, then drop its oldest frame",
		  "block" },
		{ XMEM_POLICY_DROP_OLDEST, "Drop the consumer's oldest queued frame", "drop-oldest" },
		{ XMEM_POLICY_DROP_NEW, "Do not queue the new frame for that consumer", "drop-new" },
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
		{ GST_XMEM_MEMORY_AUTO, "System memory for now; CUDA memory when upstream offers it (later)", "auto" },
		{ GST_XMEM_MEMORY_SYSTEM, "Shared system memory (memfd)", "system" },
		{ GST_XMEM_MEMORY_CUDA, "CUDA device memory (not implemented yet)", "cuda" },
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

/* Makes sure a pool with slots of at least FRAME_SIZE bytes publishes CAPS_STRING.
 * A larger frame than the slots hold means a new pool under the same name:
 * consumers see the old one close and reattach (xmemsrc does so by itself). */
static std::shared_ptr<xmem::BufferPool> ensure_pool(GstXmemSink *self, gsize frame_size)
{
	SinkState *s = self->state;
	std::unique_lock lock(s->lock);
	if (s->pool && frame_size <= s->pool->slot_size()) {
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
		GST_INFO_OBJECT(self, "frames of %" G_GSIZE_FORMAT " bytes need larger slots: recreating pool '%s'",
				frame_size, s->pool_name.c_str());
		/* Consumers of the old pool reattach to the new one: wait for them (a
		 * little) before publishing into it, or its first frames go to nobody. */
		s->rejoin = s->pool->stats().consumers;
		s->waited = false;
		s->pool->close();
		s->pool.reset();
	}
	xmem::PoolConfig config;
	config.slot_count = s->buffers;
	config.slot_size = std::max<gsize>(frame_size, 1);
	config.max_consumers = s->max_consumers;
	config.policy = xmem::Policy(s->policy);
	config.block_timeout = std::chrono::nanoseconds(s->block_timeout);
	config.mode = s->perms;
	config.format = s->caps_string;
	config.producer = "xmemsink";
	auto pool = xmem::BufferPool::create(s->pool_name, config);
	if (!pool) {
		lock.unlock();
		post_pool_error(self, pool.error());
		return nullptr;
	}
	GST_INFO_OBJECT(self, "created pool '%s' at %s: %u slots of %" G_GUINT64_FORMAT " bytes", s->pool_name.c_str(),
			(*pool)->path().c_str(), config.slot_count, config.slot_size);
	s->pool = pool.value();
	return s->pool;
}

static gboolean gst_xmem_sink_start(GstBaseSink *sink)
{
	auto *self = GST_XMEM_SINK(sink);
	SinkState *s = self->state;
	std::lock_guard lock(s->lock);
	if (s->memory == GST_XMEM_MEMORY_CUDA) {
		GST_ELEMENT_ERROR(self, RESOURCE, SETTINGS, ("memory=cuda is not supported yet."),
				  ("xmemsink publishes system memory only; CUDA pools come with the CUDA support"));
		return FALSE;
	}
	auto path = xmem::socket_path(s->pool_name);
	if (!path) {
		GST_ELEMENT_ERROR(self, RESOURCE, SETTINGS, ("Invalid pool-name."),
				  ("%s", path.error().message.c_str()));
		return FALSE;
	}
	s->waited = false;
	s->rejoin = 0;
	s->unlocked = false;
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
	return TRUE;
}

static gboolean gst_xmem_sink_set_caps(GstBaseSink *sink, GstCaps *caps)
{
	auto *self = GST_XMEM_SINK(sink);
	SinkState *s = self->state;
	gsize size = 0;
	{
		std::lock_guard lock(s->lock);
		gchar *str = gst_caps_to_string(caps);
		s->caps_string = str;
		g_free(str);
		if (s->caps_string.size() >= XMEM_FORMAT_MAX) {
			GST_ELEMENT_ERROR(self, STREAM, FORMAT, ("Caps too long for an xmem pool."),
					  ("%zu bytes, at most %d", s->caps_string.size(), XMEM_FORMAT_MAX - 1));
			return FALSE;
		}
		s->is_video = gst_video_info_from_caps(&s->info, caps);
		if (s->is_video)
			size = s->info.size;
		else if (!s->pool)
			return TRUE; /* size known with the first buffer */
	}
	GST_DEBUG_OBJECT(self, "caps %" GST_PTR_FORMAT, static_cast<gpointer>(caps));
	return ensure_pool(self, size) != nullptr;
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
	if (!core || core->slot_size() < info.size)
		return TRUE;

	GstBufferPool *pool = gst_xmem_buffer_pool_new(core);
	GstStructure *config = gst_buffer_pool_get_config(pool);
	gst_buffer_pool_config_set_params(config, caps, guint(info.size), 0, 0);
	gst_buffer_pool_config_add_option(config, GST_BUFFER_POOL_OPTION_VIDEO_META);
	if (!gst_buffer_pool_set_config(pool, config)) {
		gst_object_unref(pool);
		return TRUE;
	}
	gst_query_add_allocation_pool(query, pool, guint(info.size), 0, 0);
	gst_query_add_allocation_meta(query, GST_VIDEO_META_API_TYPE, nullptr);
	gst_object_unref(pool);
	return TRUE;
}

/* Waits until wait-for-consumers are attached; false when unlocked (flushing). */
/* Waits until WANTED consumers are attached, or until DEADLINE (monotonic µs);
 * false when unlocked (flushing). */
static bool wait_for_consumers(GstXmemSink *self, xmem::BufferPool &pool, guint wanted, gint64 deadline)
{
	SinkState *s = self->state;
	if (wanted)
		GST_INFO_OBJECT(self, "waiting for %u consumer(s) of pool '%s'", wanted, pool.name().c_str());
	/* A startup wait only: polling every few ms costs nothing per frame. */
	while (pool.stats().consumers < wanted && g_get_monotonic_time() < deadline) {
		if (s->unlocked.load())
			return false;
		std::this_thread::sleep_for(std::chrono::milliseconds(5));
	}
	return true;
}

/* A writable slot, waiting while consumers hold every one; empty when unlocked. */
static xmem::Result<xmem::BufferGuard> acquire_slot(GstXmemSink *self, xmem::BufferPool &pool)
{
	for (;;) {
		auto slot = pool.acquire(std::chrono::milliseconds(50));
		if (slot || slot.code() != xmem::Errc::timed_out || self->state->unlocked.load())
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
	GstBuffer *tmp = gst_buffer_new();
	GstMemory *mem = gst_xmem_memory_wrap(std::move(slot), s->info.size);
	gst_buffer_append_memory(tmp, mem);
	bool ok = gst_video_frame_map(&out, &s->info, tmp, GST_MAP_WRITE);
	if (ok) {
		ok = gst_video_frame_copy(&out, &in);
		gst_video_frame_unmap(&out);
	}
	slot = std::move(*gst_xmem_memory_guard(mem));
	gst_buffer_unref(tmp);
	gst_video_frame_unmap(&in);
	size = s->info.size;
	return ok;
}

static void fill_meta(GstXmemSink *self, GstBuffer *buffer, xmem::FrameMeta &m, gsize size, bool own_layout)
{
	SinkState *s = self->state;
	GstBaseSink *sink = GST_BASE_SINK(self);
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
		GstClock *clock = gst_element_get_clock(GST_ELEMENT(self));
		if (clock && GST_CLOCK_TIME_IS_VALID(running))
			m.timestamp = gst_element_get_base_time(GST_ELEMENT(self)) + running;
		if (clock)
			gst_object_unref(clock);
	}
	std::strncpy(m.content_type, s->is_video ? "video/x-raw" : "application/octet-stream",
		     sizeof(m.content_type) - 1);
	m.n_planes = 0;
	if (!s->is_video)
		return;
	const GstVideoMeta *vmeta = own_layout ? nullptr : gst_buffer_get_video_meta(buffer);
	m.n_planes = vmeta ? vmeta->n_planes : GST_VIDEO_INFO_N_PLANES(&s->info);
	for (guint p = 0; p < m.n_planes && p < XMEM_MAX_PLANES; p++) {
		m.plane_offset[p] = vmeta ? vmeta->offset[p] : s->info.offset[p];
		m.plane_stride[p] = guint32(vmeta ? vmeta->stride[p] : s->info.stride[p]);
	}
	m.ndim = 3;
	m.shape[0] = GST_VIDEO_INFO_HEIGHT(&s->info);
	m.shape[1] = GST_VIDEO_INFO_WIDTH(&s->info);
	m.shape[2] = GST_VIDEO_INFO_N_COMPONENTS(&s->info);
	m.strides[0] = m.plane_stride[0];
	m.strides[1] = GST_VIDEO_INFO_COMP_PSTRIDE(&s->info, 0);
	m.strides[2] = 1;
}

static GstFlowReturn gst_xmem_sink_render(GstBaseSink *sink, GstBuffer *buffer)
{
	auto *self = GST_XMEM_SINK(sink);
	SinkState *s = self->state;
	std::shared_ptr<xmem::BufferPool> pool;
	{
		std::lock_guard lock(s->lock);
		pool = s->pool;
	}
	gsize in_size = gst_buffer_get_size(buffer);
	if (!pool || (!s->is_video && in_size > pool->slot_size())) {
		pool = ensure_pool(self, std::max<gsize>(in_size, pool ? pool->slot_size() : 0));
		if (!pool)
			return GST_FLOW_ERROR;
	}
	guint wanted, rejoin;
	bool first;
	{
		std::lock_guard lock(s->lock);
		wanted = s->wait_for_consumers;
		rejoin = s->rejoin;
		first = !s->waited;
	}
	if (first) {
		if (!wait_for_consumers(self, *pool, wanted, G_MAXINT64))
			return GST_FLOW_FLUSHING;
		/* Reattaching consumers get two seconds: one may have gone for good. */
		if (rejoin > wanted &&
		    !wait_for_consumers(self, *pool, rejoin, g_get_monotonic_time() + 2 * G_TIME_SPAN_SECOND))
			return GST_FLOW_FLUSHING;
		std::lock_guard lock(s->lock);
		s->waited = true;
		s->rejoin = 0;
	}

	/* Zero copy: upstream wrote into a slot from our pool; publish it in place and
	 * keep a read-only reference for as long as the GstBuffer lives. */
	GstMemory *mem = gst_buffer_n_memory(buffer) == 1 ? gst_buffer_peek_memory(buffer, 0) : nullptr;
	xmem::BufferGuard *guard = mem ? gst_xmem_memory_guard(mem) : nullptr;
	if (guard && guard->writable() && !guard->is_copy() && pool->owns(*guard) && mem->offset == 0) {
		auto keep = guard->clone_ref();
		if (keep) {
			fill_meta(self, buffer, *guard->meta_mut().value(), mem->size, false);
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
	auto slot = acquire_slot(self, *pool);
	if (!slot) {
		if (s->unlocked.load())
			return GST_FLOW_FLUSHING;
		post_pool_error(self, slot.error());
		return GST_FLOW_ERROR;
	}
	gsize size = 0;
	if (!copy_into(self, buffer, *slot, size)) {
		GST_ELEMENT_ERROR(self, STREAM, FAILED, ("Cannot copy the frame into the pool."),
				  ("the buffer does not match the negotiated caps"));
		return GST_FLOW_ERROR;
	}
	fill_meta(self, buffer, *slot->meta_mut().value(), size, true);
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

static GstStructure *make_stats(GstXmemSink *self)
{
	std::shared_ptr<xmem::BufferPool> pool;
	{
		std::lock_guard lock(self->state->lock);
		pool = self->state->pool;
	}
	xmem::PoolStats st{};
	if (pool)
		st = pool->stats();
	return gst_structure_new("application/x-xmem-stats", "published", G_TYPE_UINT64, st.published, "dropped",
				 G_TYPE_UINT64, st.dropped, "consumers", G_TYPE_UINT, st.consumers, "free-slots",
				 G_TYPE_UINT, st.slots_free, "slots", G_TYPE_UINT, st.slots_total, "reaped",
				 G_TYPE_UINT64, st.reaped, "zero-copy", G_TYPE_UINT64, self->state->zero_copy.load(),
				 "copied", G_TYPE_UINT64, self->state->copied.load(), nullptr);
}

static void gst_xmem_sink_set_property(GObject *object, guint prop_id, const GValue *value, GParamSpec *pspec)
{
	auto *self = GST_XMEM_SINK(object);
	SinkState *s = self->state;
	std::lock_guard lock(s->lock);
	switch (prop_id) {
	case PROP_POOL_NAME:
		s->pool_name = g_value_get_string(value) ? g_value_get_string(value) : "";
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
	case PROP_MAX_CONSUMERS:
		s->max_consumers = g_value_get_uint(value);
		break;
	case PROP_PERMS:
		s->perms = g_value_get_uint(value);
		break;
	case PROP_MEMORY:
		s->memory = GstXmemMemoryKind(g_value_get_enum(value));
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
	case PROP_MAX_CONSUMERS:
		g_value_set_uint(value, s->max_consumers);
		break;
	case PROP_PERMS:
		g_value_set_uint(value, s->perms);
		break;
	case PROP_MEMORY:
		g_value_set_enum(value, s->memory);
		break;
	default:
		G_OBJECT_WARN_INVALID_PROPERTY_ID(object, prop_id, pspec);
		break;
	}
}

static void gst_xmem_sink_finalize(GObject *object)
{
	auto *self = GST_XMEM_SINK(object);
	delete self->state;
	G_OBJECT_CLASS(parent_class)->finalize(object);
}

static void gst_xmem_sink_init(GstXmemSink *self)
{
	self->state = new SinkState();
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

	gobject->set_property = gst_xmem_sink_set_property;
	gobject->get_property = gst_xmem_sink_get_property;
	gobject->finalize = gst_xmem_sink_finalize;

	auto flags = GParamFlags(G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS | GST_PARAM_MUTABLE_READY);
	g_object_class_install_property(
		gobject, PROP_POOL_NAME,
		g_param_spec_string("pool-name", "Pool name",
				    "Name of the pool: a plain name (socket in $XDG_RUNTIME_DIR/xmem, or "
				    "/tmp/xmem-$UID) or, when it contains '/', the socket path itself",
				    DEFAULT_POOL_NAME, flags));
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
				    "With policy=block: how long (ns) to wait for a consumer before dropping its "
				    "oldest frame",
				    0, G_MAXUINT64, DEFAULT_BLOCK_TIMEOUT, flags));
	g_object_class_install_property(gobject, PROP_WAIT_FOR_CONSUMERS,
					g_param_spec_uint("wait-for-consumers", "Wait for consumers",
							  "Hold the first frame until this many consumers are attached",
							  0, XMEM_MAX_CONSUMERS, DEFAULT_WAIT_FOR_CONSUMERS, flags));
	g_object_class_install_property(gobject, PROP_MAX_CONSUMERS,
					g_param_spec_uint("max-consumers", "Max consumers",
							  "Most consumers attached at once", 1, XMEM_MAX_CONSUMERS,
							  DEFAULT_MAX_CONSUMERS, flags));
	g_object_class_install_property(
		gobject, PROP_PERMS,
		g_param_spec_uint(
			"perms", "Permissions",
			"File mode of the socket and shared memory (e.g. 0660 = 432 to share with the group); "
			"must include 0600",
			0, 0777, DEFAULT_PERMS, flags));
	g_object_class_install_property(gobject, PROP_MEMORY,
					g_param_spec_enum("memory", "Memory", "Where the pool's slots live",
							  GST_TYPE_XMEM_MEMORY_KIND, DEFAULT_MEMORY, flags));
	g_object_class_install_property(
		gobject, PROP_STATS,
		g_param_spec_boxed("stats", "Statistics",
				   "Pool statistics: published, dropped, consumers, free-slots, slots, reaped, "
				   "zero-copy (frames published in place), copied (frames copied in)",
				   GST_TYPE_STRUCTURE, GParamFlags(G_PARAM_READABLE | G_PARAM_STATIC_STRINGS)));

	gst_element_class_add_static_pad_template(element, &sink_template);
	gst_element_class_set_static_metadata(
		element, "xmem sink", "Sink/Video/Network",
		"Publishes frames into a named pool of shared, reference-counted buffers that other processes "
		"read without copying (xmemsrc).\n"
		"Example: gst-launch-1.0 videotestsrc ! video/x-raw,format=NV12,width=1280,height=720 ! "
		"xmemsink pool-name=cam0",
		"xmem developers");

	basesink->start = GST_DEBUG_FUNCPTR(gst_xmem_sink_start);
	basesink->stop = GST_DEBUG_FUNCPTR(gst_xmem_sink_stop);
	basesink->set_caps = GST_DEBUG_FUNCPTR(gst_xmem_sink_set_caps);
	basesink->propose_allocation = GST_DEBUG_FUNCPTR(gst_xmem_sink_propose_allocation);
	basesink->render = GST_DEBUG_FUNCPTR(gst_xmem_sink_render);
	basesink->event = GST_DEBUG_FUNCPTR(gst_xmem_sink_event);
	basesink->unlock = GST_DEBUG_FUNCPTR(gst_xmem_sink_unlock);
	basesink->unlock_stop = GST_DEBUG_FUNCPTR(gst_xmem_sink_unlock_stop);

	gst_type_mark_as_plugin_api(GST_TYPE_XMEM_POLICY, GstPluginAPIFlags(0));
	gst_type_mark_as_plugin_api(GST_TYPE_XMEM_MEMORY_KIND, GstPluginAPIFlags(0));
}
