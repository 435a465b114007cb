// spill.hpp - the spill tier: host buffers in one memfd that hold frames moved out of
// their slots for fifo-spill consumers (docs/design.md, "The spill tier").
//
// The memfd holds spill_frames SlotRecords, then the payload area. A buffer is a record
// and a page-aligned run of the payload area; the owner alone allocates and frees them,
// consumers hold them by holder bits as they hold slots. In a pool's index space, spill
// buffer r is index slot_count + r.
#pragma once

#include "layout.hpp"
#include "system.hpp"

#include <map>
#include <optional>
#include <span>
#include <string>

namespace xmem {

class SpillTier
{
public:
	// Owner: a new memfd for FRAMES buffers and BYTES of payload (whole pages), its
	// records free. Pages are taken when a buffer is allocated and kept when it is
	// freed, for the next; trim() gives them back (the owner does once the tier has
	// been idle a while): an idle tier costs its records' pages only.
	static Result<SpillTier> create(const std::string &name, uint32_t frames, uint64_t bytes, uint32_t mode);
	// Consumer: maps the owner's memfd FD, of the size its validated constants say.
	static Result<SpillTier> adopt(UniqueFd fd, const layout::ControlConstants &k, const std::string &where);

	int fd() const { return fd_.get(); }
	// The whole memfd as this process maps it (records, then the payload area).
	std::span<std::byte> memory() const { return { map_.data(), map_.size() }; }
	uint32_t frames() const { return frames_; }
	layout::SlotRecord &record(uint32_t r) const { return records_[r]; }
	// The payload area from OFFSET (a buffer's record says it) to its end: empty when
	// OFFSET is outside the area (another process wrote the record).
	std::span<std::byte> payload(uint64_t offset) const;

	// Owner: a free buffer with BYTES of payload (rounded up to pages), its record still
	// FREE; none when no record or no run of the payload area is free, or the pages
	// cannot be had (a full tmpfs). The caller fills the record and publishes it.
	std::optional<uint32_t> allocate(uint64_t bytes);
	// Owner: buffer R goes back; its pages stay for the next spill (see trim()).
	void free(uint32_t r);
	// Owner: the pages of the free runs from *CURSOR (an offset in the memfd) go back to
	// the kernel, at most BUDGET bytes of runs; *CURSOR moves past them. True once the
	// end was reached. Calls with the owner's lock let go between them may see other
	// runs: each call looks at the runs as they are then.
	bool trim(uint64_t *cursor, uint64_t budget);
	// The memory the memfd holds now (its records' pages and the payload's), in bytes.
	uint64_t resident() const;
	// Owner: the bytes buffer R takes (whole pages).
	uint64_t bytes_of(uint32_t r) const;
	// Owner: the offset of buffer R's payload in the memfd (its own copy).
	uint64_t offset_of(uint32_t r) const;

private:
	UniqueFd fd_;
	Mapping map_;
	layout::SlotRecord *records_ = nullptr;
	uint32_t frames_ = 0;
	uint64_t payload_offset_ = 0;
	uint64_t payload_size_ = 0;
	// Owner only: the free runs of the payload area (offset -> length), coalesced, and
	// each allocated buffer's run.
	struct Run {
		uint64_t offset;
		uint64_t length;
	};
	std::map<uint64_t, uint64_t> free_runs_;
	std::map<uint32_t, Run> taken_;
	uint32_t cursor_ = 0; // where allocate() looks for a free record first
};

} // namespace xmem
