// memfd.cpp - sealed memfds and their shared mappings: how the control segment and
// the system-memory arena are made by an owner and checked by a consumer.
#include "system.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

namespace xmem {

Result<UniqueFd> make_sealed_memfd(const std::string &label, uint64_t size, uint32_t mode, bool preallocate)
{
	UniqueFd fd(::memfd_create(label.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
	if (!fd.valid())
		return errno_error("memfd_create " + label);
	if (::ftruncate(fd.get(), off_t(size)) < 0)
		return errno_error("cannot size " + label + " to " + std::to_string(size) + " bytes");
	// Reserve the pages now: a full tmpfs must fail here, not SIGBUS a writer later.
	if (preallocate) {
		int err = ::posix_fallocate(fd.get(), 0, off_t(size));
		if (err != 0)
			return errno_error("cannot preallocate " + std::to_string(size) + " bytes for " + label, err);
	}
	if (::fchmod(fd.get(), mode & 0777) < 0)
		return errno_error("fchmod " + label);
	// Sealed against resizing, so no peer can truncate it under another's mapping.
	if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0)
		return errno_error("cannot seal " + label);
	return fd;
}

Result<Mapping> map_shared(int fd, uint64_t size, bool populate, const std::string &what)
{
	int flags = MAP_SHARED | (populate ? MAP_POPULATE : 0);
	void *p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, flags, fd, 0);
	if (p == MAP_FAILED)
		return errno_error("mmap " + what);
	return Mapping(p, size);
}

Result<Mapping> map_peer_memfd(int fd, uint64_t min_size, const std::string &where, const char *what)
{
	struct stat st;
	if (::fstat(fd, &st) < 0)
		return errno_error(where + ": fstat " + what);
	if (!S_ISREG(st.st_mode) || uint64_t(st.st_size) < min_size)
		return make_error(Errc::bad_segment, where + ": bad control segment: " + what + " is " +
							     std::to_string(st.st_size) + " bytes, expected " +
							     std::to_string(min_size));
	// Sealed against shrinking, or the owner could make our reads SIGBUS.
	int seals = ::fcntl(fd, F_GET_SEALS);
	if (seals < 0 || !(seals & F_SEAL_SHRINK))
		return make_error(Errc::bad_segment,
				  where + ": bad control segment: " + what + " is not sealed against shrinking");
	void *p = ::mmap(nullptr, size_t(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		return errno_error(where + ": mmap " + what);
	return Mapping(p, size_t(st.st_size));
}

} // namespace xmem
