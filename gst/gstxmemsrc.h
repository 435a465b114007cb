/* gstxmemsrc.h - xmemsrc: attaches to a named xmem pool and pushes its frames
 * downstream without copying them. */
#pragma once

#include <gst/base/gstpushsrc.h>
#include <gst/gst.h>

G_BEGIN_DECLS

#define GST_TYPE_XMEM_SRC (gst_xmem_src_get_type())
G_DECLARE_FINAL_TYPE(GstXmemSrc, gst_xmem_src, GST, XMEM_SRC, GstPushSrc)

GST_ELEMENT_REGISTER_DECLARE(xmemsrc);

G_END_DECLS
