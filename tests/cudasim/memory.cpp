// memory.cpp - device memory of the CUDA driver simulator: VMM allocations and their fd
// export/import, cuMemAlloc and cuMemAllocPitch, page-locked host memory, host
// registration, and the address look-up operations use.
//
// Every device address is a PROT_NONE reservation, so a CPU dereference by the caller
// faults; bytes live in memfds that the simulator reaches through private aliases.

#include "cudasim.hpp"

#include <algorithm>
#include <cinttypes>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace cudasim {

Backing::Backing(int fd, char *alias, size_t size, int device, unsigned handle_types, std::atomic<uint64_t> *usage)
	: fd_(fd), alias_(alias), size_(size), device_(device), handle_types_(handle_types), usage_(usage)
{
}

Backing::~Backing()
{
	::munmap(alias_, size_);
	::close(fd_);
	if (usage_)
		usage_->fetch_sub(size_, std::memory_order_relaxed);
}

namespace {

constexpr const char *vmm_name_prefix = "cudasim:dev";

uint64_t round_up(uint64_t value, uint64_t align)
{
	return (value + align - 1) / align * align;
}

// Whether any range of the table intersects [addr, addr + size). Ranges are disjoint.
template<typename Table>
bool overlaps(const Table &table, uintptr_t addr, size_t size)
{
	auto it = table.lower_bound(addr + size);
	if (it == table.begin())
		return false;
	--it;
	return it->first + it->second.size > addr;
}

// Charges size bytes to the device, or false when it would exceed its memory.
bool charge(State &s, int device, uint64_t size)
{
	std::atomic<uint64_t> &used = s.usage[size_t(device)];
	uint64_t now = used.load(std::memory_order_relaxed);
	do {
		if (size > s.config.memory || now > s.config.memory - size)
			return false;
	} while (!used.compare_exchange_weak(now, now + size, std::memory_order_relaxed));
	return true;
}

// A memfd of size bytes and its alias. On failure, refunds the charge (when usage is set).
std::shared_ptr<Backing> make_backing(const char *call, const char *name, size_t size, int device,
				      unsigned handle_types, std::atomic<uint64_t> *usage, CUresult *err)
{
	int fd = memfd_create(name, MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, off_t(size)) < 0) {
		*err = fail(CUDA_ERROR_OUT_OF_MEMORY, call, "memfd: %s", std::strerror(errno));
		if (fd >= 0)
			::close(fd);
		if (usage)
			usage->fetch_sub(size, std::memory_order_relaxed);
		return nullptr;
	}
	void *alias = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (alias == MAP_FAILED) {
		*err = fail(CUDA_ERROR_OUT_OF_MEMORY, call, "mmap: %s", std::strerror(errno));
		::close(fd);
		if (usage)
			usage->fetch_sub(size, std::memory_order_relaxed);
		return nullptr;
	}
	return std::make_shared<Backing>(fd, static_cast<char *>(alias), size, device, handle_types, usage);
}

} // namespace

// With exactly, aligned to align and never to twice align: code that assumes more alignment
// than it asked for (or than the driver's default) fails here, whatever addresses the
// kernel picks.
uintptr_t reserve_va(size_t size, size_t align, bool exactly)
{
	size_t span = size + (exactly ? 2 * align : align) - page_size();
	void *p = mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (p == MAP_FAILED)
		return 0;
	uintptr_t start = uintptr_t(p);
	uintptr_t aligned = round_up(start, align);
	if (exactly && aligned % (2 * align) == 0)
		aligned += align;
	if (aligned > start)
		::munmap(p, aligned - start);
	uintptr_t tail = aligned + size;
	if (start + span > tail)
		::munmap(reinterpret_cast<void *>(tail), start + span - tail);
	return aligned;
}

namespace {

// The mappings that tile [ptr, ptr + size) exactly, in address order, or empty when the
// range is not exactly a run of whole, adjacent VMM mappings. Caller holds State::lock.
std::vector<std::map<uintptr_t, Mapping>::iterator> whole_mappings(State &s, uintptr_t ptr, size_t size)
{
	std::vector<std::map<uintptr_t, Mapping>::iterator> run;
	if (size == 0 || ptr + size < ptr)
		return {};
	uintptr_t pos = ptr;
	while (pos < ptr + size) {
		auto it = s.mappings.find(pos);
		if (it == s.mappings.end() || it->second.plain)
			return {};
		pos += it->second.size;
		run.push_back(it);
	}
	if (pos != ptr + size)
		return {};
	return run;
}

// Host memory page-locked in this process (host registrations and cuMemAllocHost, by
// whole pages), held against XMEM_CUDASIM_HOST_PIN_LIMIT. Changed under State::lock.
uint64_t pinned_bytes = 0;

// Charges size bytes of page-locked host memory, or false when the pin limit forbids it.
// Caller holds State::lock.
bool pin(State &s, size_t size)
{
	if (size > s.config.pin_limit || pinned_bytes > s.config.pin_limit - size)
		return false;
	pinned_bytes += size;
	return true;
}

// Caller holds State::lock.
void unpin(size_t size)
{
	pinned_bytes -= std::min<uint64_t>(size, pinned_bytes);
}

// Whether every page of [start, start + size) is mapped readable, and writable unless
// read_only, as the process's memory map (/proc/self/maps) says. The driver pins the
// pages of a registration for the device to write (get_user_pages with FOLL_WRITE) unless
// CU_MEMHOSTREGISTER_READ_ONLY says it will only read them, so a read-only or PROT_NONE
// mapping fails. False with why set otherwise.
bool pinnable(uintptr_t start, size_t size, bool read_only, std::string &why)
{
	FILE *maps = std::fopen("/proc/self/maps", "re");
	if (!maps) {
		why = std::string("cannot read /proc/self/maps: ") + std::strerror(errno);
		return false;
	}
	uintptr_t pos = start;
	uintptr_t end = start + size;
	// Whole lines, however long their path: a line's tail must not parse as a range.
	char *line = nullptr;
	size_t capacity = 0;
	while (pos < end && getline(&line, &capacity, maps) > 0) {
		unsigned long lo = 0, hi = 0;
		char perms[5] = {};
		if (std::sscanf(line, "%lx-%lx %4s", &lo, &hi, perms) != 3 || hi <= pos)
			continue;
		if (lo > pos)
			break; // a hole at pos
		if (perms[0] != 'r') {
			why = "not readable (PROT_NONE or write-only)";
			break;
		}
		if (perms[1] != 'w' && !read_only) {
			why = "mapped read-only: the driver pins pages for the device to write unless "
			      "CU_MEMHOSTREGISTER_READ_ONLY is given";
			break;
		}
		pos = hi;
	}
	std::free(line);
	std::fclose(maps);
	if (pos >= end)
		return true;
	if (why.empty())
		why = "not mapped memory";
	return false;
}

} // namespace

