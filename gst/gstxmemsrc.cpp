/* gstxmemsrc.cpp - xmemsrc: attaches to an xmem pool, negotiates the producer's
 * caps, and pushes its frames as GstMemory wrapping the shared slots. */

/**
 * SECTION:element-xmemsrc
 * @title: xmemsrc
 *
 * Attaches to a named xmem pool (published by xmemsink or the xmem library) and
 * pushes its frames downstream without copying them: each buffer's memory is the
 * shared slot itself, read-only unless this process is the frame's only holder.
 * The frame goes back to the pool when the last buffer referring to it is freed.
 * Caps come from the producer as soon as the source attaches, so no capsfilter is
 * needed. The producer's metas are added back to each buffer; malformed ones are
 * refused, without stopping the stream (`stats`: metas-received, metas-skipped,
 * metas-refused). When the producer goes away (or is killed), the source waits for a new
 * owner of the same name and continues, with new caps if the format changed.
 *
 * From a CUDA device pool the source gives video/x-raw(memory:CUDAMemory) when
 * downstream takes it (cudaconvert, cudadownload, nvh264enc, ...) and system
 * memory otherwise (one download, e.g. for videoconvert). CUDA output is the slot
 * itself on GStreamer 1.24 and later; on 1.22, one device-to-device copy into a
 * GstCudaBufferPool buffer, after which the slot goes back at once. Either way the
 * source's stream waits for the producer's writes on the GPU. A pool that also holds
 * classes of system memory (the library allows both memories in one pool) has those
 * frames uploaded once when the output is CUDA memory, and each device frame of a
 * system-first pool downloaded. `stats` counts frames received zero-copy and copied.
 *
 * ## Example launch lines
 * |[
 * gst-launch-1.0 xmemsrc pool-name=cam0 ! videoconvert ! autovideosink
 * ]|
 * |[
 * gst-launch-1.0 xmemsrc pool-name=cam0 num-buffers=100 ! fakesink
 * ]|
 * |[
 * gst-launch-1.0 xmemsrc pool-name=gpu0 ! 'video/x-raw(memory:CUDAMemory)' ! cudaconvert ! cudadownload ! autovideosink
 * ]|
 */
#include "gstxmemsrc.h"

#include "gstxmemnothrow.h"
#include "gstxmemsrcprivate.h"

#include <xmem/xmem.hpp>

#include <gst/video/video.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

#include <poll.h>

GST_DEBUG_CATEGORY(gst_xmem_src_debug);
#define GST_CAT_DEFAULT gst_xmem_src_debug

enum {
	PROP_0,
	PROP_POOL_NAME,
	PROP_IS_LIVE,
	PROP_TIMEOUT,
	PROP_RECONNECT,
	PROP_QUEUE_SIZE,
	PROP_POLICY,
	PROP_FALLBACK,
	PROP_BLOCK_TIMEOUT,
	PROP_WAKE,
	PROP_SPIN_BUDGET,
	PROP_MAX_AGE,
	PROP_MAX_HELD,
	PROP_HISTORY,
	PROP_ADD_REFERENCE_TIMESTAMP_META,
	PROP_STATS,
};

static GType gst_xmem_src_wake_get_type(void)
{
	static GType type = 0;
	static const GEnumValue values[] = {
		{ XMEM_WAKE_SLEEP, "Sleep until the producer's wake-up", "sleep" },
		{ XMEM_WAKE_SPIN_BEFORE,
		  "Learn the frame period; near the expected arrival poll the queue instead of sleeping "
		  "(at most spin-budget per frame), sleep when the stream is irregular",
		  "spin-before" },
		{ 0, nullptr, nullptr },
	};
	if (g_once_init_enter(&type))
		g_once_init_leave(&type, g_enum_register_static("GstXmemSrcWake", values));
	return type;
}

/* The policy property's values (GstXmemSrcPolicy, gstxmemsrcprivate.h). */
static GType gst_xmem_src_policy_get_type(void)
{
	// "pool", then each policy of the library's table (lib/names.cpp) by its own name
	// (policy_name's: "block" is a pool's word for fifo), its value 1 + the policy's.
	static GType type = 0;
	if (g_once_init_enter(&type)) {
		auto names = xmem::policy_names();
		// Kept for the life of the process, as the static enum type that reads them.
		static GEnumValue *values;
		values = g_new0(GEnumValue, names.size() + 2);
		values[0] = { GST_XMEM_SRC_POLICY_POOL, "The pool's policy (xmemsink policy)", "pool" };
		size_t n = 1;
		for (const xmem::PolicyName &p : names)
			if (std::string_view(p.name) == xmem::policy_name(p.policy))
				values[n++] = { 1 + int(p.policy), p.blurb, p.name };
		g_once_init_leave(&type, g_enum_register_static("GstXmemSrcPolicy", values));
	}
	return type;
}

