// test_api.cpp - the C++ API call by call: config validation, the frame round trip,
// formats, EOS and closing, the queue policies, references, roles and pool limits.
#include "common.hpp"
#include "layout.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <ctime>
#include <set>
#include <thread>

#include <poll.h>
#include <sys/stat.h>

namespace {

using namespace std::chrono_literals;
using xmem::BufferGuard;
using xmem::BufferPool;
using xmem::Errc;
using xmem::OpenOptions;
using xmem::Policy;
using xmem::PoolConfig;
using xmem::test::eventually;
using xmem::test::Process;
using xmem::test::RuntimeDir;
using xmem::test::why;

uint64_t monotonic_ns()
{
	timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return uint64_t(ts.tv_sec) * 1000000000u + uint64_t(ts.tv_nsec);
}

// Milliseconds since T0.
long long since(std::chrono::steady_clock::time_point t0)
{
	return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
}

// Payload of frame TAG: every byte depends on the tag and its position.
std::byte pattern(uint64_t tag, uint64_t i)
{
	return std::byte((tag * 131 + i * 7 + (i >> 8)) & 0xff);
}

void fill(std::span<std::byte> bytes, uint64_t size, uint64_t tag)
{
	for (uint64_t i = 0; i < size; i++)
		bytes[i] = pattern(tag, i);
}

bool intact(std::span<const std::byte> bytes, uint64_t tag)
{
	for (uint64_t i = 0; i < bytes.size(); i++)
		if (bytes[i] != pattern(tag, i))
			return false;
	return true;
}

PoolConfig config(uint32_t slots = 4, Policy policy = Policy::drop_oldest, uint64_t slot_size = 4096)
{
	PoolConfig c;
	c.slot_count = slots;
	c.slot_size = slot_size;
	c.policy = policy;
	return c;
}

std::shared_ptr<BufferPool> create(const std::string &name, const PoolConfig &c = config())
{
	auto r = BufferPool::create(name, c);
	EXPECT_TRUE(r.ok()) << "create " << name << ": " << why(r);
	return r ? r.value() : nullptr;
}

std::shared_ptr<BufferPool> open(const std::string &name, uint32_t queue = 4)
{
	OpenOptions o;
	o.queue_size = queue;
	o.client = "test-api";
	auto r = BufferPool::open(name, o);
	EXPECT_TRUE(r.ok()) << "open " << name << ": " << why(r);
	return r ? r.value() : nullptr;
}

// Publishes one frame of SIZE bytes with payload TAG and pts TAG; its slot index.
uint32_t publish(BufferPool &pool, uint64_t tag, uint64_t size = 256)
{
	auto g = pool.acquire(2s);
	EXPECT_TRUE(g.ok()) << why(g);
	if (!g)
		return UINT32_MAX;
	fill(g->data_mut().value(), size, tag);
	auto *m = g->meta_mut().value();
	m->size = size;
	m->pts = tag;
	uint32_t index = g->index();
	auto r = pool.publish(std::move(*g));
	EXPECT_TRUE(r.ok()) << why(r);
	return index;
}

// Receives one frame and checks it is frame TAG, intact.
BufferGuard receive(BufferPool &pool, uint64_t tag, std::chrono::nanoseconds timeout = 5s)
{
	auto g = pool.receive(timeout);
	EXPECT_TRUE(g.ok()) << "waiting for frame " << tag << ": " << why(g);
	if (!g)
		return {};
	EXPECT_EQ(g->meta().pts, tag);
	EXPECT_TRUE(intact(g->data(), tag)) << "frame " << tag << " corrupt";
	return std::move(g).value();
}

// The ConsumerRecord of consumer INDEX in a raw control segment (an inspector's view).
const xmem::layout::ConsumerRecord *consumer_record(std::span<const std::byte> segment, uint32_t index)
{
	auto *h = reinterpret_cast<const xmem::layout::ControlHeader *>(segment.data());
	return reinterpret_cast<const xmem::layout::ConsumerRecord *>(segment.data() +
								      xmem::layout::consumers_offset(h->slot_count) +
								      uint64_t{ index } * h->consumer_record_size);
}

std::shared_ptr<BufferPool> inspect(const std::string &name)
{
	OpenOptions o;
	o.inspect = true;
	auto r = BufferPool::open(name, o);
	EXPECT_TRUE(r.ok()) << why(r);
	return r ? r.value() : nullptr;
}

bool readable(int fd, int timeout_ms)
{
	pollfd p{ fd, POLLIN, 0 };
	return ::poll(&p, 1, timeout_ms) == 1 && (p.revents & POLLIN);
}

std::vector<std::string> sorted(std::vector<std::string> v)
{
	std::sort(v.begin(), v.end());
	return v;
}

// create()

TEST(Create, RejectsBadConfig)
{
	RuntimeDir dir;
	auto expect_invalid = [&](PoolConfig c, const char *what) {
		auto r = BufferPool::create("bad-config", c);
		EXPECT_ERRC(r, Errc::invalid_argument);
		EXPECT_FALSE(r.ok()) << what << " was accepted";
	};
	PoolConfig c = config();
	c.slot_count = 0;
	expect_invalid(c, "slot_count 0");
	c = config();
	c.slot_count = XMEM_MAX_SLOTS + 1;
	expect_invalid(c, "slot_count > XMEM_MAX_SLOTS");
	c = config();
	c.slot_size = 0;
	expect_invalid(c, "slot_size 0");
	c = config();
	c.max_consumers = 0;
	expect_invalid(c, "max_consumers 0");
	c = config();
	c.max_consumers = XMEM_MAX_CONSUMERS + 1; // 128
	expect_invalid(c, "max_consumers 128");
	c = config();
	c.mode = 0400;
	expect_invalid(c, "mode 0400");
	c = config();
	c.mode = 0066;
	expect_invalid(c, "mode 0066");
	c = config();
	c.mode = 04600;
	expect_invalid(c, "mode 04600");
	c = config();
	c.producer = std::string(XMEM_PRODUCER_MAX, 'p');
	expect_invalid(c, "a 32-byte producer name");
	c = config();
	c.block_timeout = -1ns;
	expect_invalid(c, "a negative block timeout");
	c = config();
	c.policy = Policy(7);
	expect_invalid(c, "policy 7");
	c = config();
	c.storage = xmem::Storage(9);
	expect_invalid(c, "storage 9");
	c = config();
	c.device = 1;
	expect_invalid(c, "a device for a system-memory pool");
	c = config();
	c.format = std::string(XMEM_FORMAT_MAX, 'f');
	expect_invalid(c, "a format of XMEM_FORMAT_MAX bytes");
	// Nothing was claimed by the refused creates.
	EXPECT_EQ(dir.entries(), std::vector<std::string>{});
	EXPECT_ERRC(BufferPool::open("bad-config"), Errc::not_found);
}

TEST(Create, AcceptsBoundaryConfig)
{
	RuntimeDir dir;
	PoolConfig c = config(1, Policy::drop_oldest, 1);
	c.max_consumers = 1;
	c.producer = std::string(XMEM_PRODUCER_MAX - 1, 'p');
	auto one = create("one", c);
	ASSERT_TRUE(one);
	EXPECT_EQ(one->slot_count(), 1u);
	EXPECT_EQ(one->slot_size(), 1u);
	EXPECT_EQ(one->role(), xmem::Role::owner);
	EXPECT_EQ(one->name(), "one");
	EXPECT_EQ(one->path(), dir.pool_dir() + "/one");
	EXPECT_EQ(one->fd(), -1) << "an owner has no receive fd";

	c = config(XMEM_MAX_SLOTS, Policy::drop_oldest, 64);
	c.max_consumers = XMEM_MAX_CONSUMERS;
	auto big = create("big", c);
	ASSERT_TRUE(big);
	EXPECT_EQ(big->slot_count(), uint32_t(XMEM_MAX_SLOTS));
	EXPECT_EQ(big->stats().slots_total, uint32_t(XMEM_MAX_SLOTS));
	EXPECT_EQ(big->stats().slots_free, uint32_t(XMEM_MAX_SLOTS));
}

TEST(Create, SocketHasTheConfiguredMode)
{
	RuntimeDir dir;
	auto priv = create("private");
	ASSERT_TRUE(priv);
	struct stat st;
	ASSERT_EQ(::stat(priv->path().c_str(), &st), 0);
	EXPECT_TRUE(S_ISSOCK(st.st_mode));
	EXPECT_EQ(st.st_mode & 0777, 0600u);
	ASSERT_EQ(::stat(dir.pool_dir().c_str(), &st), 0);
	EXPECT_EQ(st.st_mode & 0077, 0u) << "the pool directory starts private";

	PoolConfig c = config();
	c.mode = 0660;
	auto group = create("group", c);
	ASSERT_TRUE(group);
	ASSERT_EQ(::stat(group->path().c_str(), &st), 0);
	EXPECT_EQ(st.st_mode & 0777, 0660u);
	ASSERT_EQ(::stat(dir.pool_dir().c_str(), &st), 0);
	EXPECT_TRUE(st.st_mode & 0010) << "group members must be able to reach a 0660 socket";
}

// The frame round trip

TEST(VideoLayout, PlanesArePitchedAndAligned)
{
	xmem::FrameMeta m{};
	// NV12 1920x1080 at 256: Y rows of 2048, UV rows of 2048 (960 pairs), 540 of them.
	auto size = xmem::set_video_layout(m, "NV12", 1920, 1080, 256);
	ASSERT_TRUE(size.ok()) << size.error().message;
	EXPECT_EQ(m.n_planes, 2u);
	EXPECT_EQ(m.plane_stride[0], 2048u);
	EXPECT_EQ(m.plane_stride[1], 2048u);
	EXPECT_EQ(m.plane_offset[0], 0u);
	EXPECT_EQ(m.plane_offset[1], 2048u * 1080);
	EXPECT_EQ(*size, 2048u * 1080 + 2048u * 540);
	EXPECT_EQ(m.size, *size);
	// Tight packing with alignment 1, as GStreamer lays out 640x480 I420 with 4.
	ASSERT_TRUE(xmem::set_video_layout(m, "I420", 640, 480, 4).ok());
	EXPECT_EQ(m.n_planes, 3u);
	EXPECT_EQ(m.plane_stride[0], 640u);
	EXPECT_EQ(m.plane_stride[1], 320u);
	EXPECT_EQ(m.plane_offset[1], 640u * 480);
	EXPECT_EQ(m.plane_offset[2], 640u * 480 + 320u * 240);
	EXPECT_EQ(m.size, 640u * 480 * 3 / 2);
	// Odd sizes round the chroma up; RGBA is one plane of 4 bytes a pixel.
	ASSERT_TRUE(xmem::set_video_layout(m, "NV12", 5, 3, 1).ok());
	EXPECT_EQ(m.plane_stride[1], 6u);
	EXPECT_EQ(m.size, 5u * 3 + 6u * 2);
	ASSERT_TRUE(xmem::set_video_layout(m, "RGBA", 100, 10, 64).ok());
	EXPECT_EQ(m.n_planes, 1u);
	EXPECT_EQ(m.plane_stride[0], 448u);
	EXPECT_EQ(m.plane_offset[1], 0u);
	// Bad input names the cause.
	EXPECT_EQ(xmem::set_video_layout(m, "MJPG", 64, 64, 64).code(), Errc::invalid_argument);
	EXPECT_EQ(xmem::set_video_layout(m, "NV12", 0, 64, 64).code(), Errc::invalid_argument);
	EXPECT_EQ(xmem::set_video_layout(m, "NV12", 64, 64, 48).code(), Errc::invalid_argument);
}

TEST(VideoLayout, PlaneShapesAreTheLayoutsOwn)
{
	// Each format's planes as video_plane() says agree with what set_video_layout() lays out.
	for (const char *format : { "NV12", "NV21", "I420", "YV12", "P010_10LE", "Y444", "GRAY8", "RGB", "BGR", "RGBA",
				    "BGRA", "RGBx", "BGRx" }) {
		xmem::FrameMeta m{};
		ASSERT_TRUE(xmem::set_video_layout(m, format, 31, 17, 1).ok()) << format;
		for (uint32_t p = 0; p < m.n_planes; p++) {
			auto shape = xmem::video_plane(format, p);
			ASSERT_TRUE(shape.ok()) << format << " " << p;
			EXPECT_EQ(shape->planes, m.n_planes) << format;
			uint64_t row = (31 + shape->x_divisor - 1) / shape->x_divisor * shape->bytes;
			uint64_t rows = (17 + shape->y_divisor - 1) / shape->y_divisor;
			EXPECT_EQ(m.plane_stride[p], row) << format << " " << p;
			uint64_t end = p + 1 < m.n_planes ? m.plane_offset[p + 1] : m.size;
			EXPECT_EQ(end - m.plane_offset[p], row * rows) << format << " " << p;
		}
		EXPECT_EQ(xmem::video_plane(format, m.n_planes).code(), Errc::invalid_argument) << format;
	}
	EXPECT_EQ(xmem::video_plane("MJPG", 0).code(), Errc::invalid_argument);
}

TEST(RoundTrip, CarriesDataAndMetadata)
{
	RuntimeDir dir;
	PoolConfig c = config(4);
	c.producer = "api-producer";
	c.format = "video/x-raw,format=GRAY8";
	auto owner = create("rt", c);
	ASSERT_TRUE(owner);
	auto consumer = open("rt");
	ASSERT_TRUE(consumer);
	EXPECT_EQ(consumer->role(), xmem::Role::consumer);
	EXPECT_EQ(consumer->slot_count(), 4u);
	EXPECT_EQ(consumer->slot_size(), 4096u);
	EXPECT_EQ(consumer->path(), owner->path());

	auto g = owner->acquire(1s);
	ASSERT_OK(g);
	EXPECT_TRUE(g->writable());
	EXPECT_FALSE(g->is_copy());
	EXPECT_EQ(g->capacity(), 4096u);
	EXPECT_EQ(g->format(), c.format);
	auto bytes = g->data_mut();
	ASSERT_OK(bytes);
	ASSERT_EQ(bytes->size(), 4096u);
	fill(*bytes, 1000, 42);
	auto m = g->meta_mut();
	ASSERT_OK(m);
	EXPECT_EQ((*m)->pts, XMEM_NONE) << "acquire starts with no pts";
	EXPECT_EQ((*m)->dts, XMEM_NONE);
	EXPECT_EQ((*m)->duration, XMEM_NONE);
	(*m)->size = 1000;
	(*m)->pts = 11;
	(*m)->dts = 22;
	(*m)->duration = 33;
	(*m)->flags = 0xabcd;
	(*m)->dtype = XMEM_DTYPE_U16;
	(*m)->ndim = 3;
	uint64_t shape[3] = { 10, 25, 2 }, strides[3] = { 100, 4, 2 };
	std::copy(shape, shape + 3, (*m)->shape);
	std::copy(strides, strides + 3, (*m)->strides);
	std::strcpy((*m)->content_type, "tensor");
	(*m)->n_planes = 2;
	(*m)->plane_stride[0] = 64;
	(*m)->plane_stride[1] = 32;
	(*m)->plane_offset[0] = 0;
	(*m)->plane_offset[1] = 640;
	uint32_t index = g->index();
	uint64_t before = monotonic_ns();
	ASSERT_OK(owner->publish(std::move(*g)));
	EXPECT_FALSE(g->valid()) << "publish consumes the guard";

	auto f = consumer->receive(5s);
	uint64_t after = monotonic_ns();
	ASSERT_OK(f);
	const xmem::FrameMeta &meta = f->meta();
	EXPECT_EQ(meta.index, index);
	EXPECT_EQ(f->index(), index);
	EXPECT_EQ(meta.seq, 1u);
	EXPECT_EQ(meta.size, 1000u);
	EXPECT_EQ(meta.pts, 11u);
	EXPECT_EQ(meta.dts, 22u);
	EXPECT_EQ(meta.duration, 33u);
	EXPECT_EQ(meta.flags, 0xabcdu);
	EXPECT_EQ(int(meta.dtype), int(XMEM_DTYPE_U16));
	EXPECT_EQ(int(meta.ndim), 3);
	EXPECT_TRUE(std::equal(shape, shape + 3, meta.shape));
	EXPECT_TRUE(std::equal(strides, strides + 3, meta.strides));
	EXPECT_STREQ(meta.content_type, "tensor");
	EXPECT_EQ(meta.n_planes, 2u);
	EXPECT_EQ(meta.plane_stride[0], 64u);
	EXPECT_EQ(meta.plane_stride[1], 32u);
	EXPECT_EQ(meta.plane_offset[1], 640u);
	EXPECT_STREQ(meta.producer, "api-producer");
	EXPECT_EQ(meta.producer_pid, uint32_t(::getpid()));
	EXPECT_EQ(int(meta.storage_type), int(XMEM_STORAGE_SYSTEM));
	EXPECT_GE(meta.timestamp, before) << "publish stamps CLOCK_MONOTONIC";
	EXPECT_LE(meta.timestamp, after);
	EXPECT_FALSE(f->writable());
	EXPECT_EQ(f->capacity(), 4096u);
	EXPECT_EQ(f->format(), c.format);
	ASSERT_EQ(f->data().size(), 1000u) << "a received frame shows its size, not the slot's";
	EXPECT_TRUE(intact(f->data(), 42));
	EXPECT_ERRC(f->meta_mut(), Errc::read_only);
	EXPECT_ERRC(f->data_mut(), Errc::read_only);

	// A timestamp the producer set is kept; seq goes on counting.
	auto g2 = owner->acquire(1s);
	ASSERT_OK(g2);
	g2->meta_mut().value()->timestamp = 123456789;
	g2->meta_mut().value()->size = 0;
	ASSERT_OK(owner->publish(std::move(*g2)));
	auto f2 = consumer->receive(5s);
	ASSERT_OK(f2);
	EXPECT_EQ(f2->meta().seq, 2u);
	EXPECT_EQ(f2->meta().timestamp, 123456789u);
	EXPECT_EQ(f2->meta().pts, XMEM_NONE);
	EXPECT_TRUE(f2->data().empty());
	EXPECT_EQ(owner->stats().published, 2u);
}

TEST(RoundTrip, FramesArriveInOrder)
{
	RuntimeDir dir;
	auto owner = create("order", config(8));
	ASSERT_TRUE(owner);
	auto consumer = open("order", 8);
	ASSERT_TRUE(consumer);
	for (uint64_t round = 0; round < 10; round++) {
		for (uint64_t i = 1; i <= 5; i++)
			publish(*owner, round * 10 + i);
		for (uint64_t i = 1; i <= 5; i++) {
			auto f = receive(*consumer, round * 10 + i);
			EXPECT_EQ(f.meta().seq, round * 5 + i);
		}
	}
	EXPECT_EQ(owner->stats().dropped, 0u);
}

// Formats

TEST(Format, SetGetAndPerFrame)
{
	RuntimeDir dir;
	PoolConfig c = config(4);
	c.format = "fmt-a";
	auto owner = create("fmt", c);
	ASSERT_TRUE(owner);
	EXPECT_EQ(owner->format(), "fmt-a");
	auto consumer = open("fmt");
	ASSERT_TRUE(consumer);
	EXPECT_EQ(consumer->format(), "fmt-a") << "a consumer learns the format at attach";

	publish(*owner, 1);
	ASSERT_OK(owner->set_format("fmt-b"));
	EXPECT_EQ(owner->format(), "fmt-b");
	EXPECT_EQ(consumer->format(), "fmt-a") << "a consumer's format changes with the frames, not before";
	publish(*owner, 2);
	publish(*owner, 3);

	auto f1 = receive(*consumer, 1);
	EXPECT_EQ(f1.format(), "fmt-a") << "a frame published before set_format keeps the old format";
	EXPECT_EQ(consumer->format(), "fmt-a");
	auto f2 = receive(*consumer, 2);
	EXPECT_EQ(f2.format(), "fmt-b") << "the first frame after set_format carries the new format";
	EXPECT_EQ(consumer->format(), "fmt-b");
	EXPECT_EQ(f1.format(), "fmt-a") << "an older frame still in hand keeps its format";
	auto f3 = receive(*consumer, 3);
	EXPECT_EQ(f3.format(), "fmt-b");

	// The slot of an old-format frame reused after the change carries the new one.
	f1.reset();
	f2.reset();
	f3.reset();
	for (uint64_t tag = 4; tag < 12; tag++) {
		publish(*owner, tag);
		EXPECT_EQ(receive(*consumer, tag).format(), "fmt-b");
	}

	// A consumer attaching now starts with the current format.
	auto late = open("fmt");
	ASSERT_TRUE(late);
	EXPECT_EQ(late->format(), "fmt-b");

	EXPECT_OK(owner->set_format(""));
	EXPECT_EQ(owner->format(), "");
	EXPECT_OK(owner->set_format(std::string(XMEM_FORMAT_MAX - 1, 'x')));
	publish(*owner, 20);
	EXPECT_EQ(receive(*consumer, 20).format(), std::string(XMEM_FORMAT_MAX - 1, 'x'));
	EXPECT_ERRC(owner->set_format(std::string(XMEM_FORMAT_MAX, 'x')), Errc::invalid_argument);
	EXPECT_ERRC(owner->set_format(std::string("a\0b", 3)), Errc::invalid_argument);
	EXPECT_EQ(owner->format(), std::string(XMEM_FORMAT_MAX - 1, 'x')) << "a refused format changes nothing";
}

// End of stream and closing

TEST(EndOfStream, AfterTheQueuedFrames)
{
	RuntimeDir dir;
	auto owner = create("eos", config(4));
	ASSERT_TRUE(owner);
	auto consumer = open("eos");
	ASSERT_TRUE(consumer);
	publish(*owner, 1);
	publish(*owner, 2);
	ASSERT_OK(owner->end_of_stream());
	receive(*consumer, 1);
	receive(*consumer, 2);
	EXPECT_ERRC(consumer->receive(5s), Errc::end_of_stream);
	EXPECT_EQ(owner->stats().dropped, 0u);
}

TEST(EndOfStream, FitsBehindAFullQueue)
{
	RuntimeDir dir;
	// Two slots, both queued: EOS takes the ring's spare entry and drops nothing.
	auto owner = create("eos-full", config(2));
	ASSERT_TRUE(owner);
	auto consumer = open("eos-full", 2);
	ASSERT_TRUE(consumer);
	publish(*owner, 1);
	publish(*owner, 2);
	ASSERT_OK(owner->end_of_stream());
	receive(*consumer, 1);
	receive(*consumer, 2);
	EXPECT_ERRC(consumer->receive(5s), Errc::end_of_stream);
	EXPECT_EQ(owner->stats().dropped, 0u);
}

TEST(Close, ConsumerDrainsThenSeesClosed)
{
	RuntimeDir dir;
	auto owner = create("close", config(4));
	ASSERT_TRUE(owner);
	auto consumer = open("close");
	ASSERT_TRUE(consumer);
	publish(*owner, 1);
	publish(*owner, 2);
	owner.reset();
	EXPECT_EQ(dir.entries(), std::vector<std::string>{}) << "socket and lock file go with the owner";
	receive(*consumer, 1);
	receive(*consumer, 2);
	EXPECT_ERRC(consumer->receive(5s), Errc::closed);
	EXPECT_ERRC(consumer->receive(0s), Errc::closed);
	EXPECT_EQ(consumer->stats().closed, 1u);
	EXPECT_ERRC(BufferPool::open("close"), Errc::not_found);
}

TEST(Close, LimboKeepsAHeldFrameIntact)
{
	RuntimeDir dir;
	auto owner = create("limbo", config(2, Policy::drop_oldest, 1 << 16));
	ASSERT_TRUE(owner);
	auto consumer = open("limbo");
	ASSERT_TRUE(consumer);
	publish(*owner, 7, 1 << 16);
	auto held = receive(*consumer, 7);
	ASSERT_TRUE(held.valid());
	owner.reset();
	// The owner and its mappings are gone; ours stays until the last guard goes.
	EXPECT_TRUE(intact(held.data(), 7));
	EXPECT_EQ(held.data().size(), size_t(1 << 16));
	EXPECT_EQ(held.meta().pts, 7u);
	auto clone = held.clone_ref();
	ASSERT_OK(clone);
	held.reset();
	EXPECT_TRUE(intact(clone->data(), 7));
	EXPECT_ERRC(consumer->receive(0s), Errc::closed);
	consumer.reset(); // the handle goes before the last guard
	EXPECT_TRUE(intact(clone->data(), 7));
	EXPECT_EQ(clone->meta().seq, 1u);
}

TEST(Close, OwnerGuardMayOutliveTheHandle)
{
	RuntimeDir dir;
	auto owner = create("outlive", config(2));
	ASSERT_TRUE(owner);
	auto g = owner->acquire(1s);
	ASSERT_OK(g);
	owner.reset();
	EXPECT_EQ(dir.entries(), std::vector<std::string>{});
	fill(g->data_mut().value(), 4096, 3);
	EXPECT_TRUE(intact(g->data(), 3));
	g->reset();
	// The name is free again.
	EXPECT_TRUE(create("outlive", config(2)));
}

TEST(Close, ExplicitCloseFreesTheName)
{
	RuntimeDir dir;
	auto owner = create("closing", config(4));
	ASSERT_TRUE(owner);
	auto consumer = open("closing");
	ASSERT_TRUE(consumer);
	publish(*owner, 1);
	auto pending = owner->acquire(1s);
	ASSERT_OK(pending);
	owner->close();
	owner->close(); // idempotent
	EXPECT_EQ(dir.entries(), std::vector<std::string>{}) << "close() left the socket or lock file";
	EXPECT_EQ(owner->stats().closed, 1u);
	EXPECT_ERRC(owner->acquire(0s), Errc::closed);
	EXPECT_ERRC(owner->publish(std::move(*pending)), Errc::closed);
	(void)owner->end_of_stream(); // whatever it returns, no crash after close()
	receive(*consumer, 1);
	EXPECT_ERRC(consumer->receive(1s), Errc::closed);
	// A new owner may take the name while the old handle still exists.
	auto next = create("closing", config(2));
	ASSERT_TRUE(next);
	auto again = open("closing");
	ASSERT_TRUE(again);
	publish(*next, 2);
	receive(*again, 2);
	owner.reset();
	EXPECT_EQ(sorted(dir.entries()), (std::vector<std::string>{ "closing", "closing.lock" }))
		<< "destroying the closed handle removed the new owner's files";
	// close() is for owners; a consumer's handle keeps working.
	again->close();
	publish(*next, 3);
	receive(*again, 3);
}

TEST(Close, CloseWakesAWaitingAcquire)
{
	RuntimeDir dir;
	auto owner = create("close-wake", config(1));
	ASSERT_TRUE(owner);
	auto consumer = open("close-wake");
	ASSERT_TRUE(consumer);
	publish(*owner, 1);
	auto held = receive(*consumer, 1); // the only slot
	std::thread closer([&] {
		std::this_thread::sleep_for(100ms);
		owner->close();
	});
	auto t0 = std::chrono::steady_clock::now();
	EXPECT_ERRC(owner->acquire(30s), Errc::closed);
	EXPECT_LT(since(t0), 10000) << "acquire() slept through close()";
	closer.join();
}

// receive() and fd()

TEST(Receive, TimesOut)
{
	RuntimeDir dir;
	auto owner = create("timeout");
	ASSERT_TRUE(owner);
	auto consumer = open("timeout");
	ASSERT_TRUE(consumer);
	auto t0 = std::chrono::steady_clock::now();
	EXPECT_ERRC(consumer->receive(0s), Errc::timed_out);
	EXPECT_LT(since(t0), 1000);
	t0 = std::chrono::steady_clock::now();
	EXPECT_ERRC(consumer->receive(200ms), Errc::timed_out);
	EXPECT_GE(since(t0), 190);
	EXPECT_LT(since(t0), 5000);
}

TEST(Receive, WakesWhenAFrameIsPublished)
{
	RuntimeDir dir;
	auto owner = create("wake");
	ASSERT_TRUE(owner);
	auto consumer = open("wake");
	ASSERT_TRUE(consumer);
	std::thread producer([&] {
		std::this_thread::sleep_for(100ms);
		publish(*owner, 5);
	});
	auto t0 = std::chrono::steady_clock::now();
	receive(*consumer, 5, 20s);
	EXPECT_LT(since(t0), 10000) << "the sleeping consumer was not woken";
	producer.join();

	// Forever, woken by EOS.
	std::thread eos([&] {
		std::this_thread::sleep_for(50ms);
		EXPECT_OK(owner->end_of_stream());
	});
	EXPECT_ERRC(consumer->receive(std::chrono::nanoseconds(XMEM_FOREVER)), Errc::end_of_stream);
	eos.join();
}

TEST(Receive, FdPollsReadableWhenAFrameArrives)
{
	RuntimeDir dir;
	auto owner = create("poll");
	ASSERT_TRUE(owner);
	auto consumer = open("poll");
	ASSERT_TRUE(consumer);
	int fd = consumer->fd();
	ASSERT_GE(fd, 0);
	EXPECT_EQ(consumer->fd(), fd) << "the fd is stable";

	for (uint64_t tag = 1; tag <= 3; tag++) {
		EXPECT_ERRC(consumer->receive(0s), Errc::timed_out);
		EXPECT_FALSE(readable(fd, 0)) << "readable with nothing queued";
		publish(*owner, tag);
		EXPECT_TRUE(readable(fd, 5000)) << "not readable after a publish";
		receive(*consumer, tag, 0s);
	}
	// EOS wakes it too.
	EXPECT_ERRC(consumer->receive(0s), Errc::timed_out);
	ASSERT_OK(owner->end_of_stream());
	EXPECT_TRUE(readable(fd, 5000));
	EXPECT_ERRC(consumer->receive(0s), Errc::end_of_stream);
}

TEST(Receive, FdPollsReadableOnTheFirstFrame)
{
	RuntimeDir dir;
	auto owner = create("poll-first");
	ASSERT_TRUE(owner);
	auto consumer = open("poll-first");
	ASSERT_TRUE(consumer);
	EXPECT_FALSE(readable(consumer->fd(), 0));
	publish(*owner, 1); // no receive() has armed it yet
	EXPECT_TRUE(readable(consumer->fd(), 5000)) << "a fresh consumer's fd missed the first frame";
	receive(*consumer, 1, 0s);
}

TEST(Receive, FdPollsReadableWhenTheOwnerCloses)
{
	RuntimeDir dir;
	auto owner = create("poll-close");
	ASSERT_TRUE(owner);
	auto consumer = open("poll-close");
	ASSERT_TRUE(consumer);
	EXPECT_ERRC(consumer->receive(0s), Errc::timed_out);
	EXPECT_FALSE(readable(consumer->fd(), 0));
	owner.reset();
	EXPECT_TRUE(readable(consumer->fd(), 5000));
	EXPECT_ERRC(consumer->receive(0s), Errc::closed);
}

// One table of names per concept: policy_names() is what policy_from_name accepts and
// policy_name gives, storage_name and storage_from_name agree.
TEST(Names, PoliciesAndStoragesBothWays)
{
	std::vector<std::string> names;
	for (const xmem::PolicyName &n : xmem::policy_names()) {
		names.emplace_back(n.name);
		EXPECT_EQ(xmem::policy_from_name(n.name), n.policy) << n.name;
	}
	EXPECT_EQ(names,
		  (std::vector<std::string>{ "block", "fifo", "drop-oldest", "drop-new", "latest", "fifo-spill" }));
	for (xmem::Policy p : { xmem::Policy::fifo, xmem::Policy::drop_oldest, xmem::Policy::drop_new,
				xmem::Policy::latest, xmem::Policy::fifo_spill }) {
		// Each policy's own name is its last in the table ("fifo", not "block").
		const char *last = nullptr;
		for (const xmem::PolicyName &n : xmem::policy_names())
			if (n.policy == p)
				last = n.name;
		ASSERT_NE(last, nullptr);
		EXPECT_STREQ(xmem::policy_name(p), last);
	}
	EXPECT_EQ(xmem::policy_name(xmem::Policy(5)), nullptr);
	EXPECT_EQ(xmem::policy_from_name("Fifo"), std::nullopt);
	EXPECT_EQ(xmem::policy_from_name(""), std::nullopt);

	EXPECT_STREQ(xmem::storage_name(xmem::Storage::system), "system");
	EXPECT_STREQ(xmem::storage_name(xmem::Storage::cuda), "cuda");
	EXPECT_EQ(xmem::storage_name(xmem::Storage(2)), nullptr);
	EXPECT_EQ(xmem::storage_from_name("system"), xmem::Storage::system);
	EXPECT_EQ(xmem::storage_from_name("cuda"), xmem::Storage::cuda);
	EXPECT_EQ(xmem::storage_from_name("gpu"), std::nullopt);
}

// Queue policies

TEST(Policy, DropOldestKeepsTheNewest)
{
	RuntimeDir dir;
	auto owner = create("drop-oldest", config(8, Policy::drop_oldest));
	ASSERT_TRUE(owner);
	auto consumer = open("drop-oldest", 2);
	ASSERT_TRUE(consumer);
	for (uint64_t tag = 1; tag <= 5; tag++)
		publish(*owner, tag);
	auto f4 = receive(*consumer, 4);
	EXPECT_EQ(f4.meta().seq, 4u);
	auto f5 = receive(*consumer, 5);
	EXPECT_ERRC(consumer->receive(0s), Errc::timed_out);
	EXPECT_EQ(owner->stats().published, 5u);
	EXPECT_EQ(owner->stats().dropped, 3u);
	auto insp = inspect("drop-oldest");
	ASSERT_TRUE(insp);
	auto *rec = consumer_record(insp->control_segment(), 0);
	EXPECT_EQ(rec->dropped.load(), 3u);
	EXPECT_EQ(rec->queued_total.load(), 5u);
	EXPECT_EQ(rec->received.load(), 2u);
	// The dropped frames' slots went back: only the two held ones are in use.
	EXPECT_EQ(owner->stats().slots_free, 6u);
}

TEST(Policy, DropNewKeepsTheFirst)
{
	RuntimeDir dir;
	auto owner = create("drop-new", config(8, Policy::drop_new));
	ASSERT_TRUE(owner);
	auto consumer = open("drop-new", 2);
	ASSERT_TRUE(consumer);
	for (uint64_t tag = 1; tag <= 5; tag++)
		publish(*owner, tag);
	auto f1 = receive(*consumer, 1);
	EXPECT_EQ(f1.meta().seq, 1u);
	auto f2 = receive(*consumer, 2);
	EXPECT_ERRC(consumer->receive(0s), Errc::timed_out);
	EXPECT_EQ(owner->stats().published, 5u);
	EXPECT_EQ(owner->stats().dropped, 3u);
	auto insp = inspect("drop-new");
	ASSERT_TRUE(insp);
	auto *rec = consumer_record(insp->control_segment(), 0);
	EXPECT_EQ(rec->dropped.load(), 3u);
	EXPECT_EQ(rec->queued_total.load(), 2u);
	EXPECT_EQ(owner->stats().slots_free, 6u);
	// With room again, new frames are queued.
	publish(*owner, 6);
	auto f6 = receive(*consumer, 6);
	EXPECT_EQ(f6.meta().seq, 6u);
}

TEST(Policy, BlockWaitsForTheConsumer)
{
	RuntimeDir dir;
	PoolConfig c = config(4, Policy::block);
	c.block_timeout = 20s;
	auto owner = create("block", c);
	ASSERT_TRUE(owner);
	auto consumer = open("block", 1);
	ASSERT_TRUE(consumer);
	publish(*owner, 1);
	auto g = owner->acquire(1s);
	ASSERT_OK(g);
	fill(g->data_mut().value(), 256, 2);
	g->meta_mut().value()->size = 256;
	g->meta_mut().value()->pts = 2;
	std::atomic<bool> done{ false };
	xmem::Result<void> result;
	std::thread publisher([&] {
		result = owner->publish(std::move(*g));
		done = true;
	});
	std::this_thread::sleep_for(300ms);
	EXPECT_FALSE(done.load()) << "publish did not wait for room in a full queue";
	auto t0 = std::chrono::steady_clock::now();
	receive(*consumer, 1);
	ASSERT_TRUE(eventually([&] { return done.load(); }, 15s)) << "publish still blocked after the receive";
	EXPECT_LT(since(t0), 10000);
	publisher.join();
	EXPECT_OK(result);
	receive(*consumer, 2);
	EXPECT_EQ(owner->stats().dropped, 0u);
}

TEST(Policy, BlockTimeoutDropsTheOldest)
{
	RuntimeDir dir;
	PoolConfig c = config(4, Policy::block);
	c.block_timeout = 300ms;
	auto owner = create("block-timeout", c);
	ASSERT_TRUE(owner);
	auto consumer = open("block-timeout", 1);
	ASSERT_TRUE(consumer);
	publish(*owner, 1);
	auto t0 = std::chrono::steady_clock::now();
	publish(*owner, 2);
	EXPECT_GE(since(t0), 290) << "publish did not wait for the block timeout";
	EXPECT_LT(since(t0), 5000);
	receive(*consumer, 2);
	EXPECT_ERRC(consumer->receive(0s), Errc::timed_out);
	EXPECT_EQ(owner->stats().dropped, 1u);
}

// Four consumers that never read: one publish waits one block timeout in all, not
// one per consumer, then drops each one's oldest frame.
TEST(Policy, BlockTimeoutBoundsTheWholePublish)
{
	RuntimeDir dir;
	PoolConfig c = config(8, Policy::block);
	c.block_timeout = 400ms;
	auto owner = create("block-all", c);
	ASSERT_TRUE(owner);
	std::vector<std::shared_ptr<BufferPool>> consumers;
	for (int i = 0; i < 4; i++) {
		consumers.push_back(open("block-all", 1));
		ASSERT_TRUE(consumers.back());
	}
	publish(*owner, 1);
	auto t0 = std::chrono::steady_clock::now();
	publish(*owner, 2);
	EXPECT_GE(since(t0), 390) << "publish did not wait for the block timeout";
	// One timeout each would be 1600 ms at least.
	EXPECT_LT(since(t0), 1200) << "each stuck consumer cost its own block timeout";
	for (auto &consumer : consumers)
		receive(*consumer, 2);
	EXPECT_EQ(owner->stats().dropped, 4u);
}

// acquire()

TEST(Acquire, TimesOutWhenConsumersHoldEverySlot)
{
	RuntimeDir dir;
	auto owner = create("held", config(2, Policy::drop_oldest));
	ASSERT_TRUE(owner);
	auto consumer = open("held", 2);
	ASSERT_TRUE(consumer);
	publish(*owner, 1);
	publish(*owner, 2);
	auto f1 = receive(*consumer, 1);
	auto f2 = receive(*consumer, 2);
	EXPECT_EQ(owner->stats().slots_free, 0u);
	auto t0 = std::chrono::steady_clock::now();
	EXPECT_ERRC(owner->acquire(0s), Errc::timed_out);
	EXPECT_LT(since(t0), 1000);
	t0 = std::chrono::steady_clock::now();
	EXPECT_ERRC(owner->acquire(200ms), Errc::timed_out);
	EXPECT_GE(since(t0), 190);
	EXPECT_LT(since(t0), 5000);
	EXPECT_TRUE(intact(f1.data(), 1)) << "a held frame was reused";
	EXPECT_TRUE(intact(f2.data(), 2));
	uint32_t freed = f1.index();
	f1.reset();
	auto g = owner->acquire(1s);
	ASSERT_OK(g);
	EXPECT_EQ(g->index(), freed);
	EXPECT_TRUE(intact(f2.data(), 2));
}

TEST(Acquire, WaitsForARelease)
{
	RuntimeDir dir;
	auto owner = create("wait-release", config(1, Policy::drop_oldest));
	ASSERT_TRUE(owner);
	auto consumer = open("wait-release", 1);
	ASSERT_TRUE(consumer);
	publish(*owner, 1);
	auto f = receive(*consumer, 1);
	std::thread releaser([&] {
		std::this_thread::sleep_for(100ms);
		f.reset();
	});
	auto t0 = std::chrono::steady_clock::now();
	auto g = owner->acquire(20s);
	EXPECT_OK(g);
	EXPECT_LT(since(t0), 10000) << "the waiting owner was not woken by the release";
	releaser.join();
}

TEST(Acquire, QueuedFramesCountAsHeldWithoutDropOldest)
{
	for (Policy p : { Policy::drop_new, Policy::block }) {
		RuntimeDir dir;
		auto owner = create("queued-held", config(2, p));
		ASSERT_TRUE(owner);
		auto consumer = open("queued-held", 2);
		ASSERT_TRUE(consumer);
		publish(*owner, 1);
		publish(*owner, 2);
		EXPECT_ERRC(owner->acquire(0s), Errc::timed_out);
		receive(*consumer, 1);
		receive(*consumer, 2);
		EXPECT_OK(owner->acquire(1s));
	}
}

TEST(Acquire, DropOldestTakesBackQueuedFrames)
{
	RuntimeDir dir;
	auto owner = create("take-back", config(2, Policy::drop_oldest));
	ASSERT_TRUE(owner);
	auto consumer = open("take-back", 2);
	ASSERT_TRUE(consumer);
	uint32_t i1 = publish(*owner, 1);
	publish(*owner, 2);
	EXPECT_EQ(owner->stats().slots_free, 0u);
	auto g = owner->acquire(0s);
	ASSERT_OK(g);
	EXPECT_EQ(g->index(), i1) << "the globally oldest queued frame is taken back";
	EXPECT_EQ(owner->stats().dropped, 1u);
	fill(g->data_mut().value(), 256, 3);
	g->meta_mut().value()->size = 256;
	g->meta_mut().value()->pts = 3;
	ASSERT_OK(owner->publish(std::move(*g)));
	receive(*consumer, 2);
	receive(*consumer, 3);
	EXPECT_ERRC(consumer->receive(0s), Errc::timed_out);
}

// get() and get_mut()

TEST(Get, PublishedSlotFromAnotherConsumer)
{
	RuntimeDir dir;
	PoolConfig c = config(4);
	c.format = "get-format";
	auto owner = create("get", c);
	ASSERT_TRUE(owner);
	auto a = open("get");
	ASSERT_TRUE(a);
	uint32_t index = publish(*owner, 9, 500);
	auto fa = receive(*a, 9);
	auto b = open("get"); // attached after the publish: nothing queued for it
	ASSERT_TRUE(b);
	EXPECT_ERRC(b->receive(0s), Errc::timed_out);
	auto fb = b->get(index);
	ASSERT_OK(fb);
	EXPECT_FALSE(fb->writable());
	EXPECT_FALSE(fb->is_copy());
	EXPECT_EQ(fb->index(), index);
	EXPECT_EQ(fb->meta().seq, 1u);
	EXPECT_EQ(fb->meta().pts, 9u);
	EXPECT_EQ(fb->format(), "get-format");
	ASSERT_EQ(fb->data().size(), 500u);
	EXPECT_TRUE(intact(fb->data(), 9));
	EXPECT_EQ(b->ref_count(index), 1u);
	EXPECT_EQ(a->ref_count(index), 1u) << "counts are per process handle";
	// The owner may reference its published frames too.
	auto fo = owner->get(index);
	ASSERT_OK(fo);
	EXPECT_TRUE(intact(fo->data(), 9));
	fo->reset();
	// Still held by b after a lets go: not reused.
	fa.reset();
	EXPECT_EQ(owner->stats().slots_free, 3u);
	fb->reset();
	EXPECT_EQ(owner->stats().slots_free, 4u);
}

// An index sent with its frame's seq: get() takes that frame, and once the slot holds
// another one it is refused (never the newer frame), also for a slot freed meanwhile.
TEST(Get, AnIndexWithItsSeqFailsOnceTheSlotsFrameChanged)
{
	RuntimeDir dir;
	auto owner = create("get-seq", config(1));
	ASSERT_TRUE(owner);
	auto a = open("get-seq");
	ASSERT_TRUE(a);
	uint32_t index = publish(*owner, 9, 500);
	auto held = receive(*a, 9);
	uint64_t seq = held.meta().seq;
	auto same = a->get(index, seq);
	ASSERT_OK(same);
	EXPECT_EQ(same->meta().seq, seq);
	EXPECT_TRUE(intact(same->data(), 9));
	auto other = a->get(index, seq + 1);
	EXPECT_ERRC(other, Errc::not_held);
	EXPECT_NE(other.error().message.find("holds frame " + std::to_string(seq) + " now"), std::string::npos)
		<< other.error().message;
	EXPECT_EQ(a->ref_count(index), 2u) << "a refused get keeps no reference";
	same->reset();
	held.reset();
	// The only slot is reused for the next frame: the old index and seq name nothing.
	uint32_t again = publish(*owner, 10, 500);
	ASSERT_EQ(again, index);
	auto next = receive(*a, 10);
	EXPECT_ERRC(a->get(index, seq), Errc::not_held);
	auto newer = a->get(index, next.meta().seq);
	ASSERT_OK(newer);
	EXPECT_TRUE(intact(newer->data(), 10));
	EXPECT_ERRC(a->get(5, seq), Errc::out_of_range);
}

TEST(Get, FreeOrWritingSlotIsNotHeld)
{
	RuntimeDir dir;
	auto owner = create("get-free", config(2, Policy::drop_new));
	ASSERT_TRUE(owner);
	auto consumer = open("get-free");
	ASSERT_TRUE(consumer);
	EXPECT_ERRC(consumer->get(0), Errc::not_held);
	EXPECT_ERRC(consumer->get_mut(1), Errc::not_held);
	EXPECT_EQ(consumer->ref_count(0), 0u);
	auto g = owner->acquire(1s);
	ASSERT_OK(g);
	EXPECT_ERRC(consumer->get(g->index()), Errc::not_held);
	EXPECT_ERRC(consumer->get_mut(g->index()), Errc::not_held);
	EXPECT_EQ(consumer->ref_count(g->index()), 0u);
	// The failed gets left no reference behind: the slot is publishable and reusable.
	fill(g->data_mut().value(), 16, 1);
	g->meta_mut().value()->size = 16;
	g->meta_mut().value()->pts = 1;
	ASSERT_OK(owner->publish(std::move(*g)));
	receive(*consumer, 1).reset();
	EXPECT_EQ(owner->stats().slots_free, 2u);
	auto g1 = owner->acquire(0s), g2 = owner->acquire(0s);
	EXPECT_OK(g1);
	EXPECT_OK(g2);
}

TEST(Get, QueuedSlotIsNotHeld)
{
	RuntimeDir dir;
	auto owner = create("get-queued", config(1, Policy::drop_new));
	ASSERT_TRUE(owner);
	auto consumer = open("get-queued", 1);
	ASSERT_TRUE(consumer);
	uint32_t index = publish(*owner, 4);
	EXPECT_ERRC(consumer->get(index), Errc::not_held);
	EXPECT_ERRC(consumer->get_mut(index), Errc::not_held);
	EXPECT_EQ(consumer->ref_count(index), 0u);
	// The queue's reference survived the refused get: the owner cannot reuse the slot.
	EXPECT_ERRC(owner->acquire(0s), Errc::timed_out);
	auto f = receive(*consumer, 4);
	// Once received, get() adds a reference.
	auto again = consumer->get(index);
	ASSERT_OK(again);
	EXPECT_EQ(consumer->ref_count(index), 2u);
	EXPECT_TRUE(intact(again->data(), 4));
}

TEST(Get, OutOfRange)
{
	RuntimeDir dir;
	auto owner = create("range", config(4));
	ASSERT_TRUE(owner);
	auto consumer = open("range");
	ASSERT_TRUE(consumer);
	for (uint32_t index : { 4u, 1000u, UINT32_MAX }) {
		for (BufferPool *p : { owner.get(), consumer.get() }) {
			EXPECT_ERRC(p->get(index), Errc::out_of_range);
			EXPECT_ERRC(p->get_mut(index), Errc::out_of_range);
			EXPECT_ERRC(p->add_ref(index), Errc::out_of_range);
			EXPECT_ERRC(p->release(index), Errc::out_of_range);
			EXPECT_ERRC(p->set_local_refs(index, 1), Errc::out_of_range);
			EXPECT_EQ(p->ref_count(index), 0u);
		}
	}
}

TEST(GetMut, SoleHolderWritesInPlace)
{
	RuntimeDir dir;
	auto owner = create("cow-inplace", config(2));
	ASSERT_TRUE(owner);
	uint32_t index = publish(*owner, 5, 300); // no consumer yet: nobody holds it
	auto b = open("cow-inplace");
	ASSERT_TRUE(b);
	auto c = open("cow-inplace");
	ASSERT_TRUE(c);
	auto w = b->get_mut(index);
	ASSERT_OK(w);
	EXPECT_TRUE(w->writable());
	EXPECT_FALSE(w->is_copy()) << "the sole holder writes in place";
	EXPECT_TRUE(intact(w->data().first(300), 5));
	auto bytes = w->data_mut();
	ASSERT_OK(bytes);
	fill(*bytes, 300, 6);
	// Visible through a fresh reference to the slot.
	auto r = b->get(index);
	ASSERT_OK(r);
	EXPECT_EQ(r->data().data(), w->data().data()) << "in place means the slot's own memory";
	EXPECT_TRUE(intact(r->data(), 6));
	EXPECT_EQ(b->ref_count(index), 2u);
	// Nobody else gets in while it is being written.
	EXPECT_ERRC(c->get(index), Errc::not_held);
	EXPECT_EQ(c->ref_count(index), 0u);
	r->reset();
	w->reset();
	EXPECT_EQ(b->ref_count(index), 0u);
	EXPECT_EQ(owner->stats().slots_free, 2u);
}

TEST(GetMut, ReleasedSlotIsReadableAgain)
{
	// get_mut() in place makes the slot EXCLUSIVE; when the writer lets go it is
	// published again, and get() works on it as before.
	RuntimeDir dir;
	auto owner = create("cow-release", config(2));
	ASSERT_TRUE(owner);
	uint32_t index = publish(*owner, 5, 300);
	auto b = open("cow-release");
	ASSERT_TRUE(b);
	auto c = open("cow-release");
	ASSERT_TRUE(c);
	{
		auto w = b->get_mut(index);
		ASSERT_OK(w);
		ASSERT_FALSE(w->is_copy());
		fill(w->data_mut().value(), 300, 6);
	}
	auto r = c->get(index);
	ASSERT_OK(r);
	EXPECT_TRUE(intact(r->data(), 6));
	r->reset();
	auto again = b->get(index);
	EXPECT_OK(again);
}

TEST(GetMut, AnotherHolderGetsAPrivateCopy)
{
	RuntimeDir dir;
	auto owner = create("cow-copy", config(2));
	ASSERT_TRUE(owner);
	auto a = open("cow-copy");
	ASSERT_TRUE(a);
	uint32_t index = publish(*owner, 5, 300);
	auto fa = receive(*a, 5);
	auto b = open("cow-copy");
	ASSERT_TRUE(b);
	auto w = b->get_mut(index);
	ASSERT_OK(w);
	EXPECT_TRUE(w->writable());
	EXPECT_TRUE(w->is_copy()) << "another holder forces a copy";
	EXPECT_EQ(w->index(), index);
	EXPECT_EQ(w->meta().pts, 5u);
	ASSERT_EQ(w->data().size(), 300u);
	EXPECT_TRUE(intact(w->data(), 5)) << "the copy starts as the frame";
	EXPECT_NE(w->data().data(), fa.data().data());
	EXPECT_EQ(b->ref_count(index), 0u) << "a private copy holds no slot reference";
	auto bytes = w->data_mut();
	ASSERT_OK(bytes);
	fill(*bytes, 300, 8);
	EXPECT_TRUE(intact(w->data(), 8));
	EXPECT_TRUE(intact(fa.data(), 5)) << "the copy's writes reached the shared frame";
	auto fresh = b->get(index);
	ASSERT_OK(fresh);
	EXPECT_TRUE(intact(fresh->data(), 5));
	// A clone of the copy shares it and takes no reference.
	auto cl = w->clone_ref();
	ASSERT_OK(cl);
	EXPECT_EQ(cl->data().data(), w->data().data());
	EXPECT_TRUE(cl->is_copy());
	EXPECT_FALSE(cl->writable());
	EXPECT_EQ(b->ref_count(index), 1u);
	w->reset();
	EXPECT_TRUE(intact(cl->data(), 8)) << "the clone keeps the copy alive";

	// The same process holding the slot already gets a copy too.
	auto w2 = a->get_mut(index);
	ASSERT_OK(w2);
	EXPECT_TRUE(w2->is_copy());
	EXPECT_EQ(a->ref_count(index), 1u);
}

// References

TEST(Refs, AddReleaseSetAndCount)
{
	RuntimeDir dir;
	auto owner = create("refs", config(1, Policy::drop_new));
	ASSERT_TRUE(owner);
	uint32_t index = publish(*owner, 3);
	ASSERT_EQ(index, 0u);
	auto b = open("refs");
	ASSERT_TRUE(b);
	EXPECT_ERRC(b->release(0), Errc::not_held);
	EXPECT_ERRC(b->add_ref(0), Errc::not_held);
	EXPECT_ERRC(b->set_local_refs(0, 2), Errc::not_held);
	EXPECT_EQ(b->ref_count(0), 0u);

	auto g = b->get(0);
	ASSERT_OK(g);
	EXPECT_EQ(b->ref_count(0), 1u);
	ASSERT_OK(b->add_ref(0));
	ASSERT_OK(b->add_ref(0));
	EXPECT_EQ(b->ref_count(0), 3u);
	ASSERT_OK(b->release(0));
	EXPECT_EQ(b->ref_count(0), 2u);
	g->reset();
	EXPECT_EQ(b->ref_count(0), 1u) << "the guard drops only its own reference";
	EXPECT_ERRC(owner->acquire(0s), Errc::timed_out) << "a non-RAII reference still holds the slot";
	ASSERT_OK(b->set_local_refs(0, 5));
	EXPECT_EQ(b->ref_count(0), 5u);
	ASSERT_OK(b->release(0));
	EXPECT_EQ(b->ref_count(0), 4u);
	EXPECT_ERRC(owner->acquire(0s), Errc::timed_out);
	ASSERT_OK(b->set_local_refs(0, 0));
	EXPECT_EQ(b->ref_count(0), 0u);
	EXPECT_ERRC(b->release(0), Errc::not_held);
	EXPECT_ERRC(b->set_local_refs(0, 0), Errc::not_held);
	// All released: the owner takes the slot back.
	auto again = owner->acquire(1s);
	ASSERT_OK(again);
	EXPECT_EQ(again->index(), 0u);
}

TEST(Refs, ReleaseToZeroFreesTheSlot)
{
	RuntimeDir dir;
	auto owner = create("refs-zero", config(1, Policy::drop_new));
	ASSERT_TRUE(owner);
	auto consumer = open("refs-zero", 1);
	ASSERT_TRUE(consumer);
	publish(*owner, 1);
	auto f = receive(*consumer, 1);
	ASSERT_OK(consumer->add_ref(0));
	f.reset();
	EXPECT_EQ(consumer->ref_count(0), 1u);
	EXPECT_ERRC(owner->acquire(0s), Errc::timed_out);
	ASSERT_OK(consumer->release(0));
	EXPECT_EQ(consumer->ref_count(0), 0u);
	EXPECT_OK(owner->acquire(1s));
}

TEST(Refs, CloneRef)
{
	RuntimeDir dir;
	auto owner = create("clone", config(2));
	ASSERT_TRUE(owner);
	auto consumer = open("clone");
	ASSERT_TRUE(consumer);
	uint32_t index = publish(*owner, 12);
	auto f = receive(*consumer, 12);
	auto c = f.clone_ref();
	ASSERT_OK(c);
	EXPECT_TRUE(c->valid());
	EXPECT_FALSE(c->writable());
	EXPECT_EQ(c->index(), index);
	EXPECT_EQ(c->data().data(), f.data().data());
	EXPECT_EQ(c->data().size(), f.data().size());
	EXPECT_EQ(c->meta().seq, f.meta().seq);
	EXPECT_EQ(consumer->ref_count(index), 2u);
	f.reset();
	EXPECT_EQ(consumer->ref_count(index), 1u);
	EXPECT_TRUE(intact(c->data(), 12));
	EXPECT_EQ(owner->stats().slots_free, 1u) << "the clone still holds the slot";
	c->reset();
	EXPECT_EQ(consumer->ref_count(index), 0u);
	EXPECT_EQ(owner->stats().slots_free, 2u);
	BufferGuard empty;
	EXPECT_ERRC(empty.clone_ref(), Errc::invalid_argument);
}

TEST(Refs, ResetTwiceAndMove)
{
	RuntimeDir dir;
	auto owner = create("reset", config(2));
	ASSERT_TRUE(owner);
	auto consumer = open("reset");
	ASSERT_TRUE(consumer);
	uint32_t index = publish(*owner, 1);
	auto f = receive(*consumer, 1);
	auto keep = f.clone_ref();
	ASSERT_OK(keep);
	ASSERT_EQ(consumer->ref_count(index), 2u);
	f.reset();
	f.reset();
	EXPECT_FALSE(f.valid());
	EXPECT_TRUE(f.data().empty());
	EXPECT_EQ(consumer->ref_count(index), 1u) << "a second reset released someone else's reference";

	BufferGuard moved = std::move(*keep);
	EXPECT_FALSE(keep->valid());
	keep->reset();
	EXPECT_EQ(consumer->ref_count(index), 1u) << "a moved-from guard released the reference";
	EXPECT_TRUE(intact(moved.data(), 1));

	// Move-assigning over a guard releases what it held.
	uint32_t index2 = publish(*owner, 2);
	auto f2 = receive(*consumer, 2);
	moved = std::move(f2);
	EXPECT_EQ(consumer->ref_count(index), 0u);
	EXPECT_EQ(consumer->ref_count(index2), 1u);
	EXPECT_TRUE(intact(moved.data(), 2));
	moved = BufferGuard();
	EXPECT_EQ(consumer->ref_count(index2), 0u);
	EXPECT_EQ(owner->stats().slots_free, 2u);
}

TEST(Refs, TryMakeWritable)
{
	RuntimeDir dir;
	auto owner = create("make-writable", config(2));
	ASSERT_TRUE(owner);
	auto a = open("make-writable");
	ASSERT_TRUE(a);
	uint32_t index = publish(*owner, 5, 300);
	auto b = open("make-writable"); // nothing queued for it
	ASSERT_TRUE(b);

	// Another holder (a's queued frame): stays read-only, never copies.
	auto g = b->get(index);
	ASSERT_OK(g);
	EXPECT_FALSE(g->try_make_writable());
	EXPECT_FALSE(g->writable());
	EXPECT_FALSE(g->is_copy());
	EXPECT_ERRC(g->data_mut(), Errc::read_only);
	// A read-only share of a private copy: no.
	auto copy = b->get_mut(index);
	ASSERT_OK(copy);
	ASSERT_TRUE(copy->is_copy());
	auto copy_ro = copy->clone_ref();
	ASSERT_OK(copy_ro);
	EXPECT_FALSE(copy_ro->try_make_writable());
	EXPECT_FALSE(copy_ro->writable());
	copy->reset();
	copy_ro->reset();
	receive(*a, 5).reset();

	// Held twice by this process: no.
	auto twice = g->clone_ref();
	ASSERT_OK(twice);
	EXPECT_FALSE(g->try_make_writable());
	twice->reset();

	// Sole holder, held once: writable in place.
	const std::byte *before = g->data().data();
	EXPECT_TRUE(g->try_make_writable());
	EXPECT_TRUE(g->writable());
	EXPECT_FALSE(g->is_copy());
	EXPECT_TRUE(g->try_make_writable()) << "already writable";
	auto bytes = g->data_mut();
	ASSERT_OK(bytes);
	EXPECT_EQ(bytes->data(), before) << "made writable by copying";
	fill(*bytes, 300, 6);
	auto r = b->get(index);
	ASSERT_OK(r);
	EXPECT_TRUE(intact(r->data().first(300), 6));
	EXPECT_ERRC(a->get(index), Errc::not_held) << "another process got in while it was being written";

	BufferGuard empty;
	EXPECT_FALSE(empty.try_make_writable());
}

TEST(Refs, Owns)
{
	RuntimeDir dir;
	auto owner = create("owns", config(2));
	ASSERT_TRUE(owner);
	auto other = create("owns-other", config(2));
	ASSERT_TRUE(other);
	auto consumer = open("owns");
	ASSERT_TRUE(consumer);
	auto g = owner->acquire(1s);
	ASSERT_OK(g);
	EXPECT_TRUE(owner->owns(*g));
	EXPECT_FALSE(other->owns(*g));
	EXPECT_FALSE(consumer->owns(*g)) << "a consumer handle does not own the owner's guard";
	ASSERT_OK(owner->publish(std::move(*g)));
	EXPECT_FALSE(owner->owns(*g)) << "a moved-from guard belongs to no pool";
	auto f = consumer->receive(5s);
	ASSERT_OK(f);
	EXPECT_TRUE(consumer->owns(*f));
	EXPECT_FALSE(owner->owns(*f));
	auto c = f->clone_ref();
	ASSERT_OK(c);
	EXPECT_TRUE(consumer->owns(*c));
	EXPECT_FALSE(owner->owns(BufferGuard()));
}

// Roles and publish errors

TEST(Roles, WrongRoleCalls)
{
	RuntimeDir dir;
	auto owner = create("roles", config(2));
	ASSERT_TRUE(owner);
	auto consumer = open("roles");
	ASSERT_TRUE(consumer);
	EXPECT_ERRC(consumer->set_format("x"), Errc::wrong_role);
	EXPECT_ERRC(consumer->end_of_stream(), Errc::wrong_role);
	EXPECT_ERRC(owner->receive(0s), Errc::wrong_role);
	publish(*owner, 1);
	auto f = receive(*consumer, 1);
	// A consumer publishes what it acquired (a guest: test_guests.cpp), not what it received.
	EXPECT_ERRC(consumer->publish(std::move(f)), Errc::read_only);
	EXPECT_EQ(owner->stats().published, 1u);
	EXPECT_EQ(owner->format(), "");

	// An inspector sees the segment but holds no frames and counts as no consumer.
	auto insp = inspect("roles");
	ASSERT_TRUE(insp);
	EXPECT_EQ(insp->role(), xmem::Role::inspector);
	EXPECT_ERRC(insp->receive(0s), Errc::wrong_role);
	EXPECT_ERRC(insp->get(0), Errc::wrong_role);
	EXPECT_ERRC(insp->acquire(0s), Errc::wrong_role);
	EXPECT_EQ(owner->stats().consumers, 1u);
	auto segment = insp->control_segment();
	ASSERT_GE(segment.size(), sizeof(xmem::layout::ControlHeader));
	uint32_t magic;
	std::memcpy(&magic, segment.data(), sizeof(magic));
	EXPECT_EQ(magic, xmem::layout::kMagic);
}

TEST(Publish, TwiceReadOnlyOversizedAndForeign)
{
	RuntimeDir dir;
	auto owner = create("publish-errors", config(1, Policy::drop_new, 1024));
	ASSERT_TRUE(owner);

	auto g = owner->acquire(1s);
	ASSERT_OK(g);
	auto ro = g->clone_ref();
	ASSERT_OK(ro);
	EXPECT_ERRC(owner->publish(std::move(*ro)), Errc::read_only);
	EXPECT_ERRC(owner->publish(BufferGuard()), Errc::invalid_argument);
	g->meta_mut().value()->size = 8;
	ASSERT_OK(owner->publish(std::move(*g)));
	EXPECT_ERRC(owner->publish(std::move(*g)), Errc::invalid_argument) << "the same guard published twice";
	EXPECT_EQ(owner->stats().published, 1u);

	// A writable reference to an already published slot is not publishable.
	auto w = owner->get_mut(0);
	ASSERT_OK(w);
	ASSERT_FALSE(w->is_copy());
	EXPECT_ERRC(owner->publish(std::move(*w)), Errc::invalid_argument);
	EXPECT_EQ(owner->stats().published, 1u);

	// A refused publish still consumes the guard: the single slot comes back.
	auto big = owner->acquire(1s);
	ASSERT_OK(big);
	big->meta_mut().value()->size = 1025;
	EXPECT_ERRC(owner->publish(std::move(*big)), Errc::out_of_range);
	auto dims = owner->acquire(0s);
	ASSERT_OK(dims);
	dims->meta_mut().value()->ndim = XMEM_MAX_DIMS + 1;
	EXPECT_ERRC(owner->publish(std::move(*dims)), Errc::invalid_argument);
	auto planes = owner->acquire(0s);
	ASSERT_OK(planes);
	planes->meta_mut().value()->n_planes = XMEM_MAX_PLANES + 1;
	EXPECT_ERRC(owner->publish(std::move(*planes)), Errc::invalid_argument);

	auto other = create("publish-other", config(1));
	ASSERT_TRUE(other);
	auto foreign = other->acquire(1s);
	ASSERT_OK(foreign);
	EXPECT_ERRC(owner->publish(std::move(*foreign)), Errc::invalid_argument);
	EXPECT_OK(other->acquire(0s)) << "the foreign guard was not released";
	EXPECT_EQ(other->stats().published, 0u);

	auto last = owner->acquire(0s);
	ASSERT_OK(last);
	last->meta_mut().value()->size = 1024;
	EXPECT_OK(owner->publish(std::move(*last)));
	EXPECT_EQ(owner->stats().published, 2u);
}

// stats()

TEST(Stats, CountsPublishedDroppedConsumersAndFreeSlots)
{
	RuntimeDir dir;
	auto owner = create("stats", config(4, Policy::drop_oldest));
	ASSERT_TRUE(owner);
	auto s = owner->stats();
	EXPECT_EQ(s.published, 0u);
	EXPECT_EQ(s.dropped, 0u);
	EXPECT_EQ(s.reaped, 0u);
	EXPECT_EQ(s.consumers, 0u);
	EXPECT_EQ(s.slots_total, 4u);
	EXPECT_EQ(s.slots_free, 4u);
	EXPECT_EQ(s.closed, 0u);

	auto consumer = open("stats", 1);
	ASSERT_TRUE(consumer);
	EXPECT_EQ(owner->stats().consumers, 1u);
	auto g = owner->acquire(1s);
	ASSERT_OK(g);
	EXPECT_EQ(owner->stats().slots_free, 3u) << "a slot being written is not free";
	g->reset();
	EXPECT_EQ(owner->stats().slots_free, 4u) << "an unpublished slot goes back on reset";
	publish(*owner, 1);
	EXPECT_EQ(owner->stats().slots_free, 3u) << "a queued frame holds its slot";
	publish(*owner, 2); // drops frame 1 for the one-frame queue
	s = owner->stats();
	EXPECT_EQ(s.published, 2u);
	EXPECT_EQ(s.dropped, 1u);
	EXPECT_EQ(s.slots_free, 3u);
	auto f = receive(*consumer, 2);
	s = consumer->stats();
	EXPECT_EQ(s.published, 2u) << "a consumer reads the same counters";
	EXPECT_EQ(s.dropped, 1u);
	EXPECT_EQ(s.consumers, 1u);
	EXPECT_EQ(s.slots_free, 3u);
	EXPECT_EQ(s.closed, 0u);
	f.reset();
	EXPECT_EQ(owner->stats().slots_free, 4u);

	consumer.reset();
	EXPECT_TRUE(eventually([&] { return owner->stats().consumers == 0; })) << "a detached consumer was not reaped";
	EXPECT_TRUE(eventually([&] { return owner->stats().reaped == 1; }));
}

TEST(Stats, ReapReleasesWhatADetachedConsumerHeld)
{
	RuntimeDir dir;
	auto owner = create("reap", config(2, Policy::drop_new));
	ASSERT_TRUE(owner);
	auto consumer = open("reap", 2);
	ASSERT_TRUE(consumer);
	publish(*owner, 1);
	publish(*owner, 2);
	auto f = receive(*consumer, 1); // one held, one still queued
	EXPECT_EQ(owner->stats().slots_free, 0u);
	consumer.reset();
	EXPECT_EQ(owner->stats().consumers, 1u) << "a guard keeps the consumer attached";
	EXPECT_EQ(owner->stats().slots_free, 1u) << "a closed handle kept its queued frame";
	publish(*owner, 3); // not queued for the closed handle
	EXPECT_EQ(owner->stats().slots_free, 1u);
	EXPECT_TRUE(intact(f.data(), 1));
	f.reset();
	EXPECT_TRUE(eventually([&] { return owner->stats().slots_free == 2; }));
	EXPECT_TRUE(eventually([&] { return owner->stats().consumers == 0; })) << "not reaped";
	EXPECT_OK(owner->acquire(0s));
}

// Limits

TEST(Limits, MaxConsumersReached)
{
	RuntimeDir dir;
	PoolConfig c = config(2);
	c.max_consumers = 2;
	auto owner = create("full", c);
	ASSERT_TRUE(owner);
	auto a = open("full");
	auto b = open("full");
	ASSERT_TRUE(a && b);
	auto refused = BufferPool::open("full");
	EXPECT_ERRC(refused, Errc::full);
	EXPECT_EQ(owner->stats().consumers, 2u);
	// A detached consumer's place is given to the next one.
	a.reset();
	std::shared_ptr<BufferPool> next;
	EXPECT_TRUE(eventually([&] {
		auto r = BufferPool::open("full");
		if (r)
			next = r.value();
		return bool(r);
	}));
	ASSERT_TRUE(next);
	publish(*owner, 1);
	receive(*next, 1);
	receive(*b, 1);
}

TEST(Limits, SeveralPoolsInOneProcess)
{
	RuntimeDir dir;
	std::vector<std::shared_ptr<BufferPool>> owners, consumers;
	for (int i = 0; i < 3; i++) {
		owners.push_back(create("multi" + std::to_string(i), config(2)));
		ASSERT_TRUE(owners.back());
		consumers.push_back(open("multi" + std::to_string(i)));
		ASSERT_TRUE(consumers.back());
	}
	EXPECT_EQ(sorted(dir.entries()), (std::vector<std::string>{ "multi0", "multi0.lock", "multi1", "multi1.lock",
								    "multi2", "multi2.lock" }));
	for (int i = 0; i < 3; i++)
		publish(*owners[i], 100 + i);
	for (int i = 2; i >= 0; i--) {
		auto f = receive(*consumers[i], 100 + i);
		EXPECT_EQ(f.meta().seq, 1u) << "each pool counts its own frames";
		EXPECT_ERRC(consumers[i]->receive(0s), Errc::timed_out);
	}
	owners[1].reset();
	EXPECT_ERRC(consumers[1]->receive(0s), Errc::closed);
	EXPECT_ERRC(consumers[0]->receive(0s), Errc::timed_out) << "closing one pool closed another";
	publish(*owners[0], 7);
	receive(*consumers[0], 7);
	owners.clear();
	EXPECT_EQ(dir.entries(), std::vector<std::string>{});
}

TEST(Limits, SecondCreateOfALiveName)
{
	RuntimeDir dir;
	auto owner = create("taken", config(2));
	ASSERT_TRUE(owner);
	auto second = BufferPool::create("taken", config(2));
	EXPECT_ERRC(second, Errc::owner_alive);
	if (!second) {
		EXPECT_NE(second.error().message.find("pid " + std::to_string(::getpid())), std::string::npos)
			<< second.error().message;
	}
	// The live pool is untouched.
	auto consumer = open("taken");
	ASSERT_TRUE(consumer);
	publish(*owner, 1);
	receive(*consumer, 1);
	EXPECT_EQ(sorted(dir.entries()), (std::vector<std::string>{ "taken", "taken.lock" }));
}

TEST(Limits, FilesRemovedWhenTheOwnerGoes)
{
	RuntimeDir dir;
	auto owner = create("files", config(2));
	ASSERT_TRUE(owner);
	auto consumer = open("files");
	ASSERT_TRUE(consumer);
	publish(*owner, 1);
	auto f = receive(*consumer, 1);
	EXPECT_EQ(sorted(dir.entries()), (std::vector<std::string>{ "files", "files.lock" }));
	owner.reset();
	EXPECT_EQ(dir.entries(), std::vector<std::string>{}) << "socket or lock file left behind";
	EXPECT_TRUE(intact(f.data(), 1));
}

TEST(Limits, StaleSocketOfADeadOwnerIsReplaced)
{
	RuntimeDir dir;
	Process producer({ xmem::test::peer_path(), "produce", "stale", "--frames", "1000000", "--fps", "1000" });
	ASSERT_TRUE(producer.wait_output("ready")) << "the producer did not start";
	EXPECT_EQ(sorted(dir.entries()), (std::vector<std::string>{ "stale", "stale.lock" }));
	EXPECT_ERRC(BufferPool::create("stale", config(2)), Errc::owner_alive);
	producer.signal(SIGKILL);
	EXPECT_EQ(producer.wait(), 128 + SIGKILL);
	// The dead owner's socket is still there, with nobody listening.
	EXPECT_EQ(sorted(dir.entries()), (std::vector<std::string>{ "stale", "stale.lock" }));
	EXPECT_ERRC(BufferPool::open("stale"), Errc::not_found);
	auto owner = create("stale", config(2));
	ASSERT_TRUE(owner);
	auto consumer = open("stale");
	ASSERT_TRUE(consumer);
	publish(*owner, 1);
	auto f = receive(*consumer, 1);
	EXPECT_EQ(f.meta().producer_pid, uint32_t(::getpid()));
	EXPECT_EQ(f.meta().seq, 1u);
	f.reset();
	owner.reset();
	EXPECT_EQ(dir.entries(), std::vector<std::string>{});
}

void fan_out(uint32_t max_consumers, const char *name)
{
	RuntimeDir dir;
	PoolConfig c = config(4);
	c.max_consumers = max_consumers;
	auto owner = create(name, c);
	ASSERT_TRUE(owner);
	std::vector<std::shared_ptr<BufferPool>> consumers;
	for (uint32_t i = 0; i < max_consumers; i++) {
		consumers.push_back(open(name, 4));
		ASSERT_TRUE(consumers.back()) << "consumer " << i;
	}
	EXPECT_EQ(owner->stats().consumers, max_consumers);
	EXPECT_ERRC(BufferPool::open(name), Errc::full);
	for (uint64_t tag = 1; tag <= 3; tag++)
		publish(*owner, tag, 1000);
	EXPECT_EQ(owner->stats().slots_free, 1u);
	for (uint32_t i = 0; i < max_consumers; i++) {
		for (uint64_t tag = 1; tag <= 3; tag++) {
			auto f = receive(*consumers[i], tag);
			EXPECT_EQ(f.meta().seq, tag) << "consumer " << i;
			if (::testing::Test::HasFailure())
				return;
		}
		EXPECT_ERRC(consumers[i]->receive(0s), Errc::timed_out);
	}
	EXPECT_EQ(owner->stats().slots_free, 4u) << "every consumer let go, but slots are still held";
	EXPECT_EQ(owner->stats().dropped, 0u);
}

TEST(Limits, SixtyFourConsumersFanOut)
{
	fan_out(64, "fan64");
}

TEST(Limits, MaximumConsumersFanOut)
{
	fan_out(XMEM_MAX_CONSUMERS, "fan127");
}

TEST(Limits, TwoHundredFiftySixSlots)
{
	RuntimeDir dir;
	auto owner = create("slots256", config(256, Policy::drop_oldest, 100));
	ASSERT_TRUE(owner);
	auto consumer = open("slots256", 256);
	ASSERT_TRUE(consumer);
	for (uint64_t tag = 1; tag <= 256; tag++)
		publish(*owner, tag, 100);
	EXPECT_EQ(owner->stats().slots_free, 0u);
	EXPECT_EQ(owner->stats().dropped, 0u);
	std::vector<BufferGuard> held;
	std::set<uint32_t> indices;
	for (uint64_t tag = 1; tag <= 256; tag++) {
		held.push_back(receive(*consumer, tag));
		indices.insert(held.back().index());
	}
	EXPECT_EQ(indices.size(), 256u);
	EXPECT_EQ(*indices.rbegin(), 255u);
	EXPECT_ERRC(owner->acquire(0s), Errc::timed_out);
	for (uint64_t tag = 1; tag <= 256; tag++)
		EXPECT_TRUE(intact(held[tag - 1].data(), tag));
	held.clear();
	EXPECT_EQ(owner->stats().slots_free, 256u);
	std::vector<BufferGuard> writing;
	for (int i = 0; i < 256; i++) {
		auto g = owner->acquire(0s);
		ASSERT_OK(g);
		writing.push_back(std::move(*g));
	}
	EXPECT_ERRC(owner->acquire(0s), Errc::timed_out);
}

} // namespace