void retire(State &s, uintptr_t base, size_t size)
{
	s.retired[base] = Retired{ size };
}

namespace {

// Frees the pages of a cuMemAllocHost allocation but keeps the range reserved PROT_NONE, so
// a CPU access through a stale pointer faults instead of landing in reused memory.
void retire_host(State &s, uintptr_t base, size_t size)
{
	s.retired_host[base] = Retired{ size };
	mmap(reinterpret_cast<void *>(base), size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
	     -1, 0);
}

// Why addr does not resolve, for the illegal-access line. Caller holds State::lock.
std::string describe_unresolved(State &s, uintptr_t addr)
{
	if (auto r = find_containing(s.reservations, addr); r != s.reservations.end()) {
		if (r->second.ipc)
			return "past the end of memory cuIpcOpenMemHandle opened";
		return r->second.plain ? "past the end of a cuMemAlloc allocation" : "reserved but not mapped";
	}
	if (find_containing(s.host_aliases, addr) != s.host_aliases.end())
		return "past the end of a host registration";
	if (find_containing(s.retired, addr) != s.retired.end())
		return "freed, unmapped or unregistered memory";
	if (find_containing(s.host_registrations, addr) != s.host_registrations.end())
		return "a registered host pointer, not its cuMemHostGetDevicePointer address";
	return "not a device address";
}

bool resolve_device(State &s, uintptr_t addr, size_t size, int device, Access access, Segments &out, Fault &fault)
{
	uintptr_t pos = addr;
	uintptr_t end = addr + size;
	while (pos < end) {
		if (auto m = find_containing(s.mappings, pos); m != s.mappings.end()) {
			const Mapping &map = m->second;
			if (map.owner && executing_context && map.owner != executing_context &&
			    !executing_context->peers.count(map.owner)) {
				fault = { pos, std::string("cuMemAlloc memory of ") + describe(*map.owner) +
						       ", touched by a stream of " + describe(*executing_context) +
						       " (another context reaches it only through peer access, "
						       "cuCtxEnablePeerAccess)" };
				return false;
			}
			CUmemAccess_flags granted = map.access[size_t(device)];
			if (granted == CU_MEM_ACCESS_FLAGS_PROT_NONE) {
				fault = { pos, "mapped, but cuMemSetAccess gave device " + std::to_string(device) +
						       " no access" };
				return false;
			}
			if (access == Access::write && granted != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
				fault = { pos,
					  "a write to memory mapped read-only for device " + std::to_string(device) };
				return false;
			}
			size_t n = std::min<uintptr_t>(end - pos, m->first + map.size - pos);
			out.push_back({ map.backing->alias() + map.offset + (pos - m->first), n, map.backing });
			pos += n;
			continue;
		}
		if (auto a = find_containing(s.host_aliases, pos); a != s.host_aliases.end()) {
			const HostRegistration &reg = s.host_registrations.at(a->second.host);
			if (pos < reg.dptr || pos - reg.dptr >= reg.size) {
				fault = { pos, "past the end of a host registration" };
				return false;
			}
			if (access == Access::write && (reg.flags & CU_MEMHOSTREGISTER_READ_ONLY)) {
				fault = { pos, "a write to host memory registered read-only" };
				return false;
			}
			// Strict: memory registered without PORTABLE is pinned for the registering
			// context only (cuMemHostRegister), so only its streams may touch it.
			if (!(reg.flags & CU_MEMHOSTREGISTER_PORTABLE) && executing_context &&
			    reg.owner != executing_context) {
				fault = { pos, "host memory " + describe(*reg.owner) +
						       " registered without CU_MEMHOSTREGISTER_PORTABLE, touched by a "
						       "stream of " +
						       describe(*executing_context) };
				return false;
			}
			size_t n = std::min<uintptr_t>(end - pos, reg.dptr + reg.size - pos);
			out.push_back({ reinterpret_cast<char *>(a->second.host + (pos - reg.dptr)), n, nullptr });
			pos += n;
			continue;
		}
		fault = { pos, describe_unresolved(s, pos) };
		return false;
	}
	return true;
}

} // namespace

thread_local Context *executing_context = nullptr;

bool in_device_space(const State &s, uintptr_t addr, size_t size)
{
	return overlaps(s.reservations, addr, size) || overlaps(s.host_aliases, addr, size) ||
	       overlaps(s.retired, addr, size);
}

bool resolve(State &s, Space space, uintptr_t addr, size_t size, int device, Access access, Segments &out, Fault &fault)
{
	out.clear();
	if (size == 0)
		return true;
	if (addr + size < addr) {
		fault = { addr, "the range wraps around the address space" };
		return false;
	}
	if (space == Space::unified)
		space = in_device_space(s, addr, size) ? Space::device : Space::host;
	if (space == Space::device)
		return resolve_device(s, addr, size, device, access, out, fault);

	// A pageable or registered host pointer, as the CPU sees it; a device address here
	// would crash the copy, and is a caller bug the real driver reports too.
	if (in_device_space(s, addr, size)) {
		fault = { addr, "a device address passed as a host pointer" };
		return false;
	}
	if (overlaps(s.retired_host, addr, size)) {
		fault = { addr, "freed cuMemAllocHost memory" };
		return false;
	}
	out.push_back({ reinterpret_cast<char *>(addr), size, nullptr });
	return true;
}

