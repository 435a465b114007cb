/* gstxmemmeta.cpp - GstMetas to and from a frame's side data (gstxmemmeta.h gives the
 * encoding): by hand for the metas video analytics needs, gst_meta_serialize() for the rest. */
#include "gstxmemmeta.h"

#include <ctime>

#include <gst/video/video.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <string>
#include <string_view>

GST_DEBUG_CATEGORY_STATIC(gst_xmem_meta_debug);
#define GST_CAT_DEFAULT gst_xmem_meta_debug

namespace {

/* Little-endian fields at any byte offset. Not GStreamer's GST_WRITE_UINT32_LE and
 * friends: on x86 they store through a misaligned pointer, which is undefined
 * behaviour (UndefinedBehaviorSanitizer says so) however well the CPU takes it. */
void write_le32(guint8 *p, guint32 v)
{
	v = GUINT32_TO_LE(v);
	std::memcpy(p, &v, sizeof(v));
}

void write_le64(guint8 *p, guint64 v)
{
	v = GUINT64_TO_LE(v);
	std::memcpy(p, &v, sizeof(v));
}

guint32 read_le32(const guint8 *p)
{
	guint32 v;
	std::memcpy(&v, p, sizeof(v));
	return GUINT32_FROM_LE(v);
}

guint64 read_le64(const guint8 *p)
{
	guint64 v;
	std::memcpy(&v, p, sizeof(v));
	return GUINT64_FROM_LE(v);
}

void init_debug()
{
	static gsize done = 0;
	if (g_once_init_enter(&done)) {
		GST_DEBUG_CATEGORY_INIT(gst_xmem_meta_debug, "xmemmeta", 0, "xmem frame metas");
		g_once_init_leave(&done, 1);
	}
}

/* Appends to a frame's side data without ever passing the budget. A record is begun,
 * filled and ended; one that outgrows the budget is dropped whole by end(). */
class SideDataWriter
{
public:
	SideDataWriter() { put_u32(GST_XMEM_META_MAGIC); }

	void begin(GstXmemMetaTag tag)
	{
		record_ = len_;
		full_ = false;
		put_u32(guint32(tag));
		put_u32(0); /* the payload's length, patched by end() */
	}
	/* Whether the record fit: it stays, or the data is as before begin(). */
	bool end()
	{
		if (full_) {
			len_ = record_;
			return false;
		}
		write_le32(buf_.data() + record_ + 4, guint32(len_ - record_ - 8));
		return true;
	}
	/* Takes the record begun back, whatever it holds. */
	void cancel()
	{
		len_ = record_;
		full_ = false;
	}
	/* The length so far, for a record that lets an optional part go (rewind()). */
	gsize mark() const { return len_; }
	void rewind(gsize mark)
	{
		len_ = mark;
		full_ = false;
	}
	bool full() const { return full_; }

	void put_u32(guint32 v)
	{
		if (guint8 *p = room(4))
			write_le32(p, v);
	}
	void put_u64(guint64 v)
	{
		if (guint8 *p = room(8))
			write_le64(p, v);
	}
	void put_string(std::string_view s)
	{
		put_u32(guint32(std::min<gsize>(s.size(), G_MAXUINT32)));
		if (guint8 *p = room(s.size()))
			std::memcpy(p, s.data(), s.size());
	}
	/* Patches a u32 written earlier at AT. */
	void set_u32(gsize at, guint32 v) { write_le32(buf_.data() + at, v); }

	std::span<const std::byte> bytes() const { return { reinterpret_cast<const std::byte *>(buf_.data()), len_ }; }
	/* Nothing past the magic. */
	bool empty() const { return len_ == 4; }

#if GST_CHECK_VERSION(1, 24, 0)
	/* gst_meta_serialize() into the record begun, through a GstByteArrayInterface that
	 * refuses to grow past the budget. */
	bool serialize(const GstMeta *meta)
	{
		struct Bounded {
			GstByteArrayInterface iface; /* first: GStreamer hands us its address */
			SideDataWriter *writer;
		};
		Bounded a{};
		gst_byte_array_interface_init(&a.iface);
		a.iface.data = buf_.data();
		a.iface.len = len_;
		a.writer = this;
		a.iface.resize = [](GstByteArrayInterface *iface, gsize length) -> gboolean {
			auto *self = reinterpret_cast<Bounded *>(iface)->writer;
			if (length > self->buf_.size()) {
				self->full_ = true;
				return FALSE;
			}
			return TRUE; /* the storage is fixed: data stays where it is */
		};
		bool ok = gst_meta_serialize(meta, &a.iface);
		if (ok)
			len_ = a.iface.len;
		return ok;
	}
#endif

private:
	guint8 *room(gsize n)
	{
		if (full_ || n > buf_.size() - len_) {
			full_ = true;
			return nullptr;
		}
		guint8 *p = buf_.data() + len_;
		len_ += n;
		return p;
	}

