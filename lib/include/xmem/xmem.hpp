// xmem.hpp - the C++ API of libxmem: named pools of preallocated, reference-counted
// frames in shared memory, published by one owner and received by many consumers.
#pragma once

#include <xmem/xmem.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace xmem {

// Error codes are xmem_status values, so the C API passes them through unchanged.
enum class Errc : int {
	ok = XMEM_OK,
	invalid_argument = XMEM_EINVAL,
	bad_name = XMEM_ENAME,
	not_found = XMEM_ENOENT,
	permission_denied = XMEM_EACCES,
	owner_alive = XMEM_EBUSY,
	not_a_pool = XMEM_ENOTPOOL,
	version_mismatch = XMEM_EVERSION,
	bad_segment = XMEM_EBADSEG,
	out_of_range = XMEM_ERANGE,
	timed_out = XMEM_ETIMEDOUT,
	closed = XMEM_ECLOSED,
	end_of_stream = XMEM_EEOS,
	full = XMEM_EFULL,
	not_held = XMEM_ENOTHELD,
	read_only = XMEM_EREADONLY,
	wrong_role = XMEM_EROLE,
	system = XMEM_ESYSTEM,
	no_memory = XMEM_ENOMEM,
	bad_frame = XMEM_EBADFRAME,
	bad_ticket = XMEM_EBADTICKET,
};

struct Error {
	Errc code = Errc::ok;
	std::string message;
};

// A value or an Error; the core never throws across its API.
template<typename T>
class [[nodiscard]] Result
{
public:
	Result(T value) : v_(std::move(value)) {}
	Result(Error error) : v_(std::move(error)) {}

	bool ok() const { return v_.index() == 0; }
	explicit operator bool() const { return ok(); }
	T &value() & { return std::get<0>(v_); }
	const T &value() const & { return std::get<0>(v_); }
	T &&value() && { return std::get<0>(std::move(v_)); }
	T &operator*() & { return value(); }
	const T &operator*() const & { return value(); }
	T *operator->() { return &std::get<0>(v_); }
	const T *operator->() const { return &std::get<0>(v_); }
	const Error &error() const { return std::get<1>(v_); }
	Errc code() const { return ok() ? Errc::ok : error().code; }

private:
	std::variant<T, Error> v_;
};

template<>
class [[nodiscard]] Result<void>
{
public:
	Result() = default;
	Result(Error error) : error_(std::move(error)) {}

	bool ok() const { return error_.code == Errc::ok; }
	explicit operator bool() const { return ok(); }
	const Error &error() const { return error_; }
	Errc code() const { return error_.code; }

private:
	Error error_;
};

using FrameMeta = xmem_frame_meta;
// BufferGuard::meta_index() of a buffer in no slot (a private copy, a spilled frame).
inline constexpr uint32_t kNoMetaIndex = XMEM_NO_META_INDEX;
// How long set_ref_count()'s holds wait for their holders by default.
inline constexpr std::chrono::nanoseconds kHoldLifetime{ XMEM_HOLD_LIFETIME_NS };
// How long the seed's calls (acquire_cpu(), acquire_cuda(), the guards' copy_to_*())
// wait for a free slot by default.
inline constexpr std::chrono::nanoseconds kSeedWait = std::chrono::seconds(1);
// Most bytes of side data a frame carries (BufferGuard::set_side_data).
inline constexpr size_t kSideDataMax = XMEM_SIDE_DATA_MAX;
using PoolStats = xmem_pool_stats;

using ConsumerStats = xmem_consumer_stats;
using SpillStats = xmem_spill_stats;
using GrowthStats = xmem_growth_stats;
using TicketStats = xmem_ticket_stats;

// How a consumer is served (xmem.h's xmem_policy): the pool's default, or each
// consumer's own (OpenOptions::policy). fifo and block are one policy.
enum class Policy {
	block = XMEM_POLICY_BLOCK,
	fifo = XMEM_POLICY_FIFO,
	drop_oldest = XMEM_POLICY_DROP_OLDEST,
	drop_new = XMEM_POLICY_DROP_NEW,
	latest = XMEM_POLICY_LATEST,
	fifo_spill = XMEM_POLICY_FIFO_SPILL,
};
// How a consumer waits for its next frame (xmem.h's xmem_wake).
enum class Wake { sleep = XMEM_WAKE_SLEEP, spin_before = XMEM_WAKE_SPIN_BEFORE };
// How a fifo-spill consumer of a CUDA pool receives spilled frames (xmem.h's
// xmem_spill_delivery): copied back into device memory of its own, or as host memory.
enum class SpillDelivery : uint32_t { device = XMEM_SPILL_DELIVERY_DEVICE, host = XMEM_SPILL_DELIVERY_HOST };

