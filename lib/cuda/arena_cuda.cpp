// arena_cuda.cpp - the CUDA arena: one VMM allocation per slot, exported as a POSIX
// fd, mapped once into one contiguous device range by the owner and each consumer.
#include "../arena.hpp"
#include "../layout.hpp"
#include "contexts.hpp"
#include "driver.hpp"
#include "ordering.hpp"

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <numeric>

namespace xmem {

namespace {

using cuda::ContextScope;
using cuda::cuda_error;
using cuda::Driver;
using cuda::PrimaryContext;

// NVENC takes device frames whose pitch is a multiple of 256 without a copy; CUDA
// textures want the device's texture pitch alignment, which is smaller today.
constexpr uint32_t kMinPitchAlignment = 256;

CUmemAllocationProp allocation_prop(CUdevice device)
{
	CUmemAllocationProp prop{};
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = device;
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	return prop;
}

// The device's allocation granularity, MINIMUM or RECOMMENDED: cuMemCreate's sizes and
// cuMemMap's addresses, sizes and offsets must be multiples of the minimum (cuda.h); the
// recommended one is for performance. Current context: the device's.
Result<uint64_t> granularity(const Driver &d, CUdevice device, CUmemAllocationGranularity_flags option,
			     const std::string &where)
{
	CUmemAllocationProp prop = allocation_prop(device);
	size_t g = 0;
	CUresult r = d.cuMemGetAllocationGranularity(&g, &prop, option);
	if (r != CUDA_SUCCESS || g == 0)
		return cuda_error(where, "cuMemGetAllocationGranularity",
				  r == CUDA_SUCCESS ? CUDA_ERROR_INVALID_VALUE : r);
	return uint64_t(g);
}

class CudaArena final : public Arena
{
public:
	CudaArena(std::shared_ptr<PrimaryContext> ctx, uint32_t ordinal, uint32_t count, uint64_t stride,
		  uint64_t alignment, bool sparse)
		: d_(cuda::driver().value()), ctx_(std::move(ctx)), ordinal_(ordinal), count_(count), stride_(stride),
		  alignment_(alignment), sparse_(sparse), mapped_(count, false)
	{
	}

	~CudaArena() override
	{
		ContextScope scope(*ctx_);
		// Every stream of this process that may still read or write a slot finishes
		// first, whatever its context: unmapping under queued work would fault it.
		cuda::synchronize_contexts(*ctx_);
		for (uint32_t i = 0; i < count_; i++)
			if (mapped_[i])
				d_->cuMemUnmap(base_ + CUdeviceptr(i) * stride_, stride_);
		if (base_)
			d_->cuMemAddressFree(base_, size());
		for (CUmemGenericAllocationHandle h : handles_)
			if (h)
				d_->cuMemRelease(h);
	}

	Storage storage() const override { return Storage::cuda; }
	uint32_t device() const override { return ordinal_; }
	uint64_t slot_stride() const override { return stride_; }
	uint64_t size() const override { return stride_ * count_; }
	std::byte *host(uint64_t) const override { return nullptr; }
	uint64_t device_address(uint64_t offset) const override { return base_ + offset; }
	uint32_t pitch_alignment() const override { return pitch_alignment_; }
	std::vector<int> fds() const override
	{
		std::vector<int> out;
		if (!sparse_) // a sparse arena's go one slot at a time (slot_fd)
			for (const UniqueFd &fd : exported_)
				out.push_back(fd.get());
		return out;
	}
	Result<bool> reach_from(uint32_t device) const override
	{
		if (device == ordinal_)
			return true;
		std::lock_guard guard(lock_);
		if (auto it = reach_.find(device); it != reach_.end())
			return it->second;
		const std::string where = "CUDA device " + std::to_string(device) + " reading device " +
					  std::to_string(ordinal_) + "'s slots";
		CUdevice peer = 0;
		if (CUresult r = d_->cuDeviceGet(&peer, int(device)); r != CUDA_SUCCESS)
			return cuda_error(where, "cuDeviceGet", r);
		int can = 0;
		if (CUresult r = d_->cuDeviceCanAccessPeer(&can, peer, ctx_->device()); r != CUDA_SUCCESS)
			return cuda_error(where, "cuDeviceCanAccessPeer", r);
		if (can) {
			// Access is set on this process's mapping, for the whole range cuMemMap
			// mapped (cuMemSetAccess takes no part of one), read-write as for its own
			// device (the flags documented for device memory). It ends with the mapping.
			// A sparse arena's slots mapped later are given it as they are mapped.
			ContextScope scope(*ctx_);
			CUresult r = CUDA_SUCCESS;
			if (!sparse_)
				r = grant(base_, size(), peer);
			for (uint32_t i = 0; sparse_ && i < count_ && r == CUDA_SUCCESS; i++)
				if (mapped_[i])
					r = grant(base_ + CUdeviceptr(i) * stride_, stride_, peer);
			if (r != CUDA_SUCCESS) {
				reach_.emplace(device, false); // refused once: not asked again
				return cuda_error(where, "cuMemSetAccess", r);
			}
		}
		reach_.emplace(device, can != 0);
		return can != 0;
	}

