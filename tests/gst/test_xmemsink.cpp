// test_xmemsink.cpp - xmemsink in a GstHarness, with the core library as the consumer:
// the proposed pool, zero copy vs. copy, metadata, stats, EOS, start-up errors, and
// the wait for consumers (wait-timeout, EOS, pause, Ctrl-C in gst-launch-1.0 -e).
#include "gst_common.hpp"

#include <gst/check/gstharness.h>

#include <cerrno>
#include <csignal>
#include <cstdarg>
#include <fstream>
#include <iterator>

#include <dlfcn.h>
#include <pthread.h>

using namespace std::chrono_literals;
using xmem::gsttest::GstTest;
using xmem::gsttest::Pipeline;
using xmem::gsttest::same_caps;
using xmem::gsttest::stat_u64;
using xmem::test::eventually;
using xmem::test::Process;

namespace {

// While set, every thread start in this process fails (EAGAIN): what std::thread
// turns into std::system_error. Nothing else provokes it here (RLIMIT_NPROC does not
// bind root), so the executable's pthread_create below stands in front of libc's.
std::atomic<bool> fail_thread_start{ false };

} // namespace

extern "C" int pthread_create(pthread_t *thread, const pthread_attr_t *attr, void *(*start)(void *), void *arg) noexcept
{
	using Real = int (*)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);
	static const Real real = reinterpret_cast<Real>(dlsym(RTLD_NEXT, "pthread_create"));
	if (fail_thread_start.load())
		return EAGAIN;
	return real(thread, attr, start, arg);
}

namespace {

constexpr const char *kCaps = "video/x-raw,format=I420,width=64,height=48,framerate=30/1";

// A harness around an xmemsink with PROPERTIES ("pool-name", value, ..., nullptr),
// set before the harness plays it.
GstHarness *sink_harness(const char *first_property, ...)
{
	GstElement *sink = gst_element_factory_make("xmemsink", nullptr);
	EXPECT_NE(sink, nullptr);
	if (!sink)
		return nullptr;
	va_list args;
	va_start(args, first_property);
	g_object_set_valist(G_OBJECT(sink), first_property, args);
	va_end(args);
	GstHarness *h = gst_harness_new_with_element(sink, "sink", nullptr);
	gst_object_unref(sink);
	return h;
}

std::shared_ptr<xmem::BufferPool> open_consumer(const std::string &name)
{
	xmem::OpenOptions options;
	options.timeout = 5s;
	options.queue_size = 8;
	auto pool = xmem::BufferPool::open(name, options);
	EXPECT_TRUE(pool.ok()) << (pool ? "" : pool.error().message);
	return pool ? pool.value() : nullptr;
}

// Fills every visible byte of FRAME with a value that depends on SEED and position.
void paint(GstBuffer *buffer, const GstVideoInfo &info, unsigned seed)
{
	GstVideoFrame frame;
	ASSERT_TRUE(gst_video_frame_map(&frame, const_cast<GstVideoInfo *>(&info), buffer, GST_MAP_WRITE));
	for (guint p = 0; p < GST_VIDEO_FRAME_N_PLANES(&frame); p++) {
		auto *data = static_cast<uint8_t *>(GST_VIDEO_FRAME_PLANE_DATA(&frame, p));
		gint stride = GST_VIDEO_FRAME_PLANE_STRIDE(&frame, p);
		gint row = GST_VIDEO_FRAME_COMP_WIDTH(&frame, p) * GST_VIDEO_FRAME_COMP_PSTRIDE(&frame, p);
		for (gint y = 0; y < GST_VIDEO_FRAME_COMP_HEIGHT(&frame, p); y++)
			for (gint x = 0; x < row; x++)
				data[y * stride + x] = uint8_t(seed * 29 + p * 71 + y * 3 + x);
	}
	gst_video_frame_unmap(&frame);
}

// The consumer's frame as the visible bytes of INFO's default layout, read through
// the plane offsets and strides the frame's metadata announces.
std::vector<uint8_t> frame_visible_bytes(const xmem::BufferGuard &frame, const GstVideoInfo &info)
{
	const auto &m = frame.meta();
	GstVideoInfo layout = info;
	EXPECT_EQ(m.n_planes, GST_VIDEO_INFO_N_PLANES(&info));
	for (guint p = 0; p < m.n_planes && p < GST_VIDEO_MAX_PLANES; p++) {
		layout.offset[p] = m.plane_offset[p];
		layout.stride[p] = gint(m.plane_stride[p]);
	}
	layout.size = m.size;
	GstBuffer *wrapped = gst_buffer_new_memdup(frame.data().data(), m.size);
	std::vector<uint8_t> out = xmem::gsttest::visible_bytes(wrapped, layout);
	gst_buffer_unref(wrapped);
	return out;
}

// Pushes SLOTS frames through harness H and has CONSUMER receive and keep each: the
// consumer then holds every slot of a pool of SLOTS, and the next frame must wait.
std::vector<xmem::BufferGuard> hold_every_slot(GstHarness *h, xmem::BufferPool &consumer, const GstVideoInfo &info,
					       int slots)
{
	std::vector<xmem::BufferGuard> held;
	for (int i = 0; i < slots; i++) {
		EXPECT_EQ(gst_harness_push(h, gst_buffer_new_allocate(nullptr, info.size, nullptr)), GST_FLOW_OK);
		auto frame = consumer.receive(5s);
		EXPECT_TRUE(frame.ok()) << frame.error().message;
		if (frame)
			held.push_back(std::move(*frame));
	}
	return held;
}

// The buffer pool the sink answers an ALLOCATION query with (nullptr if none).
GstBufferPool *query_pool(GstHarness *h, GstCaps *caps, bool *video_meta)
{
	GstQuery *query = gst_query_new_allocation(caps, TRUE);
	EXPECT_TRUE(gst_pad_peer_query(h->srcpad, query));
	GstBufferPool *pool = nullptr;
	if (gst_query_get_n_allocation_pools(query) > 0)
		gst_query_parse_nth_allocation_pool(query, 0, &pool, nullptr, nullptr, nullptr);
	*video_meta = gst_query_find_allocation_meta(query, GST_VIDEO_META_API_TYPE, nullptr);
	gst_query_unref(query);
	return pool;
}

class XmemSink : public GstTest
{
};

} // namespace

