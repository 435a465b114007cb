/* gstxmemsinkrender.cpp - xmemsink's render path: the wait for consumers, then each
 * buffer into a slot (in place, copied, uploaded, device to device or downloaded), published. */
#include "gstxmemsinkprivate.h"

#include "gstxmemmemory.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>
#include <utility>

#define GST_CAT_DEFAULT gst_xmem_sink_debug

/* Upstream buffers kept for device copies still in flight before the sink waits. */
#define MAX_HELD_INPUT 4

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
	m.capture_time = gst_xmem_capture_time_of(buffer);
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
	GST_ELEMENT_ERROR(self, STREAM, FAILED, ("%s: %s", what, error.message.c_str()), ("%s", error.message.c_str()));
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
		return copy_error(self, "Cannot copy the frame into device memory", copied.error());
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
		*ret = copy_error(self, "Cannot copy the frame out of device memory", copied.error());
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

GstFlowReturn gst_xmem_sink_render(GstBaseSink *sink, GstBuffer *buffer)
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
		GST_ELEMENT_ERROR(self, STREAM, FAILED,
				  ("Cannot copy the frame into the pool: "
				   "the buffer does not match the negotiated caps"),
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
