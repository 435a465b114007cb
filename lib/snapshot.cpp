// snapshot.cpp - xmem::snapshot(): reads a pool's control segment, as another process
// may be writing it, into plain values for xmem-inspect and tests.
#include <xmem/snapshot.hpp>

#include "device_sync.hpp"
#include "layout.hpp"
#include "system.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <span>
#include <sstream>
#include <thread>

#include <dirent.h>
#include <sys/stat.h>

namespace xmem {

namespace {

// The public state enums name the layout's values.
static_assert(uint32_t(SlotState::free) == layout::kSlotFree);
static_assert(uint32_t(SlotState::writing) == layout::kSlotWriting);
static_assert(uint32_t(SlotState::published) == layout::kSlotPublished);
static_assert(uint32_t(SlotState::exclusive) == layout::kSlotExclusive);
static_assert(uint32_t(SlotState::reclaiming) == layout::kSlotReclaiming);
static_assert(uint32_t(SlotState::unused) == layout::kSlotUnused);
static_assert(uint32_t(ConsumerState::free) == layout::kConsumerFree);
static_assert(uint32_t(ConsumerState::active) == layout::kConsumerActive);
static_assert(uint32_t(ConsumerState::dead) == layout::kConsumerDead);
static_assert(uint32_t(ConsumerState::quarantined) == layout::kConsumerQuarantined);
static_assert(uint32_t(PoolState::open) == layout::kPoolOpen);
static_assert(uint32_t(PoolState::closed) == layout::kPoolClosed);

// How long a format read waits out an owner that is rewriting it.
constexpr uint64_t kFormatSettleNs = 200'000'000;

// A fixed-size char field of the segment as a string: never past the field, even
// when the writer left out the NUL.
template<size_t N>
std::string field_string(const char (&field)[N])
{
	char copy[N];
	std::memcpy(copy, field, N);
	return std::string(copy, strnlen(copy, N));
}

// The format string and its sequence number through the seqlock: retried while the
// owner is rewriting them (odd) or rewrote them during the copy. Nothing when it never
// settles: an owner that died or stopped mid-write leaves the lock odd forever.
std::optional<FormatSnapshot> read_format(const layout::ControlHeader &h)
{
	char copy[XMEM_FORMAT_MAX];
	uint64_t deadline = monotonic_ns() + kFormatSettleNs;
	do {
		uint64_t before = h.format_lock.load(std::memory_order_acquire);
		if (before % 2 == 0) {
			// Racy by design: the sequence check below throws away a torn copy.
			std::memcpy(copy, h.format, sizeof(copy));
			uint64_t seq = h.format_seq.load(std::memory_order_relaxed);
			std::atomic_thread_fence(std::memory_order_acquire);
			if (h.format_lock.load(std::memory_order_relaxed) == before)
				return FormatSnapshot{ std::string(copy, strnlen(copy, sizeof(copy))), seq };
		}
		std::this_thread::yield();
	} while (monotonic_ns() < deadline);
	return std::nullopt;
}

// The header constants, read once: every bound below uses the same numbers.
HeaderSnapshot read_header(const layout::ControlConstants &k)
{
	HeaderSnapshot h{};
	h.magic = k.magic;
	h.magic_valid = k.magic == layout::kMagic;
	h.abi_version = k.abi_version;
	h.header_size = k.header_size;
	h.slot_record_size = k.slot_record_size;
	h.consumer_record_size = k.consumer_record_size;
	h.slot_count = k.slot_count;
	h.max_consumers = k.max_consumers;
	h.ring_capacity = k.ring_capacity;
	h.control_size = k.control_size;
	h.slot_size = k.slot_size;
	h.slot_stride = k.slot_stride;
	h.data_size = k.data_size;
	h.storage_type = k.storage_type;
	h.device_id = k.device_id;
	DeviceUuid uuid;
	std::memcpy(uuid.data(), k.device_uuid, uuid.size());
	if (uuid != DeviceUuid{})
		h.device_uuid = format_device_uuid(uuid, k.device_kind == layout::kDeviceMig);
	h.sync_mode = k.sync_mode;
	h.sync_record_size = k.sync_record_size;
	h.sync_offset = k.sync_offset;
	h.policy = k.policy;
	h.mode = k.mode;
	h.owner_pid = k.owner_pid;
	h.owner_uid = k.owner_uid;
	h.owner_pid_ns = k.owner_pid_ns;
	h.block_timeout_ns = k.block_timeout_ns;
	h.created_ns = k.created_ns;
	h.producer = field_string(k.producer);
	h.spill_frames = k.spill_frames;
	h.spill_bytes = k.spill_bytes;
	return h;
}

// The consumer records of SEGMENT that can be read safely, as the header describes
// them, or none (with a warning) when the header's numbers do not make sense.
struct ConsumerRecords {
	std::span<const std::byte> segment;
	uint64_t base = 0;
	uint64_t record_size = 0;
	uint32_t count = 0;

