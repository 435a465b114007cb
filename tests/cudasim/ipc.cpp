// ipc.cpp - legacy CUDA IPC of the CUDA driver simulator: cuIpcGetMemHandle,
// cuIpcOpenMemHandle and cuIpcCloseMemHandle, as cuda.h documents them, across processes.
//
// The bytes of cuMemAlloc memory live in a memfd (memory.cpp). A handle names that memfd as
// /proc/<exporter pid>/fd/<fd>, so an importer needs no fd passed over a socket: it opens
// that path (the same user may), and the random tag in the handle, which is also in the
// memfd's name, tells it that the fd still holds the allocation the handle was made for.
// Interprocess events (cuIpcGetEventHandle, cuIpcOpenEventHandle) are not simulated
// (unsupported.cpp): no caller of the simulator uses them.

#include "cudasim.hpp"

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <optional>

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

namespace cudasim {

std::string plain_memfd_name(int machine_device, size_t bytesize, uint64_t tag)
{
	char name[96];
	std::snprintf(name, sizeof(name), "cudasim-alloc:dev%d:%zu:%016" PRIx64, machine_device, bytesize, tag);
	return name;
}

uint64_t random_tag()
{
	uint64_t tag = 0;
	while (getrandom(&tag, sizeof(tag), 0) != ssize_t(sizeof(tag))) {
		if (errno != EINTR)
			throw std::system_error(errno, std::generic_category(), "getrandom");
	}
	return tag;
}

} // namespace cudasim

using namespace cudasim;