TEST_F(XmemSink, ProposesSlotsZeroCopy)
{
	GstHarness *h = sink_harness("pool-name", "zc", "buffers", 4, nullptr);
	ASSERT_NE(h, nullptr);
	gst_harness_set_src_caps_str(h, kCaps);
	GstVideoInfo info = xmem::gsttest::video_info(kCaps);
	auto consumer = open_consumer("zc");
	ASSERT_TRUE(consumer);
	EXPECT_TRUE(same_caps(consumer->format(), kCaps)) << "the pool publishes " << consumer->format();

	GstCaps *caps = gst_caps_from_string(kCaps);
	bool video_meta = false;
	GstBufferPool *pool = query_pool(h, caps, &video_meta);
	gst_caps_unref(caps);
	ASSERT_NE(pool, nullptr) << "xmemsink proposes no pool for raw video";
	EXPECT_TRUE(video_meta) << "xmemsink does not announce GstVideoMeta support";
	EXPECT_TRUE(gst_buffer_pool_has_option(pool, GST_BUFFER_POOL_OPTION_VIDEO_META));
	ASSERT_TRUE(gst_buffer_pool_set_active(pool, TRUE));

	for (unsigned i = 0; i < 6; i++) {
		GstBuffer *buffer = nullptr;
		ASSERT_EQ(gst_buffer_pool_acquire_buffer(pool, &buffer, nullptr), GST_FLOW_OK);
		ASSERT_EQ(gst_buffer_n_memory(buffer), 1u);
		GstMemory *mem = gst_buffer_peek_memory(buffer, 0);
		EXPECT_TRUE(gst_memory_is_type(mem, "XmemMemory")) << "pool buffers are not slots";
		EXPECT_EQ(gst_buffer_get_size(buffer), info.size);
		GstVideoMeta *vmeta = gst_buffer_get_video_meta(buffer);
		ASSERT_NE(vmeta, nullptr) << "pool buffers carry no GstVideoMeta";
		EXPECT_EQ(vmeta->width, 64u);
		EXPECT_EQ(vmeta->height, 48u);
		EXPECT_EQ(vmeta->n_planes, 3u);
		paint(buffer, info, i);
		GST_BUFFER_PTS(buffer) = i * 40 * GST_MSECOND;
		GST_BUFFER_DTS(buffer) = GST_CLOCK_TIME_NONE;
		GST_BUFFER_DURATION(buffer) = 40 * GST_MSECOND;
		if (i)
			GST_BUFFER_FLAG_SET(buffer, GST_BUFFER_FLAG_DELTA_UNIT);
		ASSERT_EQ(gst_harness_push(h, buffer), GST_FLOW_OK);

		auto frame = consumer->receive(5s);
		ASSERT_TRUE(frame.ok()) << frame.error().message;
		const auto &m = frame->meta();
		EXPECT_EQ(m.seq, i + 1);
		EXPECT_EQ(m.pts, i * 40 * GST_MSECOND);
		EXPECT_EQ(m.dts, XMEM_NONE);
		EXPECT_EQ(m.duration, 40 * GST_MSECOND);
		EXPECT_EQ(bool(m.flags & GST_BUFFER_FLAG_DELTA_UNIT), i != 0);
		EXPECT_EQ(m.size, info.size);
		EXPECT_STREQ(m.content_type, "video/x-raw");
		ASSERT_EQ(m.n_planes, 3u);
		for (guint p = 0; p < 3; p++) {
			EXPECT_EQ(m.plane_offset[p], info.offset[p]) << "plane " << p;
			EXPECT_EQ(m.plane_stride[p], guint32(info.stride[p])) << "plane " << p;
		}
		GstBuffer *expected = gst_buffer_new_allocate(nullptr, info.size, nullptr);
		paint(expected, info, i);
		EXPECT_EQ(frame_visible_bytes(*frame, info), xmem::gsttest::visible_bytes(expected, info))
			<< "frame " << i;
		gst_buffer_unref(expected);
	}

	GstElement *sink = h->element;
	EXPECT_EQ(stat_u64(sink, "zero-copy"), 6u) << "pool buffers were not published in place";
	EXPECT_EQ(stat_u64(sink, "copied"), 0u);
	EXPECT_EQ(stat_u64(sink, "published"), 6u);
	EXPECT_EQ(stat_u64(sink, "slots"), 4u);
	EXPECT_EQ(stat_u64(sink, "consumers"), 1u);
	EXPECT_EQ(stat_u64(sink, "dropped"), 0u);
	EXPECT_TRUE(eventually([&] { return stat_u64(sink, "free-slots") == 4; }))
		<< "slots still held after every frame was received and released";

	gst_buffer_pool_set_active(pool, FALSE);
	gst_object_unref(pool);
	consumer.reset();
	gst_harness_teardown(h);
	EXPECT_TRUE(dir_.entries().empty()) << "the pool's socket outlives the sink";
}