	std::array<guint8, XMEM_SIDE_DATA_MAX> buf_{};
	gsize len_ = 0;
	gsize record_ = 0;
	bool full_ = false;
};

void write_reference_timestamp(SideDataWriter &w, const GstReferenceTimestampMeta *m)
{
	g_autofree gchar *reference = m->reference ? gst_caps_to_string(m->reference) : g_strdup("");
	w.put_u64(m->timestamp);
	w.put_u64(m->duration);
	w.put_string(reference);
}

/* Whether every param went along (those that did not fit are left out). */
bool write_region_of_interest(SideDataWriter &w, const GstVideoRegionOfInterestMeta *m)
{
	w.put_string(g_quark_to_string(m->roi_type) ? g_quark_to_string(m->roi_type) : "");
	w.put_u32(guint32(m->id));
	w.put_u32(guint32(m->parent_id));
	w.put_u32(m->x);
	w.put_u32(m->y);
	w.put_u32(m->w);
	w.put_u32(m->h);
	gsize count_at = w.mark();
	w.put_u32(0);
	if (w.full())
		return false;
	guint32 count = 0;
	bool all = true;
	for (GList *l = m->params; l; l = l->next) {
		g_autofree gchar *param = gst_structure_to_string(static_cast<const GstStructure *>(l->data));
		gsize before = w.mark();
		w.put_string(param);
		if (w.full()) {
			w.rewind(before);
			all = false;
			continue;
		}
		count++;
	}
	w.set_u32(count_at, count);
	return all;
}

void write_time_code(SideDataWriter &w, const GstVideoTimeCodeMeta *m)
{
	const GstVideoTimeCode &tc = m->tc;
	w.put_u32(tc.config.fps_n);
	w.put_u32(tc.config.fps_d);
	w.put_u32(guint32(tc.config.flags));
	w.put_u32(tc.hours);
	w.put_u32(tc.minutes);
	w.put_u32(tc.seconds);
	w.put_u32(tc.frames);
	w.put_u32(tc.field_count);
	g_autofree gchar *jam =
		tc.config.latest_daily_jam ? g_date_time_format_iso8601(tc.config.latest_daily_jam) : nullptr;
	w.put_string(jam ? jam : "");
}

#if GST_CHECK_VERSION(1, 24, 0)
/* Metas whose meaning is the producer's memory: the layout of its bytes (GstVideoMeta,
 * whose layout travels in xmem's frame metadata) or a reference into it. */
bool tied_to_memory(GType api)
{
	return api == GST_VIDEO_META_API_TYPE || gst_meta_api_type_has_tag(api, GST_META_TAG_MEMORY) ||
	       gst_meta_api_type_has_tag(api, g_quark_from_static_string("memory-reference"));
}
#endif

/* Reads a frame's side data; any read past the data fails and marks it bad. */
class SideDataReader
{
public:
	explicit SideDataReader(std::span<const std::byte> bytes)
		: p_(reinterpret_cast<const guint8 *>(bytes.data())), left_(bytes.size())
	{
	}

	bool bad() const { return bad_; }
	gsize left() const { return left_; }

	guint32 u32()
	{
		const guint8 *p = take(4);
		return p ? read_le32(p) : 0;
	}
	guint64 u64()
	{
		const guint8 *p = take(8);
		return p ? read_le64(p) : 0;
	}
	/* A string: valid UTF-8, no NUL inside. */
	std::string string()
	{
		guint32 n = u32();
		const guint8 *p = take(n);
		if (!p)
			return {};
		const auto *s = reinterpret_cast<const gchar *>(p);
		if (!g_utf8_validate(s, gssize(n), nullptr)) {
			bad_ = true;
			return {};
		}
		return { s, n };
	}
	/* The next N bytes, as a reader of their own. */
	SideDataReader sub(gsize n)
	{
		const guint8 *p = take(n);
		return SideDataReader(p ? std::span<const std::byte>(reinterpret_cast<const std::byte *>(p), n)
					: std::span<const std::byte>());
	}
	const guint8 *data() const { return p_; }

private:
	const guint8 *take(gsize n)
	{
		if (bad_ || n > left_) {
			bad_ = true;
			return nullptr;
		}
		const guint8 *p = p_;
		p_ += n;
		left_ -= n;
		return p;
	}

