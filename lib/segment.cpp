// segment.cpp - creating a pool's control segment, and the checks a consumer makes
// on one an owner sent before it trusts a single size in it.
#include "segment.hpp"
#include "arena.hpp"

#include <xmem/snapshot.hpp>

#include <algorithm>
#include <cstring>

namespace xmem {

using namespace layout;

Result<void> validate_constants(const ControlConstants &k, uint64_t mapped, const std::string &where)
{
	if (k.magic != kMagic)
		return segment_error(where, "wrong magic");
	if (k.abi_version != kAbiVersion)
		return make_error(Errc::version_mismatch, where + ": control segment ABI version " +
								  std::to_string(k.abi_version) + ", this library " +
								  std::to_string(kAbiVersion));
	if (k.header_size != sizeof(ControlHeader) || k.slot_record_size != sizeof(SlotRecord))
		return segment_error(where, "record sizes differ from this library's");
	if (k.slot_count < 1 || k.slot_count > XMEM_MAX_SLOTS)
		return segment_error(where, "slot count " + std::to_string(k.slot_count) + " out of range");
	if (k.max_consumers < 1 || k.max_consumers > XMEM_MAX_CONSUMERS)
		return segment_error(where, "max consumers " + std::to_string(k.max_consumers) + " out of range");
	if (k.spill_frames > kMaxSpillFrames || (k.spill_frames == 0) != (k.spill_bytes == 0) ||
	    k.spill_bytes > (uint64_t{ 1 } << 44) || k.spill_size != layout::spill_size(k.spill_frames, k.spill_bytes))
		return segment_error(where, "spill tier sizes inconsistent");
	if (k.ring_capacity != k.slot_count + k.spill_frames + 1 ||
	    k.consumer_record_size != layout::consumer_record_size(k.ring_capacity))
		return segment_error(where, "ring size inconsistent");
	bool device = on_device(Storage(k.storage_type));
	if (!storage_name(Storage(k.storage_type)))
		return make_error(Errc::not_a_pool, where + ": storage type " + std::to_string(k.storage_type) +
							    " is not supported by this library");
	if (k.control_size != control_size(k.slot_count, k.max_consumers, k.ring_capacity) || k.control_size > mapped)
		return segment_error(where, "control size " + std::to_string(k.control_size) + " inconsistent");
	if (device ? k.sync_mode != kSyncStreamMemOps && k.sync_mode != kSyncCpu : k.sync_mode != kSyncNone)
		return segment_error(where, "sync mode " + std::to_string(k.sync_mode) + " unknown for its memory");
	if (k.sync_offset != sync_offset(k.slot_count, k.max_consumers, k.ring_capacity) ||
	    k.sync_record_size != sync_record_size(k.max_consumers))
		return segment_error(where, "sync records misplaced");
	if (k.device_kind != kDeviceGpu && (k.device_kind != kDeviceMig || !device))
		return segment_error(where, "device kind " + std::to_string(k.device_kind) + " unknown");
	if (k.first_class_slots < 1 || k.first_class_slots > k.slot_count)
		return segment_error(where,
				     "first class of " + std::to_string(k.first_class_slots) + " slots out of range");
	if (k.slot_size == 0 || k.slot_stride < k.slot_size || k.slot_stride % 64 != 0 ||
	    k.slot_stride > (uint64_t{ 1 } << 41) || k.data_size != k.slot_stride * k.first_class_slots)
		return segment_error(where, "slot sizes inconsistent");
	return {};
}

Result<void> validate_class(const ClassRecord &c, uint32_t index, uint32_t previous_end, const ControlConstants &k,
			    const std::string &where)
{
	std::string which = "size class " + std::to_string(index);
	bool device = on_device(Storage(c.storage));
	if (!storage_name(Storage(c.storage)))
		return make_error(Errc::not_a_pool, where + ": " + which + " has storage type " +
							    std::to_string(c.storage) +
							    ", which this library does not support");
	if (c.device_kind != kDeviceGpu && (c.device_kind != kDeviceMig || !device))
		return segment_error(where, which + ": device kind " + std::to_string(c.device_kind) + " unknown");
	if (device ? c.sync_mode != kSyncStreamMemOps && c.sync_mode != kSyncCpu
		   : c.sync_mode != kSyncNone || c.device != 0 ||
			     std::any_of(std::begin(c.device_uuid), std::end(c.device_uuid),
					 [](uint8_t b) { return b != 0; }))
		return segment_error(where, which + ": sync mode " + std::to_string(c.sync_mode) + " or device " +
						    std::to_string(c.device) + " unknown for its memory");
	if (c.first_slot != previous_end || c.count < 1 ||
	    c.count > k.slot_count - std::min(c.first_slot, k.slot_count))
		return segment_error(where, which + ": slots " + std::to_string(c.first_slot) + " + " +
						    std::to_string(c.count) + " out of range");
	if (c.slot_size == 0 || c.slot_stride < c.slot_size || c.slot_stride % 64 != 0 ||
	    c.slot_stride > (uint64_t{ 1 } << 41) || c.data_size != c.slot_stride * c.count)
		return segment_error(where, which + ": slot sizes inconsistent");
	if (index == 0 && (c.storage != k.storage_type || c.device != k.device_id || c.count != k.first_class_slots ||
			   c.slot_size != k.slot_size || c.slot_stride != k.slot_stride || c.sync_mode != k.sync_mode ||
			   std::memcmp(c.device_uuid, k.device_uuid, sizeof(c.device_uuid)) != 0))
		return segment_error(where, which + " is not the pool's first class");
	return {};
}

void ControlSegment::bind()
{
	header = reinterpret_cast<ControlHeader *>(map_.data());
	classes = reinterpret_cast<ClassRecord *>(map_.data() + classes_offset());
	slots = reinterpret_cast<SlotRecord *>(map_.data() + slots_offset());
	consumers_ = map_.data() + consumers_offset(k_.slot_count);
	sync_ = k_.sync_record_size ? map_.data() + k_.sync_offset : nullptr;
	slot_count = k_.slot_count;
	max_consumers = k_.max_consumers;
	ring_capacity = k_.ring_capacity;
	consumer_record_size = k_.consumer_record_size;
	slot_size = k_.slot_size;
	slot_stride = k_.slot_stride;
	spill_frames = k_.spill_frames;
}

Result<ControlSegment> ControlSegment::create(const std::string &name, const SegmentParams &p)
{
	ControlConstants k{};
	k.magic = kMagic;
	k.abi_version = kAbiVersion;
	k.header_size = sizeof(ControlHeader);
	k.slot_record_size = sizeof(SlotRecord);
	k.slot_count = p.slot_count;
	k.first_class_slots = p.first_class_slots;
	k.max_consumers = p.max_consumers;
	// Every slot and spill buffer queued, plus an EOS marker.
	k.ring_capacity = p.slot_count + p.spill_frames + 1;
	k.spill_frames = p.spill_frames;
	k.spill_bytes = p.spill_frames ? round_up(p.spill_bytes, 4096) : 0;
	k.spill_size = layout::spill_size(k.spill_frames, k.spill_bytes);
	k.consumer_record_size = layout::consumer_record_size(k.ring_capacity);
	k.control_size = control_size(k.slot_count, k.max_consumers, k.ring_capacity);
	k.slot_size = p.slot_size;
	k.slot_stride = p.slot_stride;
	k.data_size = p.slot_stride * p.first_class_slots;
	k.storage_type = uint32_t(p.storage);
	k.device_id = p.device;
	std::memcpy(k.device_uuid, p.device_uuid.data(), sizeof(k.device_uuid));
	k.device_kind = p.device_is_mig ? kDeviceMig : kDeviceGpu;
	k.policy = uint32_t(p.policy);
	k.mode = p.mode;
	k.owner_pid = uint32_t(::getpid());
	k.owner_uid = uint32_t(::geteuid());
	k.owner_pid_ns = pid_namespace_here();
	k.block_timeout_ns = p.block_timeout_ns;
	k.created_ns = monotonic_ns();
	copy_string(k.producer, sizeof(k.producer), p.producer);
	k.sync_mode = p.sync_mode; // kSyncNone for system memory (ordering_wanted)
	k.sync_record_size = sync_record_size(k.max_consumers);
	k.sync_offset = sync_offset(k.slot_count, k.max_consumers, k.ring_capacity);

	ControlSegment seg;
	auto fd = make_sealed_memfd("xmem-control:" + name, k.control_size, p.mode, false);
	if (!fd)
		return fd.error();
	seg.fd_ = std::move(fd.value());
	auto map = map_shared(seg.fd_.get(), k.control_size, true, "control segment");
	if (!map)
		return map.error();
	seg.map_ = std::move(map.value());
	seg.k_ = k;

	ControlHeader *h = new (seg.map_.data()) ControlHeader{};
	static_cast<ControlConstants &>(*h) = k;
	seg.bind();
	ClassRecord first{};
	first.storage = k.storage_type;
	first.device = k.device_id;
	std::memcpy(first.device_uuid, k.device_uuid, sizeof(first.device_uuid));
	first.device_kind = k.device_kind;
	first.sync_mode = k.sync_mode;
	first.count = k.first_class_slots;
	first.slot_size = k.slot_size;
	first.slot_stride = k.slot_stride;
	first.data_size = k.data_size;
	seg.classes[0] = first;
	h->classes.store(1, std::memory_order_relaxed); // before any other process maps it
	for (uint32_t i = 0; i < k.slot_count; i++) {
		SlotRecord *s = new (&seg.slots[i]) SlotRecord{};
		s->index = i;
		if (i < k.first_class_slots)
			s->offset = uint64_t{ i } * k.slot_stride;
		else
			s->state.store(kSlotUnused, std::memory_order_relaxed);
	}
	for (uint32_t i = 0; i < k.max_consumers; i++) {
		ConsumerRecord *c = new (seg.consumer(i)) ConsumerRecord{};
		std::atomic<uint64_t> *ring = ring_of(c);
		for (uint32_t e = 0; e < k.ring_capacity; e++)
			new (&ring[e]) std::atomic<uint64_t>(0);
	}
	if (seg.sync_) {
		for (uint32_t i = 0; i < k.slot_count; i++)
			for (uint32_t w = 0; w < kSyncDoneWord + k.max_consumers + 1; w++)
				new (seg.sync_word(i, w)) std::atomic<uint64_t>(0);
	}
	return seg;
}

Result<ControlSegment> ControlSegment::adopt(UniqueFd fd, const std::string &where)
{
	// The header first, on its own, before any size from it is trusted.
	auto map = map_peer_memfd(fd.get(), sizeof(ControlHeader), where, "control segment");
	if (!map)
		return map.error();
	ControlSegment seg;
	seg.fd_ = std::move(fd);
	seg.map_ = std::move(map.value());
	std::memcpy(&seg.k_, seg.map_.data(), sizeof(seg.k_));
	auto valid = validate_constants(seg.k_, seg.map_.size(), where);
	if (!valid)
		return valid.error();
	if (seg.k_.device_kind == kDeviceMig) {
		// This process names the device "MIG-…" from now on, even where it does not see it.
		DeviceUuid uuid;
		std::memcpy(uuid.data(), seg.k_.device_uuid, uuid.size());
		note_mig_device(uuid);
	}
	seg.bind();
	return seg;
}

} // namespace xmem