	bool maps_per_slot() const override { return sparse_; }

	// Owner of a sparse arena: a slot's memory is an allocation of its own, made, exported
	// and mapped at the commit; unmapped and released at the decommit (the driver frees
	// it once every consumer's mapping of it is gone too).
	Result<void> commit(uint64_t offset, uint64_t bytes) override
	{
		const std::string where = slot_memory();
		std::lock_guard guard(lock_);
		auto i = slot_in_state(offset, bytes, false, where);
		if (!i)
			return i.error();
		ContextScope scope(*ctx_);
		CUmemAllocationProp prop = allocation_prop(ctx_->device());
		CUmemGenericAllocationHandle h = 0;
		if (CUresult r = d_->cuMemCreate(&h, stride_, &prop, 0); r != CUDA_SUCCESS)
			return cuda_error(where + ": " + std::to_string(stride_) + " bytes", "cuMemCreate", r);
		int fd = -1;
		CUresult r = d_->cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
		if (r != CUDA_SUCCESS) {
			d_->cuMemRelease(h);
			return cuda_error(where, "cuMemExportToShareableHandle", r);
		}
		UniqueFd exported(fd);
		if (auto m = map_one(*i, h, where); !m) {
			d_->cuMemRelease(h);
			return m;
		}
		handles_[*i] = h;
		exported_[*i] = std::move(exported);
		return {};
	}

	Result<void> decommit(uint64_t offset, uint64_t bytes) override
	{
		const std::string where = slot_memory();
		std::lock_guard guard(lock_);
		auto i = slot_in_state(offset, bytes, true, where);
		if (!i)
			return i.error();
		ContextScope scope(*ctx_);
		if (auto r = unmap_one(*i, where); !r)
			return r;
		d_->cuMemRelease(handles_[*i]);
		handles_[*i] = 0;
		exported_[*i] = UniqueFd();
		return {};
	}

	Result<int> slot_fd(uint64_t offset) const override
	{
		std::lock_guard guard(lock_);
		auto i = slot_at(offset, stride_, "slot memory");
		if (!i)
			return i.error();
		if (*i >= exported_.size() || !exported_[*i].valid())
			return make_error(Errc::not_found,
					  "slot memory at offset " + std::to_string(offset) + " is not committed");
		return exported_[*i].get();
	}

