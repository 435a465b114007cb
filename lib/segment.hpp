// segment.hpp - a pool's control segment as one process sees it: the mapping, the
// constants (created by the owner, validated once by a consumer) and its records.
#pragma once

#include "layout.hpp"
#include "system.hpp"

#include <span>
#include <string>

namespace xmem {

// What the owner lays out: everything in ControlConstants that is not derived.
struct SegmentParams {
	uint32_t slot_count = 0; // slot records: the first class's and those for later ones
	uint32_t first_class_slots = 0;
	uint32_t max_consumers = 0;
	uint64_t slot_size = 0;
	uint64_t slot_stride = 0;
	Storage storage = Storage::system;
	uint32_t device = 0;
	DeviceUuid device_uuid{}; // CUDA storage
	bool device_is_mig = false; // device_uuid is a MIG device's
	layout::SyncMode sync_mode = layout::kSyncNone;
	Policy policy = Policy::drop_oldest;
	uint32_t mode = 0600;
	uint64_t block_timeout_ns = 0;
	std::string producer;
	uint32_t spill_frames = 0; // 0: no spill tier
	uint64_t spill_bytes = 0;
};

// The mapping plus copies of its validated constants. The copies are what this
// process indexes with: another process can scribble on the shared header, never
// on these. Movable, not copyable; unmaps on destruction.
class ControlSegment
{
public:
	ControlSegment() = default;

	// Owner: a new sealed memfd, every record initialised.
	static Result<ControlSegment> create(const std::string &name, const SegmentParams &params);
	// Consumer or inspector: maps FD and checks every constant (magic and version
	// first) before anything else in it is read. WHERE names the pool in errors.
	static Result<ControlSegment> adopt(UniqueFd fd, const std::string &where);

	int fd() const { return fd_.get(); }
	std::span<const std::byte> bytes() const { return { map_.data(), map_.size() }; }
	const layout::ControlConstants &constants() const { return k_; }

	layout::ControlHeader *header = nullptr;
	layout::ClassRecord *classes = nullptr; // the class table, kMaxClasses records
	layout::SlotRecord *slots = nullptr;
	uint32_t slot_count = 0; // slot records, of every class and none yet (kSlotUnused)
	uint32_t max_consumers = 0;
	uint32_t ring_capacity = 0;
	uint32_t consumer_record_size = 0;
	uint64_t slot_size = 0;
	uint64_t slot_stride = 0;
	uint32_t spill_frames = 0;

	layout::ConsumerRecord *consumer(uint32_t i) const
	{
		return reinterpret_cast<layout::ConsumerRecord *>(consumers_ + uint64_t{ i } * consumer_record_size);
	}
	// GPU ordering words of slot I (CUDA pools only, see layout.hpp): ready, the
	// pending word holding holder bit H, and done of holder H.
	std::atomic<uint64_t> &ready(uint32_t i) const { return *sync_word(i, layout::kSyncReadyWord); }
	std::atomic<uint64_t> &pending(uint32_t i, uint32_t holder) const
	{
		return *sync_word(i, layout::kSyncPendingWord + holder / 64);
	}
	std::atomic<uint64_t> &done(uint32_t i, uint32_t holder) const
	{
		return *sync_word(i, layout::kSyncDoneWord + holder);
	}
	bool has_sync_records() const { return sync_ != nullptr; }
	// Owner, before any consumer attached: the GPU ordering it ended up with.
	void set_sync_mode(layout::SyncMode mode)
	{
		k_.sync_mode = mode;
		header->sync_mode = mode;
		classes[0].sync_mode = mode;
	}

private:
	std::atomic<uint64_t> *sync_word(uint32_t i, uint32_t word) const
	{
		return reinterpret_cast<std::atomic<uint64_t> *>(sync_ + uint64_t{ i } * k_.sync_record_size) + word;
	}
	void bind(); // sets the pointers and copies from k_

	UniqueFd fd_;
	Mapping map_;
	layout::ControlConstants k_{};
	std::byte *consumers_ = nullptr;
	std::byte *sync_ = nullptr;
};

// Checks constants read from a segment of MAPPED bytes: magic, ABI version, record
// sizes, counts and sizes consistent with each other and with the mapping.
Result<void> validate_constants(const layout::ControlConstants &k, uint64_t mapped, const std::string &where);

// Checks class record C, copied out of a segment of constants K: a known memory, sizes
// that fit, and slot records after the previous class's (PREVIOUS_END) within the
// segment's. Class 0 must be what the constants say.
Result<void> validate_class(const layout::ClassRecord &c, uint32_t index, uint32_t previous_end,
			    const layout::ControlConstants &k, const std::string &where);

} // namespace xmem