static GType gst_xmem_src_fallback_get_type(void)
{
	static GType type = 0;
	static const GEnumValue values[] = {
		{ XMEM_POLICY_DROP_OLDEST, "Drop the oldest queued frame", "drop-oldest" },
		{ XMEM_POLICY_DROP_NEW, "Do not queue the new frame", "drop-new" },
		{ 0, nullptr, nullptr },
	};
	if (g_once_init_enter(&type))
		g_once_init_leave(&type, g_enum_register_static("GstXmemSrcFallback", values));
	return type;
}

#define gst_xmem_src_parent_class parent_class
G_DEFINE_TYPE_WITH_CODE(GstXmemSrc, gst_xmem_src, GST_TYPE_PUSH_SRC,
			GST_DEBUG_CATEGORY_INIT(gst_xmem_src_debug, "xmemsrc", 0, "xmem source");
			G_IMPLEMENT_INTERFACE(GST_TYPE_URI_HANDLER, gst_xmem_src_uri_handler_init))
GST_ELEMENT_REGISTER_DEFINE(xmemsrc, "xmemsrc", GST_RANK_NONE, GST_TYPE_XMEM_SRC)

/* Raw video in CUDA memory (from device pools) or system memory; the pad gives any
 * other caps a producer publishes too (see get_caps). */
static GstStaticPadTemplate src_template =
	GST_STATIC_PAD_TEMPLATE("src", GST_PAD_SRC, GST_PAD_ALWAYS,
				GST_STATIC_CAPS("video/x-raw(" GST_XMEM_CAPS_FEATURE_CUDA "); video/x-raw"));

/* Sleeps up to MS milliseconds (-1: forever) unless unlocked; false when unlocked. */
static bool nap(SrcState *s, int ms, int extra_fd = -1)
{
	pollfd fds[2] = { { s->wake.get(), POLLIN, 0 }, { extra_fd, POLLIN, 0 } };
	::poll(fds, extra_fd >= 0 ? 2 : 1, ms);
	return !s->flushing.load();
}

/* Posts E as an element error whose message, the line gst-launch-1.0 prints after
 * "ERROR:", says what failed and then the library's words: the pool, the cause and,
 * where there is one, the fix. The debug string repeats the library's message. */
static void post_error(GstXmemSrc *self, const xmem::Error &e)
{
	const char *why = e.message.c_str();
	switch (e.code) {
	case xmem::Errc::not_found:
		GST_ELEMENT_ERROR(self, RESOURCE, NOT_FOUND, ("No such xmem pool: %s", why), ("%s", why));
		break;
	case xmem::Errc::permission_denied:
		GST_ELEMENT_ERROR(self, RESOURCE, OPEN_READ, ("Permission denied by the xmem pool: %s", why),
				  ("%s", why));
		break;
	case xmem::Errc::bad_name:
		GST_ELEMENT_ERROR(self, RESOURCE, SETTINGS, ("Invalid pool-name: %s", why), ("%s", why));
		break;
	case xmem::Errc::not_a_pool:
	case xmem::Errc::bad_segment:
		GST_ELEMENT_ERROR(self, RESOURCE, OPEN_READ, ("Not an xmem pool: %s", why), ("%s", why));
		break;
	case xmem::Errc::version_mismatch:
		GST_ELEMENT_ERROR(self, RESOURCE, OPEN_READ, ("xmem protocol version mismatch: %s", why), ("%s", why));
		break;
	case xmem::Errc::timed_out:
		GST_ELEMENT_ERROR(self, RESOURCE, READ, ("Timed out waiting for the xmem pool: %s", why), ("%s", why));
		break;
	default:
		GST_ELEMENT_ERROR(self, RESOURCE, FAILED, ("xmem pool failure: %s", why), ("%s", why));
		break;
	}
}

/* Notes how the owner serves this consumer (SERVED: its stats now), for the stats property. */
void note_served(SrcState *s, const xmem::Result<xmem::ConsumerStats> &served)
{
	if (!served)
		return;
	s->served_policy.store(served->policy, std::memory_order_relaxed);
	s->served_queue.store(served->queue_size, std::memory_order_relaxed);
	s->lost.store(served->dropped, std::memory_order_relaxed);
	s->spilled.store(served->spilled, std::memory_order_relaxed);
	s->spin_ns.store(served->spin_ns, std::memory_order_relaxed);
	s->spins_caught.store(served->spins_caught, std::memory_order_relaxed);
	s->expired.store(served->expired, std::memory_order_relaxed);
	s->held.store(served->held, std::memory_order_relaxed);
	s->served_max_held.store(served->max_held, std::memory_order_relaxed);
}