// Caps change to frames larger than the slots: the sink adds a size class to its
// pool (with memory-cap, the pool makes slots of the new size on demand), proposes a pool
// of slots of the new size, and upstream's buffers from it are published in place like
// the first ones, to a consumer that never reattached.
static void larger_caps_stay_zero_copy(const char *name, guint64 memory_cap)
{
	GstHarness *h = sink_harness("pool-name", name, "buffers", 4, "memory-cap", memory_cap, nullptr);
	ASSERT_NE(h, nullptr);
	gst_harness_set_src_caps_str(h, kCaps);
	auto consumer = open_consumer(name);
	ASSERT_TRUE(consumer);
	const char *larger = "video/x-raw,format=I420,width=128,height=96,framerate=30/1";
	for (const char *caps_str : { kCaps, larger }) {
		SCOPED_TRACE(caps_str);
		gst_harness_set_src_caps_str(h, caps_str);
		GstVideoInfo info = xmem::gsttest::video_info(caps_str);
		GstCaps *caps = gst_caps_from_string(caps_str);
		bool video_meta = false;
		GstBufferPool *pool = query_pool(h, caps, &video_meta);
		gst_caps_unref(caps);
		ASSERT_NE(pool, nullptr) << "xmemsink proposes no pool for these caps";
		ASSERT_TRUE(gst_buffer_pool_set_active(pool, TRUE));
		for (unsigned i = 0; i < 3; i++) {
			GstBuffer *buffer = nullptr;
			ASSERT_EQ(gst_buffer_pool_acquire_buffer(pool, &buffer, nullptr), GST_FLOW_OK);
			EXPECT_EQ(gst_buffer_get_size(buffer), info.size);
			paint(buffer, info, i);
			ASSERT_EQ(gst_harness_push(h, buffer), GST_FLOW_OK);
			auto frame = consumer->receive(5s);
			ASSERT_TRUE(frame.ok()) << frame.error().message;
			EXPECT_EQ(frame->meta().size, info.size);
			// Class 0 holds slots 0-3; the larger frames come from class 1.
			EXPECT_EQ(frame->index() >= 4, caps_str == larger) << "slot " << frame->index();
			EXPECT_TRUE(same_caps(consumer->format(), caps_str)) << consumer->format();
			GstBuffer *expected = gst_buffer_new_allocate(nullptr, info.size, nullptr);
			paint(expected, info, i);
			EXPECT_EQ(frame_visible_bytes(*frame, info), xmem::gsttest::visible_bytes(expected, info))
				<< "frame " << i;
			gst_buffer_unref(expected);
		}
		gst_buffer_pool_set_active(pool, FALSE);
		gst_object_unref(pool);
	}
	EXPECT_EQ(stat_u64(h->element, "zero-copy"), 6u) << "pool buffers were not published in place";
	EXPECT_EQ(stat_u64(h->element, "classes"), 2u);
	EXPECT_EQ(stat_u64(h->element, "recreated"), 0u);
	auto classes = consumer->classes();
	ASSERT_EQ(classes.size(), 2u);
	EXPECT_EQ(classes[1].dynamic, memory_cap != 0);
	// Preallocated: `buffers` slots of the larger size. Made on demand: only those the
	// frames needed at once (upstream's pool holds a few).
	if (memory_cap)
		EXPECT_LE(stat_u64(h->element, "slots"), 8u);
	else
		EXPECT_EQ(stat_u64(h->element, "slots"), 8u);
	consumer.reset();
	gst_harness_teardown(h);
}

TEST_F(XmemSink, LargerCapsGetASizeClassStillZeroCopy)
{
	larger_caps_stay_zero_copy("zcgrow", 0);
}

TEST_F(XmemSink, LargerCapsGetSlotsMadeOnDemandStillZeroCopy)
{
	larger_caps_stay_zero_copy("zcgrow-cap", 8 << 20);
}

TEST_F(XmemSink, CopiesForeignBuffersOnce)
{
	GstHarness *h = sink_harness("pool-name", "copy", nullptr);
	ASSERT_NE(h, nullptr);
	gst_harness_set_src_caps_str(h, kCaps);
	GstVideoInfo info = xmem::gsttest::video_info(kCaps);
	auto consumer = open_consumer("copy");
	ASSERT_TRUE(consumer);

	// One buffer in the caps' own layout, one with padded rows (described by its
	// GstVideoMeta), as a decoder with its own pool would hand over.
	for (unsigned i = 0; i < 2; i++) {
		GstBuffer *buffer;
		GstVideoInfo layout = info;
		if (i == 0) {
			buffer = gst_buffer_new_allocate(nullptr, info.size, nullptr);
		} else {
			gsize offset = 0;
			for (guint p = 0; p < 3; p++) {
				layout.stride[p] = info.stride[p] + 32;
				layout.offset[p] = offset;
				offset += gsize(layout.stride[p]) * GST_VIDEO_INFO_COMP_HEIGHT(&info, p) + 64;
			}
			layout.size = offset;
			buffer = gst_buffer_new_allocate(nullptr, layout.size, nullptr);
			gst_buffer_memset(buffer, 0, 0xee, layout.size);
			gst_buffer_add_video_meta_full(buffer, GST_VIDEO_FRAME_FLAG_NONE, GST_VIDEO_FORMAT_I420, 64, 48,
						       3, layout.offset, layout.stride);
		}
		paint(buffer, layout, 100 + i);
		GST_BUFFER_PTS(buffer) = (i + 1) * GST_SECOND;
		GST_BUFFER_DURATION(buffer) = GST_SECOND / 30;
		ASSERT_EQ(gst_harness_push(h, buffer), GST_FLOW_OK);

		auto frame = consumer->receive(5s);
		ASSERT_TRUE(frame.ok()) << frame.error().message;
		EXPECT_EQ(frame->meta().pts, (i + 1) * GST_SECOND);
		EXPECT_EQ(frame->meta().size, info.size) << "a copied frame has the caps' default layout";
		GstBuffer *expected = gst_buffer_new_allocate(nullptr, info.size, nullptr);
		paint(expected, info, 100 + i);
		EXPECT_EQ(frame_visible_bytes(*frame, info), xmem::gsttest::visible_bytes(expected, info))
			<< "frame " << i;
		gst_buffer_unref(expected);
	}
	EXPECT_EQ(stat_u64(h->element, "copied"), 2u);
	EXPECT_EQ(stat_u64(h->element, "zero-copy"), 0u);
	EXPECT_EQ(stat_u64(h->element, "published"), 2u);
	consumer.reset();
	gst_harness_teardown(h);
}