// "fifo", "drop-oldest", "drop-new", "latest", "fifo-spill"; nullptr for another value.
const char *policy_name(Policy policy);
// The policy named NAME ("block" is "fifo"); none for another name.
std::optional<Policy> policy_from_name(std::string_view name);
// A name a policy goes by, and a line on what it does (the elements' policy properties
// list it).
struct PolicyName {
	const char *name;
	Policy policy;
	const char *blurb;
};
// Every name policy_from_name accepts, in the order the C API, Python and xmem-inspect
// list them: "block" first (fifo as a pool's configuration names it, and xmem-inspect
// shows a pool's), then each policy's own name (policy_name's) by value. Static; no
// syscall.
std::span<const PolicyName> policy_names();
// none: a handle from BufferPool::connect() that has not made or found its pool yet.
enum class Role { owner, consumer, inspector, none };
// A CUDA stream (a CUstream), kept opaque so this header needs no cuda.h. nullptr
// means no particular stream: the call then synchronizes on the CPU as it must.
using CudaStream = void *;
// Where a pool's slots live: memfd-backed system memory, or CUDA device memory.
enum class Storage : uint32_t { system = XMEM_STORAGE_SYSTEM, cuda = XMEM_STORAGE_CUDA };
// "system", "cuda"; nullptr for another value (a storage this library does not have).
const char *storage_name(Storage storage);
// The storage named NAME; none for another name.
std::optional<Storage> storage_from_name(std::string_view name);

struct PoolConfig {
	uint32_t slot_count = 8;
	uint64_t slot_size = 0;
	uint32_t max_consumers = 64;
	Policy policy = Policy::drop_oldest;
	std::chrono::nanoseconds block_timeout = std::chrono::seconds(1);
	// Who may attach, as a file mode's permission bits: the socket file's mode, and the
	// rule the owner applies to every peer's credentials (also for an abstract socket,
	// which has no file): the owner's uid, root, the group with 0060, anyone with 0006.
	uint32_t mode = 0600;
	// The group MODE's group bits let in (a gid; the owner must be a member): the socket
	// file's group, and the default directory's. None: the owner's effective group.
	std::optional<uint32_t> group;
	std::string format;
	std::string producer;
	Storage storage = Storage::system;
	// CUDA device ordinal for Storage::cuda.
	uint32_t device = 0;
	// The spill tier for Policy::fifo_spill consumers: at most SPILL_BYTES of spilled
	// frames (each rounded up to pages) in at most SPILL_FRAMES host buffers (0:
	// spill_bytes / slot_size, at least 1). 0 bytes: none. A CUDA pool's tier is
	// page-locked at its whole size while the pool lives (its copies are DMA).
	uint64_t spill_bytes = 0;
	uint32_t spill_frames = 0;
	// Slots of every size class together: the first class's slot_count and room for
	// classes preallocate() adds later (each slot costs a 6.5 KiB record in the control
	// segment). 0: slot_count + 64, at most XMEM_MAX_SLOTS.
	uint32_t max_slots = 0;
	// Growth on demand (docs/design.md, "Growth on demand"): with a cap, acquire() of
	// system memory that no free slot fits makes a slot, in a dynamic size class of a
	// quarter-power-of-two size, while the system memory of every class's slots stays
	// within MEMORY_CAP bytes. A free dynamic slot not acquired for TRIM_IDLE (0: 10 s),
	// or the least recently used free one when a new slot would pass the cap, gives its
	// memory back.
	// 0: no growth.
	uint64_t memory_cap = 0;
	std::chrono::milliseconds trim_idle{ 0 };
	// Growth of CUDA device memory, as memory_cap: acquire() of device memory that no free
	// slot fits makes a slot while each CUDA device's memory of the pool's slots stays
	// within DEVICE_MEMORY_CAP bytes. Consumers map a slot's memory when a frame of it
	// first reaches them, and again after a trim gave it back. 0: no growth.
	uint64_t device_memory_cap = 0;
};

// A size class of a pool: COUNT slots of SLOT_SIZE bytes of one memory, slots
// [first_slot, first_slot + count). Class 0 is the one the pool was created with.
struct SizeClass {
	uint32_t index = 0;
	Storage storage = Storage::system;
	uint32_t device = 0; // the owner's ordinal, for CUDA storage
	uint64_t slot_size = 0;
	uint32_t first_slot = 0;
	uint32_t count = 0;
	// How the owner orders GPU work on its slots (gpu_ordering_name(): stream memory
	// operations, or the CPU); 0 for system memory.
	uint32_t sync_mode = 0;
	// Made by acquire() (PoolConfig::memory_cap), and its slots whose memory is committed
	// now (COUNT for a preallocated class).
	bool dynamic = false;
	uint32_t committed = 0;
};

