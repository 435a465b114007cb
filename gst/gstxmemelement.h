/* gstxmemelement.h - what xmemsink and xmemsrc have in common: the pool-name and
 * stats properties, and the lifetime of each element's C++ state. */
#pragma once

#include <gst/gst.h>

#include <exception>
#include <string>
#include <utility>

#define GST_XMEM_DEFAULT_POOL_NAME "xmem"

/* The elements' settings: read and written by any thread, changed in NULL or READY
 * only (the pool is made or attached once the element starts). */
inline constexpr GParamFlags GST_XMEM_PARAM_FLAGS =
	GParamFlags(G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS | GST_PARAM_MUTABLE_READY);

/* Installs pool-name, the name of the pool an element publishes into or attaches to,
 * as property PROP_ID of KLASS. */
void gst_xmem_install_pool_name(GObjectClass *klass, guint prop_id);
/* pool-name's value in VALUE: "" for none. */
std::string gst_xmem_pool_name_from_value(const GValue *value);

/* xmem:// URIs (GstURIHandler), the same for both elements: xmem://NAME (a plain pool
 * name), xmem:///PATH (the socket at /PATH), xmem://@NAME (an abstract socket), each
 * with an optional query of properties, ?KEY=VALUE&... (a property's name and its value
 * as gst-launch-1.0 writes it). ELEMENT's pool-name and properties are set from URI,
 * all or none: a malformed URI, a name xmem refuses, an unknown, read-only or badly
 * written parameter is an error that says which (GST_URI_ERROR_BAD_URI), and so is a
 * change once the element is past READY (GST_URI_ERROR_BAD_STATE). */
gboolean gst_xmem_set_uri(GstElement *element, const gchar *uri, GError **error);
/* ELEMENT's pool as an xmem:// URI (without the other properties); NULL without one. */
gchar *gst_xmem_get_uri(GstElement *element);
/* The GstURIHandler interface of an element of URI type TYPE (GST_URI_SRC, GST_URI_SINK):
 * protocol "xmem", and the two calls above. For G_IMPLEMENT_INTERFACE. */
void gst_xmem_src_uri_handler_init(gpointer iface, gpointer data);
void gst_xmem_sink_uri_handler_init(gpointer iface, gpointer data);

/* Installs stats, a read-only GstStructure of the element's counters that BLURB
 * names (a static string), as property PROP_ID of KLASS. */
void gst_xmem_install_stats(GObjectClass *klass, guint prop_id, const gchar *blurb);

/* An element's C++ state lives outside its GObject instance, which GObject zero-fills
 * without running constructors: _init makes it, _finalize deletes it. GObject cannot
 * fail an instance, so a constructor that throws (out of memory) aborts, as
 * g_malloc() does; ELEMENT_NAME says whose. */
template<typename State, typename... Args>
State *gst_xmem_state_new(const char *element_name, Args &&...args)
{
	try {
		return new State(std::forward<Args>(args)...);
	} catch (const std::exception &e) {
		g_error("%s: %s", element_name, e.what());
	}
}

template<typename State>
void gst_xmem_state_free(State *&state)
{
	delete std::exchange(state, nullptr);
}