// A buffer's capture time (a camera's, or one a bridge carried from another host) as a
// timestamp/x-ntp or timestamp/x-unix reference timestamp becomes the frame's
// capture_time (realtime ns since 1970), which library consumers read; none: 0.
TEST_F(XmemSink, AReferenceTimestampBecomesTheFramesCaptureTime)
{
	GstHarness *h = sink_harness("pool-name", "captime", nullptr);
	ASSERT_NE(h, nullptr);
	gst_harness_set_src_caps_str(h, kCaps);
	GstVideoInfo info = xmem::gsttest::video_info(kCaps);
	auto consumer = open_consumer("captime");
	ASSERT_TRUE(consumer);
	const guint64 unix_ns = 1'795'000'000'123'456'789ULL; // 2026
	const guint64 ntp_to_unix = 2'208'988'800ULL * GST_SECOND;
	struct Case {
		const char *reference; // nullptr: no reference timestamp
		guint64 timestamp;
		guint64 capture_time;
	};
	const Case cases[] = {
		{ "timestamp/x-ntp", unix_ns + ntp_to_unix, unix_ns },
		{ "timestamp/x-unix", unix_ns + 1, unix_ns + 1 },
		{ nullptr, 0, 0 },
		{ "timestamp/x-ntp", 5 * GST_SECOND, 0 }, // before 1970: unknown
	};
	for (const Case &c : cases) {
		GstBuffer *buffer = gst_buffer_new_allocate(nullptr, info.size, nullptr);
		if (c.reference) {
			GstCaps *caps = gst_caps_new_empty_simple(c.reference);
			gst_buffer_add_reference_timestamp_meta(buffer, caps, c.timestamp, GST_CLOCK_TIME_NONE);
			gst_caps_unref(caps);
		}
		ASSERT_EQ(gst_harness_push(h, buffer), GST_FLOW_OK);
		auto frame = consumer->receive(5s);
		ASSERT_TRUE(frame.ok()) << frame.error().message;
		EXPECT_EQ(frame->meta().capture_time, c.capture_time) << (c.reference ? c.reference : "none");
	}
	consumer.reset();
	gst_harness_teardown(h);
}

TEST_F(XmemSink, StatsStructureHasEveryField)
{
	GstHarness *h = sink_harness("pool-name", "stats", "buffers", 3, nullptr);
	ASSERT_NE(h, nullptr);
	GstStructure *s = xmem::gsttest::get_stats(h->element);
	ASSERT_NE(s, nullptr) << "stats is NULL before any caps";
	for (const char *field : { "published", "dropped", "consumers", "free-slots", "slots", "reaped", "zero-copy",
				   "copied", "device-copied", "classes", "recreated", "memory" })
		EXPECT_TRUE(gst_structure_has_field(s, field)) << field;
	gst_structure_free(s);

	gst_harness_set_src_caps_str(h, kCaps);
	EXPECT_EQ(stat_u64(h->element, "slots"), 3u);
	EXPECT_EQ(stat_u64(h->element, "free-slots"), 3u);
	EXPECT_EQ(stat_u64(h->element, "consumers"), 0u);
	auto consumer = open_consumer("stats");
	ASSERT_TRUE(consumer);
	EXPECT_TRUE(eventually([&] { return stat_u64(h->element, "consumers") == 1; }));
	consumer.reset();
	gst_harness_teardown(h);
}

TEST_F(XmemSink, EosReachesCoreConsumer)
{
	GstHarness *h = sink_harness("pool-name", "eos", nullptr);
	ASSERT_NE(h, nullptr);
	gst_harness_set_src_caps_str(h, kCaps);
	GstVideoInfo info = xmem::gsttest::video_info(kCaps);
	auto consumer = open_consumer("eos");
	ASSERT_TRUE(consumer);
	GstBuffer *buffer = gst_buffer_new_allocate(nullptr, info.size, nullptr);
	paint(buffer, info, 7);
	ASSERT_EQ(gst_harness_push(h, buffer), GST_FLOW_OK);
	ASSERT_TRUE(gst_harness_push_event(h, gst_event_new_eos()));

	auto frame = consumer->receive(5s);
	ASSERT_TRUE(frame.ok()) << "the frame before EOS is lost: " << frame.error().message;
	auto end = consumer->receive(5s);
	EXPECT_EQ(end.code(), xmem::Errc::end_of_stream) << (end ? "a frame" : end.error().message);
	consumer.reset();
	gst_harness_teardown(h);
}

