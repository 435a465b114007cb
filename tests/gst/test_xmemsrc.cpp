// test_xmemsrc.cpp - xmemsrc in a GstHarness against a core-library producer: caps
// before the first frame, metadata, slot lifetime, copy-on-write; and its errors.
#include "gst_common.hpp"

#include <functional>

#include <gst/check/gstharness.h>

using namespace std::chrono_literals;
using xmem::gsttest::GstTest;
using xmem::gsttest::Pipeline;
using xmem::gsttest::same_caps;
using xmem::gsttest::stat_u64;
using xmem::test::eventually;
using xmem::test::Process;

namespace {

constexpr const char *kCaps = "video/x-raw,format=I420,width=64,height=48,framerate=30/1";

// A producer whose frames have padded rows: what a decoder's pool would publish.
struct Layout {
	guint32 stride[3] = { 96, 48, 48 };
	guint64 offset[3] = { 0, 96 * 48 + 128, 96 * 48 + 128 + 48 * 24 + 64 };
	guint64 size = 96 * 48 + 128 + 48 * 24 + 64 + 48 * 24;
};

std::shared_ptr<xmem::BufferPool> make_producer(const std::string &name, uint32_t slots = 4,
						const std::string &format = kCaps)
{
	xmem::PoolConfig config;
	config.slot_count = slots;
	config.slot_size = 16384;
	config.format = format;
	config.policy = xmem::Policy::block;
	config.block_timeout = 10s;
	auto pool = xmem::BufferPool::create(name, config);
	EXPECT_TRUE(pool.ok()) << (pool ? "" : pool.error().message);
	return pool ? pool.value() : nullptr;
}

uint8_t payload(uint64_t seq, uint64_t i)
{
	return uint8_t(seq * 13 + i * 7 + (i >> 9));
}

// Publishes frame SEQ (from 1) with the padded layout and known metadata; TIMESTAMP its
// capture time (CLOCK_MONOTONIC ns; 0: the owner's clock at publish), CAPTURE_TIME on
// the realtime clock (0: none).
void publish(xmem::BufferPool &pool, uint64_t seq, uint32_t flags = 0, uint64_t timestamp = 0,
	     uint64_t capture_time = 0)
{
	Layout l;
	auto frame = pool.acquire(5s);
	ASSERT_TRUE(frame.ok()) << frame.error().message;
	auto bytes = frame->data_mut().value();
	for (uint64_t i = 0; i < l.size; i++)
		bytes[i] = std::byte(payload(seq, i));
	auto *m = frame->meta_mut().value();
	m->size = l.size;
	m->pts = seq * GST_SECOND;
	m->dts = seq * GST_SECOND - GST_MSECOND;
	m->duration = GST_SECOND / 30;
	m->flags = flags;
	m->timestamp = timestamp;
	m->capture_time = capture_time;
	m->n_planes = 3;
	for (int p = 0; p < 3; p++) {
		m->plane_stride[p] = l.stride[p];
		m->plane_offset[p] = l.offset[p];
	}
	auto r = pool.publish(std::move(*frame));
	ASSERT_TRUE(r.ok()) << r.error().message;
}

// A playing harness around an xmemsrc attached to POOL_NAME. BLOCKING: the source's
// thread waits in each push until the test pulls that buffer.
// CONFIGURE, when given, sets the source's other properties first.
GstHarness *src_harness(const std::string &pool_name, bool blocking = false,
			const std::function<void(GstElement *)> &configure = {})
{
	GstElement *src = gst_element_factory_make("xmemsrc", nullptr);
	EXPECT_NE(src, nullptr);
	if (!src)
		return nullptr;
	g_object_set(src, "pool-name", pool_name.c_str(), "is-live", FALSE, nullptr);
	if (configure)
		configure(src);
	GstHarness *h = gst_harness_new_with_element(src, nullptr, "src");
	gst_object_unref(src);
	if (blocking)
		gst_harness_set_blocking_push_mode(h);
	gst_harness_play(h);
	return h;
}

// The next buffer the source pushed, waiting up to TIMEOUT.
GstBuffer *pull(GstHarness *h, std::chrono::milliseconds timeout = 10s)
{
	GstBuffer *buffer = nullptr;
	eventually([&] { return (buffer = gst_harness_try_pull(h)) != nullptr; }, timeout);
	return buffer;
}

GstCaps *current_caps(GstHarness *h)
{
	GstPad *pad = gst_element_get_static_pad(h->element, "src");
	GstCaps *caps = gst_pad_get_current_caps(pad);
	gst_object_unref(pad);
	return caps;
}

std::string to_string(GstCaps *caps)
{
	gchar *s = gst_caps_to_string(caps);
	std::string out = s ? s : "";
	g_free(s);
	return out;
}

class XmemSrc : public GstTest
{
};

} // namespace

