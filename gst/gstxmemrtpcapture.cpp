/* gstxmemrtpcapture.cpp - xmemrtphdrextcapture. Its bytes are RFC 6051's 64-bit NTP
 * timestamp (the form GStreamer's rtphdrextntp64 writes): the timestamp/x-ntp
 * GstReferenceTimestampMeta of the frame a packet belongs to (xmemsrc
 * add-reference-timestamp-meta makes it from the capture time). RFC 6051's own
 * extension goes only on a frame's first packet, and GStreamer before 1.24 reads a
 * depayloaded frame's extensions from its last: the frame would arrive without its time.
 * This one goes on every packet, so any depayloader finds it, and is read once a frame.
 * Its URI is xmem's own, so it never replaces rtphdrextntp64 where that is asked for. */
#include "gstxmemrtpcapture.h"

#include <gst/rtp/rtp.h>

GST_DEBUG_CATEGORY_STATIC(xmem_rtp_capture_debug);
#define GST_CAT_DEFAULT xmem_rtp_capture_debug

struct GstXmemRtpCapture {
	GstRTPHeaderExtension parent;
};

struct GstXmemRtpCaptureClass {
	GstRTPHeaderExtensionClass parent_class;
};

G_DEFINE_TYPE(GstXmemRtpCapture, gst_xmem_rtp_capture, GST_TYPE_RTP_HEADER_EXTENSION)
GST_ELEMENT_REGISTER_DEFINE(xmemrtphdrextcapture, "xmemrtphdrextcapture", GST_RANK_MARGINAL,
			    gst_xmem_rtp_capture_get_type())

namespace {

constexpr gsize kSize = 8;

/* Big-endian, a byte at a time: an extension's bytes have no alignment (GStreamer's
 * GST_WRITE_UINT64_BE stores a whole guint64 where the CPU allows it, which
 * UndefinedBehaviorSanitizer refuses). */
void put_u64_be(guint8 *data, guint64 value)
{
	for (int i = 7; i >= 0; i--) {
		data[i] = guint8(value);
		value >>= 8;
	}
}

guint64 get_u64_be(const guint8 *data)
{
	guint64 value = 0;
	for (gsize i = 0; i < kSize; i++)
		value = value << 8 | data[i];
	return value;
}

GstCaps *ntp_caps()
{
	static GstStaticCaps caps = GST_STATIC_CAPS("timestamp/x-ntp");
	return gst_static_caps_get(&caps);
}

GstRTPHeaderExtensionFlags supported_flags(GstRTPHeaderExtension *)
{
	return GstRTPHeaderExtensionFlags(GST_RTP_HEADER_EXTENSION_ONE_BYTE | GST_RTP_HEADER_EXTENSION_TWO_BYTE);
}

gsize max_size(GstRTPHeaderExtension *, const GstBuffer *)
{
	return kSize;
}

/* 0 (nothing written) for a frame without a capture time. */
gssize write(GstRTPHeaderExtension *, const GstBuffer *input_meta, GstRTPHeaderExtensionFlags, GstBuffer *,
	     guint8 *data, gsize size)
{
	if (size < kSize)
		return -1;
	GstCaps *caps = ntp_caps();
	GstReferenceTimestampMeta *meta =
		gst_buffer_get_reference_timestamp_meta(const_cast<GstBuffer *>(input_meta), caps);
	gst_caps_unref(caps);
	if (!meta)
		return 0;
	put_u64_be(data, gst_util_uint64_scale(meta->timestamp, G_GUINT64_CONSTANT(1) << 32, GST_SECOND));
	return kSize;
}

/* Every packet of a frame has it: a depayloader that reads them all (GStreamer >= 1.24
 * aggregates) gets it once. */
gboolean read(GstRTPHeaderExtension *, GstRTPHeaderExtensionFlags, const guint8 *data, gsize size, GstBuffer *buffer)
{
	if (size < kSize)
		return FALSE;
	GstCaps *caps = ntp_caps();
	if (!gst_buffer_get_reference_timestamp_meta(buffer, caps)) {
		guint64 ntp = get_u64_be(data);
		gst_buffer_add_reference_timestamp_meta(
			buffer, caps, gst_util_uint64_scale(ntp, GST_SECOND, G_GUINT64_CONSTANT(1) << 32),
			GST_CLOCK_TIME_NONE);
	}
	gst_caps_unref(caps);
	return TRUE;
}

} // namespace

static void gst_xmem_rtp_capture_class_init(GstXmemRtpCaptureClass *klass)
{
	auto *extension = GST_RTP_HEADER_EXTENSION_CLASS(klass);
	extension->get_supported_flags = supported_flags;
	extension->get_max_size = max_size;
	extension->write = write;
	extension->read = read;
	gst_element_class_set_static_metadata(GST_ELEMENT_CLASS(klass), "RTP header extension: xmem capture time",
					      GST_RTP_HDREXT_ELEMENT_CLASS,
					      "Carries each frame's capture time (its timestamp/x-ntp reference "
					      "timestamp, RFC 6051's 64-bit NTP form) on every packet of the frame",
					      "xmem");
	gst_rtp_header_extension_class_set_uri(extension, GST_XMEM_RTP_CAPTURE_URI);
	GST_DEBUG_CATEGORY_INIT(xmem_rtp_capture_debug, "xmemrtpcapture", 0, "xmem capture time RTP extension");
}

static void gst_xmem_rtp_capture_init(GstXmemRtpCapture *)
{
}
