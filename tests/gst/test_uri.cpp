// test_uri.cpp - xmem:// URIs (GstURIHandler): the three forms of a pool's name, query
// parameters that set properties, every malformed or unknown part refused with its
// reason, the URI an element reports, and applications that find a source by URI:
// uridecodebin, playbin's element lookup and gst-play-1.0 reading a pool.
#include "gst_common.hpp"

using namespace std::chrono_literals;
using xmem::gsttest::GstTest;
using xmem::gsttest::Pipeline;
using xmem::test::Process;

namespace {

class Uri : public GstTest
{
};

// The element URI makes (TYPE: source or sink), or the error's message.
std::pair<GstElement *, std::string> from_uri(GstURIType type, const char *uri)
{
	GError *error = nullptr;
	GstElement *e = gst_element_make_from_uri(type, uri, nullptr, &error);
	std::string message = error ? error->message : "";
	if (error)
		g_error_free(error);
	return { e, message };
}

std::string string_property(GstElement *e, const char *name)
{
	gchar *value = nullptr;
	g_object_get(e, name, &value, nullptr);
	std::string out = value ? value : "";
	g_free(value);
	return out;
}

std::string enum_nick(GstElement *e, const char *name)
{
	GValue v = G_VALUE_INIT;
	GParamSpec *spec = g_object_class_find_property(G_OBJECT_GET_CLASS(e), name);
	g_value_init(&v, spec->value_type);
	g_object_get_property(G_OBJECT(e), name, &v);
	GEnumValue *value = g_enum_get_value(G_ENUM_CLASS(g_type_class_peek(spec->value_type)), g_value_get_enum(&v));
	g_value_unset(&v);
	return value ? value->value_nick : "";
}

} // namespace

TEST_F(Uri, EachFormNamesItsPoolAndTheQuerySetsProperties)
{
	struct Case {
		const char *uri;
		const char *pool;
		const char *back;
	};
	for (Case c : { Case{ "xmem://cam0", "cam0", "xmem://cam0" }, Case{ "XMEM://cam0", "cam0", "xmem://cam0" },
			Case{ "xmem:///run/x/cam0", "/run/x/cam0", "xmem:///run/x/cam0" },
			Case{ "xmem://@cam0", "@cam0", "xmem://@cam0" },
			Case{ "xmem:///tmp/x%20y/cam0", "/tmp/x y/cam0", "xmem:///tmp/x%20y/cam0" } }) {
		SCOPED_TRACE(c.uri);
		for (GstURIType type : { GST_URI_SRC, GST_URI_SINK }) {
			auto [e, why] = from_uri(type, c.uri);
			ASSERT_NE(e, nullptr) << why;
			EXPECT_STREQ(GST_OBJECT_NAME(gst_element_get_factory(e)),
				     type == GST_URI_SRC ? "xmemsrc" : "xmemsink");
			EXPECT_EQ(string_property(e, "pool-name"), c.pool);
			gchar *uri = gst_uri_handler_get_uri(GST_URI_HANDLER(e));
			EXPECT_STREQ(uri, c.back);
			g_free(uri);
			gst_object_unref(e);
		}
	}
	auto [src, why] =
		from_uri(GST_URI_SRC, "xmem://cam0?policy=latest&queue-size=3&fallback=drop-new&max-age=50000000");
	ASSERT_NE(src, nullptr) << why;
	guint64 max_age = 0;
	g_object_get(src, "max-age", &max_age, nullptr);
	EXPECT_EQ(max_age, 50000000u);
	EXPECT_EQ(enum_nick(src, "policy"), "latest");
	guint queue = 0;
	g_object_get(src, "queue-size", &queue, nullptr);
	EXPECT_EQ(queue, 3u);
	EXPECT_EQ(enum_nick(src, "fallback"), "drop-new");
	gst_object_unref(src);
	auto [capped, capped_why] = from_uri(GST_URI_SRC, "xmem://cam0?max-held=3&history=2");
	ASSERT_NE(capped, nullptr) << capped_why;
	guint max_held = 0, history = 0;
	g_object_get(capped, "max-held", &max_held, "history", &history, nullptr);
	EXPECT_EQ(max_held, 3u);
	EXPECT_EQ(history, 2u);
	gst_object_unref(capped);
	auto [sink, sink_why] = from_uri(GST_URI_SINK, "xmem://cam0?buffers=12&spill-size=1048576");
	ASSERT_NE(sink, nullptr) << sink_why;
	guint slots = 0;
	g_object_get(sink, "buffers", &slots, nullptr);
	EXPECT_EQ(slots, 12u);
	gst_object_unref(sink);
}

