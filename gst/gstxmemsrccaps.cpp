/* gstxmemsrccaps.cpp - xmemsrc's negotiation: the producer's format offered downstream
 * in CUDA or system memory, the caps chosen, and the CUDA buffer pool for them. */
#include "gstxmemsrcprivate.h"

#include <mutex>
#include <utility>

#define GST_CAT_DEFAULT gst_xmem_src_debug

/* What a frame of CAPS can go downstream as: for raw video from a device pool, CUDA
 * memory first (when this build can make it), then system memory. */
static GstCaps *offer_for(GstXmemSrc *self, GstCaps *caps, bool video)
{
	SrcState *s = self->state;
	GstCaps *offer = gst_caps_copy(caps);
	if (video && s->pool && s->pool->storage() == xmem::Storage::cuda && gst_xmem_have_gst_cuda()) {
		GstCaps *cuda = gst_caps_copy(caps);
		gst_caps_set_features(cuda, 0, gst_caps_features_new(GST_XMEM_CAPS_FEATURE_CUDA, nullptr));
		offer = gst_caps_merge(cuda, offer);
	}
	return offer;
}

/* The first of OFFER downstream takes; CUDA memory needs a CUDA context on the pool's
 * device, without which system memory is the answer. Transfer full; nullptr if none. */
static GstCaps *choose_caps(GstXmemSrc *self, GstCaps *offer)
{
	SrcState *s = self->state;
	g_autoptr(GstCaps) peer = gst_pad_peer_query_caps(GST_BASE_SRC_PAD(self), offer);
	for (guint i = 0; peer && i < gst_caps_get_size(peer); i++) {
		/* Downstream's order of preference, in our caps' own words. */
		g_autoptr(GstCaps) theirs = gst_caps_copy_nth(peer, i);
		g_autoptr(GstCaps) ours = gst_caps_intersect_full(offer, theirs, GST_CAPS_INTERSECT_FIRST);
		if (gst_caps_is_empty(ours))
			continue;
		g_autoptr(GstCaps) one = gst_caps_fixate(gst_caps_copy_nth(ours, 0));
		std::string why;
		if (!gst_xmem_caps_is_cuda(one) || s->cuda.ensure(gint(s->device), &why))
			return std::exchange(one, nullptr);
		GST_WARNING_OBJECT(self, "no CUDA memory output: %s", why.c_str());
	}
	return nullptr;
}

/* Sets caps from a format string; false (with an error posted) when unusable. */
bool apply_format(GstXmemSrc *self, const std::string &format)
{
	SrcState *s = self->state;
	/* A restarted producer may keep the format and change the memory. */
	xmem::Storage storage = s->pool ? s->pool->storage() : xmem::Storage::system;
	guint device = s->pool ? s->pool->device() : 0;
	if (format == s->format && s->caps && storage == s->storage && device == s->device)
		return true;
	g_autoptr(GstCaps) caps = format.empty() ? nullptr : gst_caps_from_string(format.c_str());
	if (!caps || !gst_caps_is_fixed(caps)) {
		GST_ELEMENT_ERROR(self, STREAM, FORMAT,
				  ("The producer's caps are unusable: "
				   "pool '%s' publishes format \"%s\" (%s)",
				   s->pool->name().c_str(), format.c_str(),
				   caps ? "not fixed caps" : "GStreamer cannot parse it here"),
				  ("pool '%s' publishes format \"%s\" (%s)", s->pool->name().c_str(), format.c_str(),
				   caps ? "not fixed caps" : "GStreamer cannot parse it here"));
		return false;
	}
	GST_INFO_OBJECT(self, "producer caps %" GST_PTR_FORMAT, static_cast<gpointer>(caps));
	s->is_video = gst_video_info_from_caps(&s->info, caps);
	s->storage = storage;
	s->device = device;
	g_autoptr(GstCaps) offer = offer_for(self, caps, s->is_video);
	{
		std::lock_guard lock(s->lock);
		gst_caps_replace(&s->caps, offer);
	}
	s->format = format;
	return negotiate_output(self);
}

/* Chooses the output caps from the offer (again after a reconfigure), and the CUDA
 * buffer pool for CUDA output. Streaming thread. */
bool negotiate_output(GstXmemSrc *self)
{
	SrcState *s = self->state;
	g_autoptr(GstCaps) offer = nullptr;
	{
		std::lock_guard lock(s->lock);
		offer = s->caps ? gst_caps_ref(s->caps) : nullptr;
	}
	if (!offer)
		return true;
	s->out_pool.reset();
	s->out_cuda = false;
	g_autoptr(GstCaps) chosen = choose_caps(self, offer);
	if (!chosen || !gst_base_src_set_caps(GST_BASE_SRC(self), chosen)) {
		GST_ELEMENT_ERROR(self, CORE, NEGOTIATION,
				  ("Downstream refused the producer's caps: "
				   "format \"%s\"",
				   s->format.c_str()),
				  ("format \"%s\"", s->format.c_str()));
		return false;
	}
	GST_INFO_OBJECT(self, "output caps %" GST_PTR_FORMAT, static_cast<gpointer>(chosen));
	s->out_cuda = gst_xmem_caps_is_cuda(chosen);
	if (s->out_cuda && !GstXmemCuda::can_wrap())
		s->out_pool.reset(s->cuda.new_buffer_pool(chosen, guint(s->info.size)));
	if (s->out_cuda && !GstXmemCuda::can_wrap() && !s->out_pool) {
		GST_ELEMENT_ERROR(self, RESOURCE, FAILED,
				  ("Cannot allocate CUDA memory: "
				   "no CUDA buffer pool for format \"%s\"",
				   s->format.c_str()),
				  ("no CUDA buffer pool for format \"%s\"", s->format.c_str()));
		return false;
	}
	return true;
}