struct OpenOptions {
	// How long open() waits for the pool to appear (no socket, or a dead owner's).
	std::chrono::nanoseconds timeout{ 0 };
	// Frames this consumer may have queued; 0: its policy's default (4; 1 for latest;
	// the pool's whole ring for fifo-spill).
	uint32_t queue_size = 0;
	std::string client;
	// Attach read-only for inspection: no consumer entry, no frames (xmem-inspect).
	bool inspect = false;
	// How this consumer is served; none: the pool's policy.
	std::optional<Policy> policy;
	// fifo and fifo-spill: what a full queue does once the publisher has waited
	// block_timeout (fifo) or the spill tier is full: drop_oldest or drop_new.
	Policy fallback = Policy::drop_oldest;
	// fifo: how long a publish waits for room in this consumer's queue; 0: the pool's.
	std::chrono::nanoseconds block_timeout{ 0 };
	// spin_before: receive() learns the frame period and, near the expected arrival,
	// polls the queue instead of sleeping, at most SPIN_BUDGET per frame (fd() polls
	// readable when the spin should start); irregular streams sleep as with sleep.
	Wake wake = Wake::sleep;
	std::chrono::microseconds spin_budget{ 200 };
	// fifo-spill on a CUDA pool: a frame the spill tier holds comes back as a device
	// frame (a private copy on the stream receive() was given; frame.spilled()), or,
	// with host, as the tier's read-only host memory.
	SpillDelivery spill_delivery = SpillDelivery::device;
	// A frame older than MAX_AGE when receive() would hand it out (now minus its
	// meta().timestamp, CLOCK_MONOTONIC: the producer's, or the owner's at publish) is
	// given back unread and counted (ConsumerStats::expired), with every policy: a lagging
	// consumer never works on stale frames. 0: no limit. C and Python take microseconds'
	// worth (at most 2^32 - 1 µs, 71 minutes).
	std::chrono::nanoseconds max_age{ 0 };
	// The most slots this consumer holds at once, queued for it or taken and not let go
	// (a fifo-spill consumer's queued frames do not count: the spill tier takes them out
	// of their slots). At its cap the owner delivers it no more frames; its policy decides
	// what it misses (drop-oldest and latest: the oldest queued frame makes room; fifo:
	// the publisher waits, then its fallback), counted in `dropped`. 0: half the pool's
	// slots when it attaches (4 of xmemsink's 8), so one consumer that keeps frames never
	// takes the slots the producer and the others need, but at least its queue size and
	// one (5 for drop-oldest's default queue of 4). Values over the pool's slots mean no
	// cap. ConsumerStats::max_held says the cap the owner applies.
	uint32_t max_held = 0;
	// A late joiner's start: the newest HISTORY frames published before it attached that
	// are still in the pool (no holder let them be reused yet), oldest first, then the
	// live stream. At most its queue size (1 for latest) and its cap. The producer keeps
	// no slot longer for it: history is what is still there. 0: the live stream only.
	uint32_t history = 0;
};

// The caps of the memory a pool made by BufferPool::connect() grows to by default (its
// slots of every class together): system memory, and each CUDA device's.
inline constexpr uint64_t kConnectMemoryCap = uint64_t{ 1 } << 30; // 1 GiB
inline constexpr uint64_t kConnectDeviceMemoryCap = uint64_t{ 4 } << 30; // 4 GiB

// BufferPool::connect(): the seed's new(name), which attaches to a pool or makes it.
struct ConnectOptions {
	// How long a call that needs another process's pool (get(), receive()) waits for it
	// to appear; acquire_*() and preallocate_*() make the pool instead.
	std::chrono::nanoseconds timeout = std::chrono::seconds(10);
	// The pool this handle makes grows on demand (PoolConfig::memory_cap,
	// device_memory_cap): acquire_cpu() and acquire_cuda() of a size no class holds make a
	// slot while the slots' memory stays within these caps. 0: no growth (preallocated
	// classes only).
	uint64_t memory_cap = kConnectMemoryCap;
	uint64_t device_memory_cap = kConnectDeviceMemoryCap;
	// Who may attach to the pool this handle makes (PoolConfig::mode).
	uint32_t mode = 0600;
	// How this handle is named in the owner's consumer table when it attaches.
	std::string client = "connect";
};

// A frame ticket (BufferPool::publish_ticket): one published frame of one pool, for a
// number of redemptions until it expires. Plain data, to send over any channel: as
// the C struct's bytes, or as text.
struct Ticket {
	uint32_t slot = 0;
	uint64_t seq = 0; // the frame's publish sequence number
	uint64_t check = 0; // random, never 0

	// "xmem-ticket:SLOT:SEQ:CHECK", CHECK as 16 hex digits.
	std::string to_string() const;
	// The text of to_string(); Errc::bad_ticket for anything else.
	static Result<Ticket> parse(std::string_view text);
	bool operator==(const Ticket &) const = default;
};

class BufferPool;
struct PoolImpl;
class Publisher;
class Subscriber;
class GuestProducer;

// One reference to a slot, released on destruction. Read-only or writable; a
// writable guard from get_mut() may be a private copy (copy-on-write).
class BufferGuard
{
public:
	BufferGuard() = default;
	BufferGuard(BufferGuard &&other) noexcept;
	BufferGuard &operator=(BufferGuard &&other) noexcept;
	BufferGuard(const BufferGuard &) = delete;
	BufferGuard &operator=(const BufferGuard &) = delete;
	~BufferGuard();

	bool valid() const { return pool_ != nullptr; }
	uint32_t index() const { return index_; }
	bool writable() const { return writable_; }
	bool is_copy() const { return copy_ != nullptr; }
	// The frame came out of the pool's spill tier (a fifo-spill consumer's): host
	// memory, or its device copy (OpenOptions::spill_delivery).
	bool spilled() const;

