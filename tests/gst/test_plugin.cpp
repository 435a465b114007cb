// test_plugin.cpp - the plugin registers on any machine (no GPU needed): gst-inspect-1.0
// finds both elements, and every property of theirs is documented by a blurb.
#include "gst_common.hpp"

using xmem::gsttest::GstTest;
using xmem::test::Process;

namespace {

class Plugin : public GstTest
{
};

} // namespace

TEST_F(Plugin, InspectFindsBothElements)
{
	std::string inspect = xmem::gsttest::tool_path("GST_INSPECT");
	if (inspect.empty())
		GTEST_SKIP() << "gst-inspect-1.0 not found (GST_INSPECT unset)";
	for (const char *element : { "xmemsink", "xmemsrc" }) {
		SCOPED_TRACE(element);
		Process p({ inspect, element });
		EXPECT_EQ(p.wait(std::chrono::seconds(30)), 0) << p.output();
		std::string out = p.output();
		EXPECT_NE(out.find("pool-name"), std::string::npos) << out;
		EXPECT_NE(out.find("libgstxmem"), std::string::npos) << "not the plugin from this build: " << out;
	}
}

TEST_F(Plugin, EveryPropertyHasABlurb)
{
	for (const char *name : { "xmemsink", "xmemsrc" }) {
		SCOPED_TRACE(name);
		GstElement *element = gst_element_factory_make(name, nullptr);
		ASSERT_NE(element, nullptr);
		guint n = 0;
		GParamSpec **specs = g_object_class_list_properties(G_OBJECT_GET_CLASS(element), &n);
		EXPECT_GT(n, 0u);
		for (guint i = 0; i < n; i++) {
			const char *blurb = g_param_spec_get_blurb(specs[i]);
			EXPECT_TRUE(blurb && *blurb && std::string(blurb) != specs[i]->name)
				<< "property '" << specs[i]->name << "' has no blurb";
		}
		g_free(specs);
		for (const char *own : { "pool-name", "stats" })
			EXPECT_NE(g_object_class_find_property(G_OBJECT_GET_CLASS(element), own), nullptr) << own;
		gst_object_unref(element);
	}
}

TEST_F(Plugin, ElementsHaveDocumentedMetadata)
{
	for (const char *name : { "xmemsink", "xmemsrc" }) {
		SCOPED_TRACE(name);
		GstElementFactory *factory = gst_element_factory_find(name);
		ASSERT_NE(factory, nullptr);
		for (const char *key : { GST_ELEMENT_METADATA_LONGNAME, GST_ELEMENT_METADATA_KLASS,
					 GST_ELEMENT_METADATA_DESCRIPTION, GST_ELEMENT_METADATA_AUTHOR }) {
			const char *value = gst_element_factory_get_metadata(factory, key);
			EXPECT_TRUE(value && *value) << key;
		}
		GstPlugin *plugin = gst_plugin_feature_get_plugin(GST_PLUGIN_FEATURE(factory));
		ASSERT_NE(plugin, nullptr);
		EXPECT_STREQ(gst_plugin_get_name(plugin), "xmem");
		gst_object_unref(plugin);
		gst_object_unref(factory);
	}
}

// The elements' policy properties are the library's table (lib/names.cpp), each name with
// its value and its line of help: xmemsink every name a pool takes, "block" included;
// xmemsrc "pool" (0), then each policy's own name, valued 1 + the policy.
TEST_F(Plugin, PolicyPropertiesAreTheLibrarysTable)
{
	auto enum_of = [](const char *element, const char *property) -> GEnumClass * {
		GstElement *e = gst_element_factory_make(element, nullptr);
		if (!e)
			return nullptr;
		GParamSpec *spec = g_object_class_find_property(G_OBJECT_GET_CLASS(e), property);
		GEnumClass *values = spec && G_IS_PARAM_SPEC_ENUM(spec) ? G_PARAM_SPEC_ENUM(spec)->enum_class : nullptr;
		gst_object_unref(e);
		return values;
	};
	GEnumClass *sink = enum_of("xmemsink", "policy");
	GEnumClass *src = enum_of("xmemsrc", "policy");
	ASSERT_NE(sink, nullptr);
	ASSERT_NE(src, nullptr);
	auto names = xmem::policy_names();
	ASSERT_GE(names.size(), 6u);
	EXPECT_EQ(sink->n_values, names.size());
	guint own = 0;
	for (const xmem::PolicyName &p : names) {
		SCOPED_TRACE(p.name);
		ASSERT_NE(p.blurb, nullptr);
		GEnumValue *at_sink = g_enum_get_value_by_nick(sink, p.name);
		ASSERT_NE(at_sink, nullptr);
		EXPECT_EQ(at_sink->value, int(p.policy));
		EXPECT_STREQ(at_sink->value_name, p.blurb);
		GEnumValue *at_src = g_enum_get_value_by_nick(src, p.name);
		if (std::string_view(p.name) != xmem::policy_name(p.policy)) {
			EXPECT_EQ(at_src, nullptr) << "a consumer chooses a policy by its own name";
			continue;
		}
		own++;
		ASSERT_NE(at_src, nullptr);
		EXPECT_EQ(at_src->value, 1 + int(p.policy));
		EXPECT_STREQ(at_src->value_name, p.blurb);
	}
	EXPECT_EQ(src->n_values, 1 + own);
	GEnumValue *pool = g_enum_get_value(src, 0);
	ASSERT_NE(pool, nullptr);
	EXPECT_STREQ(pool->value_nick, "pool");
	// The lookups by name agree: what the elements offer, policy_from_name takes.
	for (guint i = 0; i < sink->n_values; i++)
		EXPECT_EQ(xmem::policy_from_name(sink->values[i].value_nick), xmem::Policy(sink->values[i].value));
}