	const guint8 *p_;
	gsize left_;
	bool bad_ = false;
};

/* Each reader returns whether its record was well formed (and its meta added). */
bool read_reference_timestamp(SideDataReader &r, GstBuffer *buffer)
{
	guint64 timestamp = r.u64();
	guint64 duration = r.u64();
	std::string reference = r.string();
	if (r.bad())
		return false;
	g_autoptr(GstCaps) caps = gst_caps_from_string(reference.c_str());
	if (!caps || !gst_caps_is_fixed(caps))
		return false;
	return gst_buffer_add_reference_timestamp_meta(buffer, caps, timestamp, duration) != nullptr;
}

bool read_region_of_interest(SideDataReader &r, GstBuffer *buffer)
{
	std::string type = r.string();
	auto id = gint(r.u32());
	auto parent_id = gint(r.u32());
	guint x = r.u32(), y = r.u32(), w = r.u32(), h = r.u32();
	guint32 count = r.u32();
	if (r.bad() || type.empty())
		return false;
	/* Every param is parsed before the meta is added: a record is taken whole or not. */
	std::vector<GstStructure *> params;
	auto free_params = [&params] {
		for (GstStructure *s : params)
			gst_structure_free(s);
	};
	for (guint32 i = 0; i < count; i++) {
		std::string text = r.string();
		GstStructure *s = r.bad() ? nullptr : gst_structure_from_string(text.c_str(), nullptr);
		if (!s) {
			free_params();
			return false;
		}
		params.push_back(s);
	}
	GstVideoRegionOfInterestMeta *m =
		gst_buffer_add_video_region_of_interest_meta(buffer, type.c_str(), x, y, w, h);
	m->id = id;
	m->parent_id = parent_id;
	for (GstStructure *s : params)
		gst_video_region_of_interest_meta_add_param(m, s); /* takes it */
	return true;
}

bool read_time_code(SideDataReader &r, GstBuffer *buffer)
{
	GstVideoTimeCode tc{};
	tc.config.fps_n = r.u32();
	tc.config.fps_d = r.u32();
	tc.config.flags = GstVideoTimeCodeFlags(r.u32());
	tc.hours = r.u32();
	tc.minutes = r.u32();
	tc.seconds = r.u32();
	tc.frames = r.u32();
	tc.field_count = r.u32();
	std::string jam = r.string();
	if (r.bad())
		return false;
	g_autoptr(GDateTime) daily_jam = nullptr;
	if (!jam.empty() && !(daily_jam = g_date_time_new_from_iso8601(jam.c_str(), nullptr)))
		return false;
	/* Checked here: adding an invalid one is a critical in GStreamer. Field counts and
	 * flags beyond GStreamer's own (progressive or fields 1-2; drop-frame, interlaced)
	 * would mean nothing downstream. */
	constexpr guint known_flags = GST_VIDEO_TIME_CODE_FLAGS_DROP_FRAME | GST_VIDEO_TIME_CODE_FLAGS_INTERLACED;
	if (tc.field_count > 2 || (guint(tc.config.flags) & ~known_flags) != 0 || !gst_video_time_code_is_valid(&tc))
		return false;
	tc.config.latest_daily_jam = daily_jam; /* the meta takes its own reference */
	return gst_buffer_add_video_time_code_meta(buffer, &tc) != nullptr;
}

enum class Outcome { added, skipped, refused };

#if GST_CHECK_VERSION(1, 24, 0)
/* gst_meta_deserialize()'s bytes: its header is checked here first (a length taken from
 * it unchecked reads past the record), then it parses a copy with a NUL after it, so a
 * payload parser that reads up to a NUL stops inside our memory. */
Outcome read_serialized(SideDataReader &r, GstBuffer *buffer)
{
	/* [total size u32][name_len u32][name][\0][version u8][payload] */
	gsize size = r.left();
	const guint8 *p = r.data();
	if (size < 10)
		return Outcome::refused;
	guint32 total = read_le32(p);
	guint32 name_len = read_le32(p + 4);
	if (total != size || name_len == 0 || name_len > size - 10 || p[8 + name_len] != '\0')
		return Outcome::refused;
	const auto *name = reinterpret_cast<const gchar *>(p + 8);
	if (std::strlen(name) != name_len || !g_utf8_validate(name, name_len, nullptr))
		return Outcome::refused;
	const GstMetaInfo *info = gst_meta_get_info(name);
	/* Not registered in this process, or one that would describe our memory with the
	 * producer's numbers (a GstVideoMeta with its offsets): not ours to add. */
	if (!info || !info->deserialize_func || tied_to_memory(info->api))
		return Outcome::skipped;
	std::vector<guint8> copy(p, p + size);
	copy.push_back(0);
	guint32 consumed = 0;
	GstMeta *meta = gst_meta_deserialize(buffer, copy.data(), size, &consumed);
	return meta && consumed == size ? Outcome::added : Outcome::refused;
}
#endif

Outcome read_record(guint32 tag, SideDataReader &r, GstBuffer *buffer)
{
	bool ok;
	switch (GstXmemMetaTag(tag)) {
	case GstXmemMetaTag::reference_timestamp:
		ok = read_reference_timestamp(r, buffer);
		break;
	case GstXmemMetaTag::region_of_interest:
		ok = read_region_of_interest(r, buffer);
		break;
	case GstXmemMetaTag::time_code:
		ok = read_time_code(r, buffer);
		break;
#if GST_CHECK_VERSION(1, 24, 0)
	case GstXmemMetaTag::serialized:
		return read_serialized(r, buffer);
#endif
	default:
		/* A tag of a later encoding, or (gst_meta_deserialize() came in 1.24) a
		 * serialized meta this GStreamer cannot read. */
		return Outcome::skipped;
	}
	return ok ? Outcome::added : Outcome::refused;
}

} // namespace