	// This guard's copy of the frame's metadata. A received frame's layout was checked
	// against its slot (receive(): Errc::bad_frame otherwise): size, tensor, and each
	// plane starting within meta().size with a stride under 2^31. How many rows of how
	// many bytes a plane has depends on the format, which the library does not parse:
	// code that reads planes itself checks offset + stride * (rows - 1) + row bytes
	// <= meta().size for its format (xmemsrc and Python's planes() do).
	const FrameMeta &meta() const { return meta_; }
	Storage storage() const { return Storage(meta_.storage_type); }
	// CUDA device ordinal of a device frame in this process (0 for system memory).
	uint32_t device() const { return meta_.device_id; }
	// Device address (a CUdeviceptr) of a device frame's bytes; 0 for system memory,
	// whose bytes are data(). The planes are at meta().plane_offset[i] from it, each
	// meta().plane_stride[i] bytes a row (the pitch).
	uint64_t device_ptr() const { return device_; }
	// A device frame whose producer died before its GPU writes to it were complete:
	// streams waiting for it were let go (so none waits forever), but its bytes are
	// whatever those writes left. Check it after the stream's wait has passed.
	bool incomplete() const;
	// Metadata to fill before publish(); only for writable guards.
	Result<FrameMeta *> meta_mut();
	std::span<const std::byte> data() const;
	Result<std::span<std::byte>> data_mut();
	uint64_t capacity() const { return capacity_; }
	// The format string this frame is in.
	const std::string &format() const;
	// Side data: up to kSideDataMax bytes of the application's own that travel with the
	// frame, in the slot's record in the control segment (system memory, also for
	// device pools); the GStreamer elements put GstMetas there. A received frame's is a
	// copy taken at receive, empty when the record's size was out of range (counted in
	// BufferPool::side_data_refused()). No syscall.
	std::span<const std::byte> side_data() const;
	// Owner: sets the side data publish() sends with this frame (a copy of BYTES; empty
	// clears it). Errors: Errc::read_only (not a guard from acquire()),
	// Errc::out_of_range (more than kSideDataMax bytes: nothing is truncated).
	Result<void> set_side_data(std::span<const std::byte> bytes);

	// Makes a read-only guard writable in place when this process is the frame's only
	// holder and holds it once; never copies. Returns whether the guard is writable.
	bool try_make_writable();
	// Another read-only reference to the same frame (a private copy is shared as is).
	Result<BufferGuard> clone_ref() const;
	// Drops the reference now; the guard becomes empty. Safe to call twice. For a
	// device frame, the slot is reused only after this process's work on it is done,
	// waited for on the CPU: the primary and the current context's streams, and the
	// stream the frame was acquired or received on. Use release(stream) to avoid it.
	void reset();
	// Drops the reference once the work queued on STREAM so far is done, without
	// waiting on the CPU: the producer's GPU waits for it before rewriting the slot.
	Result<void> release(CudaStream stream);
	// The seed's names (../shared/seeds/xmem-design.zh.md, sections 6 and 7).
	// The frame's meta index: what get(meta_index) takes in any process attached to the
	// pool and set_ref_count(meta_index, n) publishes. The slot (index()) in its low
	// XMEM_META_SLOT_BITS bits, the frame's generation above them: it names this frame,
	// never a later one of the slot. kNoMetaIndex for a buffer in no slot (a private
	// copy, a spilled frame) and an empty guard, except one set_ref_count() emptied,
	// which keeps it until forget().
	uint32_t meta_index() const;
	// The frame's bytes: the payload (a writable guard's: the slot) of system memory.
	// Errc::invalid_argument for device memory (as_cuda_ptr()), Errc::read_only for
	// as_cpu_slice_mut() of a read-only guard.
	Result<std::span<const std::byte>> as_cpu_slice() const;
	Result<std::span<std::byte>> as_cpu_slice_mut();
	// The device address of a device frame's bytes (device_ptr()). Errc::invalid_argument
	// for system memory (as_cpu_slice()), Errc::read_only for as_cuda_ptr_mut() of a
	// read-only guard (a received frame; get_mut() or try_make_writable() gives a
	// writable one).
	Result<uint64_t> as_cuda_ptr() const;
	Result<uint64_t> as_cuda_ptr_mut();
	// Lets go of the guard without releasing its reference (the seed's forget): after
	// set_ref_count() there is none left to release; a received frame's stays this
	// process's until release(meta_index) or its exit. Errc::invalid_argument for a frame
	// acquired and not published (its slot would be lost to the pool): publish it,
	// set_ref_count() it or reset() it. The guard is empty afterwards.
	Result<void> forget();
	// A copy of the frame in a buffer of its pool: a free slot of system memory
	// (copy_to_cpu) or of CUDA device DEVICE, taken as BufferPool::acquire(size, storage,
	// device, TIMEOUT, STREAM) takes one (a pool from connect() grows a class for it),
	// with the frame's bytes and metadata (BufferPool::copy()). Writable, like an acquired
	// frame, with its own meta_index(): publish it, set_ref_count() it or drop it. Into
	// device memory the copy is queued on STREAM (complete on return without one); into
	// system memory it is complete on return. Errc::out_of_range when the pool has no
	// class of that memory large enough (the message names the class to preallocate).
	Result<BufferGuard> copy_to_cpu(CudaStream stream = nullptr,
					std::chrono::nanoseconds timeout = kSeedWait) const;
	Result<BufferGuard> copy_to_cuda(uint32_t device, CudaStream stream = nullptr,
					 std::chrono::nanoseconds timeout = kSeedWait) const;
	// The seed's name for a copy between devices (the same call).
	Result<BufferGuard> copy_to_device(uint32_t device, CudaStream stream = nullptr,
					   std::chrono::nanoseconds timeout = kSeedWait) const;

