// arena.hpp - where slot bytes live: the storage seam between the pool's protocol
// and its memory. System memory (a memfd) is one arena; CUDA device memory another.
// What a role asks of a kind of memory (its device's identity, its GPU ordering, private
// memory and copies) is answered here too, by arena.cpp, the one file that dispatches on
// the kind: no role branches on it.
#pragma once

#include "device_sync.hpp"
#include "layout.hpp"
#include "system.hpp"

#include <memory>
#include <string>
#include <vector>

namespace xmem {

// What an arena is made of; the owner chooses it and records it in the control
// segment's constants, from which a consumer imports the same arena.
struct ArenaSpec {
	std::string name; // the pool's, for labels and messages
	Storage storage = Storage::system;
	uint32_t device = 0;
	uint32_t slot_count = 0;
	uint64_t slot_size = 0;
	uint32_t mode = 0600;
	// Reserve no memory at create; the owner commits each slot's (Arena::commit) when it
	// first uses it (a dynamic class: PoolConfig::memory_cap, device_memory_cap). System
	// memory stays one memfd; a CUDA slot's memory is an allocation of its own each time,
	// which a consumer maps slot by slot (Arena::map_slot).
	bool sparse = false;
};

// The slots' memory, mapped in this process. Slot i lives at offset i * slot_stride().
// An arena outlives every guard on it (guards hold the pool, the pool the arena).
class Arena
{
public:
	virtual ~Arena() = default;

	virtual Storage storage() const = 0;
	virtual uint32_t device() const = 0;
	// Bytes between slot starts (the slot size rounded up to the storage's unit),
	// and the total, slot_count * slot_stride.
	virtual uint64_t slot_stride() const = 0;
	virtual uint64_t size() const = 0;
	// CPU address of OFFSET; nullptr for device memory, which the CPU cannot touch.
	virtual std::byte *host(uint64_t offset) const = 0;
	// Device address (a CUdeviceptr) of OFFSET; 0 for system memory.
	virtual uint64_t device_address(uint64_t offset) const = 0;
	// The row alignment frames in this memory want (BufferPool::pitch_alignment()).
	virtual uint32_t pitch_alignment() const = 0;
	// The file descriptors a consumer imports this arena from, in order. Owned by the
	// arena; sent with SCM_RIGHTS at attach.
	virtual std::vector<int> fds() const = 0;
	// Whether streams on CUDA device DEVICE may read and write this arena's device memory
	// in this process: its own device, or a peer of it (cuDeviceCanAccessPeer) given access
	// to this process's mapping, at the first ask; false for a device that is no peer, and
	// for system memory. An Error when the driver refused the access between peers.
	virtual Result<bool> reach_from(uint32_t /*device*/) const { return false; }
	// Owner of a sparse arena: reserves the memory of [OFFSET, OFFSET + SIZE) now (a
	// full tmpfs or memory cgroup fails here, not with a SIGBUS at a write), or gives
	// it back, zeroing it, in every process that maps the arena.
	virtual Result<void> commit(uint64_t /*offset*/, uint64_t /*size*/)
	{
		return make_error(Errc::invalid_argument, "this memory is committed whole at create");
	}
	virtual Result<void> decommit(uint64_t /*offset*/, uint64_t /*size*/)
	{
		return make_error(Errc::invalid_argument, "this memory is committed whole at create");
	}
	// Whether each slot's memory is mapped on its own, from a file descriptor of its own
	// that a commit made (a sparse CUDA arena): a consumer maps a slot before it reads
	// it, and again once the owner gave the slot's memory back and committed new memory.
	virtual bool maps_per_slot() const { return false; }
	// Owner: the file descriptor of the committed slot at OFFSET (owned by the arena).
	virtual Result<int> slot_fd(uint64_t /*offset*/) const
	{
		return make_error(Errc::invalid_argument, "this memory is not mapped slot by slot");
	}
	// Consumer: maps the slot at OFFSET from FD (its mapping of earlier memory gone first,
	// once this process's GPU work has finished), or unmaps it (nothing if not mapped).
	virtual Result<void> map_slot(uint64_t /*offset*/, UniqueFd /*fd*/)
	{
		return make_error(Errc::invalid_argument, "this memory is not mapped slot by slot");
	}
	virtual void unmap_slot(uint64_t /*offset*/) {}
};

// Where bytes live: a kind of memory and, for a device's, the device (an ordinal of the
// process that holds the value; 0 for system memory, which check_memory() keeps).
struct Memory {
	Storage storage = Storage::system;
	uint32_t device = 0;