namespace {

// The 64 bytes of a CUipcMemHandle as the simulator fills them. Another process wrote the
// handle an importer gets: the magic, the version and the zero tail are checked first.
struct IpcMemWire {
	char magic[8];
	uint32_t version;
	int32_t pid; // the exporting process, in the importer's pid namespace too
	int32_t fd; // its memfd of the allocation
	int32_t device; // the machine's number of the allocation's device
	uint64_t size; // cuMemAlloc's bytesize
	uint64_t tag; // the allocation's random tag, also in its memfd's name
	unsigned char zero[24];
};
static_assert(sizeof(IpcMemWire) == CU_IPC_HANDLE_SIZE);
static_assert(offsetof(IpcMemWire, version) == 8 && offsetof(IpcMemWire, pid) == 12 && offsetof(IpcMemWire, fd) == 16 &&
	      offsetof(IpcMemWire, device) == 20 && offsetof(IpcMemWire, size) == 24 &&
	      offsetof(IpcMemWire, tag) == 32 && offsetof(IpcMemWire, zero) == 40);

constexpr char ipc_magic[8] = { 'c', 'u', 'd', 'a', 's', 'i', 'm', 'M' };
constexpr uint32_t ipc_version = 1;

bool decode(const CUipcMemHandle &handle, IpcMemWire &wire)
{
	std::memcpy(&wire, handle.reserved, sizeof(wire));
	if (std::memcmp(wire.magic, ipc_magic, sizeof(ipc_magic)) != 0 || wire.version != ipc_version)
		return false;
	for (unsigned char b : wire.zero) {
		if (b)
			return false;
	}
	return wire.pid > 0 && wire.fd >= 0 && wire.device >= 0 && wire.size > 0;
}

// A failure the caller cannot find in its own process: said on stderr always, like a call
// that is not simulated, because the cause is another process's lifetime.
CUresult fail_loudly(CUresult err, const char *call, const std::string &why)
{
	const char *name = "?";
	cuGetErrorName(err, &name);
	std::fprintf(stderr, "cudasim: %s -> %s: %s\n", call, name, why.c_str());
	return err;
}

// The memfd of the allocation a decoded handle names, opened from its exporter's
// /proc/PID/fd and checked to be that allocation; -1 with *err set otherwise.
int open_exported(const char *call, const IpcMemWire &wire, size_t rounded, CUresult *err)
{
	const std::string exporter = "process " + std::to_string(wire.pid);
	const std::string expected = "/memfd:" + plain_memfd_name(wire.device, size_t(wire.size), wire.tag);
	// What LINK points at (empty, with errno, when it cannot be read), and whether that is
	// the allocation: the fd number may have been reused since, and only the random tag in
	// the memfd's name tells.
	std::string target;
	auto names_allocation = [&](const char *link) {
		char buffer[256] = {};
		ssize_t n = readlink(link, buffer, sizeof(buffer) - 1);
		target.assign(buffer, n > 0 ? size_t(n) : 0);
		return target == expected || target == expected + " (deleted)";
	};
	auto gone = [&](int why) {
		if (::kill(wire.pid, 0) < 0 && errno == ESRCH)
			return fail_loudly(CUDA_ERROR_INVALID_HANDLE, call,
					   exporter + ", which exported the handle, has exited: its memory is gone");
		if (why == ENOENT)
			return fail_loudly(CUDA_ERROR_INVALID_HANDLE, call,
					   exporter +
						   " freed the exported allocation (cuMemFree, or its context went)");
		return fail_loudly(CUDA_ERROR_INVALID_HANDLE, call,
				   "cannot open " + exporter + "'s allocation: " + std::strerror(why));
	};

	// Checked before opening, so that nothing else of the exporter's is ever opened, and
	// again on the fd opened, which the exporter may have reused in between.
	char path[64];
	std::snprintf(path, sizeof(path), "/proc/%d/fd/%d", wire.pid, wire.fd);
	if (!names_allocation(path)) {
		*err = target.empty() ? gone(errno)
				      : fail_loudly(CUDA_ERROR_INVALID_HANDLE, call,
						    exporter + " freed the exported allocation (its fd " +
							    std::to_string(wire.fd) + " now holds " + target + ")");
		return -1;
	}
	int fd = ::open(path, O_RDWR | O_CLOEXEC | O_NOCTTY);
	if (fd < 0) {
		*err = gone(errno);
		return -1;
	}
	char own[64];
	std::snprintf(own, sizeof(own), "/proc/self/fd/%d", fd);
	struct stat st;
	if (!names_allocation(own) || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || uint64_t(st.st_size) != rounded) {
		::close(fd);
		*err = fail_loudly(CUDA_ERROR_INVALID_HANDLE, call, exporter + " freed the exported allocation");
		return -1;
	}
	return fd;
}

// cuIpcOpenMemHandle, in both ABI versions.
CUresult open_mem_handle(const char *call, CUdeviceptr *pdptr, const CUipcMemHandle &handle, unsigned flags)
{
	Context *ctx = nullptr;
	if (CUresult r = current_context(call, &ctx))
		return r;
	State &s = *state();
	if (!pdptr)
		return fail(CUDA_ERROR_INVALID_VALUE, call, "null pdptr");
	// cuda.h: "Must be specified as CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS".
	if (flags != CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
		return fail(CUDA_ERROR_INVALID_VALUE, call, "Flags 0x%x, not CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS",
			    flags);
	IpcMemWire wire;
	if (!decode(handle, wire))
		return fail(CUDA_ERROR_INVALID_VALUE, call, "not a handle cuIpcGetMemHandle made");
	// The call maps memory "exported from another process"; the driver refuses a handle in
	// the process that made it. Its code is not documented: INVALID_CONTEXT here.
	if (wire.pid == int32_t(getpid()))
		return fail(CUDA_ERROR_INVALID_CONTEXT, call,
			    "the handle was exported by this process: open it in another one");

	// The memory's device as this process numbers it, which the current context's device
	// must be, or reach as a peer ("as if the user called cuCtxEnablePeerAccess").
	auto seen = std::find(s.config.visible.begin(), s.config.visible.end(), wire.device);
	if (seen == s.config.visible.end())
		return fail(CUDA_ERROR_INVALID_DEVICE, call,
			    "the handle names memory of the machine's device %d, which this process does not see",
			    wire.device);
	int device = int(seen - s.config.visible.begin());
	if (device != ctx->device && !can_access_peer(s.config, ctx->device, device))
		return fail(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, call,
			    "memory of device %d, opened in %s: cuDeviceCanAccessPeer is 0", device,
			    describe(*ctx).c_str());

	// What the call returns when the handle is open here already, or nothing (caller holds
	// State::lock). Opened again in the same context: one more reference, the same address
	// (cuda.h). A process's handles of one device: one context per device may open them.
	auto already = [&]() -> std::optional<CUresult> {
		for (auto &[va, import] : s.ipc_imports) {
			if (import.exporter != wire.pid || import.exporter_device != wire.device)
				continue;
			if (import.ctx == ctx && import.tag == wire.tag) {
				import.refs++;
				*pdptr = CUdeviceptr(va);
				return CUDA_SUCCESS;
			}
			if (import.ctx != ctx && import.ctx->device == ctx->device)
				return fail(CUDA_ERROR_INVALID_CONTEXT, call,
					    "%s has handles of device %d of process %d open: one context per "
					    "device may open them",
					    describe(*import.ctx).c_str(), device, wire.pid);
		}
		return std::nullopt;
	};
	{
		std::lock_guard<std::mutex> guard(s.lock);
		if (auto r = already())
			return *r;
	}

	size_t rounded = (size_t(wire.size) + page_size() - 1) / page_size() * page_size();
	CUresult err = CUDA_SUCCESS;
	int fd = open_exported(call, wire, rounded, &err);
	if (fd < 0)
		return err;
	void *alias = mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (alias == MAP_FAILED) {
		::close(fd);
		return fail(CUDA_ERROR_MAP_FAILED, call, "mmap: %s", std::strerror(errno));
	}
	// Charged to the exporter's device, not to this process.
	auto backing = std::make_shared<Backing>(fd, static_cast<char *>(alias), rounded, device, 0, nullptr);
	uintptr_t va = reserve_va(rounded, page_size());
	if (!va)
		return fail(CUDA_ERROR_OUT_OF_MEMORY, call, "mmap: %s", std::strerror(errno));

	std::lock_guard<std::mutex> guard(s.lock);
	// Another thread may have opened it meanwhile: its address, and this one never handed out.
	if (auto r = already()) {
		::munmap(reinterpret_cast<void *>(va), rounded);
		return *r;
	}
	// Like cuMemAlloc memory, it belongs to the context that opened it: another context's
	// stream that touches it is an illegal access.
	Mapping map;
	map.size = size_t(wire.size);
	map.backing = std::move(backing);
	map.access.assign(size_t(s.config.devices), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	map.plain = true;
	map.owner = ctx;
	s.reservations[va] = Reservation{ rounded, true, ctx, true };
	s.mappings[va] = std::move(map);
	s.ipc_imports[va] = IpcImport{ ctx, wire.pid, wire.device, wire.tag, 1 };
	*pdptr = CUdeviceptr(va);
	return CUDA_SUCCESS;
}

} // namespace

CUresult CUDAAPI cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
	return guarded([&] {
		const char *call = "cuIpcGetMemHandle";
		Context *ctx = nullptr;
		if (CUresult r = current_context(call, &ctx))
			return r;
		State &s = *state();
		if (!pHandle)
			return fail(CUDA_ERROR_INVALID_VALUE, call, "null pHandle");
		std::lock_guard<std::mutex> guard(s.lock);
		// "a pointer to the base of an existing device memory allocation created with
		// cuMemAlloc": not an address inside one, not VMM memory, not memory opened here.
		auto r = s.reservations.find(uintptr_t(dptr));
		if (r == s.reservations.end() || !r->second.plain) {
			auto inside = find_containing(s.reservations, uintptr_t(dptr));
			if (inside != s.reservations.end() && inside->second.plain)
				return fail(CUDA_ERROR_INVALID_VALUE, call,
					    "0x%llx is inside an allocation, not its base 0x%" PRIxPTR, dptr,
					    inside->first);
			if (inside != s.reservations.end())
				return fail(CUDA_ERROR_INVALID_VALUE, call,
					    "0x%llx is VMM memory (cuMemExportToShareableHandle shares it)", dptr);
			return fail(CUDA_ERROR_INVALID_VALUE, call, "0x%llx is not a cuMemAlloc allocation", dptr);
		}
		if (r->second.ipc)
			return fail(CUDA_ERROR_INVALID_VALUE, call,
				    "0x%llx was opened by cuIpcOpenMemHandle: only its exporter's cuMemAlloc "
				    "allocation has a handle",
				    dptr);
		const Mapping &map = s.mappings.at(r->first);
		IpcMemWire wire = {};
		std::memcpy(wire.magic, ipc_magic, sizeof(ipc_magic));
		wire.version = ipc_version;
		wire.pid = int32_t(getpid());
		wire.fd = map.backing->fd();
		wire.device = s.config.visible[size_t(map.backing->device())];
		wire.size = map.size;
		wire.tag = map.ipc_tag;
		static_assert(sizeof(pHandle->reserved) == sizeof(wire));
		std::memcpy(pHandle->reserved, &wire, sizeof(wire));
		return CUDA_SUCCESS;
	});
}

CUresult CUDAAPI cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
	return guarded([&] { return open_mem_handle("cuIpcOpenMemHandle", pdptr, handle, Flags); });
}