/* Attaches, waiting up to `timeout` for the pool to appear (0: forever). Errors
 * other than "not there yet" end the wait at once. */
static GstFlowReturn attach(GstXmemSrc *self)
{
	SrcState *s = self->state;
	std::string name;
	guint64 timeout;
	bool reconnect;
	xmem::OpenOptions options;
	{
		std::lock_guard lock(s->lock);
		name = s->pool_name;
		timeout = s->timeout;
		reconnect = s->reconnect;
		options.queue_size = s->queue_size;
		if (s->policy != GST_XMEM_SRC_POLICY_POOL)
			options.policy = xmem::Policy(int(s->policy) - 1);
		options.fallback = xmem::Policy(s->fallback);
		options.block_timeout = std::chrono::nanoseconds(s->block_timeout);
		options.wake = xmem::Wake(s->wake_mode);
		options.spin_budget = std::chrono::microseconds(s->spin_budget);
		options.max_age = std::chrono::nanoseconds(s->max_age);
		options.max_held = s->max_held;
		options.history = s->history;
	}
	/* "program:element", so xmem-inspect tells gst-launch consumers apart. */
	const gchar *prg = g_get_prgname();
	options.client = std::string(prg ? prg : "gst") + ":" + GST_OBJECT_NAME(self);
	gint64 deadline = timeout ? g_get_monotonic_time() + gint64(timeout / 1000) : G_MAXINT64;
	bool said = false;
	for (;;) {
		/* Short tries, so unlock() is noticed; the core retries hang-ups within one. */
		gint64 left = deadline - g_get_monotonic_time();
		options.timeout = std::chrono::microseconds(std::clamp<gint64>(left, 0, 200000));
		auto pool = xmem::BufferPool::open(name, options);
		if (pool) {
			s->pool = pool.value();
			s->discont = true;
			s->last_seq = 0;
			note_served(s, s->pool->consumer_stats());
			GST_INFO_OBJECT(self, "attached to pool '%s' (%s)", name.c_str(), s->pool->path().c_str());
			return GST_FLOW_OK;
		}
		/* A dead owner's socket or none: a new owner may come. While reconnecting,
		 * an owner dying under the handshake looks like a peer that hangs up, and one
		 * stopped (SIGSTOP, a debugger) like a server that does not answer: with
		 * reconnect=true that is worth waiting for too, from the first attach on. */
		bool transient = pool.code() == xmem::Errc::not_found || pool.code() == xmem::Errc::closed ||
				 ((reconnect || s->reconnects > 0) && pool.code() == xmem::Errc::not_a_pool);
		if (!transient) {
			post_error(self, pool.error());
			return GST_FLOW_ERROR;
		}
		if (g_get_monotonic_time() >= deadline) {
			post_error(self, xmem::Error{ xmem::Errc::timed_out, pool.error().message });
			return GST_FLOW_ERROR;
		}
		if (!said) {
			GST_INFO_OBJECT(self, "waiting for pool '%s': %s", name.c_str(), pool.error().message.c_str());
			said = true;
		}
		if (!nap(s, 10))
			return GST_FLOW_FLUSHING;
	}
}

static gboolean gst_xmem_src_start(GstBaseSrc *src)
{
	auto *self = GST_XMEM_SRC(src);
	SrcState *s = self->state;
	std::string name;
	{
		std::lock_guard lock(s->lock);
		name = s->pool_name;
		gst_base_src_set_live(src, s->is_live);
	}
	auto path = xmem::socket_path(name);
	if (!path) {
		post_error(self, path.error());
		return FALSE;
	}
	if (!s->wake.open()) {
		GST_ELEMENT_ERROR(self, RESOURCE, FAILED, ("eventfd failed: %s", g_strerror(errno)),
				  ("%s", g_strerror(errno)));
		return FALSE;
	}
	s->flushing = false;
	s->format.clear();
	s->received = s->gaps = s->reconnects = s->zero_copy = s->copied = 0;
	gst_base_src_set_format(src, GST_FORMAT_TIME);
	return TRUE;
}

static gboolean gst_xmem_src_stop(GstBaseSrc *src)
{
	SrcState *s = GST_XMEM_SRC(src)->state;
	s->out_pool.reset();
	s->cuda.reset();
	s->pool.reset();
	s->wake.reset();
	std::lock_guard lock(s->lock);
	gst_caps_replace(&s->caps, nullptr);
	return TRUE;
}

