/* plugin.cpp - registers the xmem plugin: xmemsink and xmemsrc, and the RTP header
 * extension the bridge between hosts carries capture times in. Nothing here needs a
 * GPU, so the plugin registers on any machine. */
#include "gstxmemrtpcapture.h"
#include "gstxmemsink.h"
#include "gstxmemsrc.h"

#include <gst/gst.h>

static gboolean plugin_init(GstPlugin *plugin)
{
	gboolean ok = FALSE;
	ok |= GST_ELEMENT_REGISTER(xmemsink, plugin);
	ok |= GST_ELEMENT_REGISTER(xmemsrc, plugin);
	ok |= GST_ELEMENT_REGISTER(xmemrtphdrextcapture, plugin);
	return ok;
}

#define PACKAGE "xmem"
GST_PLUGIN_DEFINE(GST_VERSION_MAJOR, GST_VERSION_MINOR, xmem,
		  "Zero-copy frame sharing between processes through xmem pools", plugin_init, XMEM_VERSION, "LGPL",
		  "xmem", "https://github.com/xmem/xmem")
