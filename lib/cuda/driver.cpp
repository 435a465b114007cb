// driver.cpp - loading the CUDA driver at run time and checking what a device can
// do, so one libxmem runs on machines with and without a GPU.
#include "driver.hpp"
#include "../device_sync.hpp"
#include "contexts.hpp"

#include <cstdlib>
#include <cstring>
#include <mutex>

#include <dlfcn.h>

namespace xmem::cuda {

namespace {

#define XMEM_CUDA_STR2(x) #x
#define XMEM_CUDA_STR(x) XMEM_CUDA_STR2(x)

struct Loaded {
	Driver driver;
	Error error;
	bool ok = false;
};

Loaded load()
{
	Loaded l;
	const char *env = std::getenv("XMEM_CUDA_DRIVER"); // NOLINT(concurrency-mt-unsafe): see system.hpp
	std::string path = env && *env ? env : "libcuda.so.1";
	// Never closed: the driver's threads and handlers live as long as the process.
	void *lib = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		// glibc keeps dlerror()'s message per thread.
		const char *why = ::dlerror(); // NOLINT(concurrency-mt-unsafe)
		l.error = make_error(Errc::not_found, "no CUDA driver: cannot load " + path + " (" +
							      (why ? why : "unknown error") + ")");
		return l;
	}
	Driver &d = l.driver;
	d.library = path;
#define XMEM_CUDA_LOAD(name)                                                                                           \
	d.name = reinterpret_cast<decltype(d.name)>(::dlsym(lib, XMEM_CUDA_STR(name)));                                \
	if (!d.name) {                                                                                                 \
		l.error = make_error(Errc::not_found,                                                                  \
				     "CUDA driver " + path + " lacks " XMEM_CUDA_STR(name) " (driver too old?)");      \
		return l;                                                                                              \
	}
	XMEM_CUDA_CALLS(XMEM_CUDA_LOAD)
#undef XMEM_CUDA_LOAD
	d.cuDeviceGetUuid_v1 = reinterpret_cast<decltype(d.cuDeviceGetUuid_v1)>(::dlsym(lib, "cuDeviceGetUuid"));
	CUresult r = d.cuInit(0);
	if (r != CUDA_SUCCESS) {
		l.error = make_error(r == CUDA_ERROR_NO_DEVICE ? Errc::not_found : Errc::system,
				     "CUDA driver " + path + ": " + d.describe("cuInit", r));
		return l;
	}
	d.cuDriverGetVersion(&d.version);
	l.ok = true;
	return l;
}

} // namespace

std::string Driver::describe(const char *call, CUresult r) const
{
	const char *name = nullptr;
	const char *text = nullptr;
	if (cuGetErrorName)
		cuGetErrorName(r, &name);
	if (cuGetErrorString)
		cuGetErrorString(r, &text);
	return std::string(call) + " failed: " + (name ? name : "CUDA error " + std::to_string(int(r))) + " (" +
	       (text ? text : "no description") + ")";
}

Result<const Driver *> driver()
{
	static const Loaded loaded = load();
	if (!loaded.ok)
		return loaded.error;
	return &loaded.driver;
}

Error cuda_error(const std::string &where, const char *call, CUresult r)
{
	auto d = driver();
	std::string what = d ? (*d)->describe(call, r) : std::string(call) + " failed";
	return make_error(r == CUDA_ERROR_OUT_OF_MEMORY ? Errc::no_memory : Errc::system, where + ": " + what);
}

CUresult read_device_uuid(const Driver &d, CUdevice device, DeviceUuid *uuid, bool *mig)
{
	CUuuid id{};
	if (CUresult r = d.cuDeviceGetUuid(&id, device); r != CUDA_SUCCESS)
		return r;
	std::memcpy(uuid->data(), id.bytes, uuid->size());
	CUuuid first{};
	*mig = d.cuDeviceGetUuid_v1 && d.cuDeviceGetUuid_v1(&first, device) == CUDA_SUCCESS &&
	       std::memcmp(first.bytes, id.bytes, sizeof(id.bytes)) != 0;
	if (*mig)
		note_mig_device(*uuid);
	return CUDA_SUCCESS;
}

namespace {

// "CUDA device N (NAME, GPU-…)": the ordinal of this process, and the UUID nvidia-smi shows
// and takes (nvidia-smi's indices differ from ordinals under CUDA_VISIBLE_DEVICES); "MIG-…"
// for a MIG device.
std::string device_label(const Driver &d, CUdevice device, uint32_t ordinal, const std::string &name,
			 std::string *uuid_text)
{
	DeviceUuid bytes;
	bool mig = false;
	std::string uuid = "its UUID unknown";
	if (read_device_uuid(d, device, &bytes, &mig) == CUDA_SUCCESS) {
		uuid = format_device_uuid(bytes, mig);
		if (uuid_text)
			*uuid_text = uuid;
	}
	return "CUDA device " + std::to_string(ordinal) + " (" + (name.empty() ? "" : name + ", ") + uuid + ")";
}

// Why no context can be had on a device in compute mode MODE, if that is why: the compute
// mode named, and what an administrator can do about it. Empty for DEFAULT.
std::string compute_mode_refusal(const Driver &d, CUdevice device, uint32_t ordinal, const std::string &name, int mode)
{
	std::string uuid = "<uuid>";
	std::string label = device_label(d, device, ordinal, name, &uuid);
	std::string fix = "; an administrator can change that with nvidia-smi -i " + uuid + " -c DEFAULT";
	if (mode == CU_COMPUTEMODE_PROHIBITED)
		return label + " is in compute mode prohibited (PROHIBITED): no process may use it" + fix;
	if (mode == CU_COMPUTEMODE_EXCLUSIVE_PROCESS)
		return label +
		       " is in EXCLUSIVE_PROCESS compute mode: only one process may use it at a time, and another "
		       "process (or another CUDA context of this one) holds it, so a pool's producer and consumers "
		       "cannot share it" +
		       fix;
	return {};
}

} // namespace