// Going to NULL must not wait for a consumer that never comes.
TEST_F(XmemSink, NullNeverBlocksWhileWaitingForConsumers)
{
	GstHarness *h = sink_harness("pool-name", "waiting", "wait-for-consumers", 1, nullptr);
	ASSERT_NE(h, nullptr);
	gst_harness_set_src_caps_str(h, kCaps);
	GstVideoInfo info = xmem::gsttest::video_info(kCaps);
	std::atomic<int> result{ 1000 };
	GstBuffer *buffer = gst_buffer_new_allocate(nullptr, info.size, nullptr);
	std::thread pusher([&] { result = gst_harness_push(h, buffer); });
	std::this_thread::sleep_for(200ms);
	EXPECT_EQ(result.load(), 1000) << "the first frame did not wait for a consumer";
	auto t0 = std::chrono::steady_clock::now();
	EXPECT_EQ(gst_element_set_state(h->element, GST_STATE_NULL), GST_STATE_CHANGE_SUCCESS);
	pusher.join();
	EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
	EXPECT_EQ(result.load(), GST_FLOW_FLUSHING);
	gst_harness_teardown(h);
	EXPECT_TRUE(dir_.entries().empty());
}

// Nor for consumers that hold every slot.
TEST_F(XmemSink, NullNeverBlocksWhenConsumersHoldEverySlot)
{
	GstHarness *h = sink_harness("pool-name", "held", "buffers", 2, nullptr);
	ASSERT_NE(h, nullptr);
	gst_harness_set_src_caps_str(h, kCaps);
	GstVideoInfo info = xmem::gsttest::video_info(kCaps);
	auto consumer = open_consumer("held");
	ASSERT_TRUE(consumer);
	std::vector<xmem::BufferGuard> held = hold_every_slot(h, *consumer, info, 2);
	ASSERT_EQ(held.size(), 2u);
	std::atomic<int> result{ 1000 };
	GstBuffer *buffer = gst_buffer_new_allocate(nullptr, info.size, nullptr);
	std::thread pusher([&] { result = gst_harness_push(h, buffer); });
	std::this_thread::sleep_for(200ms);
	EXPECT_EQ(result.load(), 1000) << "a frame was published although the consumer holds every slot";
	auto t0 = std::chrono::steady_clock::now();
	EXPECT_EQ(gst_element_set_state(h->element, GST_STATE_NULL), GST_STATE_CHANGE_SUCCESS);
	pusher.join();
	EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
	EXPECT_EQ(result.load(), GST_FLOW_FLUSHING);
	// The frames the consumer holds stay readable after the owner went away.
	for (auto &g : held)
		EXPECT_EQ(g.data().size(), info.size);
	held.clear();
	consumer.reset();
	gst_harness_teardown(h);
}

// Pausing while the frame waits for a slot (the consumer holds every one) keeps the
// frame and the stream: once PLAYING again, the slot the consumer lets go carries it.
// basesink's PLAYING -> PAUSED calls unlock(); ending render() with FLUSHING there
// would drop the frame and stop upstream's task for good.
TEST_F(XmemSink, PauseWhileEverySlotIsHeldKeepsTheFrame)
{
	GstHarness *h = sink_harness("pool-name", "pauseheld", "buffers", 2, nullptr);
	ASSERT_NE(h, nullptr);
	gst_harness_set_src_caps_str(h, kCaps);
	GstVideoInfo info = xmem::gsttest::video_info(kCaps);
	auto consumer = open_consumer("pauseheld");
	ASSERT_TRUE(consumer);
	std::vector<xmem::BufferGuard> held = hold_every_slot(h, *consumer, info, 2);
	ASSERT_EQ(held.size(), 2u);
	std::atomic<int> result{ 1000 };
	GstBuffer *buffer = gst_buffer_new_allocate(nullptr, info.size, nullptr);
	paint(buffer, info, 5);
	std::thread pusher([&] { result = gst_harness_push(h, buffer); });
	std::this_thread::sleep_for(200ms);
	EXPECT_NE(gst_element_set_state(h->element, GST_STATE_PAUSED), GST_STATE_CHANGE_FAILURE);
	std::this_thread::sleep_for(300ms);
	EXPECT_EQ(result.load(), 1000) << "pausing ended the wait for a slot with "
				       << gst_flow_get_name(GstFlowReturn(result.load()));
	EXPECT_NE(gst_element_set_state(h->element, GST_STATE_PLAYING), GST_STATE_CHANGE_FAILURE);
	std::this_thread::sleep_for(100ms);
	held.clear(); // a slot comes free only now, in PLAYING
	auto frame = consumer->receive(10s);
	EXPECT_TRUE(frame.ok()) << "the waiting frame never came: " << frame.error().message;
	if (frame.ok()) {
		GstBuffer *expected = gst_buffer_new_allocate(nullptr, info.size, nullptr);
		paint(expected, info, 5);
		EXPECT_EQ(frame_visible_bytes(*frame, info), xmem::gsttest::visible_bytes(expected, info));
		gst_buffer_unref(expected);
	}
	if (!eventually([&] { return result.load() != 1000; }, 10s)) {
		ADD_FAILURE() << "the push never returned";
		gst_element_set_state(h->element, GST_STATE_NULL); /* so that the pusher returns */
	}
	pusher.join();
	EXPECT_EQ(result.load(), GST_FLOW_OK) << gst_flow_get_name(GstFlowReturn(result.load()));
	// And the stream goes on.
	EXPECT_EQ(gst_harness_push(h, gst_buffer_new_allocate(nullptr, info.size, nullptr)), GST_FLOW_OK);
	consumer.reset();
	gst_harness_teardown(h);
}

