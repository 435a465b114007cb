/* gstxmemsrcbuffer.cpp - xmemsrc's received frames as buffers: their planes checked
 * against the caps, then the slot itself, or a copy into CUDA or system memory. */
#include "gstxmemsrcprivate.h"

#include "gstxmemmemory.h"

#include <algorithm>
#include <mutex>
#include <utility>

#define GST_CAT_DEFAULT gst_xmem_src_debug

/* The bytes of one row of plane P of FINFO, WIDTH pixels wide, and its rows in a
 * picture (or field) HEIGHT rows high: from the plane's components, each up to its
 * last sample's last byte. 0 where the components do not say it (a palette plane, or
 * a format packed across pixel groups): the caller uses the format's default layout. */
static void plane_extent(const GstVideoFormatInfo *finfo, guint p, guint width, guint height, guint64 *row_bytes,
			 guint64 *rows)
{
	*row_bytes = 0;
	*rows = 0;
	for (guint c = 0; c < GST_VIDEO_FORMAT_INFO_N_COMPONENTS(finfo); c++) {
		if (GST_VIDEO_FORMAT_INFO_PLANE(finfo, c) != p)
			continue;
		gint pstride = GST_VIDEO_FORMAT_INFO_PSTRIDE(finfo, c);
		if (pstride <= 0) {
			*row_bytes = 0;
			*rows = 0;
			return;
		}
		guint64 samples = guint64(GST_VIDEO_FORMAT_INFO_SCALE_WIDTH(finfo, c, width));
		guint64 bytes =
			(guint64(GST_VIDEO_FORMAT_INFO_SHIFT(finfo, c)) + GST_VIDEO_FORMAT_INFO_DEPTH(finfo, c) + 7) /
			8;
		guint64 end = samples ? guint64(GST_VIDEO_FORMAT_INFO_POFFSET(finfo, c)) +
						guint64(pstride) * (samples - 1) + std::max<guint64>(bytes, 1)
				      : 0;
		*row_bytes = std::max(*row_bytes, end);
		*rows = std::max<guint64>(*rows, guint64(GST_VIDEO_FORMAT_INFO_SCALE_HEIGHT(finfo, c, height)));
	}
}

/* Whether frame M's planes, read as INFO (its caps) describes them, stay within its
 * payload. Another process wrote the layout; the library checked the rest (the size
 * within the slot, each plane starting within the payload, strides a gint holds), and
 * the caps' format says how many rows of how many bytes each plane has. WHY says what
 * does not fit. */
bool planes_fit(const GstVideoInfo &info, const xmem::FrameMeta &m, std::string *why)
{
	guint n = GST_VIDEO_INFO_N_PLANES(&info);
	const GstVideoFormatInfo *finfo = info.finfo;
	auto too_small = [&](const char *what, guint64 need) {
		*why = std::string(what) + " needs " + std::to_string(need) + " bytes, the frame has " +
		       std::to_string(m.size);
		return false;
	};
	/* No planes: downstream reads the caps' default layout. */
	if (m.n_planes == 0)
		return m.size >= info.size || too_small("the caps' default layout", info.size);
	if (m.n_planes != n) {
		*why = "the frame has " + std::to_string(m.n_planes) + " planes, its caps' format " +
		       GST_VIDEO_INFO_NAME(&info) + " has " + std::to_string(n);
		return false;
	}
	bool tiled = GST_VIDEO_FORMAT_INFO_IS_TILED(finfo);
	for (guint p = 0; p < n; p++) {
		guint64 row_bytes, rows;
		plane_extent(finfo, p, GST_VIDEO_INFO_WIDTH(&info), GST_VIDEO_INFO_FIELD_HEIGHT(&info), &row_bytes,
			     &rows);
		guint64 end;
		if (tiled || row_bytes == 0) {
			/* Tiles, palettes, pixel groups: the default layout of the caps, as is. */
			if (m.plane_offset[p] != info.offset[p] || gint(m.plane_stride[p]) != info.stride[p]) {
				*why = "plane " + std::to_string(p) + " of " + GST_VIDEO_INFO_NAME(&info) +
				       " is not in the caps' default layout";
				return false;
			}
			end = p + 1 < n ? info.offset[p + 1] : info.size;
		} else {
			if (m.plane_stride[p] < row_bytes) {
				*why = "plane " + std::to_string(p) + "'s rows of " + std::to_string(row_bytes) +
				       " bytes overlap (stride " + std::to_string(m.plane_stride[p]) + ")";
				return false;
			}
			/* A row is read up to its last sample (videoconvert), or as the caps'
			 * default stride says within the frame's (the CUDA copies). */
			row_bytes = std::max(row_bytes, std::min(guint64(info.stride[p]), guint64(m.plane_stride[p])));
			end = m.plane_offset[p] + guint64(m.plane_stride[p]) * (rows - 1) + row_bytes;
		}
		if (end > m.size) {
			*why = "plane " + std::to_string(p) + " (at byte " + std::to_string(m.plane_offset[p]) +
			       ", stride " + std::to_string(m.plane_stride[p]) + ", " + std::to_string(rows) +
			       " rows of " + std::to_string(row_bytes) + " bytes) ends at byte " + std::to_string(end) +
			       " of a " + std::to_string(m.size) + "-byte frame";
			return false;
		}
	}
	return true;
}