	// A private host copy of a device frame (or of a system one), outside the pool, made
	// on STREAM and complete when this returns. Read-only, like the frame; no meta index.
	Result<BufferGuard> private_copy_to_cpu(CudaStream stream = nullptr) const;
	// A private copy on CUDA device DEVICE (from system or device memory), outside the
	// pool, queued on STREAM: use it on that stream, or after it. Without a stream it is
	// complete on return. From a system-memory frame (pageable memory) the call waits, as
	// the CUDA driver does, for STREAM's earlier work before it returns; the device write
	// stays queued. Read-only, like the frame; freed with the last guard on it, once
	// STREAM's work is done (so STREAM must outlive the copy: a destroyed stream's handle
	// dangles). From a slot on another GPU that is a peer of DEVICE
	// (cuDeviceCanAccessPeer), DEVICE is given access to this process's mapping of the
	// slot's class once and the copy is queued like one on the same GPU; from other memory
	// of another GPU (no peer, a private copy) it goes through host memory: it waits for
	// STREAM's earlier work and is complete on return.
	Result<BufferGuard> private_copy_to_cuda(uint32_t device, CudaStream stream = nullptr) const;

private:
	friend class BufferPool;
	friend struct PoolImpl;
	friend class Publisher;
	friend class Subscriber;
	friend class GuestProducer;

	std::shared_ptr<PoolImpl> pool_;
	// The slot, kept apart from meta_: callers may overwrite all of meta_mut().
	uint32_t index_ = 0;
	// The frame's generation (layout::SlotRecord::frame_gen): 0 for no meta index.
	uint32_t gen_ = 0;
	// A frame this process acquired and has not published: PoolImpl::writers names the
	// guard while it does (set_ref_count() finds it there).
	bool acquired_ = false;
	// Lets go of the slot without releasing the reference, which someone else took over.
	void detach();
	FrameMeta meta_{};
	std::byte *data_ = nullptr; // host bytes; nullptr for device memory
	uint64_t device_ = 0; // device bytes; 0 for system memory
	uint64_t capacity_ = 0;
	bool writable_ = false;
	// Copy-on-write or copy_to_*: the private copy (data_ or device_ points into it);
	// no slot reference then.
	std::shared_ptr<void> copy_;
	std::shared_ptr<const std::string> format_;
	// The side data: set_side_data()'s, or the copy make_guard() took; none when empty.
	std::shared_ptr<const std::vector<std::byte>> side_data_;
	// The stream the frame was acquired or received on (nullptr: none): a stream-less
	// publish or release waits for it too. It must live until then (CUDA's own rule
	// for work queued on it); xmem keeps no context, see lib/cuda/contexts.hpp.
	CudaStream stream_ = nullptr;
};

// A handle to a pool: its owner (create) or a consumer (open). Thread-safe.
class BufferPool
{
public:
	// Creates pool NAME (a plain name under $XDG_RUNTIME_DIR/xmem or /tmp/xmem-$UID,
	// or a socket path if it contains '/'), preallocating every slot. Starts one
	// thread that accepts consumers and reaps the dead ones.
	static Result<std::shared_ptr<BufferPool>> create(std::string_view name, const PoolConfig &config);
	// Attaches to pool NAME as a consumer, waiting up to options.timeout for it.
	static Result<std::shared_ptr<BufferPool>> open(std::string_view name, const OpenOptions &options = {});
	// The seed's new(NAME): connects to pool NAME in any order with the other processes
	// using it. Attached as a consumer now when its owner is there; otherwise the handle
	// waits (role() is Role::none) and the first call that needs the pool settles it:
	// preallocate_*() and acquire_*() make it, this process its owner, with the first
	// class they ask for (a pool that grows on demand within options' caps); get(),
	// get_mut() and receive() wait up to options.timeout for another process to make it.
	// Two processes that make it at once: one owns it, the other attaches (its acquires
	// are leased, as a guest's). A call that can do neither (publish() of nothing,
	// consumer_stats()) is Errc::not_found until then; the pool's figures read zero. The
	// pool closes with its owner, as any pool: handles attached to it get Errc::closed
	// once their frames are taken (frames still held stay valid), and a later connect()
	// makes a new pool of that name. Consumers attach with Policy::latest: a frame
	// published to queues holds at most one slot of theirs.
	static Result<std::shared_ptr<BufferPool>> connect(std::string_view name, const ConnectOptions &options = {});

	~BufferPool();
	BufferPool(const BufferPool &) = delete;
	BufferPool &operator=(const BufferPool &) = delete;

	Role role() const;
	const std::string &name() const;
	// The rendezvous socket's path.
	const std::string &path() const;
	// The first size class's slot size, and the slots of every class.
	uint64_t slot_size() const;
	uint32_t slot_count() const;
	// The size classes the owner has added so far, class 0 first.
	std::vector<SizeClass> classes() const;
	// The control segment's slot records: every class's, and those for classes to come
	// (PoolConfig::max_slots). Slot indices and the layout follow it.
	uint32_t slot_records() const;
	Storage storage() const;
	// CUDA device of a device pool, as this process numbers it: a consumer finds the
	// owner's device by its UUID (ordinals differ with CUDA_VISIBLE_DEVICES).
	uint32_t device() const;
	// The row and plane alignment frames of this pool want, for set_video_layout():
	// for device memory the device's texture pitch alignment, at least 256 (what
	// NVENC and CUDA textures take without a copy); 1 for system memory.
	uint32_t pitch_alignment() const;
	// How GPU work on device slots is ordered in this process: "stream-memops",
	// "cpu" (the fallback: a CPU synchronization per publish and release) or "none".
	const char *gpu_ordering() const;

