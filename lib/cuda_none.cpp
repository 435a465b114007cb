// cuda_none.cpp - what a libxmem built without CUDA (no cuda.h at build time) says
// when asked for a device pool.
#include "arena.hpp"
#include "device_sync.hpp"

namespace xmem {

namespace {

Error no_cuda(const std::string &where)
{
	return make_error(Errc::invalid_argument,
			  where + ": CUDA storage: this libxmem was built without CUDA support (no cuda.h)");
}

} // namespace

Result<std::unique_ptr<Arena>> create_cuda_arena(const ArenaSpec &spec)
{
	return no_cuda("pool '" + spec.name + "'");
}

Result<std::unique_ptr<Arena>> import_cuda_arena(const ArenaSpec &, uint64_t, std::vector<UniqueFd>,
						 const std::string &where)
{
	return no_cuda(where);
}

Result<std::unique_ptr<DeviceSync>> make_device_sync(const ControlSegment &, const Arena &, bool, std::string *)
{
	return no_cuda("GPU ordering");
}

Result<std::unique_ptr<DeviceSpill>> make_device_spill(DeviceSync &, std::span<std::byte>, std::string *)
{
	return no_cuda("spill tier");
}

Result<std::shared_ptr<void>> device_pin(uint32_t, std::span<std::byte>)
{
	return no_cuda("page-locking");
}

bool device_has_stream_mem_ops(uint32_t)
{
	return false;
}

Result<DeviceUuid> device_uuid(uint32_t, const std::string &where)
{
	return no_cuda(where);
}

Result<uint32_t> device_ordinal(const DeviceUuid &, const std::string &where)
{
	return no_cuda(where);
}

Result<std::shared_ptr<void>> device_allocate(uint32_t, uint64_t, uint64_t *, void *)
{
	return no_cuda("device copy");
}

Result<void> device_copy(uint32_t, uint64_t, bool, uint64_t, bool, uint64_t, void *)
{
	return no_cuda("device copy");
}

Result<void> device_synchronize(uint32_t, void *)
{
	return no_cuda("device synchronize");
}

Result<void> cuda_copy_2d(const Region2D &, const Region2D &, uint64_t, uint64_t, uint32_t, CudaStream)
{
	return no_cuda("2D copy");
}

Result<std::string> cuda_check_device(uint32_t device)
{
	return no_cuda("CUDA device " + std::to_string(device));
}

Result<bool> cuda_stream_done(uint32_t, CudaStream)
{
	return no_cuda("stream query");
}

Result<void> cuda_synchronize(uint32_t, CudaStream)
{
	return no_cuda("CUDA synchronize");
}

Result<void> cuda_synchronize_context(void *)
{
	return no_cuda("CUDA synchronize");
}

Result<void> cuda_stream_wait(CudaStream, CudaStream)
{
	return no_cuda("CUDA stream wait");
}

} // namespace xmem
