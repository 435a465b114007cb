// test_classes.cpp - size classes: one pool holding slots of several sizes, classes added
// while consumers are attached (in this process and in another one, which imports each
// class's memory once, with its first frame), acquire taking the smallest free slot that
// fits, the checks on preallocate, and tickets, get() and a SIGKILLed consumer on slots
// of a later class.
#include "common.hpp"
#include "frames.hpp"
#include "protocol.hpp"
#include "rendezvous.hpp"

#include <signal.h>

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
constexpr uint64_t kLarge = 256 * 1024;

std::string peer()
{
	return xmem::test::peer_path();
}

std::shared_ptr<BufferPool> make_pool(const std::string &name, uint32_t slots, uint32_t max_slots = 0,
				      xmem::Policy policy = xmem::Policy::drop_oldest)
{
	PoolConfig config;
	config.slot_count = slots;
	config.slot_size = kSmall;
	config.max_slots = max_slots;
	config.policy = policy;
	config.block_timeout = 10s;
	auto pool = BufferPool::create(name, config);
	EXPECT_TRUE(pool.ok()) << pool.error().message;
	return pool.ok() ? pool.value() : nullptr;
}

xmem::Result<uint32_t> publish_sized(BufferPool &owner, uint64_t size, std::chrono::nanoseconds timeout = 2s)
{
	return xmem::test::publish_sized(owner, size, timeout);
}

} // namespace

// Acquire takes a slot of the smallest class that holds the size and has one free; a
// larger class when the smaller ones are all taken; none past the largest class.
TEST(Classes, AcquireTakesTheSmallestFreeSlotThatFits)
{
	RuntimeDir dir;
	auto owner = make_pool("classes-fit", 2);
	ASSERT_TRUE(owner);
	auto large = owner->preallocate(kLarge, 2, Storage::system);
	ASSERT_TRUE(large.ok()) << large.error().message;
	EXPECT_EQ(*large, 1u);
	auto medium = owner->preallocate(64 * 1024, 1, Storage::system);
	ASSERT_TRUE(medium.ok()) << medium.error().message;
	EXPECT_EQ(*medium, 2u);

	auto classes = owner->classes();
	ASSERT_EQ(classes.size(), 3u);
	EXPECT_EQ(classes[0].slot_size, kSmall);
	EXPECT_EQ(classes[0].first_slot, 0u);
	EXPECT_EQ(classes[1].slot_size, kLarge);
	EXPECT_EQ(classes[1].first_slot, 2u);
	EXPECT_EQ(classes[1].count, 2u);
	EXPECT_EQ(classes[2].first_slot, 4u);
	EXPECT_EQ(owner->slot_count(), 5u);
	EXPECT_EQ(owner->stats().slots_total, 5u);
	EXPECT_EQ(owner->stats().slots_free, 5u);

	auto a = owner->acquire(100, 0s);
	auto b = owner->acquire(kSmall, 0s);
	ASSERT_TRUE(a.ok() && b.ok());
	EXPECT_LT(a->index(), 2u);
	EXPECT_LT(b->index(), 2u);
	EXPECT_EQ(a->capacity(), kSmall);
	// The small class is used up: the next smallest with a slot free is the medium one.
	auto c = owner->acquire(100, 0s);
	ASSERT_TRUE(c.ok()) << c.error().message;
	EXPECT_EQ(c->index(), 4u);
	EXPECT_EQ(c->capacity(), 64u * 1024);
	auto d = owner->acquire(64 * 1024 + 1, 0s);
	ASSERT_TRUE(d.ok()) << d.error().message;
	EXPECT_GE(d->index(), 2u);
	EXPECT_LT(d->index(), 4u);
	EXPECT_EQ(d->capacity(), kLarge);
	EXPECT_EQ(d->data_mut().value().size(), kLarge) << "the whole slot is writable";
	// No parameter-less acquire from another class: it is the first class's, all held.
	EXPECT_EQ(owner->acquire(0s).code(), Errc::timed_out);
	auto none = owner->acquire(kLarge + 1, 0s);
	EXPECT_EQ(none.code(), Errc::out_of_range) << none.error().message;
	auto e = owner->acquire(kLarge, 0s);
	ASSERT_TRUE(e.ok());
	auto full = owner->acquire(kLarge, 0s);
	EXPECT_EQ(full.code(), Errc::timed_out);
	EXPECT_NE(full.error().message.find("2 slots"), std::string::npos) << full.error().message;
	EXPECT_EQ(owner->stats().slots_free, 0u);
}

