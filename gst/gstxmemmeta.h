/* gstxmemmeta.h - a frame's GstMetas as xmem side data: what xmemsink writes beside
 * each frame and xmemsrc adds back, in records any GStreamer version can skip. */
#pragma once

#include <xmem/xmem.hpp>

#include <gst/gst.h>

#include <atomic>
#include <cstddef>
#include <span>
#include <vector>

/* The side data of a frame from xmemsink (every integer little-endian):
 *
 *   magic "XGM1" (u32 0x314d4758), then records back to back, each
 *   tag u32 | length u32 | length bytes of payload
 *
 * A reader skips a record whose tag it does not know, and bytes at the end of a known
 * record's payload (later fields), so a producer and a consumer built against
 * different GStreamer versions understand what they share. A string is its length
 * (u32) and its bytes, UTF-8 without a NUL. */
enum class GstXmemMetaTag : guint32 {
	/* GstReferenceTimestampMeta: timestamp u64, duration u64, reference caps string. */
	reference_timestamp = 1,
	/* GstVideoRegionOfInterestMeta: roi type string, id i32, parent_id i32, x, y, w,
	 * h u32, then a u32 count of param structures, each a gst_structure_to_string(). */
	region_of_interest = 2,
	/* GstVideoTimeCodeMeta: fps_n, fps_d, flags, hours, minutes, seconds, frames,
	 * field_count u32, then the latest daily jam as ISO 8601 ("" for none). */
	time_code = 3,
	/* Any other meta with a serialize function (GStreamer >= 1.24): the bytes of
	 * gst_meta_serialize(), which name the meta's type. */
	serialized = 4,
};

inline constexpr guint32 GST_XMEM_META_MAGIC = 0x314d4758; /* "XGM1" */

/* What the encoding did, per element, for its `stats`. The streaming thread writes
 * them; any thread reads them. */
struct GstXmemMetaCounts {
	/* xmemsink: metas written beside frames, and metas left out because the frame's
	 * side data budget (XMEM_SIDE_DATA_MAX) was spent. */
	std::atomic<guint64> sent{ 0 };
	std::atomic<guint64> dropped{ 0 };
	/* Whether a drop was logged (at WARNING, once per element). */
	std::atomic<bool> warned{ false };
	/* xmemsrc: metas added to buffers; records skipped as unknown or unusable here (a
	 * tag or meta type this process does not have, one that describes the producer's
	 * memory); records refused as malformed, and frames whose side data the pool
	 * refused (its size out of range). */
	std::atomic<guint64> received{ 0 };
	std::atomic<guint64> skipped{ 0 };
	std::atomic<guint64> refused{ 0 };
	/* xmemsrc, streaming thread: the pool whose side_data_refused() was last read,
	 * and that count, so each refusal is counted once across reconnections. */
	const xmem::BufferPool *pool_seen = nullptr;
	guint64 pool_refused_seen = 0;
};

/* xmemsink: encodes BUFFER's metas into FRAME's side data (a guard from acquire()).
 * GstVideoMeta is left out (the frame's layout travels in its metadata), and so are
 * metas tied to the producer's memory and, before GStreamer 1.24, every meta but the
 * three hand-coded ones. What does not fit the budget is left out and counted; the
 * frame goes regardless. */
void gst_xmem_metas_write(GstElement *sink, GstBuffer *buffer, xmem::BufferGuard &frame, GstXmemMetaCounts &counts);

/* xmemsrc: a copy of FRAME's side data, taken before the frame is wrapped or copied,
 * counting what POOL refused since the last call. */
std::vector<std::byte> gst_xmem_metas_take(const xmem::BufferPool &pool, const xmem::BufferGuard &frame,
					   GstXmemMetaCounts &counts);

/* xmemsrc: adds the metas SIDE_DATA holds to BUFFER. Malformed records are refused
 * and counted, never fatal: the frame goes on with the metas that were well formed. */
void gst_xmem_metas_read(GstElement *src, std::span<const std::byte> side_data, GstBuffer *buffer,
			 GstXmemMetaCounts &counts);

/* xmemsrc add-reference-timestamp-meta: adds to BUFFER its frame's capture time as a
 * GstReferenceTimestampMeta with caps timestamp/x-ntp (ns since 1900 on the realtime
 * clock), the form RTP's RFC 6051 header extension sends and RTSP sources make, unless
 * BUFFER has one already (the producer's own, from the side data). The time is the
 * frame's CAPTURE_TIME (realtime) when its producer set one, else its TIMESTAMP
 * (CLOCK_MONOTONIC) on this host's realtime clock; nothing when both are 0. */
void gst_xmem_add_capture_time(GstBuffer *buffer, guint64 capture_time, guint64 timestamp);

/* xmemsink: BUFFER's capture time for the frame's capture_time: realtime ns since 1970
 * from its timestamp/x-ntp or timestamp/x-unix GstReferenceTimestampMeta, 0 without one
 * (or with one before 1970). */
guint64 gst_xmem_capture_time_of(GstBuffer *buffer);

/* Adds the counters to STATS: metas-sent and metas-dropped for a sink, metas-received,
 * metas-skipped and metas-refused for a source. */
void gst_xmem_metas_add_stats(GstStructure *stats, const GstXmemMetaCounts &counts, bool sink);