	// A free slot, writable. Waits up to timeout (no syscall unless it waits);
	// with drop-oldest it first takes back frames still queued for consumers. For a
	// device pool, STREAM waits (on the GPU) until every consumer's GPU reads of the
	// slot's last frame are done; without a stream the CPU waits for them.
	// A consumer acquires too, as a producer besides the owner (a guest): the owner
	// leases it a free slot (over a connection of the guest's own, a round trip per call;
	// its GPU reads awaited by the owner), which the guest writes through its own mapping
	// and publishes or makes a ticket of (the owner publishes it on its behalf) or drops
	// (the slot goes back). A guest's death gives its leased slots back: system memory's at
	// its hang-up, device memory's once its process has exited. docs/design.md, "Producers
	// besides the owner".
	Result<BufferGuard> acquire(std::chrono::nanoseconds timeout, CudaStream stream = nullptr);
	// As acquire(), a slot of SIZE bytes or more in the first class's memory: of
	// the smallest size class that has one free. Errc::out_of_range when no class of
	// that memory is that large.
	Result<BufferGuard> acquire(uint64_t size, std::chrono::nanoseconds timeout, CudaStream stream = nullptr);
	// The same in STORAGE (for CUDA, device DEVICE): a pool may hold classes of
	// system memory and of a CUDA device side by side (preallocate()). SIZE 0: a slot of
	// that memory's first class.
	Result<BufferGuard> acquire(uint64_t size, Storage storage, uint32_t device, std::chrono::nanoseconds timeout,
				    CudaStream stream = nullptr);
	// Owner: adds a size class of COUNT slots of SLOT_SIZE bytes, allocated now, and
	// returns its index. Consumers attached or to come take its frames like any other
	// (they import its memory once, with its first frame). STORAGE and DEVICE may differ
	// from the first class's: system memory and CUDA devices side by side. Another memory
	// in a pool with a spill tier is Errc::invalid_argument; Errc::full past max_slots or
	// 32 classes.
	Result<uint32_t> preallocate(uint64_t slot_size, uint32_t count, Storage storage, uint32_t device = 0);
	// A copy of FRAME (any frame this process holds, of this pool or another)
	// that is a buffer of this pool: a free slot of STORAGE (for CUDA, device DEVICE)
	// that holds its payload, taken as acquire(size, storage, device, TIMEOUT, STREAM)
	// takes one, with its bytes and metadata (size, times, flags, layout, tensor, side
	// data). Publish it or make a ticket of it like any acquired slot. Into device
	// memory the copy is queued on STREAM (publish on that stream: consumers' reads wait
	// for it); into system memory it is complete on return. From a frame on another GPU
	// the copy reads FRAME after STREAM's earlier work (a stream of DEVICE; FRAME's own
	// writes must be over or ordered before that): where the GPUs are peers it is queued
	// on STREAM (DEVICE is given access to this process's mapping of FRAME's class once);
	// where they are not it is staged through host memory and complete on return.
	// Errc::out_of_range when the pool has no class of that memory large enough
	// (preallocate() adds one).
	Result<BufferGuard> copy(const BufferGuard &frame, Storage storage, uint32_t device,
				 std::chrono::nanoseconds timeout, CudaStream stream = nullptr);
	// Publishes FRAME (from acquire() or copy()) to every consumer and consumes the
	// guard. For a device pool the frame is ready once the work queued on STREAM so far is
	// done; it is published at once, without waiting (without a stream: after every
	// stream of this process is synchronized). A guest's frame is published by the owner,
	// to every consumer but the guest itself, once the guest's CPU waited for STREAM (else
	// the guard's stream, else every stream of its process): consumers read it then.
	// The owner checks it as its own (Errc::out_of_range, Errc::invalid_argument): a
	// refused frame's slot goes back.
	Result<void> publish(BufferGuard &&frame, CudaStream stream = nullptr);
	// Publishes FRAME to no queue and returns a ticket for it, which REDEMPTIONS
	// get(ticket) calls (any processes attached to the pool) may redeem within TTL.
	// The slot stays held for the ticket until every redemption is made or the TTL
	// runs out, whichever comes first: then the references left go back, so a
	// consumer that dies before redeeming leaks nothing (docs/design.md, "Frame
	// tickets"). STREAM, and a guest's frame, as for publish().
	Result<Ticket> publish_ticket(BufferGuard &&frame, uint32_t redemptions, std::chrono::nanoseconds ttl,
				      CudaStream stream = nullptr);
	Result<void> set_format(std::string_view format);
	Result<void> end_of_stream();

	// Consumer: the next frame. Errc::end_of_stream at EOS; Errc::closed once the
	// owner is gone and the queue is drained; Errc::timed_out. Errc::bad_frame for a
	// frame whose layout (size, dtype, shape and strides, planes) does not fit its slot,
	// as another process may have written it: given back unread and counted in
	// frames_refused(); the next receive() goes on with the next frame. For a device pool,
	// work queued on STREAM after this call sees the producer's writes (the stream
	// waits on the GPU); without a stream the frame is ready for any stream when this
	// returns (the CPU waited). A frame whose GPU writes are not done within TIMEOUT
	// stays this consumer's: the call returns timed_out and the next receive() hands
	// that frame out first (the timeout never loses a queued frame).
	Result<BufferGuard> receive(std::chrono::nanoseconds timeout, CudaStream stream = nullptr);
	// Consumer: polls readable when receive() may return without waiting (for a frame
	// kept back for its GPU writes: readable again within 1 ms, so a poller retries).
	int fd() const;
	std::string format() const;
	PoolStats stats() const;
	// Frames this handle took without their side data, its size in the slot record
	// being over kSideDataMax (a hostile peer's writing).
	uint64_t side_data_refused() const;
	// Frames this handle refused (Errc::bad_frame from receive() or get()): their
	// layout did not fit their slot.
	uint64_t frames_refused() const;
	// Consumer: how the owner serves this handle (its policy, queue) and what it lost.
	Result<ConsumerStats> consumer_stats() const;
	// The pool's spill tier: its cap, what it holds and has held (zero without one).
	SpillStats spill_stats() const;
	// Growth on demand (PoolConfig::memory_cap); all zero for a pool that does not grow.
	GrowthStats growth_stats() const;
	// The pool's frame tickets: issued, redeemed, expired, live.
	TicketStats ticket_stats() const;

