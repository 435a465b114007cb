// arena.cpp - the one place that dispatches on a pool's memory kind: which Arena holds a
// class's slots (system memory, CUDA device memory), how many fds a consumer gets, what
// identifies a device, how GPU work on it is ordered, and private memory and its copies.
// A new kind of memory is a case in each switch here and an Arena of its own.
#include "arena.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string_view>

namespace xmem {

bool on_device(Storage storage)
{
	switch (storage) {
	case Storage::system:
		return false;
	case Storage::cuda:
		return true;
	}
	return false;
}

Result<void> check_memory(const std::string &where, Storage storage, uint32_t device)
{
	if (!storage_name(storage))
		return make_error(Errc::invalid_argument,
				  where + ": unknown storage type " + std::to_string(uint32_t(storage)));
	if (!on_device(storage) && device != 0)
		return make_error(Errc::invalid_argument, where + ": a device is only for CUDA storage");
	return {};
}

std::string memory_name(Memory memory)
{
	switch (memory.storage) {
	case Storage::system:
		return "system memory";
	case Storage::cuda:
		return "memory of CUDA device " + std::to_string(memory.device);
	}
	return "memory of storage type " + std::to_string(uint32_t(memory.storage));
}

Result<DeviceIdentity> memory_identity(Memory memory, const std::string &where)
{
	if (memory.storage != Storage::cuda)
		return DeviceIdentity{};
	auto uuid = device_uuid(memory.device, where);
	if (!uuid)
		return uuid.error();
	return DeviceIdentity{ *uuid, is_mig_device(*uuid) }; // device_uuid() noted a MIG device's
}

Result<Memory> memory_here(Storage storage, uint32_t device, const DeviceUuid &uuid, const std::string &where)
{
	// A record without a UUID (system memory) names no device of the owner's.
	if (storage != Storage::cuda || uuid == DeviceUuid{})
		return Memory{ storage, device };
	auto ordinal = device_ordinal(uuid, where);
	if (!ordinal)
		return ordinal.error();
	return Memory{ storage, *ordinal };
}

layout::SyncMode ordering_wanted(Memory memory)
{
	if (memory.storage != Storage::cuda)
		return layout::kSyncNone;
	const char *env = std::getenv("XMEM_CUDA_SYNC"); // NOLINT(concurrency-mt-unsafe): see system.hpp
	if (env && std::string_view(env) == "cpu")
		return layout::kSyncCpu;
	return device_has_stream_mem_ops(memory.device) ? layout::kSyncStreamMemOps : layout::kSyncCpu;
}

Result<std::unique_ptr<DeviceSync>> make_ordering(const ControlSegment &seg, const Arena &arena, bool mem_ops,
						  std::string *fallback)
{
	if (arena.storage() != Storage::cuda)
		return std::unique_ptr<DeviceSync>();
	return make_device_sync(seg, arena, mem_ops && device_has_stream_mem_ops(arena.device()), fallback);
}

Result<PrivateMemory> allocate_private(Memory memory, uint64_t bytes, void *stream)
{
	PrivateMemory made;
	if (memory.storage == Storage::cuda) {
		auto allocated = device_allocate(memory.device, bytes, &made.address, stream);
		if (!allocated)
			return allocated.error();
		made.owner = std::move(allocated.value());
		return made;
	}
	std::shared_ptr<std::byte[]> host(new (std::nothrow) std::byte[std::max<uint64_t>(bytes, 1)]);
	if (!host)
		return make_error(Errc::no_memory, "no memory for a copy of " + std::to_string(bytes) + " bytes");
	made.host = host.get();
	made.owner = std::move(host);
	return made;
}

Result<void> copy_bytes(const Place &to, const Place &from, uint64_t bytes, void *stream)
{
	if (to.host && from.host) {
		std::memcpy(to.host, from.host, bytes);
		return {};
	}
	// Device memory is CUDA's: its copies are the driver's (device_copy).
	if (to.host) {
		// Out of a device, on its context; complete on return: the CPU reads TO next.
		auto copied = device_copy(from.memory.device, uint64_t(uintptr_t(to.host)), false, from.address, true,
					  bytes, stream);
		if (copied && stream)
			copied = device_synchronize(from.memory.device, stream);
		return copied;
	}
	return device_copy(to.memory.device, to.address, true,
			   from.host ? uint64_t(uintptr_t(from.host)) : from.address, !from.host, bytes, stream);
}

uint32_t arena_fd_count(Storage storage, uint32_t slot_count, bool sparse)
{
	// A CUDA arena exports one allocation per slot; a sparse one's go one at a time.
	switch (storage) {
	case Storage::system:
		return 1;
	case Storage::cuda:
		return sparse ? 0 : slot_count;
	}
	return 1;
}

Result<std::unique_ptr<Arena>> create_arena(const ArenaSpec &spec)
{
	switch (spec.storage) {
	case Storage::system:
		return create_memfd_arena(spec);
	case Storage::cuda:
		return create_cuda_arena(spec);
	}
	return make_error(Errc::invalid_argument, "pool '" + spec.name + "': storage type " +
							  std::to_string(uint32_t(spec.storage)) +
							  " is not supported by this library");
}

Result<std::unique_ptr<Arena>> import_arena(const ArenaSpec &spec, uint64_t stride, std::vector<UniqueFd> fds,
					    const std::string &where)
{
	uint32_t want = arena_fd_count(spec.storage, spec.slot_count, spec.sparse);
	if (fds.size() != want)
		return make_error(Errc::not_a_pool, where + ": owner sent " + std::to_string(fds.size()) +
							    " arena file descriptors, expected " +
							    std::to_string(want));
	switch (spec.storage) {
	case Storage::system:
		return import_memfd_arena(spec, stride, std::move(fds[0]), where);
	case Storage::cuda:
		return import_cuda_arena(spec, stride, std::move(fds), where);
	}
	return make_error(Errc::not_a_pool, where + ": storage type " + std::to_string(uint32_t(spec.storage)) +
						    " is not supported by this library");
}

} // namespace xmem