TEST_F(XmemSrc, NegotiatesProducerCapsBeforeFirstFrame)
{
	auto producer = make_producer("caps");
	ASSERT_TRUE(producer);
	GstHarness *h = src_harness("caps");
	ASSERT_TRUE(eventually([&] { return producer->stats().consumers == 1; })) << "xmemsrc did not attach";
	GstCaps *caps = nullptr;
	EXPECT_TRUE(eventually([&] { return (caps = current_caps(h)) != nullptr; }))
		<< "no caps on the source pad although the producer announced its format";
	if (caps) {
		EXPECT_TRUE(same_caps(to_string(caps), kCaps)) << to_string(caps);
		gst_caps_unref(caps);
	}
	EXPECT_EQ(gst_harness_buffers_received(h), 0u);
	EXPECT_EQ(producer->stats().published, 0u);

	// The caps event reached downstream, ahead of any buffer.
	GstCaps *sink_caps = gst_pad_get_current_caps(h->sinkpad);
	ASSERT_NE(sink_caps, nullptr) << "downstream got no caps event";
	EXPECT_TRUE(same_caps(to_string(sink_caps), kCaps));
	gst_caps_unref(sink_caps);

	publish(*producer, 1);
	GstBuffer *buffer = pull(h);
	ASSERT_NE(buffer, nullptr);
	gst_buffer_unref(buffer);
	gst_harness_teardown(h);
}

TEST_F(XmemSrc, BuffersCarryProducerMetadata)
{
	auto producer = make_producer("meta");
	ASSERT_TRUE(producer);
	GstHarness *h = src_harness("meta");
	ASSERT_TRUE(eventually([&] { return producer->stats().consumers == 1; }));
	const uint32_t flags = GST_BUFFER_FLAG_DELTA_UNIT | GST_BUFFER_FLAG_MARKER | GST_BUFFER_FLAG_DROPPABLE;
	publish(*producer, 1, flags);
	publish(*producer, 2, GST_BUFFER_FLAG_HEADER);

	Layout l;
	for (uint64_t seq = 1; seq <= 2; seq++) {
		SCOPED_TRACE("frame " + std::to_string(seq));
		GstBuffer *buffer = pull(h);
		ASSERT_NE(buffer, nullptr);
		EXPECT_EQ(GST_BUFFER_PTS(buffer), seq * GST_SECOND);
		EXPECT_EQ(GST_BUFFER_DTS(buffer), seq * GST_SECOND - GST_MSECOND);
		EXPECT_EQ(GST_BUFFER_DURATION(buffer), GST_SECOND / 30);
		EXPECT_EQ(GST_BUFFER_OFFSET(buffer), seq) << "the offset is the publish sequence number";
		if (seq == 1) {
			EXPECT_EQ(GST_BUFFER_FLAGS(buffer) & flags, flags);
			EXPECT_TRUE(GST_BUFFER_FLAG_IS_SET(buffer, GST_BUFFER_FLAG_DISCONT)) << "first buffer";
		} else {
			EXPECT_TRUE(GST_BUFFER_FLAG_IS_SET(buffer, GST_BUFFER_FLAG_HEADER));
			EXPECT_FALSE(GST_BUFFER_FLAG_IS_SET(buffer, GST_BUFFER_FLAG_DELTA_UNIT));
			EXPECT_FALSE(GST_BUFFER_FLAG_IS_SET(buffer, GST_BUFFER_FLAG_DISCONT)) << "no frame was missed";
		}
		GstVideoMeta *vmeta = gst_buffer_get_video_meta(buffer);
		ASSERT_NE(vmeta, nullptr) << "no GstVideoMeta for a planar frame";
		EXPECT_EQ(vmeta->format, GST_VIDEO_FORMAT_I420);
		EXPECT_EQ(vmeta->width, 64u);
		EXPECT_EQ(vmeta->height, 48u);
		ASSERT_EQ(vmeta->n_planes, 3u);
		for (guint p = 0; p < 3; p++) {
			EXPECT_EQ(vmeta->stride[p], gint(l.stride[p])) << "plane " << p;
			EXPECT_EQ(vmeta->offset[p], l.offset[p]) << "plane " << p;
		}
		ASSERT_EQ(gst_buffer_get_size(buffer), l.size);
		EXPECT_TRUE(gst_memory_is_type(gst_buffer_peek_memory(buffer, 0), "XmemMemory"))
			<< "the frame was copied";
		GstMapInfo map;
		ASSERT_TRUE(gst_buffer_map(buffer, &map, GST_MAP_READ));
		uint64_t wrong = 0;
		for (uint64_t i = 0; i < l.size; i++)
			wrong += map.data[i] != payload(seq, i);
		gst_buffer_unmap(buffer, &map);
		EXPECT_EQ(wrong, 0u) << "payload bytes differ from the producer's";
		gst_buffer_unref(buffer);
	}
	EXPECT_EQ(stat_u64(h->element, "received"), 2u);
	EXPECT_EQ(stat_u64(h->element, "dropped"), 0u);
	gst_harness_teardown(h);
}