void release_context_memory(State &s, Context &ctx, std::vector<std::shared_ptr<Backing>> &dead)
{
	for (auto it = s.reservations.begin(); it != s.reservations.end();) {
		if (!it->second.plain || it->second.owner != &ctx) {
			++it;
			continue;
		}
		if (auto m = s.mappings.find(it->first); m != s.mappings.end()) {
			dead.push_back(std::move(m->second.backing));
			s.mappings.erase(m);
		}
		retire(s, it->first, it->second.size);
		it = s.reservations.erase(it);
	}
	// What it opened with cuIpcOpenMemHandle went with its plain reservations.
	std::erase_if(s.ipc_imports, [&ctx](const auto &entry) { return entry.second.ctx == &ctx; });

	for (auto it = s.host_registrations.begin(); it != s.host_registrations.end();) {
		if (it->second.owner != &ctx) {
			++it;
			continue;
		}
		unpin(it->second.alias_size);
		s.host_aliases.erase(it->second.alias_base);
		retire(s, it->second.alias_base, it->second.alias_size);
		it = s.host_registrations.erase(it);
	}

	for (auto it = s.host_allocations.begin(); it != s.host_allocations.end();) {
		if (it->second.owner != &ctx) {
			++it;
			continue;
		}
		unpin(it->second.size);
		retire_host(s, it->first, it->second.size);
		it = s.host_allocations.erase(it);
	}
}

} // namespace cudasim

using namespace cudasim;

namespace {

// The checks every VMM call starts with.
CUresult vmm_call(const char *call, Context **ctx)
{
	if (CUresult r = current_context(call, ctx))
		return r;
	if (state()->config.fail.no_vmm)
		return fail(CUDA_ERROR_NOT_SUPPORTED, call, "no VMM (XMEM_CUDASIM_FAIL=no_vmm)");
	return CUDA_SUCCESS;
}

CUresult check_prop(const char *call, State &s, const CUmemAllocationProp *prop)
{
	if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED)
		return fail(CUDA_ERROR_INVALID_VALUE, call, "prop->type %d is not CU_MEM_ALLOCATION_TYPE_PINNED",
			    int(prop->type));
	if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
		return fail(CUDA_ERROR_INVALID_VALUE, call, "prop->location.type %d is not CU_MEM_LOCATION_TYPE_DEVICE",
			    int(prop->location.type));
	if (prop->location.id < 0 || prop->location.id >= s.config.devices)
		return fail(CUDA_ERROR_INVALID_DEVICE, call, "prop->location.id %d", prop->location.id);
	return CUDA_SUCCESS;
}

} // namespace

