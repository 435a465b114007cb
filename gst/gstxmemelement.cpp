/* gstxmemelement.cpp - the properties xmemsink and xmemsrc share, installed once
 * for both: pool-name, word for word the same, and stats. */
#include "gstxmemelement.h"

void gst_xmem_install_pool_name(GObjectClass *klass, guint prop_id)
{
	g_object_class_install_property(
		klass, prop_id,
		g_param_spec_string("pool-name", "Pool name",
				    "Name of the pool: a plain name (socket in $XDG_RUNTIME_DIR/xmem, or "
				    "/tmp/xmem-$UID), the socket path itself when it contains '/', or "
				    "@name for an abstract socket (no file; per network namespace)",
				    GST_XMEM_DEFAULT_POOL_NAME, GST_XMEM_PARAM_FLAGS));
}

std::string gst_xmem_pool_name_from_value(const GValue *value)
{
	const gchar *name = g_value_get_string(value);
	return name ? name : "";
}

void gst_xmem_install_stats(GObjectClass *klass, guint prop_id, const gchar *blurb)
{
	g_object_class_install_property(klass, prop_id,
					g_param_spec_boxed("stats", "Statistics", blurb, GST_TYPE_STRUCTURE,
							   GParamFlags(G_PARAM_READABLE | G_PARAM_STATIC_STRINGS)));
}
