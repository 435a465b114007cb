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