// A waiting acquire takes a slot of a class added while it waits.
TEST(Classes, AWaitingAcquireTakesASlotOfAClassAddedMeanwhile)
{
	RuntimeDir dir;
	auto owner = make_pool("classes-wait", 1);
	ASSERT_TRUE(owner);
	auto held = owner->acquire(0s);
	ASSERT_TRUE(held.ok());
	std::thread adder([&] {
		std::this_thread::sleep_for(50ms);
		EXPECT_TRUE(owner->preallocate(kSmall, 1, Storage::system).ok());
	});
	auto got = owner->acquire(kSmall, 10s);
	adder.join();
	ASSERT_TRUE(got.ok()) << got.error().message;
	EXPECT_EQ(got->index(), 1u);
}

// Under slot pressure a drop-oldest consumer loses its frames oldest first, never held
// back: with an older frame of a smaller class at the head of its queue, both go before
// the large slot is free again (a look at fitting slots only would wait for ever).
TEST(Classes, DropOldestKeepsItsOrderAcrossClasses)
{
	RuntimeDir dir;
	auto owner = make_pool("classes-drop", 1);
	ASSERT_TRUE(owner);
	ASSERT_TRUE(owner->preallocate(kLarge, 1, Storage::system).ok());
	xmem::OpenOptions options;
	options.queue_size = 4;
	auto consumer = BufferPool::open("classes-drop", options);
	ASSERT_TRUE(consumer.ok());
	auto small = publish_sized(*owner, kSmall);
	ASSERT_TRUE(small.ok()) << small.error().message;
	auto large = publish_sized(*owner, kLarge);
	ASSERT_TRUE(large.ok()) << large.error().message;
	auto slot = owner->acquire(kLarge, 0s);
	ASSERT_TRUE(slot.ok()) << slot.error().message;
	EXPECT_EQ(slot->index(), *large);
	EXPECT_EQ(owner->stats().dropped, 2u);
	EXPECT_EQ((*consumer)->receive(0s).code(), Errc::timed_out);
	// With the large frame at the head, the small one behind it stays.
	slot->reset();
	auto large2 = publish_sized(*owner, kLarge);
	auto small2 = publish_sized(*owner, kSmall);
	ASSERT_TRUE(large2.ok() && small2.ok());
	auto again = owner->acquire(kLarge, 0s);
	ASSERT_TRUE(again.ok()) << again.error().message;
	EXPECT_EQ(owner->stats().dropped, 3u);
	auto kept = (*consumer)->receive(0s);
	ASSERT_TRUE(kept.ok()) << kept.error().message;
	EXPECT_EQ(kept->meta().seq, 4u);
}

TEST(Classes, PreallocateRefusesWhatItCannotDo)
{
	RuntimeDir dir;
	auto owner = make_pool("classes-bad", 2, 4);
	ASSERT_TRUE(owner);
	EXPECT_EQ(owner->preallocate(kSmall, 0, Storage::system).code(), Errc::invalid_argument);
	EXPECT_EQ(owner->preallocate(0, 1, Storage::system).code(), Errc::invalid_argument);
	EXPECT_EQ(owner->preallocate(kSmall, 1, Storage::system, 1).code(), Errc::invalid_argument)
		<< "a device is only for CUDA storage";
	// Device memory needs a CUDA driver: this suite runs without one (the CUDA suites add
	// classes of device memory to system pools on the simulator).
	auto cuda = owner->preallocate(kSmall, 1, Storage::cuda);
	EXPECT_FALSE(cuda.ok());
	EXPECT_NE(cuda.error().message.find("CUDA"), std::string::npos) << cuda.error().message;
	EXPECT_EQ(owner->classes().size(), 1u) << "a refused class was counted";
	EXPECT_EQ(owner->preallocate(kSmall, 1, Storage(7)).code(), Errc::invalid_argument);
	auto over = owner->preallocate(kSmall, 3, Storage::system);
	EXPECT_EQ(over.code(), Errc::full);
	EXPECT_NE(over.error().message.find("room for 2 more slots"), std::string::npos) << over.error().message;
	ASSERT_TRUE(owner->preallocate(kLarge, 2, Storage::system).ok());
	EXPECT_EQ(owner->preallocate(kSmall, 1, Storage::system).code(), Errc::full);
	EXPECT_EQ(owner->classes().size(), 2u) << "a refused class leaves nothing behind";

	auto consumer = BufferPool::open("classes-bad");
	ASSERT_TRUE(consumer.ok());
	EXPECT_EQ((*consumer)->preallocate(kSmall, 1, Storage::system).code(), Errc::wrong_role);
	EXPECT_EQ((*consumer)->classes().size(), 2u) << "a consumer sees the class table";

	PoolConfig config;
	config.slot_count = 4;
	config.slot_size = kSmall;
	config.max_slots = 3;
	EXPECT_EQ(BufferPool::create("classes-bad2", config).code(), Errc::invalid_argument);
	config.max_slots = XMEM_MAX_SLOTS + 1;
	EXPECT_EQ(BufferPool::create("classes-bad2", config).code(), Errc::invalid_argument);
}

