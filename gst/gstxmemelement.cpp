/* gstxmemelement.cpp - what xmemsink and xmemsrc share, written once for both: the
 * pool-name and stats properties, and xmem:// URIs. */
#include "gstxmemelement.h"

#include <xmem/xmem.hpp>

#include <memory>
#include <utility>
#include <vector>

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

namespace {

constexpr const char *kUriScheme = "xmem";
constexpr const char *kUriForms = "xmem://NAME, xmem:///SOCKET/PATH or xmem://@ABSTRACT, then ?PROPERTY=VALUE&...";

gboolean uri_error(GError **error, GstURIError code, const gchar *uri, const std::string &why)
{
	g_set_error(error, GST_URI_ERROR, code, "xmem URI '%s': %s (%s)", uri, why.c_str(), kUriForms);
	return FALSE;
}

// A percent-decoded part of a URI; none when it decodes to no valid string (a %00, a stray %).
std::unique_ptr<gchar, decltype(&g_free)> unescaped(const std::string &part)
{
	return { g_uri_unescape_string(part.c_str(), nullptr), g_free };
}

struct Setting {
	GParamSpec *spec;
	GValue value;
};

} // namespace

gboolean gst_xmem_set_uri(GstElement *element, const gchar *uri, GError **error)
{
	if (!uri)
		return uri_error(error, GST_URI_ERROR_BAD_URI, "(null)", "no URI");
	// Also on its way up: a sink's PAUSED is asynchronous, and start() ran already.
	if (GST_STATE(element) > GST_STATE_READY || GST_STATE_TARGET(element) > GST_STATE_READY)
		return uri_error(error, GST_URI_ERROR_BAD_STATE, uri,
				 "the element is running: its pool and properties change in NULL or READY only");
	std::string text = uri;
	std::string prefix = std::string(kUriScheme) + "://";
	if (g_ascii_strncasecmp(text.c_str(), prefix.c_str(), prefix.size()) != 0)
		return uri_error(error, GST_URI_ERROR_UNSUPPORTED_PROTOCOL, uri, "not an xmem:// URI");
	std::string rest = text.substr(prefix.size());
	if (rest.find('#') != std::string::npos)
		return uri_error(error, GST_URI_ERROR_BAD_URI, uri, "a fragment ('#') means nothing here");
	size_t q = rest.find('?');
	std::string target = rest.substr(0, q);
	std::string query = q == std::string::npos ? std::string() : rest.substr(q + 1);
	if (target.empty())
		return uri_error(error, GST_URI_ERROR_BAD_URI, uri, "no pool named");
	auto name = unescaped(target);
	if (!name || !*name)
		return uri_error(error, GST_URI_ERROR_BAD_URI, uri, "the pool's name is not a valid escaped string");
	std::string pool = name.get();
	// A plain name has no '/': xmem://a/b would be the relative path a/b, which xmem:///
	// says plainly when it is meant.
	if (pool[0] != '/' && pool.find('/') != std::string::npos)
		return uri_error(error, GST_URI_ERROR_BAD_URI, uri,
				 "'" + pool + "' is neither a plain name (no '/') nor an absolute socket path");
	if (auto path = xmem::socket_path(pool); !path)
		return uri_error(error, GST_URI_ERROR_BAD_URI, uri, path.error().message);

	// The properties, all checked before any is set.
	std::vector<Setting> settings;
	auto unset_all = [&] {
		for (Setting &s : settings)
			g_value_unset(&s.value);
	};
	GObjectClass *klass = G_OBJECT_GET_CLASS(element);
	size_t at = 0;
	while (!query.empty() && at <= query.size()) {
		size_t end = query.find('&', at);
		std::string pair = query.substr(at, end == std::string::npos ? std::string::npos : end - at);
		at = end == std::string::npos ? query.size() + 1 : end + 1;
		size_t eq = pair.find('=');
		auto key = unescaped(pair.substr(0, eq));
		auto value = unescaped(eq == std::string::npos ? std::string() : pair.substr(eq + 1));
		if (eq == std::string::npos || !key || !*key || !value) {
			unset_all();
			return uri_error(error, GST_URI_ERROR_BAD_URI, uri,
					 "'" + pair + "' is no PROPERTY=VALUE parameter");
		}
		GParamSpec *spec = g_object_class_find_property(klass, key.get());
		if (!spec || std::string(key.get()) == "pool-name") {
			unset_all();
			std::string factory = GST_OBJECT_NAME(gst_element_get_factory(element));
			std::string why = "unknown parameter '";
			why += key.get();
			why += "' (" + factory + " has ";
			why += spec ? "its pool in the URI itself" : "no property of that name";
			why += ": gst-inspect-1.0 " + factory + " lists them)";
			return uri_error(error, GST_URI_ERROR_BAD_URI, uri, why);
		}
		if (!(spec->flags & G_PARAM_WRITABLE) || (spec->flags & G_PARAM_CONSTRUCT_ONLY)) {
			unset_all();
			return uri_error(error, GST_URI_ERROR_BAD_URI, uri,
					 "parameter '" + std::string(key.get()) + "' is read-only");
		}
		Setting setting{ spec, G_VALUE_INIT };
		g_value_init(&setting.value, G_PARAM_SPEC_VALUE_TYPE(spec));
		if (!gst_value_deserialize(&setting.value, value.get()) ||
		    g_param_value_validate(spec, &setting.value)) {
			g_value_unset(&setting.value);
			unset_all();
			return uri_error(error, GST_URI_ERROR_BAD_URI, uri,
					 "'" + std::string(value.get()) + "' is no value of parameter '" +
						 std::string(key.get()) + "' (" +
						 g_type_name(G_PARAM_SPEC_VALUE_TYPE(spec)) + ")");
		}
		settings.push_back(setting);
	}
	g_object_set(element, "pool-name", pool.c_str(), nullptr);
	for (Setting &s : settings)
		g_object_set_property(G_OBJECT(element), s.spec->name, &s.value);
	unset_all();
	return TRUE;
}