	// The seed's names (../shared/seeds/xmem-design.zh.md, section 6; README, "Where xmem
	// departs from its seeds").
	// Owner: COUNT slots of SIZE bytes of system memory (preallocate_cuda: of CUDA device
	// DEVICE), a size class preallocate() adds; their slot indices.
	Result<std::vector<uint32_t>> preallocate_cpu(uint64_t size, uint32_t count);
	Result<std::vector<uint32_t>> preallocate_cuda(uint64_t size, uint32_t count, uint32_t device);
	// acquire(SIZE, system or cuda DEVICE, TIMEOUT, STREAM): a writable slot, in any
	// attached process (a consumer's is leased from the owner), whose frame is SIZE bytes
	// (meta().size) until its metadata says otherwise: the seed's buffer of that size.
	Result<BufferGuard> acquire_cpu(uint64_t size, std::chrono::nanoseconds timeout = kSeedWait);
	Result<BufferGuard> acquire_cuda(uint64_t size, uint32_t device, std::chrono::nanoseconds timeout = kSeedWait,
					 CudaStream stream = nullptr);
	// The frame META_INDEX (BufferGuard::meta_index(), sent by its producer) names,
	// read-only, with a reference of this process's own; its layout checked as receive()
	// checks it. A frame set_ref_count() published for N holders: one of its N holds
	// (Errc::not_held once all are taken or its lifetime ended); any other published
	// frame: while the slot still holds it. Errc::not_held for a slot reused since (never
	// the later frame) or not published; Errc::out_of_range for an index of no slot. A
	// device frame is ready for any stream (the CPU waited for its GPU writes).
	// A plain slot index (index(), below slot_records()) takes whatever frame the slot
	// holds now, unless it was published for a number of holders (refused: its meta
	// index takes one of them).
	// get_mut(): writable; in place when this process is its only holder, otherwise a
	// private copy (copy-on-write).
	Result<BufferGuard> get(uint32_t meta_index);
	Result<BufferGuard> get_mut(uint32_t meta_index);
	// As get(INDEX), only while the slot still holds frame SEQ (its meta().seq, sent with
	// the index): a slot whose frame changed since is Errc::not_held, never the newer
	// frame.
	Result<BufferGuard> get(uint32_t index, uint64_t seq);
	// Publishes the frame META_INDEX names, which this process acquired, wrote and has not
	// published, for exactly COUNT holders in any processes: each get(META_INDEX) takes one
	// of them, and the slot comes back as soon as those holders let go. Holds nobody took
	// within LIFETIME go back then: a holder whose process died before its get() costs
	// the slot LIFETIME at most (one that dies after it, nothing: its hold goes with it).
	// The acquired guard is left empty, its meta_index() readable until forget(). A
	// counted publication is a frame ticket (ticket_stats() counts it; docs/design.md,
	// "Meta indices"). Not while another thread uses that guard. Errc::invalid_argument:
	// COUNT < 1 or over the pool's consumer limit, a frame this process did not acquire
	// or published already; Errc::not_held: no frame of that index is being written here;
	// and publish()'s errors.
	Result<void> set_ref_count(uint32_t meta_index, int32_t count,
				   std::chrono::nanoseconds lifetime = kHoldLifetime);
	// Consumer: the frame TICKET names, read-only, with a reference of this process's
	// own (crash-safe: released when this process dies). One of the ticket's
	// redemptions. Errc::bad_ticket when the ticket is expired, used up, forged or of
	// another pool; Errc::closed when the owner is gone. A frame of a device pool is
	// ready for any stream (the CPU waited for its GPU writes).
	Result<BufferGuard> get(const Ticket &ticket);
	// References held without RAII, on a slot this process already holds (INDEX: its meta
	// index, or its slot index).
	Result<void> add_ref(uint32_t index);
	Result<void> release(uint32_t index);
	// Sets this process's own count of references on a slot it holds (0 releases all).
	// Other processes' counts are theirs alone: that is what makes them crash-safe.
	Result<void> set_local_refs(uint32_t index, uint32_t count);
	uint32_t ref_count(uint32_t index) const;

	// Owner: closes the pool now (as destroying the handle does) although guards
	// still keep it mapped; frees the name for a new owner. Idempotent.
	void close();
	// Whether GUARD refers to a slot of this pool.
	bool owns(const BufferGuard &guard) const;

	// For xmem-inspect: the raw control segment of an inspector handle.
	std::span<const std::byte> control_segment() const;
	// The owner's pid as this process numbers it: getpid() for the owner, for others
	// the kernel's answer at attach (SO_PEERCRED), 0 when the owner is in a PID
	// namespace this process cannot see (a sibling container).
	uint32_t owner_pid() const;

