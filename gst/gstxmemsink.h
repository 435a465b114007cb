/* gstxmemsink.h - xmemsink: publishes frames into a named xmem pool that other
 * processes attach to with xmemsrc or the xmem library. */
#pragma once

#include <gst/base/gstbasesink.h>
#include <gst/gst.h>

G_BEGIN_DECLS

#define GST_TYPE_XMEM_SINK (gst_xmem_sink_get_type())
G_DECLARE_FINAL_TYPE(GstXmemSink, gst_xmem_sink, GST, XMEM_SINK, GstBaseSink)

#define GST_TYPE_XMEM_POLICY (gst_xmem_policy_get_type())
GType gst_xmem_policy_get_type(void);

#define GST_TYPE_XMEM_MEMORY_KIND (gst_xmem_memory_kind_get_type())
GType gst_xmem_memory_kind_get_type(void);

typedef enum {
	GST_XMEM_MEMORY_AUTO = 0,
	GST_XMEM_MEMORY_SYSTEM = 1,
	GST_XMEM_MEMORY_CUDA = 2,
} GstXmemMemoryKind;

GST_ELEMENT_REGISTER_DECLARE(xmemsink);

G_END_DECLS