// Where no CUDA device can hold a pool (no driver here; tests/gst/test_cuda_gst.cpp
// covers the causes on the simulator).
TEST_F(XmemSink, CudaMemoryWithoutDeviceFailsToStartWithAnError)
{
	if (xmem::cuda_check_device(0))
		GTEST_SKIP() << "this machine has a usable CUDA device";
	Pipeline p("xmemsink name=sink pool-name=cuda memory=cuda");
	ASSERT_TRUE(p);
	EXPECT_EQ(p.play(), GST_STATE_CHANGE_FAILURE);
	auto error = p.wait_error(5s);
	ASSERT_TRUE(error) << "no error message for memory=cuda";
	EXPECT_EQ(error->source, "sink");
	EXPECT_NE(error->all().find("cuda"), std::string::npos) << error->all();
	EXPECT_TRUE(dir_.entries().empty()) << "a pool was created for memory=cuda";
}

TEST_F(XmemSink, BadPoolNameFailsWithTheCause)
{
	struct Case {
		std::string name;
		const char *cause;
	};
	std::vector<Case> cases = {
		{ "", "empty" },
		{ "bad name!", "illegal character" },
		{ std::string(300, 'x'), "longer than" },
	};
	for (const auto &c : cases) {
		SCOPED_TRACE("pool-name '" + c.name + "'");
		Pipeline p("xmemsink name=sink");
		ASSERT_TRUE(p);
		g_object_set(p.by_name("sink"), "pool-name", c.name.c_str(), nullptr);
		EXPECT_EQ(p.play(), GST_STATE_CHANGE_FAILURE);
		auto error = p.wait_error(5s);
		ASSERT_TRUE(error) << "no error message";
		EXPECT_EQ(error->domain, GST_RESOURCE_ERROR);
		EXPECT_EQ(error->code, GST_RESOURCE_ERROR_SETTINGS);
		EXPECT_NE(error->all().find(c.cause), std::string::npos) << error->all();
		if (!c.name.empty()) {
			EXPECT_NE(error->all().find(c.name), std::string::npos) << "the error does not name the pool";
		}
	}
}

// Upstream waiting for a slot (every one held by a consumer) is flushed too.
TEST_F(XmemSink, NullNeverBlocksWhenUpstreamWaitsForASlot)
{
	Pipeline p("videotestsrc is-live=true ! video/x-raw,format=I420,width=64,height=48,framerate=50/1 ! "
		   "xmemsink name=sink pool-name=starved buffers=2");
	ASSERT_TRUE(p);
	ASSERT_NE(p.play(), GST_STATE_CHANGE_FAILURE);
	xmem::OpenOptions options;
	options.timeout = 10s;
	auto opened = xmem::BufferPool::open("starved", options);
	ASSERT_TRUE(opened.ok()) << opened.error().message;
	std::vector<xmem::BufferGuard> held;
	while (held.size() < 2) {
		auto frame = (*opened)->receive(10s);
		ASSERT_TRUE(frame.ok()) << frame.error().message;
		held.push_back(std::move(*frame));
	}
	GstElement *sink = p.by_name("sink");
	std::this_thread::sleep_for(200ms);
	EXPECT_EQ(stat_u64(sink, "free-slots"), 0u);
	guint64 published = stat_u64(sink, "published");
	std::this_thread::sleep_for(200ms);
	EXPECT_EQ(stat_u64(sink, "published"), published) << "frames published although every slot is held";
	auto t0 = std::chrono::steady_clock::now();
	EXPECT_EQ(p.stop(), GST_STATE_CHANGE_SUCCESS);
	EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
	held.clear();
}

// Frames that are not raw video are copied in whole, with their caps as the format.
TEST_F(XmemSink, NonVideoBuffersAreCopied)
{
	GstHarness *h = sink_harness("pool-name", "bytes", nullptr);
	ASSERT_NE(h, nullptr);
	gst_harness_set_src_caps_str(h, "application/x-xmem-test,answer=(int)42");
	GstBuffer *buffer = gst_buffer_new_allocate(nullptr, 1000, nullptr);
	gst_buffer_memset(buffer, 0, 0x5a, 1000);
	GST_BUFFER_PTS(buffer) = 7 * GST_SECOND;
	ASSERT_EQ(gst_harness_push(h, buffer), GST_FLOW_OK);
	auto consumer = open_consumer("bytes");
	ASSERT_TRUE(consumer);
	EXPECT_TRUE(same_caps(consumer->format(), "application/x-xmem-test,answer=(int)42")) << consumer->format();
	buffer = gst_buffer_new_allocate(nullptr, 1000, nullptr);
	gst_buffer_memset(buffer, 0, 0xa5, 1000);
	GST_BUFFER_PTS(buffer) = 8 * GST_SECOND;
	ASSERT_EQ(gst_harness_push(h, buffer), GST_FLOW_OK);
	auto frame = consumer->receive(5s);
	ASSERT_TRUE(frame.ok()) << frame.error().message;
	EXPECT_EQ(frame->meta().size, 1000u);
	EXPECT_EQ(frame->meta().pts, 8 * GST_SECOND);
	EXPECT_EQ(frame->meta().n_planes, 0u);
	size_t wrong = 0;
	for (size_t i = 0; i < 1000; i++)
		wrong += frame->data()[i] != std::byte(0xa5);
	EXPECT_EQ(wrong, 0u);
	EXPECT_EQ(stat_u64(h->element, "copied"), 2u);

	// A larger buffer than any slot: a size class of its size, and every byte arrives.
	buffer = gst_buffer_new_allocate(nullptr, 100000, nullptr);
	gst_buffer_memset(buffer, 0, 0x3c, 100000);
	ASSERT_EQ(gst_harness_push(h, buffer), GST_FLOW_OK);
	frame = consumer->receive(5s);
	ASSERT_TRUE(frame.ok()) << frame.error().message;
	ASSERT_EQ(frame->meta().size, 100000u);
	wrong = 0;
	for (size_t i = 0; i < 100000; i++)
		wrong += frame->data()[i] != std::byte(0x3c);
	EXPECT_EQ(wrong, 0u);
	EXPECT_EQ(stat_u64(h->element, "classes"), 2u);
	EXPECT_EQ(stat_u64(h->element, "recreated"), 0u);
	consumer.reset();
	gst_harness_teardown(h);
}