/* The planes of a device frame: its metadata's, or the caps' default layout (INFO)
 * for a frame that has none (planes_fit() checked either against the frame). */
static GstXmemPlanes frame_planes(const xmem::BufferGuard &frame, const GstVideoInfo &info)
{
	const xmem::FrameMeta &m = frame.meta();
	GstXmemPlanes planes;
	planes.device = frame.storage() == xmem::Storage::cuda;
	planes.base = planes.device ? frame.device_ptr() : guint64(uintptr_t(frame.data().data()));
	planes.n_planes =
		m.n_planes ? std::min<guint>(m.n_planes, GST_VIDEO_MAX_PLANES) : GST_VIDEO_INFO_N_PLANES(&info);
	for (guint p = 0; p < planes.n_planes; p++) {
		planes.offset[p] = m.n_planes ? m.plane_offset[p] : info.offset[p];
		planes.stride[p] = m.n_planes ? gint(m.plane_stride[p]) : info.stride[p];
	}
	return planes;
}

/* GStreamer 1.24 and later: the device slot itself as CUDA memory, in the slot's own
 * layout, complete when pushed (GstXmemCuda::wrap waits for our stream, which waited
 * on the GPU for the producer's writes). */
static GstBuffer *wrap_cuda_memory(GstXmemSrc *self, xmem::BufferGuard &&frame, xmem::Error *error)
{
	SrcState *s = self->state;
	const xmem::FrameMeta m = frame.meta();
	GstVideoInfo layout = s->info;
	GstXmemPlanes planes = frame_planes(frame, s->info);
	gsize offset[GST_VIDEO_MAX_PLANES] = {};
	gint stride[GST_VIDEO_MAX_PLANES] = {};
	for (guint p = 0; p < planes.n_planes; p++) {
		layout.offset[p] = offset[p] = planes.offset[p];
		layout.stride[p] = stride[p] = planes.stride[p];
	}
	layout.size = gsize(m.size ? m.size : frame.capacity());
	GstMemory *mem = s->cuda.wrap(std::move(frame), layout);
	if (!mem) {
		*error = { xmem::Errc::system, "GStreamer could not wrap the device slot as CUDA memory" };
		return nullptr;
	}
	GstBuffer *buf = gst_buffer_new();
	gst_buffer_append_memory(buf, mem);
	gst_buffer_add_video_meta_full(buf, GST_VIDEO_FRAME_FLAG_NONE, GST_VIDEO_INFO_FORMAT(&s->info),
				       GST_VIDEO_INFO_WIDTH(&s->info), GST_VIDEO_INFO_HEIGHT(&s->info), planes.n_planes,
				       offset, stride);
	return buf;
}

/* A device frame as CUDA memory: one device-to-device copy on our stream, which
 * first waited (on the GPU) for the producer's writes. GStreamer 1.22's CUDA memory
 * carries no stream, so the copy is complete before the buffer goes downstream. */