CUresult CUDAAPI cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
					       CUmemAllocationGranularity_flags option)
{
	Context *ctx = nullptr;
	if (CUresult r = vmm_call("cuMemGetAllocationGranularity", &ctx))
		return r;
	State &s = *state();
	if (!granularity || !prop)
		return CUDA_ERROR_INVALID_VALUE;
	if (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)
		return fail(CUDA_ERROR_INVALID_VALUE, "cuMemGetAllocationGranularity", "option %d", int(option));
	if (CUresult r = check_prop("cuMemGetAllocationGranularity", s, prop))
		return r;
	*granularity = size_t(option == CU_MEM_ALLOC_GRANULARITY_MINIMUM ? s.config.granularity
									 : s.config.recommended_granularity);
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
			     unsigned long long flags)
{
	return guarded([&] {
		const char *call = "cuMemCreate";
		Context *ctx = nullptr;
		if (CUresult r = vmm_call(call, &ctx))
			return r;
		State &s = *state();
		if (!handle || !prop || flags)
			return fail(CUDA_ERROR_INVALID_VALUE, call, "null handle or prop, or flags");
		if (CUresult r = check_prop(call, s, prop))
			return r;
		if (prop->requestedHandleTypes & ~unsigned(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
			return fail(CUDA_ERROR_NOT_SUPPORTED, call, "requestedHandleTypes 0x%x",
				    unsigned(prop->requestedHandleTypes));
		if (size == 0 || size % s.config.granularity)
			return fail(CUDA_ERROR_INVALID_VALUE, call, "size %zu is not a non-zero multiple of %" PRIu64,
				    size, s.config.granularity);
		int device = prop->location.id;
		if (s.config.fail.alloc)
			return fail(CUDA_ERROR_OUT_OF_MEMORY, call, "XMEM_CUDASIM_FAIL=alloc");
		if (!charge(s, device, size))
			return fail(CUDA_ERROR_OUT_OF_MEMORY, call,
				    "device %d has %" PRIu64 " of %" PRIu64 " bytes in use", device,
				    s.usage[size_t(device)].load(), s.config.memory);

		// The name lets an importer recognize the fd (cudasim:dev<N>:<size>), N the
		// device's number on the simulated machine, which every process agrees on.
		char name[64];
		std::snprintf(name, sizeof(name), "%s%d:%zu", vmm_name_prefix, s.config.visible[size_t(device)], size);
		CUresult err = CUDA_SUCCESS;
		auto backing = make_backing(call, name, size, device, unsigned(prop->requestedHandleTypes),
					    &s.usage[size_t(device)], &err);
		if (!backing)
			return err;

		std::lock_guard<std::mutex> guard(s.lock);
		CUmemGenericAllocationHandle h = s.next_handle++;
		s.handles[h] = Handle{ std::move(backing) };
		*handle = h;
		return CUDA_SUCCESS;
	});
}

CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle)
{
	return guarded([&] {
		Context *ctx = nullptr;
		if (CUresult r = vmm_call("cuMemRelease", &ctx))
			return r;
		State &s = *state();
		std::shared_ptr<Backing> dropped; // freed after unlocking, if no mapping holds it
		std::lock_guard<std::mutex> guard(s.lock);
		auto it = s.handles.find(handle);
		if (it == s.handles.end())
			return fail(CUDA_ERROR_INVALID_VALUE, "cuMemRelease", "unknown handle 0x%llx", handle);
		if (--it->second.refs == 0) {
			dropped = std::move(it->second.backing);
			s.handles.erase(it);
		}
		return CUDA_SUCCESS;
	});
}

CUresult CUDAAPI cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle,
					      CUmemAllocationHandleType handleType, unsigned long long flags)
{
	return guarded([&] {
		const char *call = "cuMemExportToShareableHandle";
		Context *ctx = nullptr;
		if (CUresult r = vmm_call(call, &ctx))
			return r;
		State &s = *state();
		if (!shareableHandle || flags)
			return fail(CUDA_ERROR_INVALID_VALUE, call, "null shareableHandle or flags");
		if (handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
			return fail(CUDA_ERROR_NOT_SUPPORTED, call, "handle type %d", int(handleType));
		if (s.config.fail.no_posix_fd)
			return fail(CUDA_ERROR_NOT_SUPPORTED, call, "XMEM_CUDASIM_FAIL=no_posix_fd");

		std::lock_guard<std::mutex> guard(s.lock);
		auto it = s.handles.find(handle);
		if (it == s.handles.end())
			return fail(CUDA_ERROR_INVALID_VALUE, call, "unknown handle 0x%llx", handle);
		if (!(it->second.backing->handle_types() & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
			return fail(CUDA_ERROR_INVALID_VALUE, call,
				    "cuMemCreate did not request CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR");
		int fd = fcntl(it->second.backing->fd(), F_DUPFD_CLOEXEC, 0);
		if (fd < 0)
			return fail(CUDA_ERROR_OPERATING_SYSTEM, call, "dup: %s", std::strerror(errno));
		*static_cast<int *>(shareableHandle) = fd;
		return CUDA_SUCCESS;
	});
}

CUresult CUDAAPI cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle,
						CUmemAllocationHandleType shHandleType)
{
	return guarded([&] {
		const char *call = "cuMemImportFromShareableHandle";
		Context *ctx = nullptr;
		if (CUresult r = vmm_call(call, &ctx))
			return r;
		State &s = *state();
		if (!handle)
			return CUDA_ERROR_INVALID_VALUE;
		if (shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
			return fail(CUDA_ERROR_NOT_SUPPORTED, call, "handle type %d", int(shHandleType));
		if (s.config.fail.no_posix_fd)
			return fail(CUDA_ERROR_NOT_SUPPORTED, call, "XMEM_CUDASIM_FAIL=no_posix_fd");

		intptr_t value = intptr_t(reinterpret_cast<uintptr_t>(osHandle));
		if (value < 0 || value > INT_MAX)
			return fail(CUDA_ERROR_INVALID_VALUE, call, "osHandle %" PRIdPTR " is not an fd", value);
		int fd = int(value);

		// Only an fd exported by a simulator (in any process) is an allocation.
		char link[64];
		char target[256] = {};
		std::snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
		ssize_t n = readlink(link, target, sizeof(target) - 1);
		std::string prefix = std::string("/memfd:") + vmm_name_prefix;
		int device = -1;
		size_t size = 0;
		if (n <= 0 || std::strncmp(target, prefix.c_str(), prefix.size()) != 0 ||
		    std::sscanf(target + prefix.size(), "%d:%zu", &device, &size) != 2)
			return fail(CUDA_ERROR_INVALID_VALUE, call, "fd %d (%s) is not an exported allocation", fd,
				    n > 0 ? target : "not open");
		struct stat st;
		if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || uint64_t(st.st_size) != size || size == 0)
			return fail(CUDA_ERROR_INVALID_VALUE, call, "fd %d does not hold %zu bytes", fd, size);
		// This process's ordinal of the machine's device N.
		int physical = device;
		if (physical < 0 || size_t(physical) >= s.config.machine.size())
			return fail(CUDA_ERROR_INVALID_DEVICE, call,
				    "fd %d is memory of device %d, not of this machine", fd, physical);
		auto seen = std::find(s.config.visible.begin(), s.config.visible.end(), physical);
		if (seen == s.config.visible.end())
			return fail(CUDA_ERROR_INVALID_DEVICE, call,
				    "fd %d is memory of the machine's device %d (%s), which this process does not see",
				    fd, physical, machine_uuid_text(s.config.machine[size_t(physical)]).c_str());
		device = int(seen - s.config.visible.begin());

		// The caller keeps its fd: the allocation holds a duplicate.
		int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
		if (own < 0)
			return fail(CUDA_ERROR_OPERATING_SYSTEM, call, "dup: %s", std::strerror(errno));
		void *alias = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, own, 0);
		if (alias == MAP_FAILED) {
			::close(own);
			return fail(CUDA_ERROR_OUT_OF_MEMORY, call, "mmap: %s", std::strerror(errno));
		}
		// Imported memory was charged to the exporter's device, not to this process.
		auto backing = std::make_shared<Backing>(own, static_cast<char *>(alias), size, device,
							 unsigned(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR), nullptr);

		std::lock_guard<std::mutex> guard(s.lock);
		CUmemGenericAllocationHandle h = s.next_handle++;
		s.handles[h] = Handle{ std::move(backing) };
		*handle = h;
		return CUDA_SUCCESS;
	});
}

CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
				     unsigned long long flags)
{
	return guarded([&] {
		const char *call = "cuMemAddressReserve";
		Context *ctx = nullptr;
		if (CUresult r = vmm_call(call, &ctx))
			return r;
		State &s = *state();
		if (!ptr || flags)
			return fail(CUDA_ERROR_INVALID_VALUE, call, "null ptr or flags");
		if (size == 0 || size % s.config.granularity)
			return fail(CUDA_ERROR_INVALID_VALUE, call, "size %zu is not a non-zero multiple of %" PRIu64,
				    size, s.config.granularity);
		if (alignment & (alignment - 1))
			return fail(CUDA_ERROR_INVALID_VALUE, call, "alignment %zu is not a power of two", alignment);
		// cuda.h says only "a power of two or zero"; what the driver makes of one below the
		// granularity is not documented. Strict: refused, since cuMemMap needs the start of
		// a mapping aligned to the minimum granularity.
		if (alignment % s.config.granularity)
			return fail(CUDA_ERROR_INVALID_VALUE, call,
				    "alignment %zu is not 0 or a multiple of the minimum granularity %" PRIu64,
				    alignment, s.config.granularity);
		if (addr % page_size())
			return fail(CUDA_ERROR_INVALID_VALUE, call, "hint 0x%llx is not page aligned", addr);

		// The hint is only a hint; the simulator ignores it. The reservation is aligned as
		// asked (0: to the minimum granularity, the least any mapping needs) and no more.
		size_t align = std::max<size_t>(alignment, size_t(s.config.granularity));
		uintptr_t va = reserve_va(size, align, true);
		if (!va)
			return fail(CUDA_ERROR_OUT_OF_MEMORY, call, "mmap: %s", std::strerror(errno));

		std::lock_guard<std::mutex> guard(s.lock);
		s.reservations[va] = Reservation{ size, false, nullptr };
		*ptr = CUdeviceptr(va);
		return CUDA_SUCCESS;
	});
}