CUresult CUDAAPI cuIpcOpenMemHandle_v1(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
	return guarded([&] { return open_mem_handle("cuIpcOpenMemHandle", pdptr, handle, Flags); });
}

CUresult CUDAAPI cuIpcCloseMemHandle(CUdeviceptr dptr)
{
	return guarded([&] {
		const char *call = "cuIpcCloseMemHandle";
		Context *ctx = nullptr;
		if (CUresult r = current_context(call, &ctx))
			return r;
		State &s = *state();
		std::shared_ptr<Backing> dropped; // unmapped after unlocking
		std::lock_guard<std::mutex> guard(s.lock);
		auto it = s.ipc_imports.find(uintptr_t(dptr));
		if (it == s.ipc_imports.end())
			return fail(CUDA_ERROR_INVALID_VALUE, call,
				    "0x%llx is not open memory cuIpcOpenMemHandle returned", dptr);
		if (it->second.ctx != ctx)
			return fail(CUDA_ERROR_INVALID_CONTEXT, call, "0x%llx was opened by %s, not the current %s",
				    dptr, describe(*it->second.ctx).c_str(), describe(*ctx).c_str());
		if (--it->second.refs > 0)
			return CUDA_SUCCESS;
		// No implicit synchronization, as cuMemFree: queued work that still uses the
		// address faults when it executes.
		auto m = s.mappings.find(it->first);
		dropped = std::move(m->second.backing);
		s.mappings.erase(m);
		auto r = s.reservations.find(it->first);
		retire(s, r->first, r->second.size);
		s.reservations.erase(r);
		s.ipc_imports.erase(it);
		return CUDA_SUCCESS;
	});
}