static gboolean gst_xmem_src_unlock(GstBaseSrc *src)
{
	SrcState *s = GST_XMEM_SRC(src)->state;
	s->flushing = true;
	s->wake.signal();
	return TRUE;
}

static gboolean gst_xmem_src_unlock_stop(GstBaseSrc *src)
{
	SrcState *s = GST_XMEM_SRC(src)->state;
	s->flushing = false;
	s->wake.drain();
	return TRUE;
}

/* Caps are set in create() as soon as the pool is attached; until then there is
 * nothing to negotiate, and waiting here could not be interrupted cleanly. */
static gboolean gst_xmem_src_negotiate(GstBaseSrc *src)
{
	return negotiate_output(GST_XMEM_SRC(src));
}

static GstCaps *gst_xmem_src_get_caps(GstBaseSrc *src, GstCaps *filter)
{
	SrcState *s = GST_XMEM_SRC(src)->state;
	GstCaps *caps;
	{
		std::lock_guard lock(s->lock);
		/* Before the producer's caps are known, anything: a producer may publish
		 * other data than the raw video the template names. */
		caps = s->caps ? gst_caps_ref(s->caps) : gst_caps_new_any();
	}
	if (filter) {
		GstCaps *all = caps;
		caps = gst_caps_intersect_full(filter, all, GST_CAPS_INTERSECT_FIRST);
		gst_caps_unref(all);
	}
	return caps;
}

/* Drops a frame whose layout does not fit (WHY): counted in stats (frames-refused); a
 * warning on the bus the first time, in the debug log each time. The stream goes on. */
static void refuse_frame(GstXmemSrc *self, const std::string &why)
{
	SrcState *s = self->state;
	if (s->refused++ == 0)
		GST_ELEMENT_WARNING(self, STREAM, DECODE, ("Refused a frame whose layout does not fit its memory."),
				    ("pool '%s': %s (later ones are counted in stats, frames-refused)",
				     s->pool->name().c_str(), why.c_str()));
	else
		GST_WARNING_OBJECT(self, "refused frame: %s", why.c_str());
}

static bool capture_time_wanted(SrcState *s)
{
	std::lock_guard lock(s->lock);
	return s->add_reference_timestamp_meta;
}

static GstFlowReturn gst_xmem_src_create(GstPushSrc *psrc, GstBuffer **out)
{
	auto *self = GST_XMEM_SRC(psrc);
	SrcState *s = self->state;
	guint64 timeout;
	bool reconnect;
	{
		std::lock_guard lock(s->lock);
		timeout = s->timeout;
		reconnect = s->reconnect;
	}
	for (;;) {
		if (s->flushing.load())
			return GST_FLOW_FLUSHING;
		if (!s->pool) {
			GstFlowReturn ret = attach(self);
			if (ret != GST_FLOW_OK)
				return ret;
			if (s->reconnects > 0)
				GST_INFO_OBJECT(self, "reattached to pool '%s'", s->pool->name().c_str());
			/* Negotiate now, before the first frame arrives. */
			if (!apply_format(self, s->pool->format()))
				return GST_FLOW_NOT_NEGOTIATED;
		}

		gint64 deadline = timeout ? g_get_monotonic_time() + gint64(timeout / 1000) : G_MAXINT64;
		for (;;) {
			/* CUDA output: our stream waits (on the GPU) for the producer's writes. */
			xmem::CudaStream stream = s->out_cuda ? s->cuda.stream() : nullptr;
			auto frame = s->pool->receive(std::chrono::nanoseconds(0), stream);
			if (frame) {
				if (!apply_format(self, frame->format()))
					return GST_FLOW_NOT_NEGOTIATED;
				/* Before any path reads pixels: videoconvert, a CUDA copy, a
				 * wrapped slot all follow the planes. */
				if (std::string why; s->is_video && !planes_fit(s->info, frame->meta(), &why)) {
					refuse_frame(self, "frame " + std::to_string(frame->meta().seq) + ": " + why);
					continue;
				}
				xmem::Error error;
				auto metas = gst_xmem_metas_take(*s->pool, *frame, s->metas);
				const guint64 capture_time = frame->meta().capture_time;
				const guint64 timestamp = frame->meta().timestamp;
				*out = wrap_frame(self, std::move(frame.value()), &error);
				if (*out) {
					gst_xmem_metas_read(GST_ELEMENT(self), metas, *out, s->metas);
					if (capture_time_wanted(s))
						gst_xmem_add_capture_time(*out, capture_time, timestamp);
				}
				if (!*out) {
					GST_ELEMENT_ERROR(
						self, RESOURCE, READ,
						("Cannot copy the frame out of device memory: "
						 "pool '%s': %s",
						 s->pool->name().c_str(), error.message.c_str()),
						("pool '%s': %s", s->pool->name().c_str(), error.message.c_str()));
					return GST_FLOW_ERROR;
				}
				return GST_FLOW_OK;
			}
			if (frame.code() == xmem::Errc::bad_frame) {
				refuse_frame(self, frame.error().message);
				continue;
			}
			if (frame.code() == xmem::Errc::end_of_stream) {
				GST_INFO_OBJECT(self, "end of stream from pool '%s'", s->pool->name().c_str());
				return GST_FLOW_EOS;
			}
			if (frame.code() == xmem::Errc::closed) {
				if (!reconnect) {
					GST_ELEMENT_ERROR(self, RESOURCE, READ,
							  ("The xmem pool's producer went away: %s",
							   frame.error().message.c_str()),
							  ("%s", frame.error().message.c_str()));
					return GST_FLOW_ERROR;
				}
				GST_INFO_OBJECT(self, "producer of pool '%s' went away; waiting for a new one",
						s->pool->name().c_str());
				s->pool.reset();
				s->reconnects++;
				break;
			}
			if (frame.code() != xmem::Errc::timed_out) {
				post_error(self, frame.error());
				return GST_FLOW_ERROR;
			}
			gint64 now = g_get_monotonic_time();
			if (now >= deadline) {
				GST_ELEMENT_ERROR(self, RESOURCE, READ,
						  ("Timed out waiting for a frame: "
						   "no frame from pool '%s' within %" GST_TIME_FORMAT,
						   s->pool->name().c_str(), GST_TIME_ARGS(timeout)),
						  ("no frame from pool '%s' within %" GST_TIME_FORMAT,
						   s->pool->name().c_str(), GST_TIME_ARGS(timeout)));
				return GST_FLOW_ERROR;
			}
			int ms = deadline == G_MAXINT64
					 ? -1
					 : int(std::min<gint64>((deadline - now + 999) / 1000, G_MAXINT));
			/* The pool's fd polls readable on a frame, EOS or the owner's death. */
			if (!nap(s, ms, s->pool->fd()))
				return GST_FLOW_FLUSHING;
		}
	}
}