void gst_xmem_metas_write(GstElement *sink, GstBuffer *buffer, xmem::BufferGuard &frame, GstXmemMetaCounts &counts)
{
	init_debug();
	SideDataWriter w;
	guint64 sent = 0, dropped = 0;
	gpointer state = nullptr;
	while (GstMeta *meta = gst_buffer_iterate_meta(buffer, &state)) {
		GType api = meta->info->api;
		bool whole = true; /* a record that fit went with all its parts */
		if (api == GST_REFERENCE_TIMESTAMP_META_API_TYPE) {
			w.begin(GstXmemMetaTag::reference_timestamp);
			write_reference_timestamp(w, reinterpret_cast<GstReferenceTimestampMeta *>(meta));
		} else if (api == GST_VIDEO_REGION_OF_INTEREST_META_API_TYPE) {
			w.begin(GstXmemMetaTag::region_of_interest);
			whole = write_region_of_interest(w, reinterpret_cast<GstVideoRegionOfInterestMeta *>(meta));
		} else if (api == GST_VIDEO_TIME_CODE_META_API_TYPE) {
			w.begin(GstXmemMetaTag::time_code);
			write_time_code(w, reinterpret_cast<GstVideoTimeCodeMeta *>(meta));
		} else {
#if GST_CHECK_VERSION(1, 24, 0)
			if (tied_to_memory(api) || !meta->info->serialize_func)
				continue;
			w.begin(GstXmemMetaTag::serialized);
			if (!w.serialize(meta) && !w.full()) {
				/* A serializer that failed for its own reasons: that meta cannot travel. */
				w.cancel();
				GST_DEBUG_OBJECT(sink, "%s did not serialize", g_type_name(meta->info->type));
				continue;
			}
#else
			continue; /* gst_meta_serialize() came in 1.24; GstVideoMeta and the like never go */
#endif
		}
		bool fit = w.end();
		sent += fit;
		dropped += !fit || !whole;
	}
	auto stored = frame.set_side_data(w.empty() ? std::span<const std::byte>() : w.bytes());
	if (!stored) {
		/* The writer never passes the budget: only a guard not from acquire() gets here. */
		GST_WARNING_OBJECT(sink, "frame metas not stored: %s", stored.error().message.c_str());
		return;
	}
	counts.sent += sent;
	if (dropped == 0)
		return;
	counts.dropped += dropped;
	if (!counts.warned.exchange(true))
		GST_WARNING_OBJECT(sink,
				   "a frame's metas exceed its %d-byte side data budget: %" G_GUINT64_FORMAT
				   " left out (the frame went; stats metas-dropped counts them, "
				   "and this is logged once)",
				   XMEM_SIDE_DATA_MAX, dropped);
}

std::vector<std::byte> gst_xmem_metas_take(const xmem::BufferPool &pool, const xmem::BufferGuard &frame,
					   GstXmemMetaCounts &counts)
{
	guint64 refused = pool.side_data_refused();
	if (counts.pool_seen != &pool) {
		counts.pool_seen = &pool;
		counts.pool_refused_seen = 0;
	}
	if (refused > counts.pool_refused_seen) {
		counts.refused += refused - counts.pool_refused_seen;
		counts.pool_refused_seen = refused;
	}
	std::span<const std::byte> side = frame.side_data();
	return { side.begin(), side.end() };
}