CUresult CUDAAPI cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
	return guarded([&] {
		const char *call = "cuMemAddressFree";
		Context *ctx = nullptr;
		if (CUresult r = vmm_call(call, &ctx))
			return r;
		State &s = *state();
		std::lock_guard<std::mutex> guard(s.lock);
		auto it = s.reservations.find(uintptr_t(ptr));
		if (it == s.reservations.end() || it->second.plain)
			return fail(CUDA_ERROR_INVALID_VALUE, call, "0x%llx is not a reservation", ptr);
		if (it->second.size != size)
			return fail(CUDA_ERROR_INVALID_VALUE, call, "size %zu, reserved %zu", size, it->second.size);
		if (overlaps(s.mappings, uintptr_t(ptr), size))
			return fail(CUDA_ERROR_INVALID_VALUE, call, "0x%llx is still mapped: cuMemUnmap first", ptr);
		retire(s, it->first, it->second.size);
		s.reservations.erase(it);
		return CUDA_SUCCESS;
	});
}

CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
			  unsigned long long flags)
{
	return guarded([&] {
		const char *call = "cuMemMap";
		Context *ctx = nullptr;
		if (CUresult r = vmm_call(call, &ctx))
			return r;
		State &s = *state();
		uint64_t g = s.config.granularity;
		if (flags)
			return fail(CUDA_ERROR_INVALID_VALUE, call, "flags 0x%llx", flags);
		if (size == 0 || size % g || ptr % g || offset % g)
			return fail(CUDA_ERROR_INVALID_VALUE, call,
				    "ptr 0x%llx, size %zu, offset %zu: each must be a multiple of %" PRIu64, ptr, size,
				    offset, g);
		if (ptr + size < ptr)
			return CUDA_ERROR_INVALID_VALUE;

		std::lock_guard<std::mutex> guard(s.lock);
		auto h = s.handles.find(handle);
		if (h == s.handles.end())
			return fail(CUDA_ERROR_INVALID_VALUE, call, "unknown handle 0x%llx", handle);
		const std::shared_ptr<Backing> &backing = h->second.backing;
		if (offset > backing->size() || size > backing->size() - offset)
			return fail(CUDA_ERROR_INVALID_VALUE, call, "offset %zu + size %zu exceed the allocation's %zu",
				    offset, size, backing->size());
		auto r = find_containing(s.reservations, uintptr_t(ptr));
		if (r == s.reservations.end() || r->second.plain || ptr + size > r->first + r->second.size)
			return fail(CUDA_ERROR_INVALID_VALUE, call, "[0x%llx, +%zu) is not inside one reservation", ptr,
				    size);
		if (overlaps(s.mappings, uintptr_t(ptr), size))
			return fail(CUDA_ERROR_INVALID_VALUE, call, "[0x%llx, +%zu) is already mapped", ptr, size);

		Mapping map;
		map.size = size;
		map.offset = offset;
		map.backing = backing;
		map.access.assign(size_t(s.config.devices), CU_MEM_ACCESS_FLAGS_PROT_NONE);
		map.handle = handle;
		s.mappings[uintptr_t(ptr)] = std::move(map);
		return CUDA_SUCCESS;
	});
}

CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size)
{
	return guarded([&] {
		const char *call = "cuMemUnmap";
		Context *ctx = nullptr;
		if (CUresult r = vmm_call(call, &ctx))
			return r;
		State &s = *state();
		std::vector<std::shared_ptr<Backing>> dropped; // freed after unlocking if released
		std::lock_guard<std::mutex> guard(s.lock);
		auto run = whole_mappings(s, uintptr_t(ptr), size);
		if (run.empty())
			return fail(CUDA_ERROR_INVALID_VALUE, call, "[0x%llx, +%zu) is not exactly mapped", ptr, size);
		for (auto it : run) {
			dropped.push_back(std::move(it->second.backing));
			s.mappings.erase(it);
		}
		return CUDA_SUCCESS;
	});
}

CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
	return guarded([&] {
		const char *call = "cuMemSetAccess";
		Context *ctx = nullptr;
		if (CUresult r = vmm_call(call, &ctx))
			return r;
		State &s = *state();
		if (!desc || count == 0)
			return fail(CUDA_ERROR_INVALID_VALUE, call, "no descriptors");
		for (size_t i = 0; i < count; i++) {
			const CUmemAccessDesc &d = desc[i];
			if (d.location.type != CU_MEM_LOCATION_TYPE_DEVICE)
				return fail(CUDA_ERROR_INVALID_VALUE, call, "desc[%zu].location.type %d", i,
					    int(d.location.type));
			if (d.location.id < 0 || d.location.id >= s.config.devices)
				return fail(CUDA_ERROR_INVALID_DEVICE, call, "desc[%zu].location.id %d", i,
					    d.location.id);
			if (d.flags != CU_MEM_ACCESS_FLAGS_PROT_NONE && d.flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
			    d.flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
				return fail(CUDA_ERROR_INVALID_VALUE, call, "desc[%zu].flags %d", i, int(d.flags));
		}

		std::lock_guard<std::mutex> guard(s.lock);
		auto run = whole_mappings(s, uintptr_t(ptr), size);
		if (run.empty())
			return fail(CUDA_ERROR_INVALID_VALUE, call, "[0x%llx, +%zu) is not exactly mapped", ptr, size);
		// A device reaches another's memory only where cuDeviceCanAccessPeer says so
		// (never, unless XMEM_CUDASIM_PEER=all): access for any other device is refused,
		// so mapping an allocation for the wrong ordinal fails here, not silently.
		for (auto it : run) {
			for (size_t i = 0; i < count; i++) {
				int owner = it->second.backing->device();
				int device = desc[i].location.id;
				if (device != owner && desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE &&
				    !can_access_peer(s.config, device, owner))
					return fail(CUDA_ERROR_INVALID_DEVICE, call,
						    "desc[%zu]: device %d cannot access memory of device %d "
						    "(cuDeviceCanAccessPeer is 0)",
						    i, device, owner);
			}
		}
		for (auto it : run) {
			for (size_t i = 0; i < count; i++)
				it->second.access[size_t(desc[i].location.id)] = desc[i].flags;
		}
		return CUDA_SUCCESS;
	});
}

CUresult CUDAAPI cuMemGetAccess(unsigned long long *flags, const CUmemLocation *location, CUdeviceptr ptr)
{
	return guarded([&] {
		const char *call = "cuMemGetAccess";
		Context *ctx = nullptr;
		if (CUresult r = vmm_call(call, &ctx))
			return r;
		State &s = *state();
		if (!flags || !location)
			return fail(CUDA_ERROR_INVALID_VALUE, call, "null flags or location");
		if (location->type != CU_MEM_LOCATION_TYPE_DEVICE)
			return fail(CUDA_ERROR_INVALID_VALUE, call, "location type %d", int(location->type));
		if (location->id < 0 || location->id >= s.config.devices)
			return fail(CUDA_ERROR_INVALID_DEVICE, call, "location id %d", location->id);
		std::lock_guard<std::mutex> guard(s.lock);
		// VMM mappings only: what cuMemSetAccess set for the device (none until then).
		auto m = find_containing(s.mappings, uintptr_t(ptr));
		if (m == s.mappings.end() || m->second.plain)
			return fail(CUDA_ERROR_INVALID_VALUE, call, "0x%llx is not mapped by cuMemMap", ptr);
		*flags = m->second.access[size_t(location->id)];
		return CUDA_SUCCESS;
	});
}

CUresult CUDAAPI cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
	return guarded([&] {
		const char *call = "cuMemRetainAllocationHandle";
		Context *ctx = nullptr;
		if (CUresult r = vmm_call(call, &ctx))
			return r;
		State &s = *state();
		if (!handle)
			return fail(CUDA_ERROR_INVALID_VALUE, call, "null handle");
		std::lock_guard<std::mutex> guard(s.lock);
		// Any address of a range cuMemMap mapped, not only its start; the handle is the one
		// mapped there, back again if every cuMemRelease let it go, and needs one more.
		auto m = find_containing(s.mappings, reinterpret_cast<uintptr_t>(addr));
		if (m == s.mappings.end() || m->second.plain)
			return fail(CUDA_ERROR_INVALID_VALUE, call, "%p is not mapped by cuMemMap", addr);
		auto it = s.handles.try_emplace(m->second.handle, Handle{ m->second.backing, 0 }).first;
		it->second.refs++;
		*handle = m->second.handle;
		return CUDA_SUCCESS;
	});
}

CUresult CUDAAPI cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop, CUmemGenericAllocationHandle handle)
{
	return guarded([&] {
		const char *call = "cuMemGetAllocationPropertiesFromHandle";
		Context *ctx = nullptr;
		if (CUresult r = vmm_call(call, &ctx))
			return r;
		State &s = *state();
		if (!prop)
			return fail(CUDA_ERROR_INVALID_VALUE, call, "null prop");
		std::lock_guard<std::mutex> guard(s.lock);
		auto it = s.handles.find(handle);
		if (it == s.handles.end())
			return fail(CUDA_ERROR_INVALID_VALUE, call, "unknown handle 0x%llx", handle);
		// The allocation's device as this process numbers it (an imported one's too).
		*prop = CUmemAllocationProp{};
		prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
		prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
		prop->location.id = it->second.backing->device();
		prop->requestedHandleTypes = CUmemAllocationHandleType(it->second.backing->handle_types());
		return CUDA_SUCCESS;
	});
}