	explicit BufferPool(std::shared_ptr<PoolImpl> impl);

private:
	Result<std::vector<uint32_t>> preallocate_cuda_or_cpu(uint64_t size, uint32_t count, Storage storage,
							      uint32_t device);

	// A handle from connect() until the pool is settled (Role::none); none otherwise.
	struct Connecting;
	// The pool this handle is attached to, settling a connect() handle as WANTS says:
	// attach if the pool exists (look), wait for it up to the timeout (wait), or make it
	// with a first class of FIRST (make). nullptr when it stays unsettled.
	enum class Settle { look, wait, make };
	struct FirstClass {
		uint64_t size;
		uint32_t count;
		Storage storage;
		uint32_t device;
	};
	// MADE: set when this call made the pool.
	Result<PoolImpl *> settle(Settle wants, const FirstClass *first = nullptr, bool *made = nullptr) const;
	// settle(look), for calls that read the pool's figures: nullptr while unsettled.
	PoolImpl *settled() const;
	// settle(look), for calls that need the pool: Errc::not_found naming CALL otherwise.
	Result<PoolImpl *> attached(const char *call) const;

	// Set once (under connecting_'s lock, then attached_ release-stored) and never again.
	mutable std::shared_ptr<PoolImpl> impl_;
	mutable std::atomic<bool> attached_{ false };
	std::unique_ptr<Connecting> connecting_;
};

// Fills META's video plane layout (n_planes, plane_offset, plane_stride) and size for
// a WIDTH x HEIGHT frame of FORMAT (GStreamer's names: NV12, NV21, I420, YV12,
// P010_10LE, Y444, GRAY8, RGB, BGR, RGBA, BGRA, RGBx, BGRx), every row padded and every
// plane started on a multiple of ALIGNMENT bytes (a power of two; use the pool's
// pitch_alignment()). Returns the payload size, which must fit the slot.
Result<uint64_t> set_video_layout(FrameMeta &meta, std::string_view format, uint32_t width, uint32_t height,
				  uint32_t alignment);

// One plane of a raw video format as set_video_layout() lays it out: BYTES per sample
// (a U and V pair in a semi-planar chroma plane), ceil(width / X_DIVISOR) samples a row,
// ceil(height / Y_DIVISOR) rows; PLANES: the format's plane count.
struct VideoPlane {
	uint32_t planes = 0;
	uint32_t bytes = 0;
	uint32_t x_divisor = 1;
	uint32_t y_divisor = 1;
};
// Plane PLANE of FORMAT (set_video_layout()'s names); Errc::invalid_argument for an
// unknown format or a plane past its count. The one table of formats: the C API and
// Python read it here.
Result<VideoPlane> video_plane(std::string_view format, uint32_t plane);

// One side of cuda_copy_2d(): host memory (any, pinned or not) or CUDA device memory.
struct Region2D {
	uint64_t address = 0; // a host pointer, or a CUdeviceptr when device is set
	uint64_t pitch = 0; // bytes from the start of one row to the next
	bool device = false;
};
// Copies a WIDTH_BYTES x HEIGHT rectangle between host and CUDA device memory (at
// least one side on the device), through the CUDA driver xmem loaded: what an
// element or app uses to fill a device slot or read one without linking CUDA
// itself. Queued on STREAM, in the stream's own context (DEVICE's primary context
// without a stream, and then complete on return). A pageable host side (memory not
// page-locked with cuMemAllocHost or cuMemHostRegister) makes the call wait for
// STREAM, as the CUDA driver does: into pageable memory it returns once the copy ran,
// from it once the stream's earlier work is done and the bytes are staged.
Result<void> cuda_copy_2d(const Region2D &dst, const Region2D &src, uint64_t width_bytes, uint64_t height,
			  uint32_t device, CudaStream stream = nullptr);
// Checks that CUDA device DEVICE can hold a device pool (driver, device, virtual
// memory management, POSIX-fd sharing) and returns its name; the error names the cause.
Result<std::string> cuda_check_device(uint32_t device);
// Whether the work queued on STREAM so far is done (cuStreamQuery): never waits.
Result<bool> cuda_stream_done(uint32_t device, CudaStream stream);
// Waits on the CPU for STREAM (nullptr: the streams of DEVICE's primary context and of
// the calling thread's current context; the driver has no call that reaches every
// context, and xmem keeps none it was shown: a destroyed context's handle dangles).
Result<void> cuda_synchronize(uint32_t device, CudaStream stream = nullptr);
// Waits on the CPU for every stream of CONTEXT (a CUcontext: one a framework made).
Result<void> cuda_synchronize_context(void *context);
// Makes the work queued on WAITER from now on wait, on the GPU, for the work queued on
// PRODUCER so far (an event recorded on PRODUCER): the CPU does not wait. The streams
// may be of different contexts; neither may be a default stream.
Result<void> cuda_stream_wait(CudaStream waiter, CudaStream producer);

// Where NAME's socket lives, or an error for a bad name: a plain name's under
// default_directory(), a name with a '/' is a path, and "@NAME" is NAME in the abstract
// socket namespace (no file: one per network namespace, for containers that share a
// network namespace but no directory; access is the owner's check of each peer's
// credentials against its mode and group).
Result<std::string> socket_path(std::string_view name);
// Whether a socket path names an abstract socket ("@NAME").
bool is_abstract(std::string_view path);
// The directory plain names live in.
std::string default_directory();

} // namespace xmem
