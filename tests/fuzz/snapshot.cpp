// snapshot.cpp - fuzzes xmem::snapshot(), what xmem-inspect reads from a pool while
// other processes write it. An inspector's handle is made as attach makes it: a real
// control segment (ControlSegment::create) adopted and validated; then the fuzzer's
// bytes overwrite the segment, constants included, as a hostile or broken owner could
// after the validation, and snapshot() reads it. Input: slot count (u16), max
// consumers (u8), flags (u8: bit 0 CUDA storage; the others 0x42: leave the format
// seqlock as written), then the segment's bytes from offset 0.
#include "fuzz.hpp"

#include "layout.hpp"
#include "pool_impl.hpp"
#include "segment.hpp"

#include <xmem/snapshot.hpp>

#include <memory>

using xmem::fuzz::Input;
namespace layout = xmem::layout;

namespace {

constexpr uint8_t kKeepSeqlock = 0x42;

void check(const xmem::PoolSnapshot &v, const xmem::ControlSegment &seg)
{
	XMEM_FUZZ_CHECK(v.slots.size() <= seg.slot_count, std::to_string(v.slots.size()));
	XMEM_FUZZ_CHECK(v.slots_free <= v.slots.size(), "");
	XMEM_FUZZ_CHECK(v.consumers.size() <= XMEM_MAX_CONSUMERS, std::to_string(v.consumers.size()));
	XMEM_FUZZ_CHECK(v.consumers_attached <= v.consumers.size(), "");
	// Strings end at their field, NUL or not.
	XMEM_FUZZ_CHECK(v.header.producer.size() <= XMEM_PRODUCER_MAX, "");
	if (v.format)
		XMEM_FUZZ_CHECK(v.format->text.size() <= XMEM_FORMAT_MAX, "");
	for (size_t i = 0; i < v.slots.size(); i++) {
		const auto &s = v.slots[i];
		// Records of the classes, each once, in order (a scribbled class table may
		// leave gaps).
		XMEM_FUZZ_CHECK(s.index < seg.slot_count && (i == 0 || s.index > v.slots[i - 1].index), "");
		XMEM_FUZZ_CHECK(s.holders.size() <= layout::kHolderWords * 64, "");
		for (const auto &h : s.holders)
			XMEM_FUZZ_CHECK(h.bit < layout::kHolderWords * 64, "");
	}
	for (const auto &c : v.consumers) {
		XMEM_FUZZ_CHECK(c.index < XMEM_MAX_CONSUMERS, "");
		XMEM_FUZZ_CHECK(c.client.size() <= 32, "");
		if (c.queued)
			XMEM_FUZZ_CHECK(*c.queued == c.queue.size() && *c.queued <= XMEM_MAX_SLOTS + 1,
					std::to_string(*c.queued));
		else
			XMEM_FUZZ_CHECK(c.queue.empty(), "");
	}
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	Input in(data, size);
	xmem::SegmentParams params;
	params.slot_count = 1 + in.take<uint16_t>() % XMEM_MAX_SLOTS;
	params.first_class_slots = params.slot_count;
	params.max_consumers = 1 + in.take<uint8_t>() % XMEM_MAX_CONSUMERS;
	uint8_t flags = in.take<uint8_t>();
	params.storage = flags & 1 ? xmem::Storage::cuda : xmem::Storage::system;
	params.sync_mode = flags & 1 ? layout::kSyncStreamMemOps : layout::kSyncNone;
	params.slot_size = 4096;
	params.slot_stride = 4096;
	params.producer = "fuzz";
	auto created = xmem::ControlSegment::create("fuzz", params);
	if (!created)
		xmem::fuzz::fail("creating a control segment", created.error().message);
	// As an inspector's attach does: adopt (and validate) the owner's memfd.
	auto adopted = xmem::ControlSegment::adopt(xmem::UniqueFd(::dup(created->fd())), "pool 'fuzz'");
	XMEM_FUZZ_CHECK(adopted.ok(), adopted.ok() ? "" : adopted.error().message);

	auto impl = std::make_shared<xmem::PoolImpl>();
	impl->role = xmem::Role::inspector;
	impl->name = "fuzz";
	impl->path = "/fuzz";
	impl->seg = std::move(adopted.value());

	// Then the segment changes under the inspector.
	auto bytes = in.rest();
	std::span<const std::byte> mapped = impl->seg.bytes();
	auto *base = const_cast<std::byte *>(mapped.data());
	std::memcpy(base, bytes.data(), std::min(bytes.size(), mapped.size()));
	if ((flags & 0xfe) != kKeepSeqlock) {
		// An odd seqlock makes every snapshot wait 200 ms for the format to settle:
		// but for one flags value, keep the fuzzer fast.
		auto *h = reinterpret_cast<layout::ControlHeader *>(base);
		h->format_lock.fetch_and(~uint64_t{ 1 });
	}

	xmem::BufferPool pool(impl);
	xmem::fuzz::GuardPage guard(impl->seg.bytes());
	auto view = xmem::snapshot(pool);
	XMEM_FUZZ_CHECK(view.ok(), view.ok() ? "" : view.error().message);
	check(view.value(), impl->seg);
	// The library's own reads of the same bytes, as xmem-inspect's handle makes them.
	auto stats = pool.stats();
	XMEM_FUZZ_CHECK(stats.slots_total <= impl->seg.slot_count && stats.slots_free <= stats.slots_total, "");
	return 0;
}

std::vector<std::vector<uint8_t>> fuzz_seeds()
{
	std::vector<std::vector<uint8_t>> seeds;
	for (const auto &img : xmem::fuzz::real_pool_images()) {
		xmem::fuzz::Output out;
		out.put(uint16_t(img.slot_count - 1)).put(uint8_t(img.max_consumers - 1)).put(uint8_t(0));
		// Trailing zeros are what the segment holds anyway.
		size_t n = img.bytes.size();
		while (n > 0 && img.bytes[n - 1] == std::byte{ 0 })
			n--;
		out.put_bytes(std::span(img.bytes).first(n));
		seeds.push_back(out.take());
	}
	return seeds;
}
