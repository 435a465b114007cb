// test_frame_layout.cpp - a frame's layout (size, dtype, shape and strides, planes) is
// another process's writing: a reader refuses one that does not fit its slot, counts it,
// gives the slot back and goes on with the next frame; an owner cannot publish one.
#include "common.hpp"
#include "scribble.hpp"

#include <climits>
#include <cstring>
#include <functional>

namespace {

using namespace std::chrono_literals;
using xmem::BufferPool;
using xmem::Errc;
using xmem::FrameMeta;
using xmem::test::eventually;
using xmem::test::RuntimeDir;
using xmem::test::slot_record;
using xmem::test::why;

constexpr uint32_t kSlots = 4;
constexpr uint64_t kSlotSize = 16384;
constexpr uint32_t kWidth = 64, kHeight = 48;

std::shared_ptr<BufferPool> create(const std::string &name)
{
	xmem::PoolConfig c;
	c.slot_count = kSlots;
	c.slot_size = kSlotSize;
	c.format = "video/x-raw, format=(string)NV12, width=(int)64, height=(int)48";
	auto r = BufferPool::create(name, c);
	EXPECT_TRUE(r.ok()) << why(r);
	return r ? r.value() : nullptr;
}

std::shared_ptr<BufferPool> open(const std::string &name)
{
	xmem::OpenOptions o;
	o.client = "test-frame-layout";
	o.queue_size = kSlots;
	auto r = BufferPool::open(name, o);
	EXPECT_TRUE(r.ok()) << why(r);
	return r ? r.value() : nullptr;
}

// An NV12 frame as the elements publish it: planes, and the luma plane as a tensor.
void fill_video(FrameMeta &m)
{
	auto size = xmem::set_video_layout(m, "NV12", kWidth, kHeight, 1);
	ASSERT_TRUE(size.ok()) << why(size);
	m.ndim = 3;
	m.shape[0] = kHeight;
	m.shape[1] = kWidth;
	m.shape[2] = 1;
	m.strides[0] = m.plane_stride[0];
	m.strides[1] = 1;
	m.strides[2] = 1;
}

// Publishes a well-formed frame; its slot.
uint32_t publish(BufferPool &owner)
{
	auto g = owner.acquire(2s);
	EXPECT_TRUE(g.ok()) << why(g);
	if (!g)
		return UINT32_MAX;
	fill_video(*g->meta_mut().value());
	uint32_t index = g->index();
	auto r = owner.publish(std::move(*g));
	EXPECT_TRUE(r.ok()) << why(r);
	return index;
}

// A layout another process could write, and what the refusal must name.
struct Scribble {
	const char *name;
	std::function<void(FrameMeta &)> write;
	const char *names;
};

const std::vector<Scribble> &scribbles()
{
	static const std::vector<Scribble> all = {
		{ "size past the slot", [](FrameMeta &m) { m.size = kSlotSize + 1; }, "size 16385 > slot size 16384" },
		{ "size all ones", [](FrameMeta &m) { m.size = UINT64_MAX; }, "> slot size" },
		{ "dtype none", [](FrameMeta &m) { m.dtype = 200; }, "dtype 200" },
		{ "ndim past the array", [](FrameMeta &m) { m.ndim = XMEM_MAX_DIMS + 1; }, "ndim 9 > 8" },
		{ "shape past the payload", [](FrameMeta &m) { m.shape[0] = kHeight * 4; }, "shape and strides reach" },
		{ "strides past the payload", [](FrameMeta &m) { m.strides[1] = 1u << 20; },
		  "shape and strides reach" },
		{ "shape times strides overflows",
		  [](FrameMeta &m) {
			  m.shape[0] = UINT64_MAX / 2;
			  m.strides[0] = 4;
		  },
		  "overflow" },
		{ "a zero dimension beside one past int64",
		  [](FrameMeta &m) {
			  m.shape[0] = 0;
			  m.shape[1] = uint64_t{ 1 } << 63;
		  },
		  "overflow int64" },
		{ "a stride past int64", [](FrameMeta &m) { m.strides[2] = uint64_t{ 1 } << 63; }, "overflow int64" },
		{ "a broadcast over the payload",
		  [](FrameMeta &m) {
			  m.shape[2] = uint64_t{ 1 } << 40;
			  m.strides[2] = 0;
		  },
		  "(a broadcast or overlap)" },
		{ "n_planes past the array", [](FrameMeta &m) { m.n_planes = XMEM_MAX_PLANES + 1; }, "n_planes 5 > 4" },
		{ "plane past the payload", [](FrameMeta &m) { m.plane_offset[1] = m.size; },
		  "plane 1 starts at byte" },
		{ "plane far away", [](FrameMeta &m) { m.plane_offset[0] = uint64_t{ 1 } << 62; }, "plane 0 starts" },
		{ "negative stride", [](FrameMeta &m) { m.plane_stride[1] = 0xffffff00u; }, "plane 1's stride" },
		{ "size zero under planes", [](FrameMeta &m) { m.size = 0; }, "reach" },
	};
	return all;
}

} // namespace