TEST_F(XmemSrc, SlotReturnsWhenBufferIsFreed)
{
	auto producer = make_producer("release", 4);
	ASSERT_TRUE(producer);
	GstHarness *h = src_harness("release");
	ASSERT_TRUE(eventually([&] { return producer->stats().consumers == 1; }));
	publish(*producer, 1);
	GstBuffer *buffer = pull(h);
	ASSERT_NE(buffer, nullptr);
	EXPECT_EQ(producer->stats().slots_free, 3u) << "the buffer downstream should hold its slot";
	GstBuffer *sub = gst_buffer_copy_region(buffer, GST_BUFFER_COPY_MEMORY, 16, 64);
	gst_buffer_unref(buffer);
	std::this_thread::sleep_for(50ms);
	EXPECT_EQ(producer->stats().slots_free, 3u) << "a shared region of the buffer still refers to the slot";
	gst_buffer_unref(sub);
	EXPECT_TRUE(eventually([&] { return producer->stats().slots_free == 4; }))
		<< "the slot did not come back when its last buffer was freed";
	gst_harness_teardown(h);
}

// Whether BUFFER's memory is the slot itself, writable in place: not flagged
// read-only, and a WRITE map gives the very bytes a READ map gives.
void expect_writable_in_place(GstBuffer *buffer)
{
	GstMemory *mem = gst_buffer_peek_memory(buffer, 0);
	EXPECT_FALSE(GST_MEMORY_IS_READONLY(mem)) << "sole holder, yet the memory is read-only";
	GstMapInfo read, write;
	ASSERT_TRUE(gst_buffer_map(buffer, &read, GST_MAP_READ));
	const guint8 *in_place = read.data;
	gst_buffer_unmap(buffer, &read);
	ASSERT_TRUE(gst_buffer_map(buffer, &write, GST_MAP_WRITE));
	EXPECT_EQ(write.data, in_place) << "writing copied the frame although this consumer is its only holder";
	write.data[0] = 0x42;
	gst_buffer_unmap(buffer, &write);
	EXPECT_TRUE(gst_memory_is_type(gst_buffer_peek_memory(buffer, 0), "XmemMemory"));
}

TEST_F(XmemSrc, WritableInPlaceWhenSoleHolder)
{
	auto producer = make_producer("sole");
	ASSERT_TRUE(producer);
	// The source's thread blocks in push until we pull, so frame 2 is received only
	// once its publish() has returned (see EveryFrameWritableWhenSoleHolder).
	GstHarness *h = src_harness("sole", true);
	ASSERT_TRUE(eventually([&] { return producer->stats().consumers == 1; }));
	publish(*producer, 1);
	ASSERT_TRUE(eventually([&] { return gst_harness_buffers_in_queue(h) == 1; })) << "frame 1 not pushed";
	publish(*producer, 2);
	GstBuffer *first = pull(h);
	ASSERT_NE(first, nullptr);
	GstBuffer *buffer = pull(h);
	ASSERT_NE(buffer, nullptr);
	EXPECT_EQ(GST_BUFFER_OFFSET(buffer), 2u);
	expect_writable_in_place(buffer);
	gst_buffer_unref(buffer);
	gst_buffer_unref(first);
	gst_harness_teardown(h);
}

// The same for a frame the source receives the moment it is published.
TEST_F(XmemSrc, EveryFrameWritableWhenSoleHolder)
{
	auto producer = make_producer("every");
	ASSERT_TRUE(producer);
	GstHarness *h = src_harness("every");
	ASSERT_TRUE(eventually([&] { return producer->stats().consumers == 1; }));
	for (uint64_t seq = 1; seq <= 2000 && !HasFailure(); seq++) {
		SCOPED_TRACE("frame " + std::to_string(seq));
		publish(*producer, seq);
		GstBuffer *buffer = pull(h);
		ASSERT_NE(buffer, nullptr);
		expect_writable_in_place(buffer);
		gst_buffer_unref(buffer);
	}
	gst_harness_teardown(h);
}