gchar *gst_xmem_get_uri(GstElement *element)
{
	gchar *pool = nullptr;
	g_object_get(element, "pool-name", &pool, nullptr);
	if (!pool || !*pool) {
		g_free(pool);
		return nullptr;
	}
	// Reserved characters escaped, but the '/' of a path and the '@' of an abstract name kept.
	gchar *escaped = g_uri_escape_string(pool, "/@", FALSE);
	gchar *uri = g_strconcat(kUriScheme, "://", escaped, nullptr);
	g_free(escaped);
	g_free(pool);
	return uri;
}

namespace {

const gchar *const *uri_protocols(GType)
{
	static const gchar *const protocols[] = { kUriScheme, nullptr };
	return protocols;
}

gchar *uri_of(GstURIHandler *handler)
{
	return gst_xmem_get_uri(GST_ELEMENT(handler));
}

gboolean set_uri(GstURIHandler *handler, const gchar *uri, GError **error)
{
	return gst_xmem_set_uri(GST_ELEMENT(handler), uri, error);
}

template<GstURIType kType>
void uri_handler_init(gpointer g_iface)
{
	auto *iface = static_cast<GstURIHandlerInterface *>(g_iface);
	iface->get_type = [](GType) {
		return kType;
	};
	iface->get_protocols = uri_protocols;
	iface->get_uri = uri_of;
	iface->set_uri = set_uri;
}

} // namespace

void gst_xmem_src_uri_handler_init(gpointer iface, gpointer)
{
	uri_handler_init<GST_URI_SRC>(iface);
}

void gst_xmem_sink_uri_handler_init(gpointer iface, gpointer)
{
	uri_handler_init<GST_URI_SINK>(iface);
}
