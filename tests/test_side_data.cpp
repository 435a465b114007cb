// test_side_data.cpp - a frame's side data (BufferGuard::set_side_data, side_data, the C
// API's xmem_buffer_*_side_data): its trip to consumers, its budget, and a size scribbled
// into the slot record refused and counted.
#include "common.hpp"
#include "scribble.hpp"

#include <cstring>
#include <numeric>

namespace {

using namespace std::chrono_literals;
using xmem::BufferPool;
using xmem::Errc;
using xmem::test::RuntimeDir;
using xmem::test::slot_record;
using xmem::test::why;

std::shared_ptr<BufferPool> create(const std::string &name)
{
	xmem::PoolConfig c;
	c.slot_count = 4;
	c.slot_size = 4096;
	auto r = BufferPool::create(name, c);
	EXPECT_TRUE(r.ok()) << why(r);
	return r ? r.value() : nullptr;
}

std::shared_ptr<BufferPool> open(const std::string &name)
{
	xmem::OpenOptions o;
	o.client = "test-side-data";
	auto r = BufferPool::open(name, o);
	EXPECT_TRUE(r.ok()) << why(r);
	return r ? r.value() : nullptr;
}

std::vector<std::byte> bytes_of(size_t n, unsigned seed)
{
	std::vector<std::byte> v(n);
	for (size_t i = 0; i < n; i++)
		v[i] = std::byte((i * 31 + seed) & 0xff);
	return v;
}

bool same(std::span<const std::byte> a, std::span<const std::byte> b)
{
	return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
}

// Publishes a frame with SIDE as its side data; its slot index.
uint32_t publish(BufferPool &pool, std::span<const std::byte> side)
{
	auto g = pool.acquire(2s);
	EXPECT_TRUE(g.ok()) << why(g);
	if (!g)
		return UINT32_MAX;
	g->meta_mut().value()->size = 16;
	auto set = g->set_side_data(side);
	EXPECT_TRUE(set.ok()) << why(set);
	EXPECT_TRUE(same(g->side_data(), side));
	uint32_t index = g->index();
	auto r = pool.publish(std::move(*g));
	EXPECT_TRUE(r.ok()) << why(r);
	return index;
}

} // namespace

TEST(SideData, TravelsWithEachFrameAsACopyTakenAtReceive)
{
	RuntimeDir dir;
	auto owner = create("side");
	auto consumer = open("side");
	ASSERT_TRUE(owner && consumer);
	auto first = bytes_of(100, 1);
	auto full = bytes_of(xmem::kSideDataMax, 2); // the whole budget: nothing is cut
	uint32_t slot = publish(*owner, first);
	publish(*owner, full);
	publish(*owner, {}); // none: the slot's previous side data must not show through

	auto f1 = consumer->receive(2s);
	ASSERT_TRUE(f1.ok()) << why(f1);
	EXPECT_TRUE(same(f1->side_data(), first));
	// A copy: what the record holds afterwards does not change the received frame.
	std::memset(slot_record(*consumer, slot)->side_data, 0xee, 100);
	EXPECT_TRUE(same(f1->side_data(), first));
	auto clone = f1->clone_ref();
	ASSERT_TRUE(clone.ok());
	EXPECT_TRUE(same(clone->side_data(), first));
	auto copy = f1->private_copy_to_cpu();
	ASSERT_TRUE(copy.ok()) << why(copy);
	EXPECT_TRUE(same(copy->side_data(), first));

	auto f2 = consumer->receive(2s);
	ASSERT_TRUE(f2.ok()) << why(f2);
	EXPECT_TRUE(same(f2->side_data(), full));
	auto f3 = consumer->receive(2s);
	ASSERT_TRUE(f3.ok()) << why(f3);
	EXPECT_TRUE(f3->side_data().empty());
	EXPECT_EQ(consumer->side_data_refused(), 0u);

	// A slot reused for a frame without side data carries none.
	f1->reset();
	clone->reset();
	f2->reset();
	f3->reset();
	for (int i = 0; i < 4; i++) {
		publish(*owner, {});
		auto f = consumer->receive(2s);
		ASSERT_TRUE(f.ok()) << why(f);
		EXPECT_TRUE(f->side_data().empty()) << "frame " << i << " of slot " << f->index();
	}
}

TEST(SideData, OverTheBudgetIsAnErrorNeverTruncated)
{
	RuntimeDir dir;
	auto owner = create("budget");
	ASSERT_TRUE(owner);
	auto g = owner->acquire(2s);
	ASSERT_TRUE(g.ok()) << why(g);
	auto small = bytes_of(10, 3);
	ASSERT_TRUE(g->set_side_data(small).ok());
	auto big = bytes_of(xmem::kSideDataMax + 1, 4);
	auto r = g->set_side_data(big);
	EXPECT_EQ(r.code(), Errc::out_of_range);
	EXPECT_NE(r.error().message.find("4096"), std::string::npos) << r.error().message;
	// The refused call changed nothing.
	EXPECT_TRUE(same(g->side_data(), small));
	ASSERT_TRUE(g->set_side_data({}).ok());
	EXPECT_TRUE(g->side_data().empty());
	ASSERT_TRUE(owner->publish(std::move(*g)).ok());
}