static gboolean gst_xmem_src_query(GstBaseSrc *src, GstQuery *query)
{
	auto *self = GST_XMEM_SRC(src);
	SrcState *s = self->state;
	if (GST_QUERY_TYPE(query) == GST_QUERY_CONTEXT && s->cuda.handle_context_query(query))
		return TRUE;
	if (GST_QUERY_TYPE(query) == GST_QUERY_LATENCY) {
		bool live;
		GstClockTime frame = 0;
		{
			std::lock_guard lock(s->lock);
			live = s->is_live;
			/* The offer's memories share one format: the first says the rate. */
			gint fps_n = 0, fps_d = 1;
			if (s->caps && !gst_caps_is_empty(s->caps) &&
			    gst_structure_get_fraction(gst_caps_get_structure(s->caps, 0), "framerate", &fps_n,
						       &fps_d) &&
			    fps_n > 0)
				frame = gst_util_uint64_scale_int(GST_SECOND, fps_d, fps_n);
		}
		/* Frames carry the producer's clock time and arrive microseconds later:
		 * one frame of latency covers that and the handoff jitter. */
		gst_query_set_latency(query, live, frame, GST_CLOCK_TIME_NONE);
		GST_DEBUG_OBJECT(self, "latency: live %d, min %" GST_TIME_FORMAT, live, GST_TIME_ARGS(frame));
		return TRUE;
	}
	return GST_BASE_SRC_CLASS(parent_class)->query(src, query);
}

static void gst_xmem_src_set_context(GstElement *element, GstContext *context)
{
	GST_XMEM_SRC(element)->state->cuda.set_context(context);
	GST_ELEMENT_CLASS(parent_class)->set_context(element, context);
}

