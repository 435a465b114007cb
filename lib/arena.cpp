// arena.cpp - the one place that dispatches on a pool's memory kind: which Arena holds a
// class's slots (system memory, CUDA device memory) and how many fds a consumer gets.
#include "arena.hpp"

namespace xmem {

uint32_t arena_fd_count(Storage storage, uint32_t slot_count, bool sparse)
{
	// A CUDA arena exports one allocation per slot; a sparse one's go one at a time.
	if (storage == Storage::cuda)
		return sparse ? 0 : slot_count;
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