static GstBuffer *copy_to_cuda_memory(GstXmemSrc *self, xmem::BufferGuard &&frame, xmem::Error *error)
{
	SrcState *s = self->state;
	if (!s->out_pool) {
		/* GStreamer 1.24 and later wrap device slots and need no pool of their own: one is
		 * made for the first frame of system memory (a pool of mixed memories). */
		g_autoptr(GstCaps) caps = gst_pad_get_current_caps(GST_BASE_SRC_PAD(self));
		if (caps)
			s->out_pool.reset(s->cuda.new_buffer_pool(caps, guint(s->info.size)));
	}
	g_autoptr(GstBuffer) buf = nullptr;
	if (!s->out_pool || gst_buffer_pool_acquire_buffer(s->out_pool.get(), &buf, nullptr) != GST_FLOW_OK) {
		*error = { xmem::Errc::no_memory, "no buffer from the CUDA buffer pool" };
		return nullptr;
	}
	GstMemory *mem = gst_buffer_peek_memory(buf, 0);
	GstVideoInfo layout;
	GstMapInfo map;
	if (!GstXmemCuda::memory_layout(mem, &layout) || !GstXmemCuda::map_device(mem, &map, GST_MAP_WRITE)) {
		*error = { xmem::Errc::invalid_argument, "cannot map the CUDA buffer for writing" };
		return nullptr;
	}
	GstXmemPlanes dst;
	dst.base = guint64(uintptr_t(map.data));
	dst.device = true;
	dst.n_planes = GST_VIDEO_INFO_N_PLANES(&layout);
	for (guint p = 0; p < dst.n_planes; p++) {
		dst.offset[p] = layout.offset[p];
		dst.stride[p] = layout.stride[p];
	}
	/* A device frame's own device; a system frame (of a pool of mixed memories) is
	 * uploaded on our context's. */
	guint device = frame.storage() == xmem::Storage::cuda ? frame.device() : guint(s->cuda.device());
	xmem::CudaStream stream = s->cuda.stream();
	auto r = gst_xmem_copy_planes(s->info, dst, frame_planes(frame, s->info), device, stream);
	/* The slot is the producer's again once our copy has read it (on the GPU). */
	auto released = frame.release(stream);
	auto synced = xmem::cuda_synchronize(device, stream);
	gst_memory_unmap(mem, &map);
	for (auto *step : { &r, &released, &synced }) {
		if (!*step) {
			*error = step->error();
			return nullptr;
		}
	}
	return std::exchange(buf, nullptr);
}

/* A device frame in system memory: one download, in the caps' default layout. */
static GstBuffer *copy_to_system_memory(GstXmemSrc *self, xmem::BufferGuard &&frame, xmem::Error *error)
{
	SrcState *s = self->state;
	const xmem::FrameMeta &m = frame.meta();
	gsize size = s->is_video ? s->info.size : m.size;
	g_autoptr(GstBuffer) buf = gst_buffer_new_allocate(nullptr, size, nullptr);
	GstMapInfo map;
	if (!buf || !gst_buffer_map(buf, &map, GST_MAP_WRITE)) {
		*error = { xmem::Errc::no_memory, "cannot allocate a frame of " + std::to_string(size) + " bytes" };
		return nullptr;
	}
	guint64 host = guint64(uintptr_t(map.data));
	xmem::Result<void> r;
	if (s->is_video) {
		GstXmemPlanes dst;
		dst.base = host;
		dst.n_planes = GST_VIDEO_INFO_N_PLANES(&s->info);
		for (guint p = 0; p < dst.n_planes; p++) {
			dst.offset[p] = s->info.offset[p];
			dst.stride[p] = s->info.stride[p];
		}
		r = gst_xmem_copy_planes(s->info, dst, frame_planes(frame, s->info), frame.device(), nullptr);
	} else {
		r = xmem::cuda_copy_2d({ host, size, false }, { frame.device_ptr(), size, true }, size, 1,
				       frame.device());
	}
	gst_buffer_unmap(buf, &map);
	if (!r) {
		*error = r.error();
		return nullptr;
	}
	return std::exchange(buf, nullptr);
}

/* Whether this consumer, holding what SERVED says (the frame just taken included), holds
 * so many slots that the frame should leave its own at once: the owner queues nothing to
 * a consumer at its cap (max-held), so one slot of the cap stays free for the next frame
 * while this one is copied (where the cap has room for that). */
static bool near_cap(GstXmemSrc *self, const xmem::Result<xmem::ConsumerStats> &served)
{
	SrcState *s = self->state;
	if (!served || served->max_held == 0)
		return false;
	guint spare = served->max_held >= 3 ? 1 : 0;
	if (served->held + spare < served->max_held)
		return false;
	if (!s->said_cap) {
		s->said_cap = true;
		GST_WARNING_OBJECT(self,
				   "pool '%s': this consumer holds %u slots, its cap (max-held) is %u: frames are "
				   "copied out of their slots while it holds that many (stats copied-held)",
				   s->pool->name().c_str(), served->held, served->max_held);
	}
	return true;
}

/* A frame of system memory, copied whole into a buffer of its own: its planes stay where
 * its metadata says. The slot goes back when FRAME does (at the caller's return). */
static GstBuffer *copy_system_frame(const xmem::BufferGuard &frame, gsize size, xmem::Error *error)
{
	std::span<const std::byte> data = frame.data();
	if (data.size() < size) {
		*error = { xmem::Errc::bad_frame, "frame of " + std::to_string(size) + " bytes in a " +
							  std::to_string(data.size()) + "-byte slot" };
		return nullptr;
	}
	GstBuffer *buf = gst_buffer_new_memdup(data.data(), size);
	if (!buf)
		*error = { xmem::Errc::no_memory, "cannot allocate a frame of " + std::to_string(size) + " bytes" };
	return buf;
}