static void gst_xmem_src_set_property(GObject *object, guint prop_id, const GValue *value, GParamSpec *pspec)
{
	SrcState *s = GST_XMEM_SRC(object)->state;
	std::lock_guard lock(s->lock);
	switch (prop_id) {
	case PROP_POOL_NAME:
		s->pool_name = gst_xmem_pool_name_from_value(value);
		break;
	case PROP_IS_LIVE:
		s->is_live = g_value_get_boolean(value);
		break;
	case PROP_TIMEOUT:
		s->timeout = g_value_get_uint64(value);
		break;
	case PROP_RECONNECT:
		s->reconnect = g_value_get_boolean(value);
		break;
	case PROP_QUEUE_SIZE:
		s->queue_size = g_value_get_uint(value);
		break;
	case PROP_POLICY:
		s->policy = GstXmemSrcPolicy(g_value_get_enum(value));
		break;
	case PROP_FALLBACK:
		s->fallback = xmem_policy(g_value_get_enum(value));
		break;
	case PROP_BLOCK_TIMEOUT:
		s->block_timeout = g_value_get_uint64(value);
		break;
	case PROP_WAKE:
		s->wake_mode = xmem_wake(g_value_get_enum(value));
		break;
	case PROP_SPIN_BUDGET:
		s->spin_budget = g_value_get_uint(value);
		break;
	case PROP_MAX_HELD:
		s->max_held = g_value_get_uint(value);
		break;
	case PROP_HISTORY:
		s->history = g_value_get_uint(value);
		break;
	case PROP_ADD_REFERENCE_TIMESTAMP_META:
		s->add_reference_timestamp_meta = g_value_get_boolean(value);
		break;
	case PROP_MAX_AGE:
		s->max_age = g_value_get_uint64(value);
		break;
	default:
		G_OBJECT_WARN_INVALID_PROPERTY_ID(object, prop_id, pspec);
		break;
	}
}

static GstStructure *make_stats(SrcState *s)
{
	GstStructure *stats = gst_structure_new(
		"application/x-xmem-src-stats", "received", G_TYPE_UINT64, s->received, "dropped", G_TYPE_UINT64,
		s->gaps, "reconnects", G_TYPE_UINT64, s->reconnects, "zero-copy", G_TYPE_UINT64, s->zero_copy, "copied",
		G_TYPE_UINT64, s->copied, "memory", G_TYPE_STRING, s->out_cuda ? "cuda" : "system", "frames-refused",
		G_TYPE_UINT64, s->refused, nullptr);
	guint policy = s->served_policy.load(std::memory_order_relaxed);
	const char *name = policy == G_MAXUINT ? "none" : xmem::policy_name(xmem::Policy(policy));
	gst_structure_set(stats, "policy", G_TYPE_STRING, name ? name : "invalid", "queue-size", G_TYPE_UINT,
			  s->served_queue.load(std::memory_order_relaxed), "lost", G_TYPE_UINT64,
			  s->lost.load(std::memory_order_relaxed), "spilled", G_TYPE_UINT64,
			  s->spilled.load(std::memory_order_relaxed), "spin-ns", G_TYPE_UINT64,
			  s->spin_ns.load(std::memory_order_relaxed), "spins-caught", G_TYPE_UINT64,
			  s->spins_caught.load(std::memory_order_relaxed), "expired", G_TYPE_UINT64,
			  s->expired.load(std::memory_order_relaxed), "held", G_TYPE_UINT,
			  s->held.load(std::memory_order_relaxed), "max-held", G_TYPE_UINT,
			  s->served_max_held.load(std::memory_order_relaxed), "copied-held", G_TYPE_UINT64,
			  s->copied_held.load(std::memory_order_relaxed), nullptr);
	gst_xmem_metas_add_stats(stats, s->metas, false);
	return stats;
}

static void gst_xmem_src_get_property(GObject *object, guint prop_id, GValue *value, GParamSpec *pspec)
{
	SrcState *s = GST_XMEM_SRC(object)->state;
	std::lock_guard lock(s->lock);
	switch (prop_id) {
	case PROP_POOL_NAME:
		g_value_set_string(value, s->pool_name.c_str());
		break;
	case PROP_IS_LIVE:
		g_value_set_boolean(value, s->is_live);
		break;
	case PROP_TIMEOUT:
		g_value_set_uint64(value, s->timeout);
		break;
	case PROP_RECONNECT:
		g_value_set_boolean(value, s->reconnect);
		break;
	case PROP_QUEUE_SIZE:
		g_value_set_uint(value, s->queue_size);
		break;
	case PROP_POLICY:
		g_value_set_enum(value, s->policy);
		break;
	case PROP_FALLBACK:
		g_value_set_enum(value, s->fallback);
		break;
	case PROP_BLOCK_TIMEOUT:
		g_value_set_uint64(value, s->block_timeout);
		break;
	case PROP_WAKE:
		g_value_set_enum(value, s->wake_mode);
		break;
	case PROP_SPIN_BUDGET:
		g_value_set_uint(value, s->spin_budget);
		break;
	case PROP_MAX_HELD:
		g_value_set_uint(value, s->max_held);
		break;
	case PROP_HISTORY:
		g_value_set_uint(value, s->history);
		break;
	case PROP_ADD_REFERENCE_TIMESTAMP_META:
		g_value_set_boolean(value, s->add_reference_timestamp_meta);
		break;
	case PROP_MAX_AGE:
		g_value_set_uint64(value, s->max_age);
		break;
	case PROP_STATS:
		/* Read racily from the streaming thread's counters: a snapshot. */
		g_value_take_boxed(value, make_stats(s));
		break;
	default:
		G_OBJECT_WARN_INVALID_PROPERTY_ID(object, prop_id, pspec);
		break;
	}
}