Result<DeviceInfo> check_device(uint32_t ordinal, const std::string &where)
{
	auto loaded = driver();
	if (!loaded)
		return make_error(loaded.code(), where + ": " + loaded.error().message);
	const Driver &d = **loaded;
	int count = 0;
	if (CUresult r = d.cuDeviceGetCount(&count); r != CUDA_SUCCESS)
		return cuda_error(where, "cuDeviceGetCount", r);
	if (count == 0)
		return make_error(Errc::not_found, where + ": no CUDA device");
	if (ordinal >= uint32_t(count))
		return make_error(Errc::invalid_argument, where + ": CUDA device " + std::to_string(ordinal) +
								  " out of range (this machine has " +
								  std::to_string(count) + ")");
	DeviceInfo info;
	if (CUresult r = d.cuDeviceGet(&info.device, int(ordinal)); r != CUDA_SUCCESS)
		return cuda_error(where, "cuDeviceGet", r);
	char name[256] = {};
	if (d.cuDeviceGetName(name, sizeof(name) - 1, info.device) == CUDA_SUCCESS)
		info.name = name;
	auto attribute = [&](CUdevice_attribute a) {
		int v = 0;
		return d.cuDeviceGetAttribute(&v, a, info.device) == CUDA_SUCCESS ? v : 0;
	};
	std::string device = "CUDA device " + std::to_string(ordinal) + " (" + info.name + ")";
	if (int mode = attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_MODE); mode == CU_COMPUTEMODE_PROHIBITED)
		return make_error(Errc::permission_denied,
				  where + ": " + compute_mode_refusal(d, info.device, ordinal, info.name, mode));
	if (!attribute(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED))
		return make_error(Errc::invalid_argument,
				  where + ": " + device + " lacks virtual memory management (cuMemCreate)");
	if (!attribute(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED))
		return make_error(Errc::invalid_argument,
				  where + ": " + device + " cannot share memory as POSIX file descriptors");
	info.stream_mem_ops = attribute(CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS) != 0;
	if (int a = attribute(CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT); a > 0)
		info.pitch_alignment = uint32_t(a);
	return info;
}

Result<std::shared_ptr<PrimaryContext>> PrimaryContext::retain(uint32_t ordinal, const std::string &where)
{
	auto info = check_device(ordinal, where);
	if (!info)
		return info.error();
	const Driver *d = driver().value();
	CUcontext ctx = nullptr;
	if (CUresult r = d->cuDevicePrimaryCtxRetain(&ctx, info->device); r != CUDA_SUCCESS) {
		// The driver's code for a device another process holds in EXCLUSIVE_PROCESS mode is
		// CUDA_ERROR_DEVICE_UNAVAILABLE by its description, but no call documents it: the
		// compute mode, not the code, says why.
		int mode = CU_COMPUTEMODE_DEFAULT;
		if (d->cuDeviceGetAttribute(&mode, CU_DEVICE_ATTRIBUTE_COMPUTE_MODE, info->device) != CUDA_SUCCESS)
			mode = CU_COMPUTEMODE_DEFAULT;
		std::string why = compute_mode_refusal(*d, info->device, ordinal, info->name, mode);
		if (why.empty())
			return cuda_error(where, "cuDevicePrimaryCtxRetain", r);
		return make_error(Errc::permission_denied,
				  where + ": " + why + " (" + d->describe("cuDevicePrimaryCtxRetain", r) + ")");
	}
	return std::shared_ptr<PrimaryContext>(new PrimaryContext(d, info->device, ctx));
}

PrimaryContext::~PrimaryContext()
{
	d_->cuDevicePrimaryCtxRelease(device_);
}

ContextScope::ContextScope(const PrimaryContext &ctx, CUstream stream) : d_(driver().value())
{
	CUcontext target = ctx.get();
	// The legacy and per-thread default streams are the current context's own.
	bool named = stream && stream != CU_STREAM_LEGACY && stream != CU_STREAM_PER_THREAD;
	CUcontext own = nullptr;
	if (named && d_->cuStreamGetCtx(stream, &own) == CUDA_SUCCESS && own)
		target = own;
	pushed_ = d_->cuCtxPushCurrent(target) == CUDA_SUCCESS;
}

ContextScope::~ContextScope()
{
	CUcontext popped;
	if (pushed_)
		d_->cuCtxPopCurrent(&popped);
}

} // namespace xmem::cuda