TEST(SideData, OnlyAFrameFromAcquireTakesSideData)
{
	RuntimeDir dir;
	auto owner = create("readonly");
	auto consumer = open("readonly");
	ASSERT_TRUE(owner && consumer);
	publish(*owner, bytes_of(8, 5));
	auto f = consumer->receive(2s);
	ASSERT_TRUE(f.ok()) << why(f);
	EXPECT_EQ(f->set_side_data(bytes_of(4, 6)).code(), Errc::read_only);
	// Writable in place (this consumer is the only holder), but published: still refused.
	ASSERT_TRUE(f->try_make_writable());
	EXPECT_EQ(f->set_side_data(bytes_of(4, 6)).code(), Errc::read_only);
	EXPECT_TRUE(same(f->side_data(), bytes_of(8, 5)));
	xmem::BufferGuard empty;
	EXPECT_EQ(empty.set_side_data(bytes_of(4, 6)).code(), Errc::read_only);
	EXPECT_TRUE(empty.side_data().empty());
}

TEST(SideData, ScribbledSizeIsRefusedAndCounted)
{
	RuntimeDir dir;
	auto owner = create("scribble");
	auto consumer = open("scribble");
	ASSERT_TRUE(owner && consumer);
	auto side = bytes_of(64, 7);
	for (uint32_t bad : { uint32_t(xmem::kSideDataMax + 1), uint32_t(0x7fffffff), UINT32_MAX }) {
		uint32_t slot = publish(*owner, side);
		ASSERT_LT(slot, 4u);
		// A hostile peer rewrites the size between publish and receive.
		slot_record(*consumer, slot)->side_data_size = bad;
		uint64_t before = consumer->side_data_refused();
		auto f = consumer->receive(2s);
		ASSERT_TRUE(f.ok()) << why(f);
		EXPECT_TRUE(f->side_data().empty()) << "size " << bad;
		EXPECT_EQ(consumer->side_data_refused(), before + 1) << "size " << bad;
		EXPECT_EQ(f->meta().size, 16u) << "the frame itself goes on";
	}
	// In range again: the next frame's side data is read as usual.
	publish(*owner, side);
	auto f = consumer->receive(2s);
	ASSERT_TRUE(f.ok()) << why(f);
	EXPECT_TRUE(same(f->side_data(), side));
	EXPECT_EQ(consumer->side_data_refused(), 3u);
}

TEST(SideData, CApi)
{
	RuntimeDir dir;
	xmem_pool_config c;
	xmem_pool_config_init(&c);
	c.slot_size = 1024;
	xmem_pool *owner = nullptr, *consumer = nullptr;
	ASSERT_EQ(xmem_pool_create("capi", &c, &owner), XMEM_OK) << xmem_last_error();
	ASSERT_EQ(xmem_pool_open("capi", nullptr, &consumer), XMEM_OK) << xmem_last_error();

	xmem_buffer *b = nullptr;
	ASSERT_EQ(xmem_pool_acquire(owner, 1'000'000'000, &b), XMEM_OK);
	std::vector<char> big(XMEM_SIDE_DATA_MAX + 1, 'x');
	EXPECT_EQ(xmem_buffer_set_side_data(b, big.data(), big.size()), XMEM_ERANGE);
	EXPECT_NE(std::string(xmem_last_error()).find("budget"), std::string::npos) << xmem_last_error();
	EXPECT_EQ(xmem_buffer_set_side_data(b, nullptr, 3), XMEM_EINVAL);
	EXPECT_EQ(xmem_buffer_set_side_data(nullptr, "abc", 3), XMEM_EINVAL);
	ASSERT_EQ(xmem_buffer_set_side_data(b, "hello", 5), XMEM_OK);
	xmem_buffer_meta_mut(b)->size = 8;
	ASSERT_EQ(xmem_pool_publish(owner, b), XMEM_OK);

	xmem_buffer *r = nullptr;
	ASSERT_EQ(xmem_pool_receive(consumer, 1'000'000'000, &r), XMEM_OK) << xmem_last_error();
	size_t size = 0;
	const void *data = xmem_buffer_side_data(r, &size);
	ASSERT_EQ(size, 5u);
	EXPECT_EQ(std::memcmp(data, "hello", 5), 0);
	EXPECT_EQ(xmem_buffer_set_side_data(r, "no", 2), XMEM_EREADONLY);
	EXPECT_EQ(xmem_pool_side_data_refused(consumer), 0u);
	xmem_buffer_release(r);
	EXPECT_EQ(xmem_buffer_side_data(nullptr, &size), nullptr);
	EXPECT_EQ(size, 0u);
	EXPECT_EQ(xmem_pool_side_data_refused(nullptr), 0u);

	xmem_pool_close(consumer);
	xmem_pool_close(owner);
}
