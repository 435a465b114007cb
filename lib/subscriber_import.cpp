// subscriber_import.cpp - a consumer's imports of memory the owner made after it
// attached: size classes (PeerRole::classes) and dynamic device slots (PeerRole::slot).
#include "subscriber.hpp"

#include "protocol.hpp"
#include "rendezvous.hpp"

#include <algorithm>
#include <cstring>

namespace xmem {

using namespace layout;

Result<layout::ClassRecord> Subscriber::class_record(uint32_t c) const
{
	layout::ClassRecord record;
	std::memcpy(&record, &seg.classes[c], sizeof(record));
	uint32_t previous_end = c == 0 ? 0 : pool_.classes[c - 1].first_slot + pool_.classes[c - 1].count;
	if (auto valid = validate_class(record, c, previous_end, seg.constants(), pool_.where()); !valid)
		return valid.error();
	return record;
}

Result<DeviceSync *> Subscriber::device_ordering(const layout::ClassRecord &record, const Arena &memory)
{
	uint32_t n = pool_.classes_known.load(std::memory_order_relaxed);
	for (uint32_t c = 0; c < n; c++)
		if (pool_.classes[c].sync && Memory{ memory.storage(), memory.device() }.holds(*pool_.classes[c].arena))
			return pool_.classes[c].sync;
	bool first = !pool_.has_device_slots();
	auto made = pool_.add_sync(memory, record.sync_mode == layout::kSyncStreamMemOps);
	if (!made || !*made)
		return made; // an error, or memory the CPU orders
	DeviceSync *sync = *made;
	// A consumer of a system pool meets device memory: from now on it waits for the
	// producer's GPU writes, which the owner's death must release.
	if (first && self) {
		self->sync_mode = sync->mode();
		if (!owner_watch.joinable())
			if (auto watched = watch_owner(); !watched)
				return watched.error();
	}
	return sync;
}

Result<Memory> Subscriber::memory_of(const layout::ClassRecord &c) const
{
	DeviceUuid uuid;
	std::memcpy(uuid.data(), c.device_uuid, uuid.size());
	return memory_here(Storage(c.storage), c.device, uuid, pool_.where());
}

Result<void> Subscriber::import_classes()
{
	std::lock_guard lock(pool_.classes_lock);
	uint32_t counted = std::min(seg.header->classes.load(std::memory_order_acquire), layout::kMaxClasses);
	for (uint32_t c = pool_.classes_known.load(std::memory_order_relaxed); c < counted; c++) {
		std::string which = pool_.where() + ": size class " + std::to_string(c);
		auto record = class_record(c);
		if (!record)
			return record.error();
		auto memory = memory_of(*record);
		if (!memory)
			return memory.error();
		uint64_t deadline = monotonic_ns() + kReplyTimeoutNs;
		protocol::Hello hello = protocol::make_hello(protocol::PeerRole::classes, 0, "");
		hello.class_index = c;
		auto answer = rendezvous::ask_owner(pool_.path, hello, deadline, which, protocol::kMaxFds);
		if (!answer)
			return answer.error();
		// A dynamic class of device memory: its slots' memory comes slot by slot (map_slot).
		bool sparse = (seg.header->dynamic_classes.load(std::memory_order_acquire) >> c) & 1;
		size_t want = arena_fd_count(Storage(record->storage), record->count, sparse);
		if (answer->fds.size() != std::min(want, protocol::kMaxFds))
			return make_error(Errc::not_a_pool,
					  which + ": owner sent " + std::to_string(answer->fds.size()) +
						  " file descriptors, expected " + std::to_string(want));
		std::vector<UniqueFd> fds = std::move(answer->fds);
		if (auto received = rendezvous::receive_arena_fds(answer->conn.get(), fds, want, deadline, which);
		    !received)
			return received.error();
		ArenaSpec spec{ pool_.name,    memory->storage,	  memory->device,
				record->count, record->slot_size, seg.constants().mode };
		spec.sparse = sparse;
		auto arena = import_arena(spec, record->slot_stride, std::move(fds), which);
		if (!arena)
			return arena.error();
		auto sync = device_ordering(*record, **arena);
		if (!sync)
			return make_error(sync.code(), which + ": " + sync.error().message);
		pool_.class_arenas.push_back(std::move(arena.value()));
		pool_.add_class(c, *record, pool_.class_arenas.back().get(), *sync);
	}
	return {};
}

Result<void> Subscriber::map_slot(uint32_t index)
{
	auto c = pool_.class_of(index);
	if (!c)
		return make_error(Errc::bad_frame,
				  pool_.where() + ": slot " + std::to_string(index) + " is in no class");
	const PoolImpl::SlotClass &cls = pool_.classes[*c];
	const std::string which = pool_.where() + ": slot " + std::to_string(index) + "'s device memory";
	std::lock_guard lock(slot_maps_lock);
	// The record's generation is a hint (another process may write it): mapped already
	// when it is the one mapped here; otherwise the owner says what the slot's memory is.
	uint32_t hint = seg.slots[index].memory_gen.load(std::memory_order_acquire);
	if (hint != 0 && hint == mapped_gen[index])
		return {};
	protocol::Hello hello = protocol::make_hello(protocol::PeerRole::slot, 0, "");
	hello.slot_index = index;
	auto answer = rendezvous::ask_owner(pool_.path, hello, monotonic_ns() + kReplyTimeoutNs, which, 1);
	if (!answer)
		return answer.error();
	const protocol::Welcome &welcome = answer->welcome;
	if (answer->fds.size() != 1 || welcome.data_size != cls.slot_stride || welcome.memory_gen == 0 ||
	    welcome.memory_gen > UINT32_MAX)
		return make_error(Errc::not_a_pool,
				  which + ": the owner sent " + std::to_string(answer->fds.size()) +
					  " file descriptors for " + std::to_string(welcome.data_size) +
					  " bytes of generation " + std::to_string(welcome.memory_gen) +
					  ", expected one for " + std::to_string(cls.slot_stride) + " bytes");
	// The memory mapped here already (the record lied): kept, the fd closed.
	if (mapped_gen[index] == welcome.memory_gen)
		return {};
	uint64_t offset = uint64_t{ index - cls.first_slot } * cls.slot_stride;
	mapped_gen[index] = 0;
	if (auto mapped = const_cast<Arena *>(cls.arena)->map_slot(offset, std::move(answer->fds[0])); !mapped)
		return make_error(mapped.code(), which + ": " + mapped.error().message);
	mapped_gen[index] = uint32_t(welcome.memory_gen);
	return {};
}

void Subscriber::unmap_trimmed()
{
	if (seg.header->device_memory_cap == 0)
		return;
	uint64_t trimmed = seg.header->trimmed.load(std::memory_order_acquire);
	if (trimmed == trims_seen.load(std::memory_order_relaxed))
		return;
	std::lock_guard lock(slot_maps_lock);
	trims_seen.store(trimmed, std::memory_order_relaxed);
	for (uint32_t i = 0; i < mapped_gen.size(); i++) {
		if (mapped_gen[i] == 0 || seg.slots[i].memory_gen.load(std::memory_order_acquire) == mapped_gen[i])
			continue;
		{
			// A slot held here keeps its memory, whatever its record says.
			std::lock_guard refs(pool_.refs_lock);
			if (pool_.local_refs[i] != 0)
				continue;
		}
		auto c = pool_.class_of(i);
		if (!c)
			continue;
		const PoolImpl::SlotClass &cls = pool_.classes[*c];
		const_cast<Arena *>(cls.arena)->unmap_slot(uint64_t{ i - cls.first_slot } * cls.slot_stride);
		mapped_gen[i] = 0;
	}
}

} // namespace xmem