TEST_F(XmemSrc, ReadOnlyWhenSharedAndWritesCopy)
{
	auto producer = make_producer("shared");
	ASSERT_TRUE(producer);
	GstHarness *h = src_harness("shared");
	ASSERT_TRUE(eventually([&] { return producer->stats().consumers == 1; }));
	xmem::OpenOptions options;
	options.timeout = 5s;
	auto other = xmem::BufferPool::open("shared", options);
	ASSERT_TRUE(other.ok()) << other.error().message;
	ASSERT_EQ(producer->stats().consumers, 2u);

	publish(*producer, 1);
	auto held = (*other)->receive(5s);
	ASSERT_TRUE(held.ok()) << held.error().message;
	GstBuffer *buffer = pull(h);
	ASSERT_NE(buffer, nullptr);
	// Copy-on-write is decided when mapping for write: another consumer holds the
	// frame, so the write map must give the buffer a private copy.
	GstMemory *mem = gst_buffer_peek_memory(buffer, 0);

	Layout l;
	GstMapInfo map;
	ASSERT_TRUE(gst_buffer_map(buffer, &map, GST_MAP_WRITE));
	ASSERT_GE(map.size, l.size);
	std::memset(map.data, 0xff, l.size);
	gst_buffer_unmap(buffer, &map);
	EXPECT_NE(gst_buffer_peek_memory(buffer, 0), mem) << "the write map did not replace the shared slot";

	uint64_t wrong = 0;
	auto original = held->data();
	for (uint64_t i = 0; i < l.size; i++)
		wrong += original[i] != std::byte(payload(1, i));
	EXPECT_EQ(wrong, 0u) << "a write through a read-only frame reached the other consumer's frame";
	ASSERT_TRUE(gst_buffer_map(buffer, &map, GST_MAP_READ));
	EXPECT_EQ(map.data[0], 0xff) << "the writer does not see its own write";
	gst_buffer_unmap(buffer, &map);

	gst_buffer_unref(buffer);
	held->reset();
	EXPECT_TRUE(eventually([&] { return producer->stats().slots_free == 4; }));
	gst_harness_teardown(h);
}

// Downstream keeps every buffer: near its cap xmemsrc copies each frame out of its slot
// and gives the slot back at once, so every frame still arrives, intact and in order,
// while the slots it holds stay within the cap (one spare for the next frame).
TEST_F(XmemSrc, NearItsCapFramesAreCopiedOutAndTheirSlotsGoBackAtOnce)
{
	auto producer = make_producer("keeps", 8);
	ASSERT_TRUE(producer);
	GstHarness *h =
		src_harness("keeps", false, [](GstElement *src) { g_object_set(src, "max-held", 3u, nullptr); });
	ASSERT_TRUE(eventually([&] { return producer->stats().consumers == 1; }));
	Layout l;
	std::vector<GstBuffer *> kept;
	for (uint64_t seq = 1; seq <= 10; seq++) {
		publish(*producer, seq);
		GstBuffer *buffer = pull(h);
		ASSERT_NE(buffer, nullptr) << "frame " << seq;
		EXPECT_EQ(GST_BUFFER_PTS(buffer), seq * GST_SECOND);
		GstMapInfo map;
		ASSERT_TRUE(gst_buffer_map(buffer, &map, GST_MAP_READ));
		uint64_t wrong = 0;
		for (uint64_t i = 0; i < l.size && i < map.size; i++)
			wrong += map.data[i] != payload(seq, i);
		EXPECT_EQ(wrong, 0u) << "frame " << seq;
		gst_buffer_unmap(buffer, &map);
		kept.push_back(buffer);
	}
	GstElement *src = h->element;
	EXPECT_EQ(stat_u64(src, "zero-copy"), 1u) << "the first frame stays in its slot";
	EXPECT_EQ(stat_u64(src, "copied-held"), 9u);
	EXPECT_EQ(stat_u64(src, "max-held"), 3u);
	EXPECT_EQ(stat_u64(src, "lost"), 0u);
	EXPECT_TRUE(eventually([&] { return producer->stats().slots_free == 7; }))
		<< producer->stats().slots_free << " free: the copies' slots did not come back";
	for (GstBuffer *b : kept)
		gst_buffer_unref(b);
	EXPECT_TRUE(eventually([&] { return producer->stats().slots_free == 8; }));
	gst_harness_teardown(h);
}