	// Consumer of a sparse arena: the slot's memory from the owner's FD, in place of
	// what it mapped before.
	Result<void> map_slot(uint64_t offset, UniqueFd fd) override
	{
		const std::string where = slot_memory();
		std::lock_guard guard(lock_);
		auto i = slot_at(offset, stride_, where);
		if (!i)
			return i.error();
		ContextScope scope(*ctx_);
		if (mapped_[*i])
			if (auto r = unmap_one(*i, where); !r)
				return r;
		CUmemGenericAllocationHandle h = 0;
		CUresult r = d_->cuMemImportFromShareableHandle(&h, reinterpret_cast<void *>(intptr_t(fd.get())),
								CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
		if (r != CUDA_SUCCESS)
			return make_error(Errc::not_a_pool, where + ": slot " + std::to_string(*i) +
								    " is not a CUDA allocation: " +
								    d_->describe("cuMemImportFromShareableHandle", r));
		// The mapping keeps the memory; the import handle goes at once.
		auto m = map_one(*i, h, where);
		d_->cuMemRelease(h);
		return m;
	}

	void unmap_slot(uint64_t offset) override
	{
		std::lock_guard guard(lock_);
		auto i = slot_at(offset, stride_, "slot memory");
		if (!i || !mapped_[*i])
			return;
		ContextScope scope(*ctx_);
		(void)unmap_one(*i, "slot memory");
	}
	std::shared_ptr<PrimaryContext> context() const { return ctx_; }
	void set_pitch_alignment(uint32_t a) { pitch_alignment_ = std::max(a, kMinPitchAlignment); }

	// Owner: allocates, exports and maps every slot.
	Result<void> allocate(const std::string &where)
	{
		ContextScope scope(*ctx_);
		if (auto r = reserve(where); !r)
			return r;
		handles_.assign(count_, 0);
		exported_.resize(count_);
		if (sparse_)
			return {}; // each slot's at its commit
		CUmemAllocationProp prop = allocation_prop(ctx_->device());
		for (uint32_t i = 0; i < count_; i++) {
			CUmemGenericAllocationHandle h;
			if (CUresult r = d_->cuMemCreate(&h, stride_, &prop, 0); r != CUDA_SUCCESS)
				return cuda_error(where + ": slot " + std::to_string(i) + " of " +
							  std::to_string(stride_) + " bytes",
						  "cuMemCreate", r);
			handles_[i] = h;
			int fd = -1;
			if (CUresult r = d_->cuMemExportToShareableHandle(&fd, h,
									  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
			    r != CUDA_SUCCESS)
				return cuda_error(where, "cuMemExportToShareableHandle", r);
			exported_[i] = UniqueFd(fd);
			if (auto m = map(i, h, where); !m)
				return m;
		}
		return set_access(where);
	}

	// Consumer: imports and maps every slot from FDS, releasing each import handle
	// at once (the mapping keeps the memory alive, even past the owner's death).
	Result<void> import(std::vector<UniqueFd> fds, const std::string &where)
	{
		ContextScope scope(*ctx_);
		if (auto r = reserve(where); !r)
			return r;
		for (uint32_t i = 0; i < count_ && !sparse_; i++) {
			CUmemGenericAllocationHandle h;
			CUresult r =
				d_->cuMemImportFromShareableHandle(&h, reinterpret_cast<void *>(intptr_t(fds[i].get())),
								   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
			if (r != CUDA_SUCCESS)
				return make_error(Errc::not_a_pool,
						  where + ": slot " + std::to_string(i) +
							  " is not a CUDA allocation: " +
							  d_->describe("cuMemImportFromShareableHandle", r));
			auto m = map(i, h, where);
			d_->cuMemRelease(h);
			if (!m)
				return m;
		}
		return sparse_ ? Result<void>() : set_access(where);
	}

private:
	// Aligned to the minimum granularity asked for explicitly: the default alignment (0) is
	// not documented, and every slot's mapping starts at base_ + i * stride_.
	Result<void> reserve(const std::string &where)
	{
		if (CUresult r = d_->cuMemAddressReserve(&base_, size(), alignment_, 0, 0); r != CUDA_SUCCESS)
			return cuda_error(where + ": " + std::to_string(size()) + " bytes of device address space",
					  "cuMemAddressReserve", r);
		return {};
	}

	Result<void> map(uint32_t i, CUmemGenericAllocationHandle h, const std::string &where)
	{
		if (CUresult r = d_->cuMemMap(base_ + CUdeviceptr(i) * stride_, stride_, 0, h, 0); r != CUDA_SUCCESS)
			return cuda_error(where + ": slot " + std::to_string(i), "cuMemMap", r);
		mapped_[i] = true;
		return {};
	}

	// Slot I of a sparse arena that OFFSET and BYTES name exactly. The offsets come from
	// the class's layout, never a peer's record; checked all the same.
	Result<uint32_t> slot_at(uint64_t offset, uint64_t bytes, const std::string &where) const
	{
		if (!sparse_ || bytes != stride_ || offset % stride_ != 0 || offset / stride_ >= count_)
			return make_error(Errc::invalid_argument, where + ": offset " + std::to_string(offset) + " (+" +
									  std::to_string(bytes) + ") is no slot of " +
									  std::to_string(stride_) + " bytes of " +
									  std::to_string(count_));
		return uint32_t(offset / stride_);
	}

	std::string slot_memory() const { return "CUDA device " + std::to_string(ordinal_) + " slot memory"; }

	// slot_at's slot, committed (mapped here) or not, as COMMITTED says.
	Result<uint32_t> slot_in_state(uint64_t offset, uint64_t bytes, bool committed, const std::string &where) const
	{
		auto i = slot_at(offset, bytes, where);
		if (i && mapped_[*i] != committed)
			return make_error(Errc::invalid_argument,
					  where + ": slot " + std::to_string(*i) +
						  (committed ? " is not committed" : " is committed already"));
		return i;
	}

	// A new mapping has no access (cuMemSetAccess): its own device's, and that of each peer
	// reach_from granted the arena's.
	Result<void> map_one(uint32_t i, CUmemGenericAllocationHandle h, const std::string &where)
	{
		if (auto m = map(i, h, where); !m)
			return m;
		CUdeviceptr at = base_ + CUdeviceptr(i) * stride_;
		CUresult r = grant(at, stride_, ctx_->device());
		for (auto it = reach_.begin(); it != reach_.end() && r == CUDA_SUCCESS; ++it) {
			CUdevice peer = 0;
			if (it->second && (r = d_->cuDeviceGet(&peer, int(it->first))) == CUDA_SUCCESS)
				r = grant(at, stride_, peer);
		}
		if (r != CUDA_SUCCESS) {
			(void)unmap_one(i, where);
			return cuda_error(where + ": slot " + std::to_string(i), "cuMemSetAccess", r);
		}
		return {};
	}

	// Every stream of this process that may still touch the slot finishes first, as at
	// the arena's end: unmapping under queued work would fault it.
	Result<void> unmap_one(uint32_t i, const std::string &where)
	{
		cuda::synchronize_contexts(*ctx_);
		if (CUresult r = d_->cuMemUnmap(base_ + CUdeviceptr(i) * stride_, stride_); r != CUDA_SUCCESS)
			return cuda_error(where + ": slot " + std::to_string(i), "cuMemUnmap", r);
		mapped_[i] = false;
		return {};
	}

	CUresult grant(CUdeviceptr at, uint64_t bytes, CUdevice device) const
	{
		CUmemAccessDesc access{};
		access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
		access.location.id = device;
		access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
		return d_->cuMemSetAccess(at, bytes, &access, 1);
	}

	Result<void> set_access(const std::string &where)
	{
		if (CUresult r = grant(base_, size(), ctx_->device()); r != CUDA_SUCCESS)
			return cuda_error(where, "cuMemSetAccess", r);
		return {};
	}

	const Driver *d_;
	std::shared_ptr<PrimaryContext> ctx_;
	uint32_t ordinal_;
	uint32_t count_;
	uint64_t stride_;
	uint64_t alignment_; // the device's minimum granularity, which stride_ is a multiple of
	bool sparse_; // slots committed one at a time (ArenaSpec::sparse)
	CUdeviceptr base_ = 0;
	uint32_t pitch_alignment_ = kMinPitchAlignment;
	// Serialises a sparse arena's commits, decommits and maps with reach_from.
	mutable std::mutex lock_;
	std::vector<bool> mapped_; // by slot: mapped here
	std::vector<CUmemGenericAllocationHandle> handles_; // owner only, by slot (0: none)
	std::vector<UniqueFd> exported_; // owner only, by slot
	// Other devices asked about by reach_from: whether they reach this mapping.
	mutable std::map<uint32_t, bool> reach_;
};

} // namespace

Result<std::unique_ptr<Arena>> create_cuda_arena(const ArenaSpec &spec)
{
	std::string where = "pool '" + spec.name + "'";
	auto ctx = PrimaryContext::retain(spec.device, where);
	if (!ctx)
		return ctx.error();
	const Driver *d = cuda::driver().value();
	ContextScope scope(**ctx);
	auto minimum = granularity(*d, (*ctx)->device(), CU_MEM_ALLOC_GRANULARITY_MINIMUM, where);
	if (!minimum)
		return minimum.error();
	auto recommended = granularity(*d, (*ctx)->device(), CU_MEM_ALLOC_GRANULARITY_RECOMMENDED, where);
	if (!recommended)
		return recommended.error();
	// Slots are recommended-sized for speed, and must be multiples of the minimum: cuda.h
	// does not promise that one is a multiple of the other.
	uint64_t stride = layout::round_up(spec.slot_size, std::lcm(*minimum, *recommended));
	auto arena = std::make_unique<CudaArena>(std::move(ctx.value()), spec.device, spec.slot_count, stride, *minimum,
						 spec.sparse);
	if (auto info = cuda::check_device(spec.device, where))
		arena->set_pitch_alignment(info->pitch_alignment);
	if (auto r = arena->allocate(where); !r)
		return r.error();
	return std::unique_ptr<Arena>(std::move(arena));
}

Result<std::unique_ptr<Arena>> import_cuda_arena(const ArenaSpec &spec, uint64_t stride, std::vector<UniqueFd> fds,
						 const std::string &where)
{
	auto ctx = PrimaryContext::retain(spec.device, where);
	if (!ctx)
		return ctx.error();
	uint64_t minimum = 0;
	{
		ContextScope scope(**ctx);
		auto g =
			granularity(*cuda::driver().value(), (*ctx)->device(), CU_MEM_ALLOC_GRANULARITY_MINIMUM, where);
		if (!g)
			return g.error();
		minimum = *g;
	}
	// The owner wrote the stride: each slot is mapped at a multiple of it, which the
	// driver takes only at its minimum granularity.
	uint64_t bytes = 0;
	if (__builtin_mul_overflow(stride, uint64_t(spec.slot_count), &bytes))
		return make_error(Errc::not_a_pool, where + ": the pool's slot stride (" + std::to_string(stride) +
							    " bytes) times its slot count overflows");
	if (stride == 0 || stride % minimum != 0)
		return make_error(Errc::not_a_pool,
				  where + ": the pool's slot stride (" + std::to_string(stride) +
					  " bytes) is not a multiple of CUDA device " + std::to_string(spec.device) +
					  "'s allocation granularity (" + std::to_string(minimum) + " bytes)");
	auto arena = std::make_unique<CudaArena>(std::move(ctx.value()), spec.device, spec.slot_count, stride, minimum,
						 spec.sparse);
	if (auto info = cuda::check_device(spec.device, where))
		arena->set_pitch_alignment(info->pitch_alignment);
	if (auto r = arena->import(std::move(fds), where); !r)
		return r.error();
	return std::unique_ptr<Arena>(std::move(arena));
}

Result<std::unique_ptr<DeviceSync>> make_device_sync(const ControlSegment &seg, const Arena &arena, bool mem_ops,
						     std::string *fallback)
{
	auto *a = dynamic_cast<const CudaArena *>(&arena);
	if (!a)
		return make_error(Errc::invalid_argument, "GPU ordering needs a CUDA arena");
	return std::unique_ptr<DeviceSync>(cuda::Ordering::create(seg, a->context(), mem_ops, fallback));
}

bool device_has_stream_mem_ops(uint32_t device)
{
	auto info = cuda::check_device(device, "");
	return info && info->stream_mem_ops;
}

Result<DeviceUuid> device_uuid(uint32_t ordinal, const std::string &where)
{
	auto loaded = cuda::driver();
	if (!loaded)
		return make_error(loaded.code(), where + ": " + loaded.error().message);
	const cuda::Driver &d = **loaded;
	CUdevice dev = 0;
	if (CUresult r = d.cuDeviceGet(&dev, int(ordinal)); r != CUDA_SUCCESS)
		return cuda::cuda_error(where, "cuDeviceGet", r);
	DeviceUuid uuid;
	bool mig = false;
	if (CUresult r = cuda::read_device_uuid(d, dev, &uuid, &mig); r != CUDA_SUCCESS)
		return cuda::cuda_error(where, "cuDeviceGetUuid", r);
	return uuid;
}

Result<uint32_t> device_ordinal(const DeviceUuid &uuid, const std::string &where)
{
	auto loaded = cuda::driver();
	if (!loaded)
		return make_error(loaded.code(), where + ": " + loaded.error().message);
	int count = 0;
	if (CUresult r = (*loaded)->cuDeviceGetCount(&count); r != CUDA_SUCCESS)
		return cuda::cuda_error(where, "cuDeviceGetCount", r);
	for (int i = 0; i < count; i++) {
		auto candidate = device_uuid(uint32_t(i), where);
		if (!candidate)
			return candidate.error();
		if (*candidate == uuid)
			return uint32_t(i);
	}
	const char *visible = std::getenv("CUDA_VISIBLE_DEVICES"); // NOLINT(concurrency-mt-unsafe): see system.hpp
	std::string name = format_device_uuid(uuid);
	// CUDA shows a process one MIG device at most, and no GPU beside it (NVIDIA's MIG user
	// guide): without CUDA_VISIBLE_DEVICES naming it, a MIG device is easily not the one.
	std::string hint = is_mig_device(uuid) ? "; CUDA shows a process one MIG device at most and no GPU beside it: "
						 "CUDA_VISIBLE_DEVICES=" +
							 name + " picks this one"
					       : "";
	return make_error(Errc::not_found, where + ": the pool's memory is on " + name +
						   ", which this process does not see (" + std::to_string(count) +
						   " CUDA device(s) visible, CUDA_VISIBLE_DEVICES " +
						   (visible ? "'" + std::string(visible) + "'" : "unset") + hint + ")");
}

} // namespace xmem