TEST(FrameLayout, AReceivedFrameThatDoesNotFitIsRefusedCountedAndTheStreamGoesOn)
{
	RuntimeDir dir;
	auto owner = create("layout");
	auto consumer = open("layout");
	ASSERT_TRUE(owner && consumer);
	uint64_t refused = 0;
	for (const Scribble &s : scribbles()) {
		uint32_t slot = publish(*owner);
		ASSERT_LT(slot, kSlots);
		// A hostile peer rewrites the layout between publish and receive.
		s.write(slot_record(*consumer, slot)->meta);
		auto f = consumer->receive(2s);
		ASSERT_FALSE(f.ok()) << s.name << ": received";
		EXPECT_EQ(f.code(), Errc::bad_frame) << s.name << ": " << why(f);
		EXPECT_NE(f.error().message.find(s.names), std::string::npos) << s.name << ": " << why(f);
		EXPECT_EQ(consumer->frames_refused(), ++refused) << s.name;
		// The slot went back unread: the owner has every slot free again.
		EXPECT_TRUE(eventually([&] { return owner->stats().slots_free == kSlots; }, 2s))
			<< s.name << ": " << owner->stats().slots_free << " slots free";
		// The next frame comes as usual.
		publish(*owner);
		auto next = consumer->receive(2s);
		ASSERT_TRUE(next.ok()) << s.name << ": " << why(next);
		EXPECT_EQ(next->meta().n_planes, 2u);
		EXPECT_EQ(next->meta().size, next->meta().plane_offset[1] + next->meta().plane_stride[1] * kHeight / 2);
	}
	EXPECT_EQ(refused, scribbles().size());
}

TEST(FrameLayout, GetByIndexChecksTheLayoutToo)
{
	RuntimeDir dir;
	auto owner = create("layout-get");
	auto a = open("layout-get");
	auto b = open("layout-get");
	ASSERT_TRUE(owner && a && b);
	uint32_t slot = publish(*owner);
	ASSERT_LT(slot, kSlots);
	auto held = a->receive(2s); // keeps the slot published while B takes it by index
	ASSERT_TRUE(held.ok()) << why(held);
	auto drop = b->receive(2s);
	ASSERT_TRUE(drop.ok()) << why(drop);
	drop->reset();
	slot_record(*b, slot)->meta.plane_offset[1] = kSlotSize * 2;
	for (bool writable : { false, true }) {
		auto g = writable ? b->get_mut(slot) : b->get(slot);
		ASSERT_FALSE(g.ok()) << (writable ? "get_mut" : "get");
		EXPECT_EQ(g.code(), Errc::bad_frame) << why(g);
		EXPECT_EQ(b->ref_count(slot), 0u) << "the reference went back";
	}
	EXPECT_EQ(b->frames_refused(), 2u);
	// A's copy of the metadata was taken at receive: the scribble does not reach it.
	EXPECT_LT(held->meta().plane_offset[1], held->meta().size);
}

TEST(FrameLayout, AnOwnerCannotPublishALayoutConsumersWouldRefuse)
{
	RuntimeDir dir;
	auto owner = create("layout-publish");
	auto consumer = open("layout-publish");
	ASSERT_TRUE(owner && consumer);
	for (const Scribble &s : scribbles()) {
		auto g = owner->acquire(2s);
		ASSERT_TRUE(g.ok()) << why(g);
		FrameMeta &m = *g->meta_mut().value();
		fill_video(m);
		s.write(m);
		auto r = owner->publish(std::move(*g));
		ASSERT_FALSE(r.ok()) << s.name << ": published";
		// The size past the slot keeps its own code; every other layout is a bad argument.
		EXPECT_TRUE(r.code() == Errc::invalid_argument || r.code() == Errc::out_of_range)
			<< s.name << ": " << why(r);
		EXPECT_EQ(consumer->receive(0ns).code(), Errc::timed_out) << s.name << ": nothing was queued";
	}
	EXPECT_EQ(owner->stats().slots_free, kSlots);
	EXPECT_EQ(owner->stats().published, 0u);
}

TEST(FrameLayout, CApi)
{
	RuntimeDir dir;
	auto owner = create("layout-c");
	ASSERT_TRUE(owner);
	xmem_open_options o;
	xmem_open_options_init(&o);
	xmem_pool *consumer = nullptr;
	ASSERT_EQ(xmem_pool_open("layout-c", &o, &consumer), XMEM_OK) << xmem_last_error();
	uint32_t slot = publish(*owner);
	ASSERT_LT(slot, kSlots);
	// The C handle has no control_segment(): scribble through a C++ consumer's mapping.
	auto peer = open("layout-c");
	ASSERT_TRUE(peer);
	slot_record(*peer, slot)->meta.size = kSlotSize * 2;
	xmem_buffer *b = nullptr;
	EXPECT_EQ(xmem_pool_receive(consumer, 2'000'000'000, &b), XMEM_EBADFRAME);
	EXPECT_EQ(b, nullptr);
	EXPECT_NE(std::string(xmem_last_error()).find("size 32768 > slot size 16384"), std::string::npos)
		<< xmem_last_error();
	EXPECT_STREQ(xmem_status_name(XMEM_EBADFRAME), "XMEM_EBADFRAME");
	EXPECT_EQ(xmem_pool_frames_refused(consumer), 1u);
	EXPECT_EQ(xmem_pool_frames_refused(nullptr), 0u);
	publish(*owner);
	ASSERT_EQ(xmem_pool_receive(consumer, 2'000'000'000, &b), XMEM_OK) << xmem_last_error();
	xmem_buffer_release(b);
	xmem_pool_close(consumer);
}