// max-age: a frame older than that when it would be pushed is given back unread and
// counted (stats expired); the next, fresh one is pushed.
TEST_F(XmemSrc, FramesOlderThanMaxAgeAreGivenBackUnread)
{
	auto producer = make_producer("aged", 4);
	ASSERT_TRUE(producer);
	GstHarness *h = src_harness("aged", false, [](GstElement *src) {
		g_object_set(src, "max-age", guint64(500 * GST_MSECOND), nullptr);
	});
	ASSERT_TRUE(eventually([&] { return producer->stats().consumers == 1; }));
	uint64_t now = uint64_t(g_get_monotonic_time()) * 1000;
	publish(*producer, 1, 0, now - 2 * GST_SECOND);
	publish(*producer, 2);
	GstBuffer *buffer = pull(h);
	ASSERT_NE(buffer, nullptr);
	EXPECT_EQ(GST_BUFFER_OFFSET(buffer), 2u) << "the frame stamped 2 s ago was pushed";
	EXPECT_EQ(stat_u64(h->element, "expired"), 1u);
	gst_buffer_unref(buffer);
	EXPECT_TRUE(eventually([&] { return producer->stats().slots_free == 4; }));
	gst_harness_teardown(h);
}

// add-reference-timestamp-meta: each frame's capture time (its CLOCK_MONOTONIC timestamp)
// as timestamp/x-ntp on the realtime clock, what RTP's RFC 6051 extension sends to
// another host; without the property, no such meta.
TEST_F(XmemSrc, TheCaptureTimeBecomesAnNtpReferenceTimestamp)
{
	auto producer = make_producer("captured", 4);
	ASSERT_TRUE(producer);
	GstHarness *with = src_harness("captured", false, [](GstElement *src) {
		g_object_set(src, "add-reference-timestamp-meta", TRUE, nullptr);
	});
	GstHarness *without = src_harness("captured");
	ASSERT_TRUE(eventually([&] { return producer->stats().consumers == 2; }));
	// Captured 2 s ago, by both clocks; NTP's epoch is 2208988800 s before Unix's.
	const uint64_t age = 2 * GST_SECOND;
	const uint64_t captured = uint64_t(g_get_monotonic_time()) * 1000 - age;
	const uint64_t expected = uint64_t(g_get_real_time()) * 1000 - age + 2208988800ULL * GST_SECOND;
	publish(*producer, 1, 0, captured);
	GstCaps *ntp = gst_caps_new_empty_simple("timestamp/x-ntp");
	// A frame whose producer set its capture time (another host's, through a bridge):
	// that, exactly, whatever its monotonic timestamp.
	const uint64_t remote = 1'795'000'000'123'456'789ULL;
	publish(*producer, 2, 0, captured, remote);
	GstBuffer *buffer = pull(with);
	ASSERT_NE(buffer, nullptr);
	GstReferenceTimestampMeta *meta = gst_buffer_get_reference_timestamp_meta(buffer, ntp);
	ASSERT_NE(meta, nullptr) << "no timestamp/x-ntp on the frame";
	const int64_t off = int64_t(meta->timestamp) - int64_t(expected);
	// The two clocks' difference read here and in the element: equal but for the time
	// between the reads (and a step of the realtime clock, which a test machine has not).
	EXPECT_LT(std::llabs(off), int64_t(100 * GST_MSECOND)) << "off by " << off << " ns";
	EXPECT_EQ(meta->duration, GST_CLOCK_TIME_NONE);
	gst_buffer_unref(buffer);
	buffer = pull(with);
	ASSERT_NE(buffer, nullptr);
	meta = gst_buffer_get_reference_timestamp_meta(buffer, ntp);
	ASSERT_NE(meta, nullptr);
	EXPECT_EQ(meta->timestamp, remote + 2'208'988'800ULL * GST_SECOND);
	gst_buffer_unref(buffer);
	for (int i = 0; i < 2; i++) {
		buffer = pull(without);
		ASSERT_NE(buffer, nullptr);
		EXPECT_EQ(gst_buffer_get_reference_timestamp_meta(buffer, ntp), nullptr);
		gst_buffer_unref(buffer);
	}
	gst_caps_unref(ntp);
	gst_harness_teardown(with);
	gst_harness_teardown(without);
}

// A pool that publishes rarely: with history=1 a source that attaches after the last
// frame pushes it at once (caps first), not at the next publish.
TEST_F(XmemSrc, WithHistoryALateSourcePushesTheLastFrameAtOnce)
{
	auto producer = make_producer("rarely", 4);
	ASSERT_TRUE(producer);
	publish(*producer, 1);
	auto start = std::chrono::steady_clock::now();
	GstHarness *h =
		src_harness("rarely", false, [](GstElement *src) { g_object_set(src, "history", 1u, nullptr); });
	GstBuffer *buffer = pull(h, 2s);
	ASSERT_NE(buffer, nullptr) << "the frame published before it attached never came";
	EXPECT_LT(std::chrono::steady_clock::now() - start, 500ms);
	EXPECT_EQ(GST_BUFFER_OFFSET(buffer), 1u);
	EXPECT_EQ(GST_BUFFER_PTS(buffer), GST_SECOND);
	gst_buffer_unref(buffer);
	gst_harness_teardown(h);
}

TEST_F(XmemSrc, EosFromProducer)
{
	auto producer = make_producer("eos");
	ASSERT_TRUE(producer);
	GstHarness *h = src_harness("eos");
	ASSERT_TRUE(eventually([&] { return producer->stats().consumers == 1; }));
	publish(*producer, 1);
	ASSERT_TRUE(producer->end_of_stream().ok());
	GstBuffer *buffer = pull(h);
	ASSERT_NE(buffer, nullptr);
	gst_buffer_unref(buffer);
	bool eos = false;
	eventually(
		[&] {
			while (GstEvent *event = gst_harness_try_pull_event(h)) {
				eos |= GST_EVENT_TYPE(event) == GST_EVENT_EOS;
				gst_event_unref(event);
			}
			return eos;
		},
		10s);
	EXPECT_TRUE(eos) << "no EOS event after the producer's end of stream";
	gst_harness_teardown(h);
}

// A producer that goes away (closing its pool, no EOS) and comes back under the
// same name with another format: the source reattaches and renegotiates.
TEST_F(XmemSrc, ReattachesWithNewCapsWhenProducerReturns)
{
	auto producer = make_producer("back");
	ASSERT_TRUE(producer);
	// Blocking pushes: the source learns of the close only once the pool is fully
	// closed (see SurvivesProducerRestartsInQuickSuccession).
	GstHarness *h = src_harness("back", true);
	ASSERT_TRUE(eventually([&] { return producer->stats().consumers == 1; }));
	publish(*producer, 1);
	ASSERT_TRUE(eventually([&] { return gst_harness_buffers_in_queue(h) == 1; })) << "frame 1 not pushed";
	producer->close();
	producer.reset();
	GstBuffer *buffer = pull(h);
	ASSERT_NE(buffer, nullptr);
	gst_buffer_unref(buffer);
	ASSERT_TRUE(eventually([&] { return stat_u64(h->element, "reconnects") == 1; }));

	const std::string gray = "video/x-raw,format=GRAY8,width=32,height=16,framerate=30/1";
	producer = make_producer("back", 4, gray);
	ASSERT_TRUE(producer);
	ASSERT_TRUE(eventually([&] { return producer->stats().consumers == 1; }, 10s)) << "xmemsrc did not reattach";
	GstCaps *caps = nullptr;
	EXPECT_TRUE(eventually([&] {
		if (caps)
			gst_caps_unref(caps);
		caps = current_caps(h);
		return caps && same_caps(to_string(caps), gray);
	})) << "the new producer's caps were not negotiated";
	if (caps)
		gst_caps_unref(caps);
	auto frame = producer->acquire(5s);
	ASSERT_TRUE(frame.ok());
	frame->meta_mut().value()->size = 32 * 16;
	ASSERT_TRUE(producer->publish(std::move(*frame)).ok());
	buffer = pull(h);
	ASSERT_NE(buffer, nullptr);
	EXPECT_EQ(gst_buffer_get_size(buffer), 32u * 16);
	EXPECT_TRUE(GST_BUFFER_FLAG_IS_SET(buffer, GST_BUFFER_FLAG_DISCONT));
	gst_buffer_unref(buffer);
	gst_harness_teardown(h);
}

// The same, over and over, without waiting: the source must never take the
// closing pool for something that is not a pool.
TEST_F(XmemSrc, SurvivesProducerRestartsInQuickSuccession)
{
	GstElement *src = gst_element_factory_make("xmemsrc", nullptr);
	ASSERT_NE(src, nullptr);
	g_object_set(src, "pool-name", "restarts", "is-live", FALSE, nullptr);
	Pipeline p("fakesink name=sink sync=false enable-last-sample=false");
	gst_bin_add(GST_BIN(p.get()), src);
	ASSERT_TRUE(gst_element_link(src, p.by_name("sink")));
	ASSERT_NE(p.play(), GST_STATE_CHANGE_FAILURE);
	for (int round = 0; round < 30 && !HasFailure(); round++) {
		SCOPED_TRACE("round " + std::to_string(round));
		auto producer = make_producer("restarts");
		ASSERT_TRUE(producer);
		ASSERT_TRUE(eventually([&] { return producer->stats().consumers == 1; }, 10s))
			<< "xmemsrc did not attach";
		publish(*producer, 1);
		ASSERT_TRUE(eventually([&] { return producer->stats().slots_free == 4; }, 10s)) << "frame not consumed";
		producer->close();
		auto error = p.wait_error(20ms);
		ASSERT_FALSE(error) << error->all();
	}
	auto error = p.wait_error(200ms);
	EXPECT_FALSE(error) << error->all();
}

// Errors: a source that cannot attach posts an element error that names the pool and
// the cause in its message, the line gst-launch-1.0 prints after "ERROR:" (the debug
// string carries the core's message too).

TEST_F(XmemSrc, BadPoolNamesAreErrors)
{
	struct Case {
		std::string name;
		const char *cause;
	};
	std::vector<Case> cases = {
		{ "", "empty" },
		{ "bad name!", "illegal character" },
		{ "bad/", "directory" },
		{ std::string(300, 'x'), "longer than" },
	};
	for (const auto &c : cases) {
		SCOPED_TRACE("pool-name '" + c.name + "'");
		Pipeline p("xmemsrc name=src timeout=2000000000 ! fakesink");
		ASSERT_TRUE(p);
		g_object_set(p.by_name("src"), "pool-name", c.name.c_str(), nullptr);
		p.play();
		auto error = p.wait_error(10s);
		ASSERT_TRUE(error) << "no error message";
		EXPECT_EQ(error->source, "src");
		EXPECT_EQ(error->domain, GST_RESOURCE_ERROR);
		EXPECT_EQ(error->code, GST_RESOURCE_ERROR_SETTINGS) << error->all();
		EXPECT_NE(error->message.find(c.cause), std::string::npos) << error->all();
		if (!c.name.empty()) {
			EXPECT_NE(error->message.find(c.name), std::string::npos) << "the error does not name the pool";
		}
	}
}

class XmemSrcNotAPool : public XmemSrc, public ::testing::WithParamInterface<const char *>
{
};

TEST_P(XmemSrcNotAPool, IsAnErrorNamingPoolAndCause)
{
	std::string path = dir_.path() + "/" + GetParam() + ".sock";
	Process server({ xmem::test::peer_path(), "serve", path, "--kind", GetParam() });
	ASSERT_TRUE(server.wait_output("ready")) << "xmem-test-peer serve did not start";
	Pipeline p("xmemsrc name=src timeout=3000000000 ! fakesink");
	ASSERT_TRUE(p);
	g_object_set(p.by_name("src"), "pool-name", path.c_str(), nullptr);
	p.play();
	auto error = p.wait_error(20s);
	ASSERT_TRUE(error) << "no error message";
	EXPECT_EQ(error->source, "src");
	EXPECT_EQ(error->domain, GST_RESOURCE_ERROR);
	EXPECT_NE(error->all().find(path), std::string::npos) << "the error does not name the pool: " << error->all();
	EXPECT_NE(error->lower().find("not an xmem pool"), std::string::npos) << error->all();
}

INSTANTIATE_TEST_SUITE_P(Kinds, XmemSrcNotAPool, ::testing::Values("garbage", "stream", "silent"));

// The owner's refusal reaches the message itself, with its fix: a fifo-spill consumer
// of a pool whose owner set no spill size (it said "xmem pool failure." alone before,
// the cause only in the debug string).
TEST_F(XmemSrc, ARefusalsCauseAndFixAreInTheErrorsMessage)
{
	auto producer = make_producer("nospill");
	ASSERT_TRUE(producer);
	Pipeline p("xmemsrc name=src pool-name=nospill policy=fifo-spill timeout=5000000000 ! fakesink");
	ASSERT_TRUE(p);
	p.play();
	auto error = p.wait_error(20s);
	ASSERT_TRUE(error) << "a fifo-spill consumer of a pool without a spill tier was not refused";
	EXPECT_EQ(error->source, "src");
	EXPECT_EQ(error->message.find('\n'), std::string::npos) << "one line: " << error->message;
	for (const char *words : { "nospill", "no spill tier", "fifo-spill", "spill-size" })
		EXPECT_NE(error->message.find(words), std::string::npos) << words << " not in: " << error->message;
}

TEST_F(XmemSrc, TimesOutWithoutPool)
{
	Pipeline p("xmemsrc name=src pool-name=nobody-here timeout=500000000 ! fakesink");
	ASSERT_TRUE(p);
	auto t0 = std::chrono::steady_clock::now();
	p.play();
	auto error = p.wait_error(20s);
	ASSERT_TRUE(error) << "no error although timeout=0.5 s and no pool";
	EXPECT_GE(std::chrono::steady_clock::now() - t0, 400ms) << "gave up before the timeout";
	EXPECT_EQ(error->source, "src");
	EXPECT_EQ(error->domain, GST_RESOURCE_ERROR);
	EXPECT_NE(error->all().find("nobody-here"), std::string::npos) << error->all();
	EXPECT_NE(error->lower().find("timed out"), std::string::npos) << error->all();
}

TEST_F(XmemSrc, TimesOutWaitingForAFrame)
{
	auto producer = make_producer("quiet");
	ASSERT_TRUE(producer);
	Pipeline p("xmemsrc name=src pool-name=quiet timeout=500000000 ! fakesink");
	ASSERT_TRUE(p);
	p.play();
	ASSERT_TRUE(eventually([&] { return producer->stats().consumers == 1; })) << "xmemsrc did not attach";
	auto t0 = std::chrono::steady_clock::now();
	auto error = p.wait_error(20s);
	ASSERT_TRUE(error) << "no error although no frame came within timeout=0.5 s";
	EXPECT_GE(std::chrono::steady_clock::now() - t0, 300ms) << "gave up before the timeout";
	EXPECT_EQ(error->source, "src");
	EXPECT_NE(error->all().find("quiet"), std::string::npos) << error->all();
	EXPECT_NE(error->lower().find("timed out"), std::string::npos) << error->all();
}

TEST_F(XmemSrc, WithoutReconnectTheProducersDepartureIsAnError)
{
	auto producer = make_producer("once");
	ASSERT_TRUE(producer);
	Pipeline p("xmemsrc name=src pool-name=once reconnect=false is-live=false ! fakesink");
	ASSERT_TRUE(p);
	p.play();
	ASSERT_TRUE(eventually([&] { return producer->stats().consumers == 1; })) << "xmemsrc did not attach";
	publish(*producer, 1);
	producer->close();
	producer.reset();
	auto error = p.wait_error(20s);
	ASSERT_TRUE(error) << "no error although reconnect=false and the producer went away";
	EXPECT_EQ(error->source, "src");
	EXPECT_EQ(error->domain, GST_RESOURCE_ERROR);
	EXPECT_NE(error->all().find("once"), std::string::npos) << "the error does not name the pool: " << error->all();
}

// Planes another process wrote that start within the frame but, read as the caps say
// (I420 64x48: 48 luma rows, 24 of each chroma), run past it: each is refused before
// anything reads a pixel (stats: frames-refused), and the stream goes on.
TEST_F(XmemSrc, FramesWhosePlanesDoNotFitTheirCapsAreRefusedAndTheStreamGoesOn)
{
	auto producer = make_producer("planes");
	ASSERT_TRUE(producer);
	GstHarness *h = src_harness("planes");
	ASSERT_TRUE(eventually([&] { return producer->stats().consumers == 1; }));
	Layout l;
	const std::vector<std::pair<const char *, std::function<void(xmem::FrameMeta &)>>> bad = {
		{ "a chroma stride past the frame",
		  [](xmem::FrameMeta &m) {
			  m.plane_stride[2] = 1u << 30;
		  } },
		{ "the last plane at the frame's end",
		  [](xmem::FrameMeta &m) {
			  m.plane_offset[2] = m.size - 1;
		  } },
		{ "a luma stride twice its rows",
		  [](xmem::FrameMeta &m) {
			  m.plane_stride[0] *= 4;
		  } },
		{ "two planes for a three-plane format",
		  [](xmem::FrameMeta &m) {
			  m.n_planes = 2;
		  } },
		{ "no planes and less than the caps' size",
		  [](xmem::FrameMeta &m) {
			  m.n_planes = 0;
			  m.size = 64 * 48;
		  } },
	};
	uint64_t seq = 0;
	for (auto &[what, scribble] : bad) {
		SCOPED_TRACE(what);
		publish(*producer, ++seq);
		auto frame = producer->acquire(5s);
		ASSERT_TRUE(frame.ok()) << frame.error().message;
		auto *m = frame->meta_mut().value();
		m->size = l.size;
		m->n_planes = 3;
		for (int p = 0; p < 3; p++) {
			m->plane_stride[p] = l.stride[p];
			m->plane_offset[p] = l.offset[p];
		}
		scribble(*m);
		ASSERT_TRUE(producer->publish(std::move(*frame)).ok()) << "the library's own checks pass";
		++seq;
		publish(*producer, ++seq);
		for (uint64_t want : { seq - 2, seq }) {
			GstBuffer *buffer = pull(h);
			ASSERT_NE(buffer, nullptr) << "frame " << want;
			EXPECT_EQ(GST_BUFFER_OFFSET(buffer), want);
			// The one after the refused frame says the stream has a gap (the first
			// buffer is a discontinuity anyway).
			EXPECT_EQ(GST_BUFFER_FLAG_IS_SET(buffer, GST_BUFFER_FLAG_DISCONT), want == seq || want == 1)
				<< "frame " << want;
			gst_buffer_unref(buffer);
		}
	}
	EXPECT_EQ(stat_u64(h->element, "frames-refused"), bad.size());
	EXPECT_EQ(stat_u64(h->element, "received"), 2 * bad.size());
	gst_harness_teardown(h);
}