namespace {

// cuMemAlloc's device memory of the current context ctx: bytesize bytes, CPU-inaccessible,
// freed with the context. Its call has checked dptr and bytesize.
CUresult alloc_plain(const char *call, Context *ctx, CUdeviceptr *dptr, size_t bytesize)
{
	State &s = *state();
	if (s.config.fail.alloc)
		return fail(CUDA_ERROR_OUT_OF_MEMORY, call, "XMEM_CUDASIM_FAIL=alloc");
	size_t rounded = round_up(bytesize, page_size());
	if (!charge(s, ctx->device, rounded))
		return fail(CUDA_ERROR_OUT_OF_MEMORY, call, "device %d has %" PRIu64 " of %" PRIu64 " bytes in use",
			    ctx->device, s.usage[size_t(ctx->device)].load(), s.config.memory);

	// The name holds the random tag a legacy IPC handle of this memory carries (ipc.cpp).
	uint64_t tag = random_tag();
	std::string name = plain_memfd_name(s.config.visible[size_t(ctx->device)], bytesize, tag);
	CUresult err = CUDA_SUCCESS;
	auto backing = make_backing(call, name.c_str(), rounded, ctx->device, 0, &s.usage[size_t(ctx->device)], &err);
	if (!backing)
		return err;
	uintptr_t va = reserve_va(rounded, page_size());
	if (!va)
		return fail(CUDA_ERROR_OUT_OF_MEMORY, call, "mmap: %s", std::strerror(errno));

	// Bytes past bytesize, up to the page, are backed but not mapped: touching them
	// is an illegal access, as past any allocation's end.
	Mapping map;
	map.size = bytesize;
	map.backing = std::move(backing);
	map.access.assign(size_t(s.config.devices), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	map.plain = true;
	map.owner = ctx;
	map.ipc_tag = tag;

	std::lock_guard<std::mutex> guard(s.lock);
	s.reservations[va] = Reservation{ rounded, true, ctx };
	s.mappings[va] = std::move(map);
	*dptr = CUdeviceptr(va);
	return CUDA_SUCCESS;
}

} // namespace

CUresult CUDAAPI cuMemAlloc(CUdeviceptr *dptr, size_t bytesize)
{
	return guarded([&] {
		const char *call = "cuMemAlloc";
		Context *ctx = nullptr;
		if (CUresult r = current_context(call, &ctx))
			return r;
		if (!dptr || bytesize == 0)
			return fail(CUDA_ERROR_INVALID_VALUE, call, "null dptr or zero size");
		return alloc_plain(call, ctx, dptr, bytesize);
	});
}

CUresult CUDAAPI cuMemAllocPitch(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
				 unsigned int ElementSizeBytes)
{
	return guarded([&] {
		const char *call = "cuMemAllocPitch";
		Context *ctx = nullptr;
		if (CUresult r = current_context(call, &ctx))
			return r;
		if (!dptr || !pPitch || WidthInBytes == 0 || Height == 0)
			return fail(CUDA_ERROR_INVALID_VALUE, call, "null dptr or pPitch, or zero width or height");
		if (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16)
			return fail(CUDA_ERROR_INVALID_VALUE, call, "ElementSizeBytes %u is not 4, 8 or 16",
				    ElementSizeBytes);
		// Rows start 512 bytes apart at least (a multiple of the texture pitch alignment),
		// as on real GPUs: code that assumes pitch == width reads the padding.
		constexpr size_t row_alignment = 512;
		size_t pitch = round_up(WidthInBytes, row_alignment);
		size_t bytes;
		if (pitch < WidthInBytes || pitch > 2147483647u || __builtin_mul_overflow(pitch, Height, &bytes))
			return fail(CUDA_ERROR_INVALID_VALUE, call, "%zu x %zu bytes", WidthInBytes, Height);
		if (CUresult r = alloc_plain(call, ctx, dptr, bytes))
			return r;
		*pPitch = pitch;
		return CUDA_SUCCESS;
	});
}

CUresult CUDAAPI cuMemFree(CUdeviceptr dptr)
{
	return guarded([&] {
		const char *call = "cuMemFree";
		Context *ctx = nullptr;
		if (CUresult r = current_context(call, &ctx))
			return r;
		State &s = *state();
		std::shared_ptr<Backing> dropped;
		std::lock_guard<std::mutex> guard(s.lock);
		// No implicit synchronization ("may" in cuda.h): work still queued that uses the
		// allocation faults when it executes.
		auto it = s.reservations.find(uintptr_t(dptr));
		if (it == s.reservations.end() || !it->second.plain)
			return fail(CUDA_ERROR_INVALID_VALUE, call, "0x%llx is not a cuMemAlloc allocation", dptr);
		if (it->second.ipc)
			return fail(CUDA_ERROR_INVALID_VALUE, call,
				    "0x%llx was opened by cuIpcOpenMemHandle: cuIpcCloseMemHandle closes it", dptr);
		auto m = s.mappings.find(it->first);
		dropped = std::move(m->second.backing);
		s.mappings.erase(m);
		retire(s, it->first, it->second.size);
		s.reservations.erase(it);
		return CUDA_SUCCESS;
	});
}

CUresult CUDAAPI cuMemHostRegister(void *p, size_t bytesize, unsigned int Flags)
{
	return guarded([&] {
		const char *call = "cuMemHostRegister";
		Context *ctx = nullptr;
		if (CUresult r = current_context(call, &ctx))
			return r;
		State &s = *state();
		if (s.config.fail.no_host_register)
			return fail(CUDA_ERROR_NOT_SUPPORTED, call, "XMEM_CUDASIM_FAIL=no_host_register");
		constexpr unsigned known = CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP |
					   CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_READ_ONLY;
		if (!p || bytesize == 0 || (Flags & ~known))
			return fail(CUDA_ERROR_INVALID_VALUE, call, "null pointer, zero size or flags 0x%x", Flags);
		if (Flags & CU_MEMHOSTREGISTER_IOMEMORY)
			return fail(CUDA_ERROR_NOT_SUPPORTED, call, "CU_MEMHOSTREGISTER_IOMEMORY is not simulated");
		int read_only_supported = 0;
		if ((Flags & CU_MEMHOSTREGISTER_READ_ONLY) &&
		    (cuDeviceGetAttribute(&read_only_supported, CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED,
					  ctx->device) != CUDA_SUCCESS ||
		     !read_only_supported))
			return fail(CUDA_ERROR_NOT_SUPPORTED, call,
				    "CU_MEMHOSTREGISTER_READ_ONLY on a device without "
				    "CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED");

		uintptr_t host = reinterpret_cast<uintptr_t>(p);
		if (host + bytesize < host)
			return CUDA_ERROR_INVALID_VALUE;
		uintptr_t first_page = host & ~uintptr_t(page_size() - 1);
		size_t alias_size = round_up(host + bytesize - first_page, page_size());
		// Pinning needs every page to exist, readable, and writable unless READ_ONLY. The
		// driver's error for a read-only mapping is not documented; INVALID_VALUE here.
		std::string why;
		if (!pinnable(first_page, alias_size, Flags & CU_MEMHOSTREGISTER_READ_ONLY, why))
			return fail(CUDA_ERROR_INVALID_VALUE, call, "[%p, +%zu): %s", p, bytesize, why.c_str());

		uintptr_t alias = reserve_va(alias_size, page_size());
		if (!alias)
			return fail(CUDA_ERROR_OUT_OF_MEMORY, call, "mmap: %s", std::strerror(errno));

		std::lock_guard<std::mutex> guard(s.lock);
		if (in_device_space(s, host, bytesize) || overlaps(s.host_registrations, host, bytesize) ||
		    overlaps(s.host_allocations, host, bytesize)) {
			// Never handed out: give the alias back rather than retire it.
			::munmap(reinterpret_cast<void *>(alias), alias_size);
			if (in_device_space(s, host, bytesize))
				return fail(CUDA_ERROR_INVALID_VALUE, call, "%p is device memory", p);
			return fail(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, call,
				    "[%p, +%zu) overlaps a registration or cuMemAllocHost memory", p, bytesize);
		}
		// Pinning can fail, as it does for the real driver when the kernel will not
		// lock more pages (CUDA_ERROR_OUT_OF_MEMORY).
		if (!pin(s, alias_size)) {
			::munmap(reinterpret_cast<void *>(alias), alias_size);
			return fail(CUDA_ERROR_OUT_OF_MEMORY, call,
				    "%zu more bytes would pass XMEM_CUDASIM_HOST_PIN_LIMIT=%" PRIu64 " (%" PRIu64
				    " pinned)",
				    alias_size, s.config.pin_limit, pinned_bytes);
		}
		HostRegistration reg;
		reg.size = bytesize;
		reg.flags = Flags;
		// Same offset in its page as p, so the device address has p's alignment.
		reg.dptr = CUdeviceptr(alias + (host - first_page));
		reg.alias_base = alias;
		reg.alias_size = alias_size;
		reg.owner = ctx;
		s.host_registrations[host] = reg;
		s.host_aliases[alias] = HostAlias{ alias_size, host };
		return CUDA_SUCCESS;
	});
}

CUresult CUDAAPI cuMemHostUnregister(void *p)
{
	return guarded([&] {
		const char *call = "cuMemHostUnregister";
		Context *ctx = nullptr;
		if (CUresult r = current_context(call, &ctx))
			return r;
		State &s = *state();
		std::lock_guard<std::mutex> guard(s.lock);
		auto it = s.host_registrations.find(reinterpret_cast<uintptr_t>(p));
		if (it == s.host_registrations.end())
			return fail(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, call, "%p is not the base of a registration",
				    p);
		unpin(it->second.alias_size);
		s.host_aliases.erase(it->second.alias_base);
		retire(s, it->second.alias_base, it->second.alias_size);
		s.host_registrations.erase(it);
		return CUDA_SUCCESS;
	});
}

CUresult CUDAAPI cuMemHostGetDevicePointer(CUdeviceptr *pdptr, void *p, unsigned int Flags)
{
	return guarded([&] {
		const char *call = "cuMemHostGetDevicePointer";
		Context *ctx = nullptr;
		if (CUresult r = current_context(call, &ctx))
			return r;
		State &s = *state();
		if (!pdptr || Flags)
			return fail(CUDA_ERROR_INVALID_VALUE, call, "null pdptr or flags");
		std::lock_guard<std::mutex> guard(s.lock);
		uintptr_t host = reinterpret_cast<uintptr_t>(p);
		auto it = find_containing(s.host_registrations, host);
		if (it == s.host_registrations.end())
			return fail(CUDA_ERROR_INVALID_VALUE, call, "%p is not registered host memory", p);
		// Strict: without PORTABLE the memory is pinned for the registering context only.
		if (!(it->second.flags & CU_MEMHOSTREGISTER_PORTABLE) && it->second.owner != ctx)
			return fail(CUDA_ERROR_INVALID_VALUE, call,
				    "%p was registered without CU_MEMHOSTREGISTER_PORTABLE by another context", p);
		*pdptr = it->second.dptr + (host - it->first);
		return CUDA_SUCCESS;
	});
}

CUresult CUDAAPI cuMemAllocHost(void **pp, size_t bytesize)
{
	return guarded([&] {
		const char *call = "cuMemAllocHost";
		Context *ctx = nullptr;
		if (CUresult r = current_context(call, &ctx))
			return r;
		if (!pp || bytesize == 0)
			return fail(CUDA_ERROR_INVALID_VALUE, call, "null pp or zero size");
		// Page-locking changes nothing the simulator can observe: these are ordinary pages,
		// which copies take as host memory. Streams reach them only through copies.
		size_t size = round_up(bytesize, page_size());
		void *p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (p == MAP_FAILED)
			return fail(CUDA_ERROR_OUT_OF_MEMORY, call, "mmap: %s", std::strerror(errno));
		State &s = *state();
		std::lock_guard<std::mutex> guard(s.lock);
		if (!pin(s, size)) {
			::munmap(p, size);
			return fail(CUDA_ERROR_OUT_OF_MEMORY, call,
				    "%zu more bytes would pass XMEM_CUDASIM_HOST_PIN_LIMIT=%" PRIu64, size,
				    s.config.pin_limit);
		}
		s.host_allocations[reinterpret_cast<uintptr_t>(p)] = HostAllocation{ size, ctx };
		*pp = p;
		return CUDA_SUCCESS;
	});
}

CUresult CUDAAPI cuMemFreeHost(void *p)
{
	return guarded([&] {
		const char *call = "cuMemFreeHost";
		Context *ctx = nullptr;
		if (CUresult r = current_context(call, &ctx))
			return r;
		State &s = *state();
		std::lock_guard<std::mutex> guard(s.lock);
		// No implicit synchronization, as cuMemFree: a queued copy that still uses the
		// memory faults when it executes.
		auto it = s.host_allocations.find(reinterpret_cast<uintptr_t>(p));
		if (it == s.host_allocations.end())
			return fail(CUDA_ERROR_INVALID_VALUE, call, "%p is not a cuMemAllocHost allocation", p);
		unpin(it->second.size);
		retire_host(s, it->first, it->second.size);
		s.host_allocations.erase(it);
		return CUDA_SUCCESS;
	});
}
