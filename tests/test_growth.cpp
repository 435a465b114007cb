// test_growth.cpp - growth on demand (PoolConfig::memory_cap): acquire makes system-memory
// slots that no free slot fits, up to the cap, and keeps freed ones for reuse; the least
// recently used free ones give their memory back when a new one would pass the cap, and
// idle ones after trim_idle; consumers attached before the growth (here and in another
// process) read every frame of the slots made since, also after a trim and a new commit;
// a consumer SIGKILLed holding a dynamic slot keeps it from trims until it is reaped;
// xmem-inspect shows the growth.
#include "common.hpp"
#include "frames.hpp"
#include "layout.hpp"

#include <signal.h>
#include <sys/stat.h>

#include <filesystem>
#include <set>
#include <thread>

namespace {

using namespace std::chrono_literals;
using xmem::BufferGuard;
using xmem::BufferPool;
using xmem::Errc;
using xmem::PoolConfig;
using xmem::Storage;
using xmem::test::eventually;
using xmem::test::Process;
using xmem::test::RuntimeDir;

constexpr uint64_t kSmall = 4096;
constexpr uint64_t kMiB = 1 << 20;

std::string peer()
{
	return xmem::test::peer_path();
}

std::shared_ptr<BufferPool> make_pool(const std::string &name, uint64_t cap, std::chrono::milliseconds idle = 0ms,
				      xmem::Policy policy = xmem::Policy::drop_oldest, uint32_t slots = 2)
{
	PoolConfig config;
	config.slot_count = slots;
	config.slot_size = kSmall;
	config.policy = policy;
	config.block_timeout = 10s;
	config.memory_cap = cap;
	config.trim_idle = idle;
	auto pool = BufferPool::create(name, config);
	EXPECT_TRUE(pool.ok()) << pool.error().message;
	return pool.ok() ? pool.value() : nullptr;
}

xmem::Result<uint32_t> publish_sized(BufferPool &owner, uint64_t size, std::chrono::nanoseconds timeout = 2s)
{
	return xmem::test::publish_sized(owner, size, timeout);
}

// The dynamic classes of POOL.
std::vector<xmem::SizeClass> dynamic_classes(const BufferPool &pool)
{
	std::vector<xmem::SizeClass> out;
	for (const xmem::SizeClass &c : pool.classes())
		if (c.dynamic)
			out.push_back(c);
	return out;
}

// System memory the pool's memfds hold, as the kernel counts it (st_blocks of each
// "memfd:xmem-data:NAME" this process has open, each file once).
uint64_t allocated_kib(const std::string &name)
{
	std::set<ino_t> seen;
	uint64_t total = 0;
	for (const auto &entry : std::filesystem::directory_iterator("/proc/self/fd")) {
		std::error_code ec;
		auto target = std::filesystem::read_symlink(entry.path(), ec);
		if (ec || target.string() != "/memfd:xmem-data:" + name + " (deleted)")
			continue;
		struct stat st;
		if (::stat(entry.path().c_str(), &st) == 0 && seen.insert(st.st_ino).second)
			total += uint64_t(st.st_blocks) * 512 / 1024;
	}
	return total;
}

} // namespace