	const layout::ConsumerRecord &operator[](uint32_t i) const
	{
		// Computed as PoolImpl::consumer() does.
		return *reinterpret_cast<const layout::ConsumerRecord *>(segment.data() + base +
									 uint64_t{ i } * record_size);
	}
};

ConsumerRecords find_consumer_records(std::span<const std::byte> segment, uint32_t slot_count, const HeaderSnapshot &h,
				      std::vector<std::string> &warnings)
{
	ConsumerRecords records{ segment, layout::consumers_offset(slot_count), h.consumer_record_size, 0 };
	uint32_t max_consumers = std::min<uint32_t>(h.max_consumers, XMEM_MAX_CONSUMERS);
	if (h.ring_capacity > XMEM_MAX_SLOTS + layout::kMaxSpillFrames + 1 || records.record_size % 64 != 0 ||
	    records.record_size < layout::consumer_record_size(h.ring_capacity)) {
		warnings.push_back("consumer record size " + std::to_string(records.record_size) +
				   " does not fit a ring of " + std::to_string(h.ring_capacity) +
				   " entries: consumers not shown");
		return records;
	}
	uint64_t fit = records.base < segment.size() ? (segment.size() - records.base) / records.record_size : 0;
	if (fit < max_consumers) {
		warnings.push_back("only " + std::to_string(fit) + " of " + std::to_string(max_consumers) +
				   " consumer records fit in the mapping");
		max_consumers = uint32_t(fit);
	}
	records.count = max_consumers;
	return records;
}

SlotSnapshot read_slot(const layout::SlotRecord &slot, uint32_t index, std::optional<uint32_t> owner_pid,
		       const std::vector<std::optional<uint32_t>> &consumer_pids)
{
	SlotSnapshot s{};
	s.index = index;
	uint32_t state = slot.state.load(std::memory_order_acquire);
	s.state = SlotState(state);
	// One load of each word, so the holders listed and the free flag agree.
	uint64_t words[layout::kHolderWords];
	uint64_t any = 0;
	for (uint32_t w = 0; w < layout::kHolderWords; w++) {
		words[w] = slot.holders[w].load(std::memory_order_seq_cst);
		any |= words[w];
	}
	for (uint32_t bit = 0; bit < layout::kHolderWords * 64; bit++) {
		if (!(words[bit / 64] & layout::holder_mask(bit)))
			continue;
		HolderSnapshot holder{ bit, std::nullopt };
		if (bit == layout::kOwnerBit)
			holder.pid = owner_pid;
		else if (bit - 1 < consumer_pids.size())
			holder.pid = consumer_pids[bit - 1];
		s.holders.push_back(holder);
	}
	s.seq = slot.meta.seq;
	s.side_data_size = *static_cast<const volatile uint32_t *>(&slot.side_data_size);
	s.ticket_left = slot.ticket_check.load(std::memory_order_relaxed)
				? slot.ticket_left.load(std::memory_order_relaxed)
				: 0;
	s.free = layout::slot_is_free(state, any);
	return s;
}

ConsumerSnapshot read_consumer(const layout::ConsumerRecord &rec, uint32_t index, uint32_t state,
			       uint32_t ring_capacity, std::span<const layout::SlotRecord> slots)
{
	ConsumerSnapshot c{};
	c.index = index;
	c.state = ConsumerState(state);
	c.pid = rec.pid;
	c.uid = rec.uid;
	c.gid = rec.gid;
	c.own_pid = rec.own_pid;
	c.pid_ns = rec.pid_ns;
	c.client = field_string(rec.client);
	// Head first: it never passes tail, so tail read after it is not behind it.
	c.head = rec.head.load(std::memory_order_acquire);
	c.tail = rec.tail.load(std::memory_order_acquire);
	if (c.tail - c.head <= ring_capacity) {
		c.queued = c.tail - c.head;
		// ring_of() takes a mutable record; the entries are only loaded here.
		const std::atomic<uint64_t> *ring = layout::ring_of(const_cast<layout::ConsumerRecord *>(&rec));
		for (uint64_t k = c.head; k != c.tail; k++) {
			uint64_t e = ring[k % ring_capacity].load(std::memory_order_acquire);
			uint32_t what = uint32_t(e);
			QueueEntrySnapshot q{};
			q.end_of_stream = what == layout::kEosEntry;
			q.taken = what == layout::kTakenEntry || what == layout::kSkipEntry;
			q.spilled = !q.end_of_stream && !q.taken && (what & layout::kSpillEntry);
			q.slot = q.spilled ? what & ~layout::kSpillEntry : what;
			if (!q.spilled && q.slot < slots.size())
				q.seq = slots[q.slot].meta.seq;
			c.queue.push_back(q);
		}
	}
	c.received = rec.received.load(std::memory_order_relaxed);
	c.dropped = rec.dropped.load(std::memory_order_relaxed);
	c.queued_total = rec.queued_total.load(std::memory_order_relaxed);
	c.queue_size = rec.queue_size;
	c.sync_mode = rec.sync_mode;
	c.policy = rec.policy;
	c.fallback = rec.fallback;
	c.block_timeout_ns = rec.block_timeout_ns;
	c.spilled = rec.spilled.load(std::memory_order_relaxed);
	c.max_held = rec.max_held;
	c.history = rec.history;
	return c;
}

// The process that PID_NS numbers OWN_PID, as this process numbers it: a walk of /proc
// for a process in that namespace whose innermost pid (the last of its status's NSpid)
// is OWN_PID. Found only where PID_NS is this process's namespace or a descendant.
std::optional<uint32_t> find_in_namespace(uint32_t own_pid, uint64_t pid_ns)
{
	DIR *proc = ::opendir("/proc");
	if (!proc)
		return std::nullopt;
	std::optional<uint32_t> found;
	// readdir() is only unsafe on a DIR shared between threads; this one is not.
	while (dirent *e = ::readdir(proc)) { // NOLINT(concurrency-mt-unsafe)
		char *end = nullptr;
		unsigned long pid = std::strtoul(e->d_name, &end, 10);
		if (!end || *end != '\0' || pid == 0 || pid > UINT32_MAX)
			continue;
		std::string dir = std::string("/proc/") + e->d_name;
		struct stat st;
		if (::stat((dir + "/ns/pid").c_str(), &st) < 0 || st.st_ino != pid_ns)
			continue;
		std::ifstream status(dir + "/status");
		std::string line;
		while (std::getline(status, line)) {
			if (line.rfind("NSpid:", 0) != 0)
				continue;
			std::istringstream fields(line.substr(6));
			uint64_t inner = 0;
			for (uint64_t v; fields >> v;)
				inner = v;
			if (inner == own_pid)
				found = uint32_t(pid);
			break;
		}
		if (found)
			break;
	}
	::closedir(proc);
	return found;
}

// A consumer's pid as this process (in namespace HERE) numbers it, from what the owner
// saw and what the consumer reported.
std::optional<uint32_t> consumer_pid_here(const ConsumerSnapshot &c, uint64_t owner_ns, uint64_t here)
{
	if (here && c.pid_ns == here && c.own_pid)
		return c.own_pid;
	if (c.pid && ((here && owner_ns == here) || (!owner_ns && !c.pid_ns)))
		return c.pid; // the owner's view is this process's (or nothing better is known)
	if (here && c.pid_ns && c.own_pid)
		return find_in_namespace(c.own_pid, c.pid_ns);
	return std::nullopt;
}

} // namespace

Result<PoolSnapshot> snapshot(const BufferPool &pool)
{
	std::span<const std::byte> segment = pool.control_segment();
	if (segment.size() < layout::slots_offset())
		return Error{ Errc::bad_segment, "pool '" + pool.name() + "': control segment too small" };
	const auto &h = *reinterpret_cast<const layout::ControlHeader *>(segment.data());

	PoolSnapshot v;
	v.name = pool.name();
	v.path = pool.path();
	v.header = read_header(h);
	v.pid_ns_here = pid_namespace_here();
	if (uint32_t pid = pool.owner_pid())
		v.owner_pid_here = pid;
	else if (v.pid_ns_here && v.header.owner_pid_ns == v.pid_ns_here)
		v.owner_pid_here = v.header.owner_pid;

	// The layout follows the slot count validated at attach, not a re-read of the
	// header, exactly as the library's own handle does.
	uint32_t slot_count = pool.slot_records();
	if (v.header.slot_count != slot_count)
		v.warnings.push_back("header slot count " + std::to_string(v.header.slot_count) + " differs from " +
				     std::to_string(slot_count) + " at attach");
	uint64_t slots_fit = (segment.size() - layout::slots_offset()) / sizeof(layout::SlotRecord);
	uint32_t slots_shown = uint32_t(std::min<uint64_t>(slot_count, slots_fit));
	ConsumerRecords consumers = find_consumer_records(segment, slot_count, v.header, v.warnings);

	v.state = PoolState(h.state.load(std::memory_order_acquire));
	v.format = read_format(h);
	v.published = h.published.load(std::memory_order_relaxed);
	v.dropped = h.dropped.load(std::memory_order_relaxed);
	v.reaped = h.reaped.load(std::memory_order_relaxed);
	v.spill = pool.spill_stats();
	v.tickets = pool.ticket_stats();
	v.growth = pool.growth_stats();
	const auto *slots = reinterpret_cast<const layout::SlotRecord *>(segment.data() + layout::slots_offset());

	// Each consumer's pid as this process numbers it, for its holder bits too (none for
	// a free record's: a bit may outlive its consumer for a moment).
	std::vector<std::optional<uint32_t>> consumer_pids(consumers.count);
	for (uint32_t i = 0; i < consumers.count; i++) {
		uint32_t state = consumers[i].state.load(std::memory_order_acquire);
		if (state == layout::kConsumerFree)
			continue;
		ConsumerSnapshot c =
			read_consumer(consumers[i], i, state, v.header.ring_capacity, std::span(slots, slots_shown));
		c.pid_here = consumer_pid_here(c, v.header.owner_pid_ns, v.pid_ns_here);
		consumer_pids[i] = c.pid_here;
		if (state == layout::kConsumerActive)
			v.consumers_attached++;
		v.consumers.push_back(std::move(c));
	}

	// The records of the classes the table names, each once and in order, bounded by
	// what the mapping holds (a scribbled table may overlap or leave gaps).
	v.classes = pool.classes();
	for (uint32_t i = 0; i < slots_shown; i++) {
		auto in = std::find_if(v.classes.begin(), v.classes.end(),
				       [i](const SizeClass &c) { return i - c.first_slot < c.count; });
		if (in == v.classes.end())
			continue;
		v.slots.push_back(read_slot(slots[i], i, v.owner_pid_here, consumer_pids));
		v.slots.back().size_class = in->index;
		if (v.slots.back().free)
			v.slots_free++;
		for (const HolderSnapshot &holder : v.slots.back().holders)
			for (ConsumerSnapshot &c : v.consumers)
				if (holder.bit == 1 + c.index)
					c.held++;
	}
	return v;
}

} // namespace xmem