// basesink's last sample would keep a reference to the last frame's slot: one slot
// never free while the sink runs, and with buffers=1 upstream waiting forever.
// xmemsink turns it off by default.
TEST_F(XmemSink, LastSampleHoldsNoSlot)
{
	Pipeline p("videotestsrc num-buffers=5 ! video/x-raw,format=I420,width=64,height=48 ! "
		   "xmemsink name=sink pool-name=one buffers=1");
	ASSERT_TRUE(p);
	ASSERT_NE(p.play(), GST_STATE_CHANGE_FAILURE);
	EXPECT_EQ(p.wait_eos(10s), "") << "a one-slot pool stalls: the last sample holds its slot";
	EXPECT_EQ(stat_u64(p.by_name("sink"), "free-slots"), 1u);
}

// wait-timeout: with no consumer, the first frame waits that long; then the sink
// warns and publishes without them, so the stream goes on and ends.
TEST_F(XmemSink, WaitTimeoutWarnsAndPublishesWithoutConsumers)
{
	Pipeline p("videotestsrc num-buffers=3 ! video/x-raw,format=I420,width=64,height=48 ! "
		   "xmemsink name=sink pool-name=alone wait-for-consumers=1 wait-timeout=300000000");
	ASSERT_TRUE(p);
	guint64 timeout = 0;
	g_object_get(p.by_name("sink"), "wait-timeout", &timeout, nullptr);
	EXPECT_EQ(timeout, 300000000u);
	auto t0 = std::chrono::steady_clock::now();
	ASSERT_NE(p.play(), GST_STATE_CHANGE_FAILURE);
	GstMessage *msg = p.pop(GstMessageType(GST_MESSAGE_WARNING | GST_MESSAGE_ERROR | GST_MESSAGE_EOS), 30s);
	ASSERT_NE(msg, nullptr) << "the sink still waits after wait-timeout";
	EXPECT_EQ(GST_MESSAGE_TYPE(msg), GST_MESSAGE_WARNING) << GST_MESSAGE_TYPE_NAME(msg);
	if (GST_MESSAGE_TYPE(msg) == GST_MESSAGE_WARNING) {
		GError *error = nullptr;
		gchar *debug = nullptr;
		gst_message_parse_warning(msg, &error, &debug);
		std::string text = std::string(error->message) + " | " + (debug ? debug : "");
		EXPECT_NE(text.find("No consumer attached within 0.3 s"), std::string::npos) << text;
		EXPECT_NE(text.find("alone"), std::string::npos) << "the warning does not name the pool: " << text;
		EXPECT_STREQ(GST_OBJECT_NAME(GST_MESSAGE_SRC(msg)), "sink");
		g_error_free(error);
		g_free(debug);
	}
	gst_message_unref(msg);
	EXPECT_GE(std::chrono::steady_clock::now() - t0, 300ms) << "the first frame did not wait";
	EXPECT_EQ(p.wait_eos(30s), "") << "the stream did not end after the wait";
	GstElement *sink = p.by_name("sink");
	EXPECT_EQ(stat_u64(sink, "published"), 3u) << "frames were lost after the wait";
	EXPECT_EQ(stat_u64(sink, "consumers"), 0u);
}

// gst-launch-1.0 -e turns Ctrl-C into an EOS sent to the sources, whose thread is the
// one waiting in the sink: with wait-timeout the wait ends, the EOS passes and the
// process exits cleanly (without it, it would wait for a consumer forever).
TEST_F(XmemSink, GstLaunchInterruptedWhileWaitingExitsCleanly)
{
	std::string launch = xmem::gsttest::tool_path("GST_LAUNCH");
	if (launch.empty())
		GTEST_SKIP() << "gst-launch-1.0 not found (GST_LAUNCH unset)";
	// The sink's log says when the first frame is at the wait: Ctrl-C any earlier can
	// meet the live sink's preroll, where gst-launch-1.0 itself deadlocks (it holds the
	// pipeline's state lock while the sink waits for PLAYING), whatever the sink.
	std::string log = dir_.path() + "/launch.log";
	Process p({ "/usr/bin/env", "GST_DEBUG=xmemsink:4", "GST_DEBUG_FILE=" + log, launch, "-e", "videotestsrc",
		    "is-live=true", "!", "video/x-raw,format=I420,width=64,height=48,framerate=30/1", "!", "xmemsink",
		    "pool-name=ctrlc", "wait-for-consumers=1", "wait-timeout=3000000000" });
	auto logged = [&](const std::string &text) {
		std::ifstream in(log);
		return std::string(std::istreambuf_iterator<char>(in), {}).find(text) != std::string::npos;
	};
	ASSERT_TRUE(eventually([&] { return logged("waiting for 1 consumer(s) of pool 'ctrlc'"); }, 30s))
		<< "the first frame never reached the wait:\n"
		<< p.output();
	auto t0 = std::chrono::steady_clock::now();
	p.signal(SIGINT);
	int status = p.wait(20s);
	EXPECT_EQ(status, 0) << "gst-launch-1.0 -e did not end cleanly after Ctrl-C (-1: still running):\n"
			     << p.output();
	EXPECT_NE(p.output().find("Got EOS"), std::string::npos) << p.output();
	EXPECT_LT(std::chrono::steady_clock::now() - t0, 20s);
	EXPECT_TRUE(eventually([&] { return dir_.entries().empty(); })) << "the pool outlives its producer";
}

