// subscriber.cpp - fuzzes what a consumer reads from a control segment another
// process wrote: the constants it validates at attach (segment.cpp), then, attached,
// the ring entries, head and tail, slot states, holder bits, metadata and formats it
// reads in receive(), get(), stats() and detach (subscriber.cpp, pool.cpp). A fake
// owner sends a real Welcome with a memfd holding the fuzzer's segment; a script
// then writes to the segment as an owner (or a hostile peer) would, between calls.
// Input: flags (bit 0: attach as an inspector; bits 1-2: shrink the memfd by a page,
// by half), the Welcome's consumer index, a SegmentImage, then the script.
#include "fuzz.hpp"

#include "layout.hpp"
#include "protocol.hpp"
#include "segment.hpp"

#include <xmem/snapshot.hpp>

#include <memory>

using namespace std::chrono_literals;
using xmem::fuzz::Input;
namespace layout = xmem::layout;
namespace protocol = xmem::protocol;

namespace {

enum Op : uint8_t {
	kScribble, // u32 offset, u64 value: 8 bytes anywhere in the segment
	kPush, // u32 slot, u32 seq: queue a frame for this consumer, as the owner does
	kReceive,
	kGet, // u16 index
	kGetMut, // u16 index
	kDrop, // u8 guard
	kUse, // u8 guard: read it every way a consumer can
	kRefs, // u8 which, u16 index, u8 count
	kStats,
	kOps
};

constexpr size_t kMaxGuards = 8;
constexpr uint64_t kMaxData = 16u << 20;

xmem::fuzz::FakeOwner &fake_owner()
{
	static xmem::fuzz::FakeOwner owner("subscriber");
	return owner;
}

struct Shared {
	std::byte *base = nullptr;
	size_t size = 0;
	~Shared()
	{
		if (base)
			::munmap(base, size);
	}
	bool fits(uint64_t offset, uint64_t n) const { return offset <= size && n <= size - offset; }
};

void use_guard(xmem::BufferGuard &g, const layout::ControlConstants &k)
{
	XMEM_FUZZ_CHECK(g.index() < k.slot_count, std::to_string(g.index()));
	XMEM_FUZZ_CHECK(g.meta().n_planes <= XMEM_MAX_PLANES, std::to_string(g.meta().n_planes));
	XMEM_FUZZ_CHECK(g.meta().ndim <= XMEM_MAX_DIMS, std::to_string(g.meta().ndim));
	XMEM_FUZZ_CHECK(std::strlen(g.meta().content_type) < XMEM_CONTENT_TYPE_MAX, "");
	XMEM_FUZZ_CHECK(std::strlen(g.meta().producer) < XMEM_PRODUCER_MAX, "");
	XMEM_FUZZ_CHECK(g.format().size() < XMEM_FORMAT_MAX, std::to_string(g.format().size()));
	auto data = g.data();
	XMEM_FUZZ_CHECK(data.size() <= g.capacity() && g.capacity() <= k.slot_size,
			std::to_string(data.size()) + " of " + std::to_string(g.capacity()));
	// Every byte the guard offers must be mapped.
	volatile uint8_t sum = 0;
	for (std::byte b : data)
		sum = uint8_t(sum + uint8_t(b));
	// Side data: a copy within the budget, whatever size the record says.
	auto side = g.side_data();
	XMEM_FUZZ_CHECK(side.size() <= xmem::kSideDataMax, std::to_string(side.size()));
	for (std::byte b : side)
		sum = uint8_t(sum + uint8_t(b));
	if (g.try_make_writable()) {
		auto bytes = g.data_mut();
		XMEM_FUZZ_CHECK(bytes.ok() && bytes->size() == g.capacity(), "");
		std::memset(bytes->data(), 0x5a, bytes->size());
	}
	auto copy = g.private_copy_to_cpu();
	if (copy)
		XMEM_FUZZ_CHECK(copy->data().size() <= data.size() || g.writable(), "copy larger than the frame");
	auto clone = g.clone_ref();
	if (clone)
		XMEM_FUZZ_CHECK(clone->index() == g.index(), "");
}

void run_script(Input &in, xmem::BufferPool &pool, const Shared &shared, const layout::ControlConstants &k,
		uint32_t consumer_index, bool inspect)
{
	std::vector<xmem::BufferGuard> guards;
	auto keep = [&](xmem::Result<xmem::BufferGuard> &&g) {
		if (!g)
			return;
		use_guard(g.value(), k);
		if (guards.size() == kMaxGuards)
			guards.erase(guards.begin());
		guards.push_back(std::move(g.value()));
	};
	uint64_t record = layout::consumers_offset(k.slot_count) + uint64_t{ consumer_index } * k.consumer_record_size;
	for (int step = 0; step < 64 && !in.empty(); step++) {
		switch (in.take<uint8_t>() % kOps) {
		case kScribble: {
			uint32_t offset = in.take<uint32_t>();
			uint64_t value = in.take<uint64_t>();
			if (shared.fits(offset, 8))
				std::memcpy(shared.base + offset, &value, 8);
			break;
		}
		case kPush: {
			uint32_t slot = in.take<uint32_t>();
			uint32_t seq = in.take<uint32_t>();
			if (inspect ||
			    !shared.fits(record, sizeof(layout::ConsumerRecord) + uint64_t{ k.ring_capacity } * 8))
				break;
			auto *c = reinterpret_cast<layout::ConsumerRecord *>(shared.base + record);
			uint64_t t = c->tail.load();
			// SEQ 0: the entry an owner pushes (its position); else whatever position SEQ says.
			layout::ring_of(c)[t % k.ring_capacity].store(seq == 0 ? layout::ring_entry(t, slot)
									       : (uint64_t{ seq } << 32) | slot);
			uint64_t at = layout::slots_offset() + uint64_t{ slot } * sizeof(layout::SlotRecord);
			if (slot < k.slot_count && shared.fits(at, sizeof(layout::SlotRecord))) {
				auto *s = reinterpret_cast<layout::SlotRecord *>(shared.base + layout::slots_offset()) +
					  slot;
				s->holders[(1 + consumer_index) / 64].fetch_or(layout::holder_mask(1 + consumer_index));
				s->state.store(layout::kSlotPublished);
			}
			c->tail.store(t + 1);
			break;
		}
		case kReceive: {
			auto got = pool.receive(0s);
			if (inspect)
				XMEM_FUZZ_CHECK(got.code() == xmem::Errc::wrong_role, "an inspector received");
			keep(std::move(got));
			break;
		}
		case kGet:
			keep(pool.get(in.take<uint16_t>()));
			break;
		case kGetMut:
			keep(pool.get_mut(in.take<uint16_t>()));
			break;
		case kDrop: {
			uint8_t which = in.take<uint8_t>();
			if (!guards.empty())
				guards.erase(guards.begin() + which % guards.size());
			break;
		}
		case kUse: {
			uint8_t which = in.take<uint8_t>();
			if (!guards.empty())
				use_guard(guards[which % guards.size()], k);
			break;
		}
		case kRefs: {
			uint8_t which = in.take<uint8_t>();
			uint16_t index = in.take<uint16_t>();
			uint8_t count = in.take<uint8_t>();
			if (which % 3 == 0)
				(void)pool.add_ref(index);
			else if (which % 3 == 1)
				(void)pool.release(index);
			else
				(void)pool.set_local_refs(index, count);
			(void)pool.ref_count(index);
			break;
		}
		case kStats: {
			// While the format seqlock is odd every snapshot waits 200 ms for it:
			// that case is the snapshot harness's.
			auto *h = reinterpret_cast<layout::ControlHeader *>(shared.base);
			bool settled = shared.fits(0, sizeof(*h)) && h->format_lock.load() % 2 == 0;
			auto stats = pool.stats();
			XMEM_FUZZ_CHECK(stats.slots_total <= k.slot_count && stats.slots_free <= stats.slots_total, "");
			XMEM_FUZZ_CHECK(stats.consumers <= k.max_consumers, "");
			XMEM_FUZZ_CHECK(pool.format().size() < XMEM_FORMAT_MAX, "");
			if (settled) {
				auto view = xmem::snapshot(pool);
				XMEM_FUZZ_CHECK(view.ok() && view->slots.size() <= k.slot_count, "");
			}
			break;
		}
		}
	}
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	Input in(data, size);
	uint8_t flags = in.take<uint8_t>();
	uint32_t consumer_index = in.take<uint32_t>();
	auto img = xmem::fuzz::SegmentImage::read(in);
	bool inspect = flags & 1;
	// A memfd shorter than the segment it holds, in one bit flip: what a consumer must
	// refuse before it indexes a single record.
	if (flags & 2)
		img.size -= std::min<uint32_t>(img.size, 4096);
	if (flags & 4)
		img.size /= 2;
	img.prefix = img.prefix.first(std::min<size_t>(img.prefix.size(), img.size));

	xmem::UniqueFd control = xmem::fuzz::sealed_memfd(img.prefix, img.size);
	Shared shared;
	if (img.size > 0) {
		void *p = ::mmap(nullptr, img.size, PROT_READ | PROT_WRITE, MAP_SHARED, control.get(), 0);
		if (p == MAP_FAILED)
			xmem::fuzz::fail("mmap", std::strerror(errno));
		shared.base = static_cast<std::byte *>(p);
		shared.size = img.size;
	}
	// The constants as the segment holds them at attach: what the harness (the
	// "owner") lays its writes out by, and what the consumer validates.
	layout::ControlConstants k{};
	std::memcpy(&k, img.prefix.data(), std::min(img.prefix.size(), sizeof(k)));

	// The data arena the constants describe, when it is not too big to make.
	xmem::UniqueFd data_fd;
	std::vector<int> fds{ control.get() };
	bool cuda = k.storage_type == XMEM_STORAGE_CUDA;
	// The first size class's (later classes are imported over connections of their own).
	size_t arena_fds = inspect ? 0 : cuda ? std::min<size_t>(k.first_class_slots, XMEM_MAX_SLOTS) : 1;
	if (arena_fds > 0) {
		uint64_t bytes = k.slot_stride * k.first_class_slots;
		if (k.first_class_slots == 0 || bytes / k.first_class_slots != k.slot_stride || bytes > kMaxData)
			bytes = 4096;
		if (cuda)
			bytes = 4096;
		data_fd = xmem::fuzz::sealed_memfd({}, bytes);
	}
	std::vector<xmem::fuzz::Message> messages;
	protocol::Welcome w = protocol::make_welcome(consumer_index, img.size, k.data_size, 1, "fuzz-format");
	size_t first = std::min(arena_fds, protocol::kMaxFds - 1);
	fds.insert(fds.end(), first, data_fd.get());
	messages.push_back({ std::vector<std::byte>(reinterpret_cast<std::byte *>(&w),
						    reinterpret_cast<std::byte *>(&w) + sizeof(w)),
			     fds });
	for (size_t next = first; next < arena_fds;) {
		size_t n = std::min(arena_fds - next, protocol::kMaxFds);
		protocol::MessageHeader h = protocol::make_header(protocol::MessageType::arena_fds, sizeof(h));
		messages.push_back({ std::vector<std::byte>(reinterpret_cast<std::byte *>(&h),
							    reinterpret_cast<std::byte *>(&h) + sizeof(h)),
				     std::vector<int>(n, data_fd.get()) });
		next += n;
	}

	xmem::fuzz::FakeOwner &owner = fake_owner();
	owner.serve(std::move(messages), false);
	xmem::OpenOptions options;
	options.inspect = inspect;
	options.client = "fuzz";
	auto opened = xmem::BufferPool::open(owner.path(), options);
	owner.sent();
	if (opened) {
		// It attached: then the constants passed every check.
		auto valid = xmem::validate_constants(k, img.size, "fuzz");
		XMEM_FUZZ_CHECK(valid.ok(), valid.error().message);
		XMEM_FUZZ_CHECK(inspect || consumer_index < k.max_consumers, std::to_string(consumer_index));
		xmem::fuzz::GuardPage guard(opened.value()->control_segment());
		run_script(in, *opened.value(), shared, k, consumer_index, inspect);
		opened = xmem::Error{};
	}
	opened = xmem::Error{};
	owner.done();
	return 0;
}

std::vector<std::vector<uint8_t>> fuzz_seeds()
{
	std::vector<std::vector<uint8_t>> seeds;
	auto images = xmem::fuzz::real_pool_images();
	for (size_t n = 0; n < images.size(); n++) {
		const auto &img = images[n];
		for (bool inspect : { false, true }) {
			if (inspect && n % 2)
				continue; // keeps the corpus small
			xmem::fuzz::Output out;
			out.put(uint8_t(inspect)).put(uint32_t(0));
			xmem::fuzz::SegmentImage::write(out, img.bytes);
			// Take what is queued, look at it, hold some, ask for slots by index, and
			// queue one more frame as the owner would.
			for (uint32_t i = 0; i < img.queued + 1; i++)
				out.put(uint8_t(kReceive));
			out.put(uint8_t(kUse)).put(uint8_t(0));
			out.put(uint8_t(kGet)).put(uint16_t(0));
			out.put(uint8_t(kGetMut)).put(uint16_t(img.slot_count - 1));
			out.put(uint8_t(kStats));
			if (!inspect) {
				out.put(uint8_t(kRefs)).put(uint8_t(0)).put(uint16_t(0)).put(uint8_t(1));
				out.put(uint8_t(kRefs)).put(uint8_t(1)).put(uint16_t(0)).put(uint8_t(1));
			}
			out.put(uint8_t(kDrop)).put(uint8_t(0));
			out.put(uint8_t(kPush)).put(uint32_t(0)).put(uint32_t(7));
			out.put(uint8_t(kReceive)).put(uint8_t(kStats));
			seeds.push_back(out.take());
		}
	}
	return seeds;
}