static void gst_xmem_src_finalize(GObject *object)
{
	gst_xmem_state_free(GST_XMEM_SRC(object)->state);
	G_OBJECT_CLASS(parent_class)->finalize(object);
}

static void gst_xmem_src_init(GstXmemSrc *self)
{
	self->state = gst_xmem_state_new<SrcState>("xmemsrc", GST_ELEMENT(self));
	gst_base_src_set_live(GST_BASE_SRC(self), DEFAULT_IS_LIVE);
	gst_base_src_set_format(GST_BASE_SRC(self), GST_FORMAT_TIME);
}

static void gst_xmem_src_class_init(GstXmemSrcClass *klass)
{
	GObjectClass *gobject = G_OBJECT_CLASS(klass);
	GstElementClass *element = GST_ELEMENT_CLASS(klass);
	GstBaseSrcClass *basesrc = GST_BASE_SRC_CLASS(klass);
	GstPushSrcClass *pushsrc = GST_PUSH_SRC_CLASS(klass);

	/* Producers' caps name GstVideo's flag-set types (nvh264dec's carry
	 * multiview-flags=(GstVideoMultiviewFlagsSet)...), and gst_caps_from_string() parses
	 * a typed value only once its type is registered: a consumer pipeline with no other
	 * video element may not have done that yet. */
	g_type_ensure(GST_TYPE_VIDEO_MULTIVIEW_FLAGSET);
	g_type_ensure(GST_TYPE_VIDEO_MULTIVIEW_FLAGS);
	g_type_ensure(GST_TYPE_VIDEO_MULTIVIEW_MODE);

	/* Each callback that runs C++ code goes through GST_XMEM_NO_THROW: no exception
	 * may unwind into GStreamer (gstxmemnothrow.h). */
	gobject->set_property = GST_XMEM_NO_THROW(gst_xmem_src_set_property);
	gobject->get_property = GST_XMEM_NO_THROW(gst_xmem_src_get_property);
	gobject->finalize = gst_xmem_src_finalize;

	auto flags = GST_XMEM_PARAM_FLAGS;
	gst_xmem_install_pool_name(gobject, PROP_POOL_NAME);
	g_object_class_install_property(gobject, PROP_IS_LIVE,
					g_param_spec_boolean("is-live", "Is live",
							     "Act as a live source: timestamps from the producer's "
							     "clock time (monotonic system clock)",
							     DEFAULT_IS_LIVE, flags));
	g_object_class_install_property(
		gobject, PROP_TIMEOUT,
		g_param_spec_uint64("timeout", "Timeout",
				    "How long (ns) to wait for the pool to appear, or for the next frame, before "
				    "posting an error (0 = forever)",
				    0, G_MAXUINT64, DEFAULT_TIMEOUT, flags));
	g_object_class_install_property(
		gobject, PROP_RECONNECT,
		g_param_spec_boolean("reconnect", "Reconnect",
				     "When the producer goes away or is killed (EOS aside), wait "
				     "for a new owner of the same name and continue",
				     DEFAULT_RECONNECT, flags));
	g_object_class_install_property(
		gobject, PROP_QUEUE_SIZE,
		g_param_spec_uint("queue-size", "Queue size",
				  "Frames this consumer may have queued in the pool (0: its policy's default: 4, 1 "
				  "for latest, the whole ring for fifo-spill)",
				  0, XMEM_MAX_SLOTS + 4096, DEFAULT_QUEUE_SIZE, flags));
	g_object_class_install_property(gobject, PROP_POLICY,
					g_param_spec_enum("policy", "Policy",
							  "How the producer serves this consumer (pool: the pool's "
							  "policy); it never changes what other consumers receive",
							  gst_xmem_src_policy_get_type(), GST_XMEM_SRC_POLICY_POOL,
							  flags));
	g_object_class_install_property(
		gobject, PROP_FALLBACK,
		g_param_spec_enum("fallback", "Fallback",
				  "policy=fifo or fifo-spill: what a full queue does once the "
				  "producer has waited block-timeout, or the spill tier is full",
				  gst_xmem_src_fallback_get_type(), XMEM_POLICY_DROP_OLDEST, flags));
	g_object_class_install_property(
		gobject, PROP_BLOCK_TIMEOUT,
		g_param_spec_uint64("block-timeout", "Block timeout",
				    "policy=fifo: how long (ns) the producer waits for room in this consumer's "
				    "queue (0: the pool's block-timeout)",
				    0, G_MAXINT64, 0, flags));
	g_object_class_install_property(gobject, PROP_WAKE,
					g_param_spec_enum("wake", "Wake",
							  "How this consumer waits for the next frame: sleep, or "
							  "spin-before (lower latency for some CPU: stats spin-ns)",
							  gst_xmem_src_wake_get_type(), XMEM_WAKE_SLEEP, flags));
	g_object_class_install_property(gobject, PROP_SPIN_BUDGET,
					g_param_spec_uint("spin-budget", "Spin budget",
							  "wake=spin-before: most microseconds spun per frame", 1,
							  1000000, 200, flags));
	g_object_class_install_property(
		gobject, PROP_MAX_AGE,
		g_param_spec_uint64("max-age", "Maximum age",
				    "Frames older than this (ns, by their producer's timestamp) when they would "
				    "be pushed are given back unread and counted (stats expired), with every "
				    "policy: a lagging consumer never works on stale frames (0: no limit)",
				    0, G_MAXUINT32 * G_GUINT64_CONSTANT(1000), 0, flags));
	g_object_class_install_property(
		gobject, PROP_MAX_HELD,
		g_param_spec_uint("max-held", "Maximum held",
				  "The most slots this consumer holds at once, queued or pushed downstream and "
				  "not yet let go (0: half the pool's slots, at least its queue size and one). "
				  "Near it, frames are copied out "
				  "of their slot into ordinary memory (system, or CUDA for a device pool) and "
				  "the slot goes back at once (stats copied-held): a pipeline that keeps frames "
				  "still gets each one, and costs the other consumers none of their slots",
				  0, G_MAXUINT, 0, flags));
	g_object_class_install_property(
		gobject, PROP_HISTORY,
		g_param_spec_uint("history", "History",
				  "On attaching, first push up to this many of the newest frames published "
				  "before, while they are still in the pool (oldest first), then the live "
				  "stream; at most the queue size (0: the live stream only)",
				  0, G_MAXUINT, 0, flags));
	g_object_class_install_property(
		gobject, PROP_ADD_REFERENCE_TIMESTAMP_META,
		g_param_spec_boolean("add-reference-timestamp-meta", "Add reference timestamp meta",
				     "Add each frame's capture time (its producer's timestamp) as a "
				     "GstReferenceTimestampMeta timestamp/x-ntp on this host's realtime clock, "
				     "unless the frame carries one already: RTP's RFC 6051 header extension "
				     "(extmap ntp-64) takes it to another host (pipelines/bridge-send.sh)",
				     FALSE, flags));
	gst_xmem_install_stats(gobject, PROP_STATS,
			       "This consumer's counters: received, dropped, reconnects, zero-copy (frames "
			       "pushed as the shared slot itself), copied, memory, frames-refused; and how the "
			       "producer serves it: policy, queue-size, lost (frames its policy dropped), "
			       "spilled (its frames moved to the spill tier), expired (frames older than "
			       "max-age, given back unread), held and max-held (the slots it holds now, "
			       "taken and not let go, and its cap), copied-held (frames copied out of their "
			       "slot near the cap). Details: zero-copy (frames "
			       "pushed as the shared slot itself), copied (frames of a device pool copied "
			       "into CUDA or system memory), memory (what goes downstream: cuda, system)");

	gst_element_class_add_static_pad_template(element, &src_template);
	gst_element_class_set_static_metadata(
		element, "xmem source", "Source/Video/Network",
		"Attaches to a named pool of shared, reference-counted buffers (xmemsink) and pushes its frames "
		"without copying; caps come from the producer.\n"
		"Example: gst-launch-1.0 xmemsrc pool-name=cam0 ! videoconvert ! autovideosink",
		"xmem developers");

	basesrc->start = GST_XMEM_NO_THROW(gst_xmem_src_start);
	basesrc->stop = GST_XMEM_NO_THROW(gst_xmem_src_stop);
	basesrc->unlock = GST_DEBUG_FUNCPTR(gst_xmem_src_unlock);
	basesrc->unlock_stop = GST_DEBUG_FUNCPTR(gst_xmem_src_unlock_stop);
	basesrc->negotiate = GST_XMEM_NO_THROW(gst_xmem_src_negotiate);
	basesrc->get_caps = GST_XMEM_NO_THROW(gst_xmem_src_get_caps);
	basesrc->query = GST_XMEM_NO_THROW(gst_xmem_src_query);
	element->set_context = GST_XMEM_NO_THROW(gst_xmem_src_set_context);
	pushsrc->create = GST_XMEM_NO_THROW(gst_xmem_src_create);
}
