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