TEST(Classes, AtMost32Classes)
{
	RuntimeDir dir;
	auto owner = make_pool("classes-many", 1, 64);
	ASSERT_TRUE(owner);
	for (uint32_t c = 1; c < 32; c++)
		ASSERT_TRUE(owner->preallocate(kSmall * (c + 1), 1, Storage::system).ok()) << c;
	EXPECT_EQ(owner->preallocate(kSmall, 1, Storage::system).code(), Errc::full);
	// Each size goes to its own class.
	for (uint32_t c = 0; c < 32; c++) {
		auto g = owner->acquire(kSmall * (c + 1), 0s);
		ASSERT_TRUE(g.ok()) << c;
		EXPECT_EQ(g->index(), c);
	}
}

// A consumer attached before a class existed takes its frames like any other, byte for
// byte, with the right capacity; by get() too, and through a ticket.
TEST(Classes, AConsumerAttachedBeforeAClassTakesItsFrames)
{
	RuntimeDir dir;
	auto owner = make_pool("classes-late", 2);
	ASSERT_TRUE(owner);
	auto consumer = BufferPool::open("classes-late");
	ASSERT_TRUE(consumer.ok());
	ASSERT_TRUE(publish_sized(*owner, kSmall).ok());
	auto first = (*consumer)->receive(2s);
	ASSERT_TRUE(first.ok());
	EXPECT_TRUE(xmem::test::check(first->data(), first->meta().seq));

	ASSERT_TRUE(owner->preallocate(kLarge, 3, Storage::system).ok());
	for (int i = 0; i < 6; i++) {
		uint64_t size = i % 2 ? kLarge : kLarge / 2 + uint64_t(i);
		auto index = publish_sized(*owner, size);
		ASSERT_TRUE(index.ok()) << index.error().message;
		EXPECT_GE(*index, 2u);
		auto frame = (*consumer)->receive(2s);
		ASSERT_TRUE(frame.ok()) << frame.error().message;
		EXPECT_EQ(frame->index(), *index);
		EXPECT_EQ(frame->meta().size, size);
		EXPECT_EQ(frame->capacity(), kLarge);
		EXPECT_EQ(frame->data().size(), size);
		EXPECT_TRUE(xmem::test::check(frame->data(), frame->meta().seq)) << "frame " << i;
	}
	// A ticket on a slot of the new class, redeemed by the consumer.
	auto slot = owner->acquire(kLarge, 2s);
	ASSERT_TRUE(slot.ok());
	uint64_t seq = owner->stats().published + 1;
	xmem::test::fill(slot->data_mut().value(), kLarge, seq);
	slot->meta_mut().value()->size = kLarge;
	auto ticket = owner->publish_ticket(std::move(*slot), 1, 10s);
	ASSERT_TRUE(ticket.ok()) << ticket.error().message;
	EXPECT_GE(ticket->slot, 2u);
	auto redeemed = (*consumer)->get(*ticket);
	ASSERT_TRUE(redeemed.ok()) << redeemed.error().message;
	EXPECT_TRUE(xmem::test::check(redeemed->data(), seq));
	// Not by its slot index: its holders are counted, and its meta index's one hold is taken.
	auto again = (*consumer)->get(ticket->slot);
	EXPECT_EQ(again.code(), Errc::not_held);
	EXPECT_NE(again.error().message.find(std::to_string(redeemed->meta_index())), std::string::npos)
		<< again.error().message;
	EXPECT_EQ((*consumer)->get(redeemed->meta_index()).code(), Errc::not_held);
	// A slot no class has taken is not a frame.
	EXPECT_EQ((*consumer)->get(60).code(), Errc::out_of_range);
}

