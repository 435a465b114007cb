// spill.cpp - the spill tier's memfd, its records and the owner's allocator of its
// payload area (first fit over page runs, coalesced on free).
#include "spill.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

namespace xmem {

using namespace layout;

namespace {

constexpr uint64_t kPage = 4096;

} // namespace

Result<SpillTier> SpillTier::create(const std::string &name, uint32_t frames, uint64_t bytes, uint32_t mode)
{
	SpillTier t;
	uint64_t size = spill_size(frames, bytes);
	auto fd = make_sealed_memfd("xmem-spill:" + name, size, mode, false);
	if (!fd)
		return fd.error();
	t.fd_ = std::move(fd.value());
	auto map = map_shared(t.fd_.get(), size, false, "spill tier");
	if (!map)
		return map.error();
	t.map_ = std::move(map.value());
	t.frames_ = frames;
	t.payload_offset_ = spill_payload_offset(frames);
	t.payload_size_ = size - t.payload_offset_;
	t.records_ = reinterpret_cast<SlotRecord *>(t.map_.data());
	for (uint32_t r = 0; r < frames; r++)
		new (&t.records_[r]) SlotRecord{};
	t.free_runs_[t.payload_offset_] = t.payload_size_;
	return t;
}

Result<SpillTier> SpillTier::adopt(UniqueFd fd, const ControlConstants &k, const std::string &where)
{
	SpillTier t;
	auto map = map_peer_memfd(fd.get(), k.spill_size, where, "spill tier");
	if (!map)
		return map.error();
	t.fd_ = std::move(fd);
	t.map_ = std::move(map.value());
	t.frames_ = k.spill_frames;
	t.payload_offset_ = spill_payload_offset(k.spill_frames);
	t.payload_size_ = k.spill_size - t.payload_offset_;
	t.records_ = reinterpret_cast<SlotRecord *>(t.map_.data());
	return t;
}

std::span<std::byte> SpillTier::payload(uint64_t offset) const
{
	uint64_t end = payload_offset_ + payload_size_;
	if (offset < payload_offset_ || offset >= end)
		return {};
	return { map_.data() + offset, size_t(end - offset) };
}

std::optional<uint32_t> SpillTier::allocate(uint64_t bytes)
{
	uint64_t length = round_up(std::max<uint64_t>(bytes, 1), kPage);
	std::optional<uint32_t> record;
	for (uint32_t n = 0; n < frames_ && !record; n++) {
		uint32_t r = (cursor_ + n) % frames_;
		if (!taken_.contains(r))
			record = r;
	}
	if (!record)
		return std::nullopt;
	for (auto it = free_runs_.begin(); it != free_runs_.end(); ++it) {
		auto [offset, free] = *it;
		if (free < length)
			continue;
		// The pages now, so a full tmpfs fails here and not as a SIGBUS in a copy; and
		// mapped here in one call, not by a fault per page in the copy (each fault a
		// trap, dear in a virtual machine). Kernels before 5.14 fault them in the copy.
		if (::fallocate(fd_.get(), 0, off_t(offset), off_t(length)) < 0)
			return std::nullopt;
		(void)::madvise(map_.data() + offset, length, MADV_POPULATE_WRITE);
		free_runs_.erase(it);
		if (free > length)
			free_runs_[offset + length] = free - length;
		taken_[*record] = Run{ offset, length };
		cursor_ = *record + 1;
		return record;
	}
	return std::nullopt;
}

void SpillTier::free(uint32_t r)
{
	auto it = taken_.find(r);
	if (it == taken_.end())
		return;
	Run run = it->second;
	taken_.erase(it);
	// Its pages stay, mapped, for the next spill: a first touch of a page costs far
	// more than the copy into it. trim() gives them back once the tier is idle.
	auto next = free_runs_.lower_bound(run.offset);
	if (next != free_runs_.end() && run.offset + run.length == next->first) {
		run.length += next->second;
		next = free_runs_.erase(next);
	}
	if (next != free_runs_.begin()) {
		auto prev = std::prev(next);
		if (prev->first + prev->second == run.offset) {
			prev->second += run.length;
			return;
		}
	}
	free_runs_[run.offset] = run.length;
}

bool SpillTier::trim(uint64_t *cursor, uint64_t budget)
{
	// The first free run that ends past the cursor, or none.
	auto next = [&] {
		auto it = free_runs_.upper_bound(*cursor);
		if (it != free_runs_.begin() && std::prev(it)->first + std::prev(it)->second > *cursor)
			it = std::prev(it);
		return it;
	};
	for (auto it = next(); it != free_runs_.end(); it = next()) {
		if (budget == 0)
			return false;
		uint64_t from = std::max(*cursor, it->first);
		uint64_t length = std::min(it->first + it->second - from, budget);
		(void)::fallocate(fd_.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off_t(from), off_t(length));
		*cursor = from + length;
		budget -= length;
	}
	return true;
}

uint64_t SpillTier::resident() const
{
	struct stat st;
	return ::fstat(fd_.get(), &st) == 0 ? uint64_t(st.st_blocks) * 512 : 0;
}

uint64_t SpillTier::bytes_of(uint32_t r) const
{
	auto it = taken_.find(r);
	return it == taken_.end() ? 0 : it->second.length;
}

uint64_t SpillTier::offset_of(uint32_t r) const
{
	auto it = taken_.find(r);
	return it == taken_.end() ? 0 : it->second.offset;
}

} // namespace xmem