GstBuffer *wrap_frame(GstXmemSrc *self, xmem::BufferGuard &&frame, xmem::Error *error)
{
	SrcState *s = self->state;
	xmem::FrameMeta m = frame.meta();
	GstBuffer *buf;
	bool device_frame = frame.storage() == xmem::Storage::cuda;
	/* Negotiated to CUDA memory, a frame of system memory (a pool of mixed memories
	 * may hold both) is uploaded: CUDA caps never carry system memory. */
	bool own_layout = device_frame || s->out_cuda;
	bool wraps = (device_frame && s->out_cuda && GstXmemCuda::can_wrap()) || !own_layout;
	/* Once a frame: what the cap decides, and the stats property (as of the take). */
	auto served = s->pool->consumer_stats();
	if (wraps && near_cap(self, served)) {
		buf = device_frame ? copy_to_cuda_memory(self, std::move(frame), error)
				   : copy_system_frame(frame, gsize(m.size), error);
		if (!buf)
			return nullptr;
		s->copied++;
		s->copied_held.fetch_add(1, std::memory_order_relaxed);
	} else if (device_frame && s->out_cuda && GstXmemCuda::can_wrap()) {
		if (!(buf = wrap_cuda_memory(self, std::move(frame), error)))
			return nullptr;
		s->zero_copy++;
	} else if (own_layout) {
		buf = s->out_cuda ? copy_to_cuda_memory(self, std::move(frame), error)
				  : copy_to_system_memory(self, std::move(frame), error);
		if (!buf)
			return nullptr;
		s->copied++;
	} else {
		/* Writers get the slot in place when nobody else holds the frame by the
		 * time they map it, a copy otherwise (see gst_xmem_memory_wrap). */
		buf = gst_buffer_new();
		gst_buffer_append_memory(buf, gst_xmem_memory_wrap(std::move(frame), m.size, true));
		s->zero_copy++;
	}

	/* A device frame carries its own layout: the copy's memory's (the caps' default,
	 * or the CUDA buffer pool's), or the wrapped slot's, set above. */
	if (!own_layout && s->is_video && m.n_planes > 0 && m.n_planes == GST_VIDEO_INFO_N_PLANES(&s->info)) {
		gsize offset[GST_VIDEO_MAX_PLANES] = {};
		gint stride[GST_VIDEO_MAX_PLANES] = {};
		for (guint p = 0; p < m.n_planes; p++) {
			offset[p] = m.plane_offset[p];
			stride[p] = gint(m.plane_stride[p]);
		}
		gst_buffer_add_video_meta_full(buf, GST_VIDEO_FRAME_FLAG_NONE, GST_VIDEO_INFO_FORMAT(&s->info),
					       GST_VIDEO_INFO_WIDTH(&s->info), GST_VIDEO_INFO_HEIGHT(&s->info),
					       m.n_planes, offset, stride);
	}

	GST_BUFFER_FLAGS(buf) = m.flags & ~guint(GST_BUFFER_FLAG_TAG_MEMORY | GST_BUFFER_FLAG_DISCONT);
	if (s->discont || (s->last_seq && m.seq != s->last_seq + 1)) {
		GST_BUFFER_FLAG_SET(buf, GST_BUFFER_FLAG_DISCONT);
		if (s->last_seq && m.seq > s->last_seq + 1)
			s->gaps += m.seq - s->last_seq - 1;
	}
	s->discont = false;
	s->last_seq = m.seq;
	GST_BUFFER_OFFSET(buf) = m.seq;
	GST_BUFFER_DURATION(buf) = m.duration;

	bool live;
	{
		std::lock_guard lock(s->lock);
		live = s->is_live;
	}
	if (live) {
		/* The producer published the frame's clock time on the monotonic system
		 * clock; in our pipeline that is base time + running time. */
		g_autoptr(GstClock) clock = gst_element_get_clock(GST_ELEMENT(self));
		GstClockTime base = gst_element_get_base_time(GST_ELEMENT(self));
		GstClockTime pts = GST_CLOCK_TIME_NONE;
		if (clock && m.timestamp != 0)
			pts = m.timestamp > base ? m.timestamp - base : 0;
		GST_BUFFER_PTS(buf) = pts;
		GST_BUFFER_DTS(buf) = GST_CLOCK_TIME_NONE;
	} else {
		GST_BUFFER_PTS(buf) = m.pts;
		GST_BUFFER_DTS(buf) = m.dts;
	}
	s->received++;
	note_served(s, served);
	return buf;
}