// Another process, attached before any class was added, receives frames of three
// classes added while it runs, each checked byte for byte; one killed while holding a
// frame of a later class gives it back.
TEST(Classes, AnotherProcessImportsEachClassOnceAndLosesNothing)
{
	RuntimeDir dir;
	// fifo: a consumer that falls behind holds the producer back instead of losing frames.
	auto owner = make_pool("classes-mp", 4, 0, xmem::Policy::fifo);
	ASSERT_TRUE(owner);
	Process consumer({ peer(), "consume", "classes-mp", "--frames", "40", "--hold", "1" });
	Process killed({ peer(), "consume", "classes-mp", "--frames", "11", "--hold", "1", "--hold-forever", "--policy",
			 "drop-oldest" });
	ASSERT_TRUE(eventually([&] { return owner->stats().consumers == 2; }));
	std::vector<uint64_t> sizes{ kSmall, 64 * 1024, kLarge, 1 << 20 };
	for (int i = 0; i < 40; i++) {
		if (i % 10 == 0 && i > 0) {
			ASSERT_TRUE(owner->preallocate(sizes[size_t(i / 10)], 3, Storage::system).ok());
		}
		// Sizes cycle over the classes made so far; each frame fills most of its slot.
		uint64_t size = sizes[size_t(i % (i / 10 + 1))] - 100;
		auto published = publish_sized(*owner, size, 10s);
		ASSERT_TRUE(published.ok()) << published.error().message;
		std::this_thread::sleep_for(1ms);
	}
	EXPECT_EQ(consumer.wait(30s), 0) << consumer.output();
	EXPECT_EQ(consumer.field("received"), 40);
	EXPECT_EQ(consumer.field("gaps"), 0) << consumer.output();
	EXPECT_EQ(consumer.field("corrupt"), 0);

	ASSERT_TRUE(killed.wait_output("holding=1"));
	killed.signal(SIGKILL);
	EXPECT_EQ(killed.wait(10s), 128 + SIGKILL);
	EXPECT_TRUE(eventually([&] { return owner->stats().reaped >= 1 && owner->stats().consumers == 0; }))
		<< "reaped " << owner->stats().reaped << ", consumers " << owner->stats().consumers;
	EXPECT_TRUE(eventually([&] { return owner->stats().slots_free == owner->stats().slots_total; }))
		<< "every slot of every class free again";
	EXPECT_EQ(owner->stats().slots_total, 13u);
}

// The owner answers an import only for a class it has, and never for the first (it
// comes with the attach): a request for another is refused with a reason.
TEST(Classes, AnImportOfAClassThatDoesNotExistIsRefused)
{
	RuntimeDir dir;
	auto owner = make_pool("classes-none", 2);
	ASSERT_TRUE(owner);
	ASSERT_TRUE(owner->preallocate(kLarge, 1, Storage::system).ok());
	for (uint32_t asked : { 0u, 2u, 31u, 1000u }) {
		auto conn = xmem::rendezvous::connect(owner->path(), xmem::monotonic_ns() + 2'000'000'000);
		ASSERT_TRUE(conn.ok()) << conn.error().message;
		auto hello = xmem::protocol::make_hello(xmem::protocol::PeerRole::classes, 0, "");
		hello.class_index = asked;
		ASSERT_TRUE(xmem::rendezvous::send_message(conn->get(), &hello, sizeof(hello), nullptr, 0).ok());
		auto msg = xmem::rendezvous::receive_message(conn->get(), xmem::monotonic_ns() + 2'000'000'000, "test",
							     xmem::protocol::kMaxFds);
		ASSERT_TRUE(msg.ok()) << msg.error().message;
		EXPECT_TRUE(msg->fds.empty()) << "no memory for class " << asked;
		auto reply = xmem::protocol::parse_reply(msg->data, "test");
		EXPECT_EQ(reply.code(), Errc::invalid_argument) << asked;
	}
	// Class 1 is answered with its memory: one memfd.
	auto conn = xmem::rendezvous::connect(owner->path(), xmem::monotonic_ns() + 2'000'000'000);
	ASSERT_TRUE(conn.ok());
	auto hello = xmem::protocol::make_hello(xmem::protocol::PeerRole::classes, 0, "");
	hello.class_index = 1;
	ASSERT_TRUE(xmem::rendezvous::send_message(conn->get(), &hello, sizeof(hello), nullptr, 0).ok());
	auto msg = xmem::rendezvous::receive_message(conn->get(), xmem::monotonic_ns() + 2'000'000'000, "test",
						     xmem::protocol::kMaxFds);
	ASSERT_TRUE(msg.ok()) << msg.error().message;
	EXPECT_EQ(msg->fds.size(), 1u);
	auto reply = xmem::protocol::parse_reply(msg->data, "test");
	ASSERT_TRUE(reply.ok()) << reply.error().message;
	EXPECT_EQ(reply->data_size, kLarge);
}