// A size no class holds makes a dynamic class (of a quarter-power-of-two size) and one
// committed slot; more are made while the cap allows, a second class of the size once the
// first's records are all in use; past the cap acquire waits, then times out; a freed
// dynamic slot is reused, not made again.
TEST(Growth, AcquireMakesSlotsUpToTheCapAndReusesThem)
{
	RuntimeDir dir;
	auto owner = make_pool("growth-cap", kMiB);
	ASSERT_TRUE(owner);
	auto start = owner->growth_stats();
	EXPECT_EQ(start.memory_cap, kMiB);
	EXPECT_EQ(start.trim_idle_ns, 10'000'000'000u);
	EXPECT_EQ(start.system_bytes, 2 * kSmall);
	EXPECT_EQ(start.dynamic_slots, 0u);

	constexpr uint64_t kWant = 100 * 1000; // a slot of 112 KiB (1.75 * 64 KiB)
	constexpr uint64_t kSlot = 112 * 1024;
	std::vector<BufferGuard> held;
	auto first = owner->acquire(kWant, 1s);
	ASSERT_TRUE(first.ok()) << first.error().message;
	EXPECT_EQ(first->capacity(), kSlot);
	EXPECT_GE(first->index(), 2u);
	auto made = dynamic_classes(*owner);
	ASSERT_EQ(made.size(), 1u);
	EXPECT_EQ(made[0].slot_size, kSlot);
	EXPECT_EQ(made[0].count, 8u);
	EXPECT_EQ(made[0].committed, 1u);
	EXPECT_EQ(owner->stats().slots_total, 3u) << "uncommitted records are no slots";
	held.push_back(std::move(*first));
	// (1 MiB - 8 KiB) / 112 KiB: 9 slots fit, the 9th in a second class of the size.
	for (int i = 1; i < 9; i++) {
		auto more = owner->acquire(kWant, 1s);
		ASSERT_TRUE(more.ok()) << "slot " << i << ": " << more.error().message;
		std::memset(more->data_mut().value().data(), i, kWant);
		held.push_back(std::move(*more));
	}
	made = dynamic_classes(*owner);
	ASSERT_EQ(made.size(), 2u);
	EXPECT_EQ(made[0].committed, 8u);
	EXPECT_EQ(made[1].committed, 1u);
	auto g = owner->growth_stats();
	EXPECT_EQ(g.dynamic_slots, 9u);
	EXPECT_EQ(g.dynamic_bytes, 9 * kSlot);
	EXPECT_EQ(g.system_bytes, 2 * kSmall + 9 * kSlot);
	EXPECT_EQ(g.grown, 9u);
	EXPECT_EQ(g.dynamic_classes, 0b110u);
	EXPECT_LE(g.system_bytes, g.memory_cap);
	EXPECT_EQ(allocated_kib("growth-cap"), 8 + 9 * kSlot / 1024) << "the memory of exactly the slots made";

	// Past the cap: no slot within the timeout, counted.
	auto none = owner->acquire(kWant, 50ms);
	ASSERT_FALSE(none.ok());
	EXPECT_EQ(none.code(), Errc::timed_out) << none.error().message;
	EXPECT_GE(owner->growth_stats().refused, 1u);
	// A size no class holds, past the cap: refused at once, saying why.
	auto huge = owner->acquire(2 * kMiB, 50ms);
	ASSERT_FALSE(huge.ok());
	EXPECT_EQ(huge.code(), Errc::full);
	EXPECT_NE(huge.error().message.find("memory cap"), std::string::npos) << huge.error().message;

	// A freed dynamic slot is taken again, not made again.
	uint32_t freed = held[3].index();
	held.erase(held.begin() + 3);
	auto again = owner->acquire(kWant, 1s);
	ASSERT_TRUE(again.ok()) << again.error().message;
	EXPECT_EQ(again->index(), freed);
	EXPECT_EQ(owner->growth_stats().grown, 9u);
	// A smaller size takes the smallest free slot that fits: a static one.
	held.clear();
	again = xmem::Result<BufferGuard>(xmem::Error{ Errc::closed, "" });
	auto small = owner->acquire(kSmall, 1s);
	ASSERT_TRUE(small.ok());
	EXPECT_LT(small->index(), 2u);
}

// At the cap, a new slot of a size no free slot fits takes the memory of the free dynamic
// slot used least recently; a held one (a consumer's frame) is never trimmed.
TEST(Growth, AtTheCapTheLeastRecentlyUsedFreeSlotGivesWay)
{
	RuntimeDir dir;
	// Static 8 KiB, two slots of 160 KiB, then room for one of 256 KiB only in place of one.
	auto owner = make_pool("growth-lru", 512 * 1024);
	ASSERT_TRUE(owner);
	auto consumer = BufferPool::open("growth-lru");
	ASSERT_TRUE(consumer.ok());
	auto a = publish_sized(*owner, 150 * 1024); // a class of 160 KiB
	ASSERT_TRUE(a.ok()) << a.error().message;
	auto b = publish_sized(*owner, 155 * 1024); // the same class, a second slot
	ASSERT_TRUE(b.ok()) << b.error().message;
	EXPECT_NE(*a, *b);
	// The consumer keeps b's frame; a's it lets go.
	auto fa = (*consumer)->receive(2s);
	ASSERT_TRUE(fa.ok());
	EXPECT_EQ(fa->index(), *a);
	EXPECT_TRUE(xmem::test::check(fa->data(), fa->meta().seq));
	auto fb = (*consumer)->receive(2s);
	ASSERT_TRUE(fb.ok());
	EXPECT_EQ(fb->index(), *b);
	fa = xmem::Result<BufferGuard>(xmem::Error{ Errc::closed, "" });
	EXPECT_TRUE(eventually([&] { return owner->stats().slots_free == 3; }));
	EXPECT_EQ(allocated_kib("growth-lru"), 8u + 2 * 160);

	// 240 KiB (a class of 256 KiB): no room, so a's slot (free, used first) gives way.
	auto c = publish_sized(*owner, 240 * 1024);
	ASSERT_TRUE(c.ok()) << c.error().message;
	auto g = owner->growth_stats();
	EXPECT_EQ(g.trimmed, 1u);
	EXPECT_EQ(g.dynamic_slots, 2u);
	EXPECT_EQ(g.system_bytes, (8 + 160 + 256) * 1024u);
	EXPECT_EQ(allocated_kib("growth-lru"), 8u + 160 + 256);
	// b's frame is whole: its slot kept its memory.
	EXPECT_TRUE(xmem::test::check(fb->data(), fb->meta().seq));
	auto fc = (*consumer)->receive(2s);
	ASSERT_TRUE(fc.ok());
	EXPECT_EQ(fc->index(), *c);
	EXPECT_TRUE(xmem::test::check(fc->data(), fc->meta().seq));
	// a's old frame is gone: its slot is no slot now.
	auto gone = (*consumer)->get(*a);
	EXPECT_FALSE(gone.ok());
	// Both dynamic slots held: another size finds no room.
	auto d = owner->acquire(300 * 1024, 50ms);
	ASSERT_FALSE(d.ok());
	EXPECT_EQ(d.code(), Errc::full) << d.error().message;
	// Both let go, both are trimmed for it.
	fb = xmem::Result<BufferGuard>(xmem::Error{ Errc::closed, "" });
	fc = xmem::Result<BufferGuard>(xmem::Error{ Errc::closed, "" });
	EXPECT_TRUE(eventually([&] { return owner->acquire(300 * 1024, 50ms).ok(); }));
	EXPECT_EQ(owner->growth_stats().trimmed, 3u);
	EXPECT_EQ(allocated_kib("growth-lru"), 8u + 320) << "the new slot's memory only";
}

// Free dynamic slots idle for trim_idle give their memory back (the kernel's count of the
// mapping drops too); a held one waits until it is let go; a slot trimmed and made again
// holds its new frame whole for a consumer that mapped the class's memory long before.
TEST(Growth, IdleSlotsGiveTheirMemoryBack)
{
	RuntimeDir dir;
	auto owner = make_pool("growth-idle", 4 * kMiB, 200ms);
	ASSERT_TRUE(owner);
	auto consumer = BufferPool::open("growth-idle");
	ASSERT_TRUE(consumer.ok());
	std::vector<BufferGuard> frames;
	for (int i = 0; i < 3; i++) {
		ASSERT_TRUE(publish_sized(*owner, 512 * 1024).ok());
		auto f = (*consumer)->receive(2s);
		ASSERT_TRUE(f.ok());
		EXPECT_TRUE(xmem::test::check(f->data(), f->meta().seq));
		frames.push_back(std::move(*f));
	}
	EXPECT_EQ(owner->growth_stats().dynamic_slots, 3u);
	EXPECT_EQ(allocated_kib("growth-idle"), 8u + 3 * 512);
	uint32_t kept = frames[0].index();
	frames.erase(frames.begin() + 1, frames.end());
	EXPECT_TRUE(eventually([&] { return owner->growth_stats().trimmed == 2; }, 10s));
	EXPECT_EQ(owner->growth_stats().dynamic_slots, 1u) << "the held slot keeps its memory";
	EXPECT_EQ(allocated_kib("growth-idle"), 8u + 512);
	std::this_thread::sleep_for(400ms);
	EXPECT_EQ(owner->growth_stats().dynamic_slots, 1u);
	EXPECT_TRUE(xmem::test::check(frames[0].data(), frames[0].meta().seq));
	frames.clear();
	EXPECT_TRUE(eventually([&] { return owner->growth_stats().dynamic_slots == 0; }, 10s));
	EXPECT_EQ(owner->growth_stats().system_bytes, 2 * kSmall);
	EXPECT_EQ(allocated_kib("growth-idle"), 8u);
	EXPECT_FALSE((*consumer)->get(kept).ok());

	// Made again in the same memory the consumer mapped: every byte of the new frame.
	for (int i = 0; i < 4; i++) {
		ASSERT_TRUE(publish_sized(*owner, 500 * 1024).ok());
		auto f = (*consumer)->receive(2s);
		ASSERT_TRUE(f.ok());
		EXPECT_TRUE(xmem::test::check(f->data(), f->meta().seq)) << "frame " << i;
	}
	EXPECT_EQ(dynamic_classes(*owner).size(), 1u);
	EXPECT_GE(owner->growth_stats().grown, 4u);
}

// Another process attached before any growth receives frames of growing and shrinking
// sizes, each checked byte for byte, while idle slots are trimmed and made again; one
// SIGKILLed holding a frame of a dynamic slot keeps it from the trims until it is reaped.
TEST(Growth, AnotherProcessReadsEveryFrameWhileSlotsComeAndGo)
{
	RuntimeDir dir;
	auto owner = make_pool("growth-mp", 8 * kMiB, 100ms, xmem::Policy::fifo, 4);
	ASSERT_TRUE(owner);
	Process consumer({ peer(), "consume", "growth-mp", "--frames", "60", "--hold", "1" });
	Process killed({ peer(), "consume", "growth-mp", "--frames", "6", "--hold", "1", "--hold-forever", "--policy",
			 "drop-oldest" });
	ASSERT_TRUE(eventually([&] { return owner->stats().consumers == 2; }));
	std::vector<uint64_t> sizes{ 64 * 1024, 2000, 300 * 1024, 1 << 20, 3 << 19 };
	for (int i = 0; i < 60; i++) {
		uint64_t size = sizes[size_t(i / 6) % sizes.size()] - uint64_t(i);
		auto published = publish_sized(*owner, size, 10s);
		ASSERT_TRUE(published.ok()) << "frame " << i << ": " << published.error().message;
		// Pauses long enough for the idle trim now and then.
		std::this_thread::sleep_for(i % 12 == 11 ? 300ms : 1ms);
	}
	EXPECT_EQ(consumer.wait(30s), 0) << consumer.output();
	EXPECT_EQ(consumer.field("received"), 60);
	EXPECT_EQ(consumer.field("gaps"), 0) << consumer.output();
	EXPECT_EQ(consumer.field("corrupt"), 0);
	auto g = owner->growth_stats();
	EXPECT_GT(g.trimmed, 0u);
	EXPECT_GT(g.grown, g.trimmed);

	// The killed consumer's last frame (its 6th: frame 5, of 64 KiB) stays held.
	ASSERT_TRUE(killed.wait_output("holding=1"));
	std::this_thread::sleep_for(500ms);
	EXPECT_GE(owner->growth_stats().dynamic_slots, 1u) << "a held dynamic slot is never trimmed";
	killed.signal(SIGKILL);
	EXPECT_EQ(killed.wait(10s), 128 + SIGKILL);
	EXPECT_TRUE(eventually([&] { return owner->stats().reaped >= 1 && owner->stats().consumers == 0; }));
	EXPECT_TRUE(eventually([&] { return owner->growth_stats().dynamic_slots == 0; }, 10s))
		<< owner->growth_stats().dynamic_slots << " dynamic slots left";
	EXPECT_EQ(owner->growth_stats().system_bytes, 4 * kSmall);
}

// Growth off (no cap) changes nothing: a size no class holds is out of range. Bad
// settings are refused.
TEST(Growth, SettingsAreChecked)
{
	RuntimeDir dir;
	auto fixed = make_pool("growth-off", 0);
	ASSERT_TRUE(fixed);
	EXPECT_EQ(fixed->acquire(kSmall + 1, 10ms).code(), Errc::out_of_range);
	EXPECT_EQ(fixed->growth_stats().memory_cap, 0u);
	EXPECT_TRUE(dynamic_classes(*fixed).empty());

	PoolConfig config;
	config.slot_size = kSmall;
	config.trim_idle = -1ms;
	config.memory_cap = kMiB;
	EXPECT_EQ(BufferPool::create("growth-bad", config).code(), Errc::invalid_argument);
	config.trim_idle = 100ms;
	config.memory_cap = 0;
	auto r = BufferPool::create("growth-bad", config);
	EXPECT_EQ(r.code(), Errc::invalid_argument);
	EXPECT_NE(r.error().message.find("memory cap"), std::string::npos) << r.error().message;
}

// A guest (a consumer that produces) gets slots made on demand too, through the owner.
TEST(Growth, AGuestsLeaseMayGrowThePool)
{
	RuntimeDir dir;
	auto owner = make_pool("growth-guest", kMiB);
	ASSERT_TRUE(owner);
	auto guest = BufferPool::open("growth-guest");
	auto reader = BufferPool::open("growth-guest");
	ASSERT_TRUE(guest.ok() && reader.ok());
	auto frame = (*guest)->acquire(300 * 1024, 2s);
	ASSERT_TRUE(frame.ok()) << frame.error().message;
	EXPECT_GE(frame->capacity(), 300u * 1024);
	xmem::test::fill(frame->data_mut().value(), 300 * 1024, 77);
	frame->meta_mut().value()->size = 300 * 1024;
	ASSERT_TRUE((*guest)->publish(std::move(*frame)).ok());
	auto got = (*reader)->receive(2s);
	ASSERT_TRUE(got.ok()) << got.error().message;
	EXPECT_EQ(got->meta().size, 300u * 1024);
	EXPECT_TRUE(xmem::test::check(got->data(), 77));
	EXPECT_EQ(owner->growth_stats().grown, 1u);
}

// xmem-inspect shows the cap, the memory in use and each dynamic class's slots.
TEST(Growth, InspectShowsTheGrowth)
{
	RuntimeDir dir;
	auto owner = make_pool("growth-inspect", 2 * kMiB);
	ASSERT_TRUE(owner);
	auto held = owner->acquire(600 * 1024, 1s);
	ASSERT_TRUE(held.ok());
	const char *inspect = std::getenv("XMEM_INSPECT");
	ASSERT_NE(inspect, nullptr);
	Process text({ inspect, "growth-inspect" });
	EXPECT_EQ(text.wait(10s), 0) << text.output();
	EXPECT_NE(text.output().find("1 made on demand (room for 3) of 655360 bytes"), std::string::npos)
		<< text.output();
	EXPECT_NE(text.output().find("of 2097152 bytes of system memory in slots; 1 made on demand"), std::string::npos)
		<< text.output();
	Process json({ inspect, "--json", "growth-inspect" });
	EXPECT_EQ(json.wait(10s), 0) << json.output();
	EXPECT_NE(json.output().find("\"memory_cap\":2097152"), std::string::npos) << json.output();
	EXPECT_NE(json.output().find("\"dynamic\":true,\"committed\":1"), std::string::npos) << json.output();
}

// A peer that writes the control segment (any attached process can) makes the owner lose
// no memory it did not count and trim no preallocated slot: the owner keeps its own account
// of committed slots and dynamic classes.
TEST(Growth, APeerWritingTheSegmentChangesNothingTheOwnerCounts)
{
	RuntimeDir dir;
	auto owner = make_pool("growth-scribble", kMiB, 50ms);
	ASSERT_TRUE(owner);
	auto peer_pool = BufferPool::open("growth-scribble");
	ASSERT_TRUE(peer_pool.ok());
	ASSERT_TRUE(publish_sized(*owner, 100 * 1000).ok());
	auto first = (*peer_pool)->receive(2s);
	ASSERT_TRUE(first.ok());
	first = xmem::Result<BufferGuard>(xmem::Error{ Errc::closed, "" });
	// The peer marks every class dynamic and every record of the dynamic class FREE.
	auto bytes = (*peer_pool)->control_segment();
	auto *base = const_cast<std::byte *>(bytes.data());
	auto *header = reinterpret_cast<xmem::layout::ControlHeader *>(base);
	header->dynamic_classes.store(~0u);
	auto *slots = reinterpret_cast<xmem::layout::SlotRecord *>(base + xmem::layout::slots_offset());
	const xmem::SizeClass made = dynamic_classes(*owner).at(0);
	for (uint32_t i = made.first_slot; i < made.first_slot + made.count; i++)
		if (slots[i].state.load() == xmem::layout::kSlotUnused)
			slots[i].state.store(xmem::layout::kSlotFree);
	// Idle trims come and go: the preallocated slots keep their memory.
	std::this_thread::sleep_for(300ms);
	EXPECT_TRUE(eventually([&] { return owner->growth_stats().dynamic_slots == 0; }));
	EXPECT_EQ(allocated_kib("growth-scribble"), 8u);
	// Every slot handed out has its memory committed and counted.
	std::vector<BufferGuard> held;
	for (int i = 0; i < 8; i++) {
		auto slot = owner->acquire(100 * 1000, 1s);
		ASSERT_TRUE(slot.ok()) << slot.error().message;
		held.push_back(std::move(*slot));
	}
	EXPECT_EQ(owner->growth_stats().dynamic_slots, 8u);
	EXPECT_EQ(allocated_kib("growth-scribble"), 8u + 8 * 112);
	for (int i = 0; i < 2; i++) {
		auto small = owner->acquire(kSmall, 1s);
		ASSERT_TRUE(small.ok());
		EXPECT_LT(small->index(), 2u);
		held.push_back(std::move(*small));
	}
	EXPECT_EQ(allocated_kib("growth-scribble"), 8u + 8 * 112);
}

// Records of a dynamic class whose memory is not committed, made FREE by a peer, are no
// slots to wait for either: at the cap, acquire times out on time instead of spinning on
// them for ever (tests/hostile's scribble-growth found that).
TEST(Growth, AcquireAtTheCapTimesOutWhateverAPeerWroteInUncommittedRecords)
{
	RuntimeDir dir;
	// Records for 3 slots (the cap over the slot size), memory for 2 beside class 0.
	auto owner = make_pool("growth-spin", 3 * 112 * 1024 + 4096);
	ASSERT_TRUE(owner);
	auto peer_pool = BufferPool::open("growth-spin");
	ASSERT_TRUE(peer_pool.ok());
	std::vector<BufferGuard> held;
	for (int i = 0; i < 2; i++) {
		auto slot = owner->acquire(100 * 1000, 1s);
		ASSERT_TRUE(slot.ok()) << slot.error().message;
		held.push_back(std::move(*slot));
	}
	auto *base = const_cast<std::byte *>((*peer_pool)->control_segment().data());
	auto *slots = reinterpret_cast<xmem::layout::SlotRecord *>(base + xmem::layout::slots_offset());
	const xmem::SizeClass made = dynamic_classes(*owner).at(0);
	EXPECT_EQ(made.committed, 2u);
	EXPECT_EQ(made.count, 3u);
	for (uint32_t i = made.first_slot; i < made.first_slot + made.count; i++)
		if (slots[i].state.load() == xmem::layout::kSlotUnused)
			slots[i].state.store(xmem::layout::kSlotFree);
	auto start = std::chrono::steady_clock::now();
	auto none = owner->acquire(100 * 1000, 200ms);
	auto took = std::chrono::steady_clock::now() - start;
	ASSERT_FALSE(none.ok());
	EXPECT_EQ(none.code(), Errc::timed_out) << none.error().message;
	EXPECT_LT(took, 5s);
	EXPECT_EQ(owner->growth_stats().dynamic_slots, 2u);
}