	friend bool operator==(const Memory &, const Memory &) = default;
	// Whether ARENA is of this memory.
	bool holds(const Arena &arena) const { return arena.storage() == storage && arena.device() == device; }
};

// Whether memory of STORAGE is a device's: numbered by an ordinal, found by its UUID in
// other processes, GPU work on it ordered (DeviceSync), counted against the device memory
// cap. False for system memory and for a storage this library does not have.
bool on_device(Storage storage);
// STORAGE is one this library has, and DEVICE is 0 unless STORAGE is a device's. WHERE
// begins the message.
Result<void> check_memory(const std::string &where, Storage storage, uint32_t device);
// "system memory", "memory of CUDA device 1": for messages.
std::string memory_name(Memory memory);

// What other processes find MEMORY's device by (a class record's, the segment's): zeros
// for system memory.
struct DeviceIdentity {
	DeviceUuid uuid{};
	bool mig = false;
};
Result<DeviceIdentity> memory_identity(Memory memory, const std::string &where);
// The memory a class record names (STORAGE, the owner's DEVICE and its UUID), as this
// process numbers it: a device found by its UUID, an error naming it when this process
// does not see it. WHERE begins the message.
Result<Memory> memory_here(Storage storage, uint32_t device, const DeviceUuid &uuid, const std::string &where);

// Owner: how GPU work on MEMORY is to be ordered (kSyncNone for system memory; for device
// memory, stream memory operations where the device has them and XMEM_CUDA_SYNC is not
// "cpu", else CPU synchronization).
layout::SyncMode ordering_wanted(Memory memory);
// The ordering of ARENA's memory in this process (see make_device_sync): nullptr for
// memory that needs none. MEM_OPS: the pool's mode lets this process use stream memory
// operations (used where the device has them). FALLBACK receives why not, if not.
Result<std::unique_ptr<DeviceSync>> make_ordering(const ControlSegment &seg, const Arena &arena, bool mem_ops,
						  std::string *fallback);

// Memory of this process's own for a copy (copy-on-write, copy_to_*): HOST, for memory
// the CPU reads; ADDRESS on a device. Freed when the last owner of OWNER lets go (device
// memory once STREAM's work is done, see device_allocate).
struct PrivateMemory {
	std::shared_ptr<void> owner;
	std::byte *host = nullptr;
	uint64_t address = 0;
};
Result<PrivateMemory> allocate_private(Memory memory, uint64_t bytes, void *stream);

// BYTES at HOST (memory the CPU reaches), else at device address ADDRESS, of MEMORY.
struct Place {
	Memory memory;
	std::byte *host = nullptr;
	uint64_t address = 0;
};
// Copies BYTES from FROM to TO: queued on STREAM where a device copies into device memory;
// complete on return where the CPU is to read TO (host memory), or without a stream.
Result<void> copy_bytes(const Place &to, const Place &from, uint64_t bytes, void *stream);

// How many fds a consumer receives for an arena of STORAGE with SLOT_COUNT slots (SPARSE:
// a dynamic class's).
uint32_t arena_fd_count(Storage storage, uint32_t slot_count, bool sparse = false);

// Owner: allocates and maps every slot now.
Result<std::unique_ptr<Arena>> create_arena(const ArenaSpec &spec);
// Consumer: imports the owner's arena from FDS, checking it against SPEC and STRIDE
// (from the validated control segment). WHERE names the pool in errors.
Result<std::unique_ptr<Arena>> import_arena(const ArenaSpec &spec, uint64_t stride, std::vector<UniqueFd> fds,
					    const std::string &where);

// The system-memory arena: one sealed, preallocated memfd, mapped shared.
Result<std::unique_ptr<Arena>> create_memfd_arena(const ArenaSpec &spec);
Result<std::unique_ptr<Arena>> import_memfd_arena(const ArenaSpec &spec, uint64_t stride, UniqueFd fd,
						  const std::string &where);

// The CUDA arena (lib/cuda/): one VMM allocation per slot, exported as an fd.
// Without CUDA support built in, both fail with an error that says so.
Result<std::unique_ptr<Arena>> create_cuda_arena(const ArenaSpec &spec);
Result<std::unique_ptr<Arena>> import_cuda_arena(const ArenaSpec &spec, uint64_t stride, std::vector<UniqueFd> fds,
						 const std::string &where);

} // namespace xmem