TEST_F(Uri, WhatIsMalformedOrUnknownIsRefusedWithTheReason)
{
	struct Case {
		const char *uri;
		const char *because;
	};
	for (Case c :
	     { Case{ "xmem://", "no pool named" }, Case{ "xmem://?policy=latest", "no pool named" },
	       Case{ "xmem://a/b", "neither a plain name" }, Case{ "xmem://cam0#x", "fragment" },
	       Case{ "xmem://cam0?nosuch=1", "unknown parameter 'nosuch'" },
	       Case{ "xmem://cam0?pool-name=other", "its pool in the URI itself" },
	       Case{ "xmem://cam0?policy=bogus", "'bogus' is no value of parameter 'policy'" },
	       Case{ "xmem://cam0?queue-size=many", "'many' is no value of parameter 'queue-size'" },
	       Case{ "xmem://cam0?queue-size", "no PROPERTY=VALUE" }, Case{ "xmem://cam0?stats=1", "read-only" },
	       Case{ "xmem://cam%00", "not a valid escaped string" }, Case{ "xmem://..", "" } }) {
		SCOPED_TRACE(c.uri);
		GstElement *e = gst_element_factory_make("xmemsrc", nullptr);
		ASSERT_NE(e, nullptr);
		GError *error = nullptr;
		EXPECT_FALSE(gst_uri_handler_set_uri(GST_URI_HANDLER(e), c.uri, &error));
		ASSERT_NE(error, nullptr);
		EXPECT_EQ(error->domain, GST_URI_ERROR);
		EXPECT_NE(std::string(error->message).find(c.because), std::string::npos) << error->message;
		EXPECT_NE(std::string(error->message).find("xmem://NAME"), std::string::npos) << "the forms are named";
		g_error_free(error);
		EXPECT_EQ(string_property(e, "pool-name"), "xmem") << "nothing was set";
		gst_object_unref(e);
	}
	// All or none: a bad parameter after a good one leaves the first unset too.
	GstElement *e = gst_element_factory_make("xmemsrc", nullptr);
	EXPECT_FALSE(gst_uri_handler_set_uri(GST_URI_HANDLER(e), "xmem://cam0?queue-size=7&nosuch=1", nullptr));
	guint queue = 1;
	g_object_get(e, "queue-size", &queue, nullptr);
	EXPECT_EQ(queue, 0u);
	gst_object_unref(e);
	auto [none, why] = from_uri(GST_URI_SRC, "xmemx://cam0");
	EXPECT_EQ(none, nullptr);
	// Past READY the pool is in use: a URI is refused, and nothing changes.
	GstElement *sink = gst_element_factory_make("xmemsink", nullptr);
	ASSERT_TRUE(gst_uri_handler_set_uri(GST_URI_HANDLER(sink), "xmem://uri-running", nullptr));
	ASSERT_NE(gst_element_set_state(sink, GST_STATE_PAUSED), GST_STATE_CHANGE_FAILURE);
	GError *error = nullptr;
	EXPECT_FALSE(gst_uri_handler_set_uri(GST_URI_HANDLER(sink), "xmem://other", &error));
	ASSERT_NE(error, nullptr);
	EXPECT_TRUE(g_error_matches(error, GST_URI_ERROR, GST_URI_ERROR_BAD_STATE)) << error->message;
	g_error_free(error);
	EXPECT_EQ(string_property(sink, "pool-name"), "uri-running");
	gst_element_set_state(sink, GST_STATE_NULL);
	gst_object_unref(sink);
}

// uridecodebin finds xmemsrc by the URI and reads the pool an xmemsink publishes.
TEST_F(Uri, UridecodebinReadsAPool)
{
	Pipeline producer("videotestsrc num-buffers=200 is-live=true ! video/x-raw,format=I420,width=64,height=48,"
			  "framerate=100/1 ! xmemsink pool-name=uri-cam");
	ASSERT_TRUE(producer);
	producer.play();
	Pipeline consumer("uridecodebin uri=xmem://uri-cam?policy=fifo ! fakesink name=out signal-handoffs=true");
	ASSERT_TRUE(consumer);
	std::atomic<int> frames{ 0 };
	g_signal_connect(consumer.by_name("out"), "handoff",
			 G_CALLBACK(+[](GstElement *, GstBuffer *, GstPad *, gpointer counter) {
				 (*static_cast<std::atomic<int> *>(counter))++;
			 }),
			 &frames);
	consumer.play();
	EXPECT_TRUE(xmem::test::eventually([&] { return frames.load() >= 10; }, 10000ms)) << frames.load() << " frames";
}

// gst-play-1.0, as a user runs it, plays a pool by its URI.
TEST_F(Uri, GstPlayReadsAPool)
{
	std::string launch = xmem::gsttest::tool_path("GST_LAUNCH");
	if (launch.empty())
		GTEST_SKIP() << "gst-launch-1.0 not found";
	std::string play = launch.substr(0, launch.rfind('/') + 1) + "gst-play-1.0";
	if (::access(play.c_str(), X_OK) != 0)
		GTEST_SKIP() << play << " not found";
	Process producer({ launch, "videotestsrc", "num-buffers=90", "is-live=true", "!",
			   "video/x-raw,format=I420,width=64,height=48,framerate=30/1", "!", "xmemsink",
			   "pool-name=uri-play" });
	// Its errors go to stderr: both streams are read.
	auto play_uri = [&](const char *uri) {
		return Process({ "/bin/sh", "-c", "exec \"$0\" --videosink=fakesink --audiosink=fakesink \"$1\" 2>&1",
				 play, uri });
	};
	Process player = play_uri("xmem://uri-play?policy=fifo");
	// gst-play-1.0 exits 0 whatever happened: what it printed says whether it played.
	EXPECT_EQ(player.wait(30s), 0) << player.output();
	EXPECT_NE(player.output().find("Prerolled"), std::string::npos) << player.output();
	EXPECT_EQ(player.output().find("ERROR"), std::string::npos) << player.output();
	EXPECT_NE(player.output().find("0:00:01"), std::string::npos)
		<< "a second of the stream played: " << player.output();
	EXPECT_EQ(producer.wait(30s), 0) << producer.output();
	// A URI it cannot take is said so.
	Process refused = play_uri("xmem://uri-play?nosuch=1");
	EXPECT_EQ(refused.wait(30s), 0);
	EXPECT_NE(refused.output().find("unknown parameter 'nosuch' (xmemsrc has no property"), std::string::npos)
		<< refused.output();
}