void gst_xmem_metas_read(GstElement *src, std::span<const std::byte> side_data, GstBuffer *buffer,
			 GstXmemMetaCounts &counts)
{
	init_debug();
	if (side_data.empty())
		return;
	SideDataReader r(side_data);
	if (r.u32() != GST_XMEM_META_MAGIC) {
		/* Another producer's side data (the library is free to carry anything). */
		counts.skipped++;
		GST_LOG_OBJECT(src, "side data without xmemsink's magic: skipped");
		return;
	}
	guint64 added = 0, skipped = 0, refused = 0;
	while (r.left() > 0) {
		guint32 tag = r.u32();
		guint32 length = r.u32();
		SideDataReader record = r.sub(length);
		if (r.bad()) {
			/* A length past the end: nothing after it can be found. */
			refused++;
			break;
		}
		switch (read_record(tag, record, buffer)) {
		case Outcome::added:
			added++;
			break;
		case Outcome::skipped:
			skipped++;
			break;
		case Outcome::refused:
			refused++;
			GST_DEBUG_OBJECT(src, "refused a malformed meta record (tag %u, %u bytes)", tag, length);
			break;
		}
	}
	counts.received += added;
	counts.skipped += skipped;
	counts.refused += refused;
}

void gst_xmem_metas_add_stats(GstStructure *stats, const GstXmemMetaCounts &counts, bool sink)
{
	if (sink)
		gst_structure_set(stats, "metas-sent", G_TYPE_UINT64, counts.sent.load(), "metas-dropped",
				  G_TYPE_UINT64, counts.dropped.load(), nullptr);
	else
		gst_structure_set(stats, "metas-received", G_TYPE_UINT64, counts.received.load(), "metas-skipped",
				  G_TYPE_UINT64, counts.skipped.load(), "metas-refused", G_TYPE_UINT64,
				  counts.refused.load(), nullptr);
}

/* From the Unix epoch (1970) back to NTP's (1900): 70 years, 17 of them leap. */
static constexpr guint64 kNtpToUnix = (70ULL * 365 + 17) * 24 * 3600 * GST_SECOND;

void gst_xmem_add_capture_time(GstBuffer *buffer, guint64 capture_time, guint64 timestamp)
{
	if (capture_time == 0 && timestamp == 0)
		return;
	static GstStaticCaps ntp = GST_STATIC_CAPS("timestamp/x-ntp");
	GstCaps *caps = gst_static_caps_get(&ntp);
	if (!gst_buffer_get_reference_timestamp_meta(buffer, caps)) {
		guint64 realtime_ns = capture_time;
		if (realtime_ns == 0) {
			/* The two clocks read back to back: their difference moves only when the
			 * realtime clock is stepped or slewed. */
			timespec realtime{};
			timespec monotonic{};
			clock_gettime(CLOCK_MONOTONIC, &monotonic);
			clock_gettime(CLOCK_REALTIME, &realtime);
			const gint64 offset =
				(gint64(realtime.tv_sec) - gint64(monotonic.tv_sec)) * gint64(GST_SECOND) +
				(gint64(realtime.tv_nsec) - gint64(monotonic.tv_nsec));
			realtime_ns = guint64(gint64(timestamp) + offset);
		}
		gst_buffer_add_reference_timestamp_meta(buffer, caps, realtime_ns + kNtpToUnix, GST_CLOCK_TIME_NONE);
	}
	gst_caps_unref(caps);
}

guint64 gst_xmem_capture_time_of(GstBuffer *buffer)
{
	static GstStaticCaps ntp = GST_STATIC_CAPS("timestamp/x-ntp");
	static GstStaticCaps unix_time = GST_STATIC_CAPS("timestamp/x-unix");
	guint64 captured = 0;
	GstCaps *caps = gst_static_caps_get(&ntp);
	if (const GstReferenceTimestampMeta *m = gst_buffer_get_reference_timestamp_meta(buffer, caps)) {
		if (m->timestamp > kNtpToUnix)
			captured = m->timestamp - kNtpToUnix;
	} else {
		gst_caps_unref(caps);
		caps = gst_static_caps_get(&unix_time);
		if (const GstReferenceTimestampMeta *u = gst_buffer_get_reference_timestamp_meta(buffer, caps))
			captured = u->timestamp;
	}
	gst_caps_unref(caps);
	return captured;
}
