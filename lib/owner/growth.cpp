// owner/growth.cpp - size classes as the owner adds them, slots made on demand within
// the memory caps, and the trims that give idle slots' memory back.
#include "growth.hpp"

#include "config.hpp"
#include "io_poll.hpp"
#include "slot_claim.hpp"

#include "../identity.hpp"
#include "../protocol.hpp"
#include "../rendezvous.hpp"

#include <algorithm>
#include <bit>
#include <cstring>

namespace xmem::owner {

using namespace layout;

namespace {

// Growth on demand: the records a dynamic class reserves (its slots' memory is committed
// one at a time), how long a free dynamic slot keeps its memory unless PoolConfig::trim_idle
// says otherwise, and the system page.
constexpr uint32_t kDynamicClassSlots = 8;
constexpr uint64_t kDefaultTrimIdleNs = 10'000'000'000;
constexpr uint64_t kPage = 4096;

// The slot size of the dynamic class that holds SIZE bytes: whole pages, and above 16 KiB
// a quarter step of a power of two (2^k, 1.25 * 2^k, 1.5 * 2^k, 1.75 * 2^k), so a stream
// of sizes makes few classes and a slot wastes under a quarter of itself.
uint64_t dynamic_slot_size(uint64_t size)
{
	uint64_t pages = round_up(std::max<uint64_t>(size, 1), kPage);
	if (pages <= 4 * kPage)
		return pages;
	return round_up(pages, std::bit_floor(pages) / 4);
}

} // namespace

Growth::Growth(PoolImpl &pool, const std::atomic<bool> &shut) : pool_(pool), seg(pool.seg), shut(shut)
{
}

Result<void> Growth::start(const PoolConfig &config)
{
	// The owner's own copies; the header's are for peers to read.
	memory_cap = config.memory_cap;
	device_memory_cap = config.device_memory_cap;
	trim_idle_ns = config.trim_idle.count() ? uint64_t(config.trim_idle.count()) * 1'000'000 : kDefaultTrimIdleNs;
	if (grows()) {
		last_used = std::make_unique<std::atomic<uint64_t>[]>(seg.slot_count);
		committed_ = std::make_unique<std::atomic<bool>[]>(seg.slot_count);
		memory_gen = std::make_unique<uint32_t[]>(seg.slot_count);
		for (uint32_t i = 0; i < seg.constants().first_class_slots; i++)
			committed_[i].store(true, std::memory_order_relaxed);
		seg.header->memory_cap = memory_cap;
		seg.header->device_memory_cap = device_memory_cap;
		seg.header->trim_idle_ns = trim_idle_ns;
		trim_timer = monotonic_timer();
		if (!trim_timer.valid())
			return errno_error(pool_.where() + ": timerfd");
	}
	std::lock_guard lock(growth_lock);
	count_bytes(pool_.classes[0], int64_t(seg.constants().data_size));
	return {};
}

Result<uint32_t> Growth::preallocate(uint64_t slot_size, uint32_t count, Storage storage, uint32_t device)
{
	std::lock_guard growing(growth_lock);
	return add_class(slot_size, count, storage, device, false);
}

Result<uint32_t> Growth::add_class(uint64_t slot_size, uint32_t count, Storage storage, uint32_t device, bool dynamic)
{
	const std::string where = pool_.where() + (dynamic ? ": growth" : ": preallocate");
	if (count < 1)
		return make_error(Errc::invalid_argument, where + ": a class has at least one slot");
	if (slot_size == 0 || slot_size > kMaxSlotSize)
		return make_error(Errc::invalid_argument, where + ": slot size " + std::to_string(slot_size) +
								  " out of range 1.." + std::to_string(kMaxSlotSize));
	if (auto known = check_memory(where, storage, device); !known)
		return known.error();
	const Memory memory{ storage, device };
	const ClassRecord &first = seg.classes[0];
	// The spill tier's copies (and a device pool's DeviceSpill) are of the first memory.
	if (memory != Memory{ Storage(first.storage), first.device } && pool_.spill)
		return make_error(Errc::invalid_argument, where + ": a pool with a spill tier holds one memory, its "
								  "first class's");
	if (shut.load(std::memory_order_acquire))
		return make_error(Errc::closed, pool_.where() + " is closed");

	std::lock_guard lock(pool_.classes_lock);
	uint32_t n = pool_.classes_known.load(std::memory_order_relaxed);
	// Device memory: its device found by UUID in other processes, and its GPU work ordered
	// by the DeviceSync of that device's first class here (each device's own, sharing the
	// control segment's one registration: cuda/ordering.cpp).
	auto identity = memory_identity(memory, where);
	if (!identity)
		return identity.error();
	const DeviceUuid &uuid = identity->uuid;
	DeviceSync *sync = nullptr;
	for (uint32_t c = 0; c < n && !sync; c++)
		if (pool_.classes[c].sync && std::memcmp(seg.classes[c].device_uuid, uuid.data(), uuid.size()) == 0)
			sync = pool_.classes[c].sync;
	if (n == kMaxClasses)
		return make_error(Errc::full, where + ": the pool has its maximum of " + std::to_string(kMaxClasses) +
						      " size classes");
	const PoolImpl::SlotClass &last = pool_.classes[n - 1];
	uint32_t first_slot = last.first_slot + last.count;
	uint32_t room = seg.slot_count - first_slot;
	if (count > room)
		return make_error(Errc::full, where + ": room for " + std::to_string(room) + " more slots of the " +
						      std::to_string(seg.slot_count) +
						      " the pool was created with (PoolConfig::max_slots)");
	ArenaSpec spec{ pool_.name, storage, device, count, slot_size, seg.constants().mode };
	spec.sparse = dynamic;
	auto made = create_arena(spec);
	if (!made)
		return make_error(made.code(), where + ": " + made.error().message);
	std::unique_ptr<Arena> arena = std::move(made.value());
	if (!sync) {
		// The pool's first class of this device's memory: its GPU ordering (none for
		// system memory), chosen as create() chooses a device pool's.
		auto ordering = pool_.add_sync(*arena, ordering_wanted(memory) == kSyncStreamMemOps);
		if (!ordering)
			return make_error(ordering.code(), where + ": " + ordering.error().message);
		sync = *ordering;
	}

	ClassRecord record{};
	record.storage = uint32_t(storage);
	record.device = device; // 0 for system memory (check_memory)
	std::memcpy(record.device_uuid, uuid.data(), sizeof(record.device_uuid));
	record.device_kind = identity->mig ? kDeviceMig : kDeviceGpu;
	record.sync_mode = sync ? sync->mode() : kSyncNone;
	record.first_slot = first_slot;
	record.count = count;
	record.slot_size = slot_size;
	record.slot_stride = arena->slot_stride();
	record.data_size = record.slot_stride * count;
	seg.classes[n] = record;
	for (uint32_t i = first_slot; i < first_slot + count; i++) {
		// A record no process holds (UNUSED is never held): its words are reset, then
		// it becomes free once the class is counted.
		SlotRecord &slot = seg.slots[i];
		for (auto &word : slot.holders)
			word.store(0, std::memory_order_relaxed);
		slot.index = i;
		slot.offset = uint64_t{ i - first_slot } * record.slot_stride;
		slot.meta = FrameMeta{};
		slot.ticket_check.store(0, std::memory_order_relaxed);
		slot.ticket_left.store(0, std::memory_order_relaxed);
		// A dynamic class's slots stay UNUSED until grow() commits their memory.
		slot.state.store(dynamic ? kSlotUnused : kSlotFree, std::memory_order_release);
	}
	pool_.class_arenas.push_back(std::move(arena));
	pool_.add_class(n, record, pool_.class_arenas.back().get(), sync);
	if (dynamic) {
		dynamic_mask |= uint32_t{ 1 } << n;
		seg.header->dynamic_classes.store(dynamic_mask, std::memory_order_release);
	} else {
		count_bytes(pool_.classes[n], int64_t(record.data_size));
		if (committed_)
			for (uint32_t i = first_slot; i < first_slot + count; i++)
				committed_[i].store(true, std::memory_order_release);
	}
	seg.header->classes.store(n + 1, std::memory_order_release);
	// An acquire() waiting for a slot may take one of these.
	seg.header->progress.fetch_add(1, std::memory_order_seq_cst);
	futex_wake_all(&seg.header->progress);
	return n;
}

void Growth::count_bytes(const PoolImpl::SlotClass &cls, int64_t bytes)
{
	if (!on_device(cls.arena->storage())) {
		system_committed += uint64_t(bytes);
		seg.header->system_bytes.store(system_committed, std::memory_order_relaxed);
		return;
	}
	device_committed[cls.arena->device()] += uint64_t(bytes);
	seg.header->device_bytes.fetch_add(uint64_t(bytes), std::memory_order_relaxed);
}

uint64_t Growth::committed_bytes(Memory memory) const
{
	if (!on_device(memory.storage))
		return system_committed;
	auto it = device_committed.find(memory.device);
	return it == device_committed.end() ? 0 : it->second;
}

std::string Growth::full_reason(Memory memory)
{
	std::lock_guard lock(growth_lock);
	return std::to_string(committed_bytes(memory)) + " of " + std::to_string(cap_of(memory)) + " bytes in use, " +
	       std::to_string(seg.header->dynamic_slots.load(std::memory_order_relaxed)) + " slots made on demand";
}

std::optional<uint32_t> Growth::grow(uint64_t size, Memory memory)
{
	uint64_t slot_size = dynamic_slot_size(size);
	std::lock_guard lock(growth_lock);
	if (shut.load(std::memory_order_acquire))
		return std::nullopt;
	uint64_t cap = cap_of(memory);
	// A record of a dynamic class of that size and memory whose memory is not committed;
	// or a new dynamic class's first record.
	auto spare = [&]() -> std::optional<uint32_t> {
		uint32_t dynamic = dynamic_mask;
		uint32_t n = pool_.classes_known.load(std::memory_order_acquire);
		for (uint32_t c = 0; c < n; c++) {
			const PoolImpl::SlotClass &cls = pool_.classes[c];
			if (!((dynamic >> c) & 1) || cls.slot_size != slot_size || !memory.holds(*cls.arena))
				continue;
			for (uint32_t i = cls.first_slot; i < cls.first_slot + cls.count; i++)
				if (!committed_[i].load(std::memory_order_relaxed))
					return i;
		}
		return std::nullopt;
	};
	auto refused = [&] {
		seg.header->growth_refused.fetch_add(1, std::memory_order_relaxed);
		return std::nullopt;
	};
	// A slot the cap could never hold makes no class.
	if (slot_size > cap)
		return refused();
	std::optional<uint32_t> index = spare();
	if (!index) {
		// Records for no more slots than the cap could hold at once.
		uint32_t room = seg.slot_count - pool_.slots_end();
		uint32_t count = uint32_t(std::min<uint64_t>({ kDynamicClassSlots, room, cap / slot_size }));
		if (count == 0)
			return refused();
		auto made = add_class(slot_size, count, memory.storage, memory.device, true);
		if (!made)
			return refused();
		index = pool_.classes[*made].first_slot;
	}
	uint32_t i = *index;
	const PoolImpl::SlotClass &cls = pool_.classes[*pool_.class_of(i)];
	// A device slot's memory is whole allocations of the device's granularity: one the cap
	// could never hold is refused as above.
	if (cls.slot_stride > cap)
		return refused();
	// Room under the cap: the free dynamic slots of this memory used least recently give
	// theirs back.
	while (committed_bytes(memory) + cls.slot_stride > cap)
		if (!trim_one(UINT64_MAX, memory))
			return refused();
	SlotRecord &slot = seg.slots[i];
	// The offset as the class lays it out: the record's copy is another process's to write.
	uint64_t offset = uint64_t{ i - cls.first_slot } * cls.slot_stride;
	if (!const_cast<Arena *>(cls.arena)->commit(offset, cls.slot_stride))
		return refused();
	if (cls.arena->maps_per_slot()) {
		// New memory: consumers that mapped the slot's earlier memory map this one.
		memory_gen[i] = ++memory_gens ? memory_gens : ++memory_gens;
		slot.memory_gen.store(memory_gen[i], std::memory_order_relaxed);
	}
	committed_[i].store(true, std::memory_order_release);
	count_bytes(cls, int64_t(cls.slot_stride));
	seg.header->dynamic_slots.fetch_add(1, std::memory_order_relaxed);
	seg.header->dynamic_bytes.fetch_add(cls.slot_stride, std::memory_order_relaxed);
	seg.header->grown.fetch_add(1, std::memory_order_relaxed);
	// Its last use is stamped by claim(), which the caller makes next.
	arm_trim_timer(monotonic_ns() + trim_idle_ns);
	// Only this owner moves a record out of UNUSED; consumers read nothing in it.
	slot.state.store(kSlotWriting, std::memory_order_seq_cst);
	return i;
}

template<typename Visit>
void Growth::for_each_dynamic_slot(Visit visit)
{
	uint32_t n = pool_.classes_known.load(std::memory_order_acquire);
	for (uint32_t c = 0; c < n; c++) {
		if (!((dynamic_mask >> c) & 1))
			continue;
		const PoolImpl::SlotClass &cls = pool_.classes[c];
		for (uint32_t i = cls.first_slot; i < cls.first_slot + cls.count; i++)
			if (committed_[i].load(std::memory_order_relaxed))
				visit(i, last_used[i].load(std::memory_order_relaxed));
	}
}

bool Growth::trim_one(uint64_t used_before, std::optional<Memory> memory)
{
	// The free dynamic slots last used before USED_BEFORE, least recently used first.
	std::vector<std::pair<uint64_t, uint32_t>> idle;
	for_each_dynamic_slot([&](uint32_t i, uint64_t used) {
		if (used < used_before && slot_is_free(seg.slots[i]) &&
		    (!memory || memory->holds(*pool_.classes[*pool_.class_of(i)].arena)))
			idle.emplace_back(used, i);
	});
	std::sort(idle.begin(), idle.end());
	for (auto [used, i] : idle) {
		// WRITING, as for an acquire: a consumer's get() that set its bit meanwhile sees
		// it and backs off, and no acquire takes the slot.
		if (!try_reclaim(seg.slots[i], kSlotWriting))
			continue;
		const PoolImpl::SlotClass &cls = pool_.classes[*pool_.class_of(i)];
		SlotRecord &slot = seg.slots[i];
		// A device slot's last frame: its writes and every consumer's reads are over (its
		// ready and done words, looked at without waiting), or it keeps its memory.
		bool idle_now = !cls.sync || cls.sync->wait_done(i, slot.meta.seq, nullptr, 0).ok();
		uint64_t offset = uint64_t{ i - cls.first_slot } * cls.slot_stride;
		if (!idle_now || !const_cast<Arena *>(cls.arena)->decommit(offset, cls.slot_stride)) {
			slot.state.store(kSlotFree, std::memory_order_seq_cst);
			continue;
		}
		slot.meta = FrameMeta{};
		slot.side_data_size = 0;
		slot.ticket_check.store(0, std::memory_order_relaxed);
		slot.ticket_left.store(0, std::memory_order_relaxed);
		// No memory: consumers that mapped the slot's let it go (Subscriber::unmap_trimmed).
		if (cls.arena->maps_per_slot()) {
			memory_gen[i] = 0;
			slot.memory_gen.store(0, std::memory_order_relaxed);
		}
		committed_[i].store(false, std::memory_order_release);
		slot.state.store(kSlotUnused, std::memory_order_seq_cst);
		count_bytes(cls, -int64_t(cls.slot_stride));
		seg.header->dynamic_slots.fetch_sub(1, std::memory_order_relaxed);
		seg.header->dynamic_bytes.fetch_sub(cls.slot_stride, std::memory_order_relaxed);
		seg.header->trimmed.fetch_add(1, std::memory_order_relaxed);
		return true;
	}
	return false;
}

void Growth::trim_idle()
{
	std::lock_guard lock(growth_lock);
	uint64_t now = monotonic_ns();
	while (trim_one(now - std::min(now, trim_idle_ns))) {
	}
	// Next: when the dynamic slot used least recently of those left has been idle long
	// enough (one still held: a trim_idle_ns from now).
	uint64_t next = UINT64_MAX;
	for_each_dynamic_slot([&](uint32_t, uint64_t used) {
		next = std::min(next, std::max(used + trim_idle_ns, now + trim_idle_ns / 4));
	});
	trim_timer_ns = UINT64_MAX; // it fired
	arm_trim_timer(next);
}

void Growth::arm_trim_timer(uint64_t at_ns)
{
	if (at_ns < trim_timer_ns)
		arm_timer(trim_timer, at_ns, trim_timer_ns);
}

void Growth::send_slot(int conn, uint32_t index)
{
	int fd = -1;
	uint64_t stride = 0;
	uint32_t gen = 0;
	std::string refused;
	{
		// Under growth_lock: no trim or commit of the slot meanwhile, so the fd is the
		// memory of generation GEN until the Welcome is sent.
		std::lock_guard lock(growth_lock);
		auto c = index < seg.slot_count ? pool_.class_of(index) : std::nullopt;
		const PoolImpl::SlotClass *cls = c ? &pool_.classes[*c] : nullptr;
		if (!cls || !cls->arena->maps_per_slot())
			refused = "slot " + std::to_string(index) + " is no dynamic slot of device memory";
		else if (!committed_[index].load(std::memory_order_relaxed))
			refused = "slot " + std::to_string(index) + " has no memory now";
		else if (auto got = cls->arena->slot_fd(uint64_t{ index - cls->first_slot } * cls->slot_stride))
			fd = *got, stride = cls->slot_stride, gen = memory_gen[index];
		else
			refused = got.error().message;
		if (fd >= 0) {
			protocol::Welcome w =
				protocol::make_welcome(protocol::kNoConsumer, seg.bytes().size(), stride, 0, "");
			w.memory_gen = gen;
			(void)rendezvous::send_welcome(conn, w, -1, { fd });
			return;
		}
	}
	protocol::Reject r = protocol::make_reject(XMEM_EINVAL, refused);
	(void)rendezvous::send_message(conn, &r, sizeof(r), nullptr, 0);
}

} // namespace xmem::owner
