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

#include "gstxmemmemory.h"
#include "gstxmemnothrow.h"
#include "gstxmemsinkprivate.h"

#include <xmem/xmem.hpp>

#include <gst/video/video.h>

#include <algorithm>
#include <mutex>
#include <utility>

GST_DEBUG_CATEGORY(gst_xmem_sink_debug);
#define GST_CAT_DEFAULT gst_xmem_sink_debug

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

#define gst_xmem_sink_parent_class parent_class
G_DEFINE_TYPE_WITH_CODE(GstXmemSink, gst_xmem_sink, GST_TYPE_BASE_SINK,
			GST_DEBUG_CATEGORY_INIT(gst_xmem_sink_debug, "xmemsink", 0, "xmem sink");
			G_IMPLEMENT_INTERFACE(GST_TYPE_URI_HANDLER, gst_xmem_sink_uri_handler_init))
GST_ELEMENT_REGISTER_DEFINE(xmemsink, "xmemsink", GST_RANK_NONE, GST_TYPE_XMEM_SINK)

/* Raw video in CUDA or system memory; the pad also takes any other caps (see
 * get_caps), which a template cannot say next to these. */
static GstStaticPadTemplate sink_template =
	GST_STATIC_PAD_TEMPLATE("sink", GST_PAD_SINK, GST_PAD_ALWAYS,
				GST_STATIC_CAPS("video/x-raw(" GST_XMEM_CAPS_FEATURE_CUDA "); video/x-raw"));

GType gst_xmem_policy_get_type(void)
{
	// The library's table of policies (lib/names.cpp), every name it takes: a new policy
	// is offered here with no change.
	static GType type = 0;
	if (g_once_init_enter(&type)) {
		auto names = xmem::policy_names();
		// Kept for the life of the process, as the static enum type that reads them.
		static GEnumValue *values;
		values = g_new0(GEnumValue, names.size() + 1);
		for (size_t i = 0; i < names.size(); i++)
			values[i] = { int(names[i].policy), names[i].blurb, names[i].name };
		g_once_init_leave(&type, g_enum_register_static("GstXmemPolicy", values));
	}
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
			GST_ELEMENT_ERROR(self, RESOURCE, NOT_FOUND,
					  ("memory=cuda: no usable CUDA device: %s", name.error().message.c_str()),
					  ("%s", name.error().message.c_str()));
			return FALSE;
		}
		GST_INFO_OBJECT(self, "memory=cuda on %s", name->c_str());
	}
	auto path = xmem::socket_path(pool_name);
	if (!path) {
		GST_ELEMENT_ERROR(self, RESOURCE, SETTINGS, ("Invalid pool-name: %s", path.error().message.c_str()),
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
		GST_ELEMENT_ERROR(self, RESOURCE, NOT_FOUND, ("Cannot read CUDA memory: %s", why.c_str()),
				  ("%s", why.c_str()));
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
			GST_ELEMENT_ERROR(
				self, STREAM, FORMAT,
				("Caps too long for an xmem pool: %zu bytes, at most %d", length, XMEM_FORMAT_MAX - 1),
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
			GST_ELEMENT_ERROR(self, STREAM, FORMAT,
					  ("CUDA pools take raw video only: "
					   "caps %" GST_PTR_FORMAT " are not raw video",
					   static_cast<gpointer>(caps)),
					  ("caps %" GST_PTR_FORMAT " are not raw video", static_cast<gpointer>(caps)));
			return FALSE;
		}
		if (device_pool) {
			GstVideoInfo bound;
			if (!gst_xmem_aligned_info(s->info, DEVICE_SIZE_ALIGNMENT, &bound)) {
				GstVideoFormat format = GST_VIDEO_INFO_FORMAT(&s->info);
				lock.unlock();
				GST_ELEMENT_ERROR(self, STREAM, FORMAT,
						  ("Cannot lay out the frames in device memory: "
						   "format %s cannot be aligned to %d bytes",
						   gst_video_format_to_string(format), DEVICE_SIZE_ALIGNMENT),
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
			GST_ELEMENT_ERROR(self, STREAM, FORMAT,
					  ("Cannot lay out the frames in device memory: "
					   "pitch alignment %u of CUDA device %u",
					   pool->pitch_alignment(), device),
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
