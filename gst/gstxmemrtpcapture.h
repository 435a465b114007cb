/* gstxmemrtpcapture.h - xmemrtphdrextcapture: an RTP header extension that carries each
 * frame's capture time from one host to another (pipelines/bridge-send.sh and
 * bridge-receive.sh), on every packet of the frame. */
#pragma once

#include <gst/gst.h>

/* The extension's URI, for a payloader's and a depayloader's caps (extmap-N). */
#define GST_XMEM_RTP_CAPTURE_URI "urn:xmem:rtp-hdrext:capture-time"

G_BEGIN_DECLS
GST_ELEMENT_REGISTER_DECLARE(xmemrtphdrextcapture);
G_END_DECLS