// An EOS sent to the sink element ends the wait at once: the waiting frame is not
// published, and render() says EOS so upstream ends the stream.
TEST_F(XmemSink, EosSentToTheSinkEndsTheWait)
{
	GstHarness *h = sink_harness("pool-name", "eoswait", "wait-for-consumers", 1, nullptr);
	ASSERT_NE(h, nullptr);
	gst_harness_set_src_caps_str(h, kCaps);
	GstVideoInfo info = xmem::gsttest::video_info(kCaps);
	std::atomic<int> result{ 1000 };
	GstBuffer *buffer = gst_buffer_new_allocate(nullptr, info.size, nullptr);
	std::thread pusher([&] { result = gst_harness_push(h, buffer); });
	std::this_thread::sleep_for(200ms);
	EXPECT_EQ(result.load(), 1000) << "the first frame did not wait for a consumer";
	gst_element_send_event(h->element, gst_event_new_eos());
	if (!eventually([&] { return result.load() != 1000; }, 10s)) {
		ADD_FAILURE() << "the EOS did not end the wait";
		gst_element_set_state(h->element, GST_STATE_NULL); /* so that the pusher returns */
	}
	pusher.join();
	EXPECT_EQ(result.load(), GST_FLOW_EOS);
	EXPECT_EQ(stat_u64(h->element, "published"), 0u);
	gst_harness_teardown(h);
	EXPECT_TRUE(dir_.entries().empty());
}

// Pausing during the wait holds the frame (basesink's preroll), and it goes on
// waiting once PLAYING again: the consumer that comes then gets it.
TEST_F(XmemSink, PauseDuringTheWaitKeepsTheFrame)
{
	GstHarness *h = sink_harness("pool-name", "pausewait", "wait-for-consumers", 1, nullptr);
	ASSERT_NE(h, nullptr);
	gst_harness_set_src_caps_str(h, kCaps);
	GstVideoInfo info = xmem::gsttest::video_info(kCaps);
	std::atomic<int> result{ 1000 };
	GstBuffer *buffer = gst_buffer_new_allocate(nullptr, info.size, nullptr);
	paint(buffer, info, 3);
	std::thread pusher([&] { result = gst_harness_push(h, buffer); });
	std::this_thread::sleep_for(200ms);
	EXPECT_NE(gst_element_set_state(h->element, GST_STATE_PAUSED), GST_STATE_CHANGE_FAILURE);
	std::this_thread::sleep_for(200ms);
	EXPECT_EQ(result.load(), 1000) << "pausing ended the wait with "
				       << gst_flow_get_name(GstFlowReturn(result.load()));
	EXPECT_NE(gst_element_set_state(h->element, GST_STATE_PLAYING), GST_STATE_CHANGE_FAILURE);
	auto consumer = open_consumer("pausewait");
	ASSERT_TRUE(consumer);
	auto frame = consumer->receive(10s);
	ASSERT_TRUE(frame.ok()) << "the held frame never came: " << frame.error().message;
	GstBuffer *expected = gst_buffer_new_allocate(nullptr, info.size, nullptr);
	paint(expected, info, 3);
	EXPECT_EQ(frame_visible_bytes(*frame, info), xmem::gsttest::visible_bytes(expected, info));
	gst_buffer_unref(expected);
	pusher.join();
	EXPECT_EQ(result.load(), GST_FLOW_OK);
	consumer.reset();
	gst_harness_teardown(h);
}

// A thread the core cannot start (std::system_error from std::thread, or the error the
// core makes of it) reaches the application as an error message: no exception unwinds
// through GStreamer, the caps are refused, and the sink works once threads start again.
TEST_F(XmemSink, ThreadStartFailureIsAnErrorMessage)
{
	GstHarness *h = sink_harness("pool-name", "nothread", nullptr);
	ASSERT_NE(h, nullptr);
	GstBus *bus = gst_bus_new();
	gst_element_set_bus(h->element, bus);
	gst_pad_push_event(h->srcpad, gst_event_new_stream_start("nothread"));
	fail_thread_start = true;
	gst_pad_push_event(h->srcpad, gst_event_new_caps(gst_caps_from_string(kCaps)));
	fail_thread_start = false;
	GstPad *sinkpad = gst_element_get_static_pad(h->element, "sink");
	GstCaps *taken = gst_pad_get_current_caps(sinkpad);
	EXPECT_EQ(taken, nullptr) << "the sink took caps without a pool";
	if (taken)
		gst_caps_unref(taken);
	GstMessage *msg = gst_bus_pop_filtered(bus, GST_MESSAGE_ERROR);
	ASSERT_NE(msg, nullptr) << "no error message";
	auto error = xmem::gsttest::parse_error(msg);
	gst_message_unref(msg);
	EXPECT_EQ(error.source, GST_OBJECT_NAME(h->element));
	EXPECT_FALSE(error.debug.empty()) << error.all();

	gst_pad_push_event(h->srcpad, gst_event_new_caps(gst_caps_from_string(kCaps)));
	taken = gst_pad_get_current_caps(sinkpad);
	EXPECT_NE(taken, nullptr) << "the sink does not recover";
	if (taken)
		gst_caps_unref(taken);
	gst_object_unref(sinkpad);
	auto consumer = open_consumer("nothread");
	ASSERT_TRUE(consumer);
	consumer.reset();
	gst_element_set_bus(h->element, nullptr);
	gst_object_unref(bus);
	gst_harness_teardown(h);
}
