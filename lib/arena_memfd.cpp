// arena_memfd.cpp - the system-memory arena: one sealed memfd holding every slot,
// preallocated by the owner (or, for a dynamic class, committed slot by slot) and
// mapped shared by each consumer.
#include "arena.hpp"
#include "layout.hpp"

#include <fcntl.h>

namespace xmem {

namespace {

constexpr uint64_t kPage = 4096;

class MemfdArena final : public Arena
{
public:
	MemfdArena(UniqueFd fd, Mapping map, uint64_t stride)
		: fd_(std::move(fd)), map_(std::move(map)), stride_(stride)
	{
	}

	Storage storage() const override { return Storage::system; }
	uint32_t device() const override { return 0; }
	uint64_t slot_stride() const override { return stride_; }
	uint64_t size() const override { return map_.size(); }
	std::byte *host(uint64_t offset) const override { return map_.data() + offset; }
	uint64_t device_address(uint64_t) const override { return 0; }
	uint32_t pitch_alignment() const override { return 1; }
	std::vector<int> fds() const override { return { fd_.get() }; }
	Result<void> commit(uint64_t offset, uint64_t size) override
	{
		if (offset > map_.size() || size > map_.size() - offset)
			return make_error(Errc::out_of_range, "slot memory out of the arena's range");
		int err = ::posix_fallocate(fd_.get(), off_t(offset), off_t(size));
		if (err != 0)
			return errno_error("cannot commit " + std::to_string(size) + " bytes of system memory", err);
		return {};
	}
	Result<void> decommit(uint64_t offset, uint64_t size) override
	{
		if (offset > map_.size() || size > map_.size() - offset)
			return make_error(Errc::out_of_range, "slot memory out of the arena's range");
		// The pages go from every mapping; reading them after gives zeros.
		if (::fallocate(fd_.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off_t(offset), off_t(size)) < 0)
			return errno_error("cannot give back " + std::to_string(size) + " bytes of system memory");
		return {};
	}

private:
	UniqueFd fd_;
	Mapping map_;
	uint64_t stride_;
};

} // namespace

Result<std::unique_ptr<Arena>> create_memfd_arena(const ArenaSpec &spec)
{
	uint64_t stride = layout::round_up(spec.slot_size, kPage);
	uint64_t size = stride * spec.slot_count;
	auto fd = make_sealed_memfd("xmem-data:" + spec.name, size, spec.mode, !spec.sparse);
	if (!fd)
		return fd.error();
	auto map = map_shared(fd->get(), size, !spec.sparse, "data arena");
	if (!map)
		return map.error();
	return std::unique_ptr<Arena>(new MemfdArena(std::move(fd.value()), std::move(map.value()), stride));
}

Result<std::unique_ptr<Arena>> import_memfd_arena(const ArenaSpec &spec, uint64_t stride, UniqueFd fd,
						  const std::string &where)
{
	auto map = map_peer_memfd(fd.get(), stride * spec.slot_count, where, "data arena");
	if (!map)
		return map.error();
	return std::unique_ptr<Arena>(new MemfdArena(std::move(fd), std::move(map.value()), stride));
}

} // namespace xmem
