// xmem-bench-gst.cpp - frame handoff between processes through a GStreamer sink/src
// pair (xmemsink/xmemsrc, shmsink/shmsrc, unixfdsink/unixfdsrc, cudaipcsink/cudaipcsrc)
// and the in-process floor, in system memory or CUDA device memory.
//
// Every pair runs the same two programs. The producer is an app, `appsrc ! SINK`,
// that asks the sink for memory the way a real upstream element does (an
// ALLOCATION query with the caps, then the pool or allocator in the answer) and
// stamps each frame with CLOCK_MONOTONIC in its first bytes, filling nothing else.
// The consumer is an app, `SRC ! appsink`, that reads the stamp in appsink's
// new-sample callback. The producer spawns its consumers (posix_spawn of
// itself) and gets their latencies and CPU time back over a pipe. The floor pair,
// `appsrc ! appsink` in one pipeline (a tee before N appsinks for fan-out), runs
// the same producer and consumer code in one process.
//
// --memory cuda: the frames are device memory (memory:CUDAMemory caps). The producer
// takes them from the pool the sink proposes, or from a GstCudaBufferPool of its own,
// and writes the stamp with a 64-byte host-to-device copy; the consumer reads it back
// with a device-to-host copy. --source h264=FILE: a decoder makes the frames instead
// of appsrc, and a pad probe before the sink stamps each one the same way.
#include "common.hpp"

#include <gst/app/app.h>
#include <gst/gst.h>
#include <gst/video/video.h>

#ifdef XMEM_BENCH_HAVE_GST_CUDA
#define GST_USE_UNSTABLE_API
#include <gst/cuda/cuda-gst.h>
#include <gst/cuda/gstcudabufferpool.h>
#include <gst/cuda/gstcudacontext.h>
#include <gst/cuda/gstcudaloader.h>
#include <gst/cuda/gstcudamemory.h>
#include <gst/cuda/gstcudautils.h>
#if GST_CHECK_VERSION(1, 24, 0)
#include <gst/cuda/gstcudastream.h>
#endif

#include <dlfcn.h>
#endif

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <csignal>
#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

namespace {

using bench::clock_ns;
using bench::error_text;
using bench::json_string;
using bench::monotonic_ns;
using bench::percentile_us;
using bench::process_cpu_ns;
using bench::write_all;

constexpr uint64_t kStampMagic = 0x5453474d454d5858; // "XXMEMGST"
constexpr uint64_t kReadyMagic = 0x5944414552425858; // "XXBREADY"
constexpr uint64_t kReportMagic = 0x54504552425858; // "XXBREPT"
constexpr uint64_t kWarmup = UINT64_MAX; // Stamp::index of a frame that is not measured
constexpr uint32_t kLastFrame = 1; // Stamp::flags: the last measured frame
constexpr int kReportFd = 3; // where a spawned consumer writes to its producer
constexpr int kFirstPrivateFd = 10;
// What a run whose pair cannot run here exits with, besides its record (a script skips it).
constexpr int kUnavailable = 77;

// What the producer writes into the first bytes of a frame, and all it writes.
struct alignas(64) Stamp {
	uint64_t magic;
	uint64_t seq; // every frame pushed, from 1
	uint64_t index; // 0.. among measured frames, or kWarmup
	uint64_t timestamp_ns; // CLOCK_MONOTONIC right before the stamp is written (then pushed)
	uint32_t flags;
};
static_assert(sizeof(Stamp) == 64);

// What a consumer sends once it has seen its first frame.
struct Ready {
	uint64_t magic;
};

// What a consumer sends at the end, followed by `samples` latencies in ns.
struct Report {
	uint64_t magic;
	uint64_t samples; // measured frames received
	uint64_t corrupt; // frames without a valid stamp
	uint64_t cpu_ns; // user + system time from the first to the last measured frame
	uint64_t first_ns; // CLOCK_MONOTONIC at the first and the last measured frame
	uint64_t last_ns;
	double source_p50_us; // --breakdown: p50 from the stamp to the source's src pad
	uint64_t host_frames; // --memory cuda: frames that came in system memory
	uint64_t source_zero_copy; // --memory cuda: the source's own counters, where it has them
	uint64_t source_copied;
	int32_t source_counted; // 1 when the two above were read
	char threads[256]; // "name=ns;..." CPU time of each thread over the same frames
	int32_t status; // 0, or 1 when the consumer failed (see error)
	char error[220];
};

enum class Pair { xmem, xmem_spin, shm, floor, unixfd, cudaipc_legacy, cudaipc_mmap };

enum class Memory { system, cuda };

struct PairInfo {
	Pair pair;
	const char *name;
	const char *sink; // element factories; the floor needs none beyond app
	const char *src;
	bool system; // which memory the pair carries
	bool cuda;
};

constexpr PairInfo kPairs[] = {
	{ Pair::xmem, "xmem", "xmemsink", "xmemsrc", true, true },
	// xmemsrc wake=spin-before: near each expected frame it polls instead of sleeping.
	{ Pair::xmem_spin, "xmem-spin", "xmemsink", "xmemsrc", true, true },
	{ Pair::shm, "shm", "shmsink", "shmsrc", true, false },
	{ Pair::floor, "floor", "appsink", "appsrc", true, true },
	{ Pair::unixfd, "unixfd", "unixfdsink", "unixfdsrc", true, false },
	// GStreamer 1.24's CUDA IPC: legacy cuIpc handles, or mmap (VMM memory exported as fds).
	{ Pair::cudaipc_legacy, "cudaipc-legacy", "cudaipcsink", "cudaipcsrc", false, true },
	{ Pair::cudaipc_mmap, "cudaipc-mmap", "cudaipcsink", "cudaipcsrc", false, true },
};

bool is_cudaipc(const PairInfo *pair)
{
	return pair->pair == Pair::cudaipc_legacy || pair->pair == Pair::cudaipc_mmap;
}

struct Options {
	const PairInfo *pair = &kPairs[0];
	bool consumer = false;
	uint32_t width = 1920;
	uint32_t height = 1080;
	uint32_t fps = 60; // 0: unthrottled
	bool fps_given = false;
	Memory memory = Memory::system;
	std::string h264; // --source h264=FILE: the file (empty: frames from appsrc)
	std::string decoder = "nvh264dec"; // --source h264: what decodes it into CUDA memory
	uint64_t frames = 600; // measured frames (at most)
	uint64_t warmup = 60; // frames from the sink's memory before measuring
	uint32_t consumers = 1;
	double seconds = 0; // unthrottled: stop measuring after this long (0: after `frames`)
	double timeout = 60; // the whole run, seconds: past it the run is reported as failed
	std::string address; // consumer: the pool name or socket path
	std::string mode = "latency"; // a label for the record only
	bool json = false;
	bool breakdown = false; // also time frames at the sink's and the source's pads
	std::string command;
};

// Usage text and error messages are best effort: nothing to do if stderr fails.
int usage()
{
	(void)std::fprintf(
		stderr,
		"usage: xmem-bench-gst [--pair xmem|xmem-spin|shm|floor|unixfd|cudaipc-legacy|cudaipc-mmap]\n"
		"                      [--memory system|cuda] [--source appsrc|h264=FILE] [--decoder ELEMENTS]\n"
		"                      [--width W] [--height H] [--fps F (0 = unthrottled)] [--frames N]\n"
		"                      [--warmup N] [--consumers N] [--seconds S] [--timeout S] [--mode LABEL]\n"
		"                      [--breakdown] [--json]\n"
		"       --memory cuda: pairs xmem, xmem-spin, cudaipc-legacy, cudaipc-mmap, floor\n"
		"       --source h264=FILE (--memory cuda): FILE ! h264parse ! DECODER (nvh264dec) ! SINK, looped,\n"
		"                      at the decoder's rate, the frame size the file's\n"
		"       (--role consumer --address A is how the producer starts its consumers)\n");
	return 2;
}

bool parse(int argc, char **argv, Options &o)
{
	for (int i = 1; i < argc; i++) {
		std::string_view a = argv[i];
		if (a == "--json") {
			o.json = true;
			continue;
		}
		if (a == "--breakdown") {
			o.breakdown = true;
			continue;
		}
		if (i + 1 >= argc)
			return false;
		std::string_view v = argv[++i];
		char *end = nullptr;
		double n = std::strtod(v.data(), &end);
		bool numeric = !v.empty() && end && *end == '\0' && n >= 0 && n <= 1e9;
		if (a == "--pair") {
			o.pair = nullptr;
			for (const auto &p : kPairs)
				if (v == p.name)
					o.pair = &p;
			if (!o.pair)
				return false;
		} else if (a == "--role") {
			if (v != "producer" && v != "consumer")
				return false;
			o.consumer = v == "consumer";
		} else if (a == "--memory") {
			if (v != "system" && v != "cuda")
				return false;
			o.memory = v == "cuda" ? Memory::cuda : Memory::system;
		} else if (a == "--source") {
			if (v.starts_with("h264=") && v.size() > 5)
				o.h264 = v.substr(5);
			else if (v == "appsrc")
				o.h264.clear();
			else
				return false;
		} else if (a == "--decoder") {
			if (v.empty())
				return false;
			o.decoder = v;
		} else if (a == "--address")
			o.address = v;
		else if (a == "--mode")
			o.mode = v;
		else {
			if (!numeric)
				return false;
			if (a == "--width")
				o.width = uint32_t(n);
			else if (a == "--height")
				o.height = uint32_t(n);
			else if (a == "--fps") {
				o.fps = uint32_t(n);
				o.fps_given = true;
			} else if (a == "--frames")
				o.frames = uint64_t(n);
			else if (a == "--warmup")
				o.warmup = uint64_t(n);
			else if (a == "--consumers")
				o.consumers = uint32_t(n);
			else if (a == "--seconds")
				o.seconds = n;
			else if (a == "--timeout")
				o.timeout = n;
			else
				return false;
		}
	}
	const bool carried = o.memory == Memory::cuda ? o.pair->cuda : o.pair->system;
	// A decoder sets its own pace: --source h264 is never paced (fps_target 0).
	const bool decoded = !o.h264.empty();
	if (decoded && !o.fps_given)
		o.fps = 0;
	// The stamp lies in the first row of the luma plane, which device copies take row by row.
	const bool stamp_fits = o.memory == Memory::system || decoded || o.width >= sizeof(Stamp);
	return o.width > 0 && o.height > 0 && o.width % 2 == 0 && o.height % 2 == 0 && o.frames > 0 &&
	       o.consumers > 0 && o.consumers <= 16 && o.timeout > 0 && (!o.consumer || !o.address.empty()) &&
	       carried && stamp_fits && (!decoded || (o.memory == Memory::cuda && o.fps == 0));
}

// CPU time (ns) of each of this process's threads, by name (threads of one name add
// up): which thread of a pipeline spends the time. Precise (the scheduler's count).
// Threads keep the name of the thread that started them unless they set their own:
// the app thread's helpers (shmsink's poll thread, xmem's I/O thread) are "APP+".
std::map<std::string, uint64_t> thread_cpu_ns()
{
	std::map<std::string, uint64_t> out;
	GDir *dir = g_dir_open("/proc/self/task", 0, nullptr);
	if (!dir)
		return out;
	gchar *app = nullptr;
	g_file_get_contents("/proc/self/comm", &app, nullptr, nullptr);
	const std::string app_name = app ? g_strstrip(app) : "";
	const std::string self = std::to_string(::getpid());
	g_free(app);
	while (const gchar *tid = g_dir_read_name(dir)) {
		std::string base = std::string("/proc/self/task/") + tid;
		gchar *comm = nullptr, *stat = nullptr;
		if (g_file_get_contents((base + "/comm").c_str(), &comm, nullptr, nullptr) &&
		    g_file_get_contents((base + "/schedstat").c_str(), &stat, nullptr, nullptr)) {
			std::string name = g_strstrip(comm);
			if (name == app_name && tid != self)
				name += "+";
			out[name] += std::strtoull(stat, nullptr, 10);
		}
		g_free(comm);
		g_free(stat);
	}
	g_dir_close(dir);
	return out;
}

// What each thread spent between two thread_cpu_ns() snapshots.
std::map<std::string, uint64_t> thread_cpu_since(const std::map<std::string, uint64_t> &start)
{
	auto now = thread_cpu_ns();
	for (auto &[name, ns] : now) {
		auto it = start.find(name);
		ns = it != start.end() && it->second < ns ? ns - it->second : (it != start.end() ? 0 : ns);
	}
	return now;
}

// Reads LEN bytes, waiting for each part until DEADLINE (CLOCK_MONOTONIC ns).
bool read_all(int fd, void *buf, size_t len, uint64_t deadline)
{
	auto p = static_cast<char *>(buf);
	while (len > 0) {
		uint64_t now = monotonic_ns();
		if (now >= deadline)
			return false;
		pollfd pfd = { fd, POLLIN, 0 };
		int r = ::poll(&pfd, 1, int(std::min<uint64_t>((deadline - now) / 1000000 + 1, 60000)));
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			continue;
		ssize_t n = ::read(fd, p, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return false;
		p += n;
		len -= size_t(n);
	}
	return true;
}

// One JSON object on one line, keys in insertion order.
class JsonRecord
{
public:
	void str(const char *key, std::string_view v) { add(key, json_string(v)); }
	void num(const char *key, double v, int decimals)
	{
		char buf[64];
		// No figure here comes near the 60 digits BUF holds: never cut.
		(void)std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
		add(key, buf);
	}
	void null(const char *key) { add(key, "null"); }
	void raw(const char *key, const std::string &json) { add(key, json); }
	void boolean(const char *key, bool v) { add(key, v ? "true" : "false"); }
	std::string text() const { return "{" + body_ + "}"; }

private:
	void add(const char *key, const std::string &value)
	{
		body_ += std::string(body_.empty() ? "" : ", ") + json_string(key) + ": " + value;
	}
	std::string body_;
};

// {"thread": µs per frame, ...}, the busiest first.
std::string threads_json(const std::map<std::string, uint64_t> &ns, double frames)
{
	std::vector<std::pair<uint64_t, std::string>> sorted;
	for (auto &[name, v] : ns)
		if (v > 0)
			sorted.emplace_back(v, name);
	std::sort(sorted.rbegin(), sorted.rend());
	JsonRecord j;
	for (auto &[v, name] : sorted)
		j.num(name.c_str(), double(v) / 1000.0 / frames, 2);
	return j.text();
}

// The stamp in and out of a frame

#ifdef XMEM_BENCH_HAVE_GST_CUDA
// Whether BUFFER's frame is CUDA device memory, all in one GstCudaMemory (as every
// CUDA element makes NV12 frames): only then is its first byte the memory's first.
bool is_device_frame(GstBuffer *buffer)
{
	return buffer && gst_buffer_n_memory(buffer) == 1 && gst_is_cuda_memory(gst_buffer_peek_memory(buffer, 0));
}

// Copies the stamp between HOST and the first bytes of the device frame BUFFER (writing
// them when TO_DEVICE), and waits for the copy: 64 bytes, nothing else of the frame.
// GStreamer exports the driver calls it loads: cuMemcpy2DAsync from 1.22 on (it has no
// cuMemcpyHtoD before 1.24), one row of 64 bytes, on the memory's own stream where it
// has one (1.24), so that the copy comes after the work queued there on the frame
// (a source's wait for its producer), and on the context's legacy stream otherwise.
bool copy_device_stamp(GstBuffer *buffer, Stamp *host, bool to_device)
{
	GstMapInfo map;
	const auto flags = GstMapFlags((to_device ? GST_MAP_WRITE : GST_MAP_READ) | GST_MAP_CUDA);
	if (!gst_buffer_map(buffer, &map, flags))
		return false;
	auto *memory = GST_CUDA_MEMORY_CAST(gst_buffer_peek_memory(buffer, 0));
	CUstream stream = nullptr;
#if GST_CHECK_VERSION(1, 24, 0)
	if (GstCudaStream *own = gst_cuda_memory_get_stream(memory))
		stream = gst_cuda_stream_get_handle(own);
#endif
	CUDA_MEMCPY2D copy{};
	const auto device = CUdeviceptr(reinterpret_cast<uintptr_t>(map.data));
	if (to_device) {
		host->timestamp_ns = monotonic_ns();
		copy.srcMemoryType = CU_MEMORYTYPE_HOST;
		copy.srcHost = host;
		copy.dstMemoryType = CU_MEMORYTYPE_DEVICE;
		copy.dstDevice = device;
	} else {
		copy.srcMemoryType = CU_MEMORYTYPE_DEVICE;
		copy.srcDevice = device;
		copy.dstMemoryType = CU_MEMORYTYPE_HOST;
		copy.dstHost = host;
	}
	copy.srcPitch = copy.dstPitch = sizeof(Stamp);
	copy.WidthInBytes = sizeof(Stamp);
	copy.Height = 1;
	// A stream takes work only while its context is current.
	bool ok = map.size >= sizeof(Stamp) && gst_cuda_context_push(memory->context);
	if (ok) {
		ok = CuMemcpy2DAsync(&copy, stream) == CUDA_SUCCESS && CuStreamSynchronize(stream) == CUDA_SUCCESS;
		gst_cuda_context_pop(nullptr);
	}
	gst_buffer_unmap(buffer, &map);
	return ok;
}
#endif

// Whether BUFFER is a device frame (never, without GStreamer's CUDA library).
bool in_device_memory(GstBuffer *buffer)
{
#ifdef XMEM_BENCH_HAVE_GST_CUDA
	return is_device_frame(buffer);
#else
	(void)buffer;
	return false;
#endif
}

// Reads the stamp from BUFFER's first bytes, in whichever memory the frame is.
bool read_stamp(GstBuffer *buffer, Stamp &stamp)
{
	if (!buffer)
		return false;
#ifdef XMEM_BENCH_HAVE_GST_CUDA
	if (is_device_frame(buffer))
		return copy_device_stamp(buffer, &stamp, false);
#endif
	return gst_buffer_extract(buffer, 0, &stamp, sizeof(stamp)) == sizeof(stamp);
}

// Writes STAMP, with CLOCK_MONOTONIC taken right before the write, into the first
// bytes of the writable BUFFER, and nothing else.
bool write_stamp(GstBuffer *buffer, Stamp stamp)
{
#ifdef XMEM_BENCH_HAVE_GST_CUDA
	if (is_device_frame(buffer))
		return copy_device_stamp(buffer, &stamp, true);
#endif
	GstMapInfo map;
	if (!gst_buffer_map(buffer, &map, GST_MAP_WRITE))
		return false;
	bool ok = map.size >= sizeof(Stamp);
	if (ok) {
		stamp.timestamp_ns = monotonic_ns();
		std::memcpy(map.data, &stamp, sizeof(stamp));
	}
	gst_buffer_unmap(buffer, &map);
	return ok;
}

// Pipeline descriptions

constexpr const char *kCudaMedia = "video/x-raw(memory:CUDAMemory)";

std::string caps_string(const Options &o)
{
	return std::string(o.memory == Memory::cuda ? kCudaMedia : "video/x-raw") +
	       ",format=NV12,width=" + std::to_string(o.width) + ",height=" + std::to_string(o.height) +
	       ",framerate=" + std::to_string(o.fps) + "/1";
}

const char *memory_name(const Options &o)
{
	return o.memory == Memory::cuda ? "cuda" : "system";
}

gsize frame_bytes(const Options &o)
{
	GstVideoInfo info;
	gst_video_info_set_format(&info, GST_VIDEO_FORMAT_NV12, o.width, o.height);
	return GST_VIDEO_INFO_SIZE(&info);
}

// The consumer's appsink, the same for every pair: no clock sync, no preroll (a
// tee's branches would wait for each other), and no last-sample reference, so
// that it holds no frame once new-sample returns.
constexpr const char *kAppSink = "appsink sync=false async=false enable-last-sample=false";

// Whether FACTORY's elements have PROPERTY, asked of the element's class rather
// than guessed from GStreamer's version (a backport or a distribution patch counts).
bool has_property(const char *factory, const char *property)
{
	GstElementFactory *found = gst_element_factory_find(factory);
	if (!found)
		return false;
	auto *loaded = GST_ELEMENT_FACTORY(gst_plugin_feature_load(GST_PLUGIN_FEATURE(found)));
	gst_object_unref(found);
	if (!loaded)
		return false;
	GType type = gst_element_factory_get_element_type(loaded);
	gst_object_unref(loaded);
	if (type == G_TYPE_INVALID)
		return false;
	gpointer klass = g_type_class_ref(type);
	bool has = g_object_class_find_property(G_OBJECT_CLASS(klass), property) != nullptr;
	g_type_class_unref(klass);
	return has;
}

// Each pair's best settings for this job (see docs/benchmarks.md).
std::string sink_description(const Options &o, const std::string &address)
{
	switch (o.pair->pair) {
	case Pair::xmem:
	case Pair::xmem_spin:
		// Block rather than drop (the default): every frame is counted. memory=cuda: a
		// device pool, which is what memory=auto makes of CUDA input too, but one that
		// fails to start where there is no device instead of becoming something else.
		return "xmemsink name=sink pool-name=" + address + " policy=block sync=false enable-last-sample=false" +
		       (o.memory == Memory::cuda ? " memory=cuda" : "");
	case Pair::cudaipc_legacy:
	case Pair::cudaipc_mmap:
		// Its default address is one path for every run: each run its own socket.
		return "cudaipcsink name=sink address=" + address +
		       (o.pair->pair == Pair::cudaipc_mmap ? " ipc-mode=mmap" : " ipc-mode=legacy") +
		       " sync=false enable-last-sample=false";
	case Pair::shm:
		// Room for 10 frames: unthrottled, allocations from the area rarely fail
		// (a failed one falls back to system memory, which shmsink copies).
		return "shmsink name=sink socket-path=" + address +
		       " shm-size=" + std::to_string(frame_bytes(o) * 10 + (1u << 20)) +
		       " wait-for-connection=true sync=false enable-last-sample=false";
	case Pair::unixfd:
		// wait-for-connection (1.26): frames wait for a consumer instead of being
		// dropped before one connects, as shmsink's do.
		return "unixfdsink name=sink socket-path=" + address + " sync=false enable-last-sample=false" +
		       (has_property("unixfdsink", "wait-for-connection") ? " wait-for-connection=true" : "");
	case Pair::floor:
		break;
	}
	// The floor: the consumers' appsinks in the producer's pipeline.
	if (o.consumers == 1)
		return std::string(kAppSink) + " name=sink0";
	std::string d = "tee name=t";
	for (uint32_t i = 0; i < o.consumers; i++)
		d += " t. ! " + std::string(kAppSink) + " name=sink" + std::to_string(i);
	return d;
}

std::string src_description(const Options &o, const std::string &address)
{
	switch (o.pair->pair) {
	case Pair::xmem:
	case Pair::xmem_spin:
		// Caps come from the producer. timeout: give up on a missing pool or frame.
		// --memory cuda: CUDA memory out (xmemsrc would give system memory to caps without it).
		return "xmemsrc name=source pool-name=" + address +
		       " timeout=" + std::to_string(uint64_t(o.timeout * 1e9)) +
		       (o.pair->pair == Pair::xmem_spin ? " wake=spin-before spin-budget=500" : "") + " ! " +
		       (o.memory == Memory::cuda ? std::string(kCudaMedia) + " ! " : "") + kAppSink + " name=sink0";
	case Pair::cudaipc_legacy:
		// io-mode=import: the sender's memory itself, not a copy into the source's own
		// (the default). mmap mode has no choice: cudaipcsrc (1.24 to 1.26) maps each
		// frame's exported memory, copies it into memory of its own and unmaps it.
		return "cudaipcsrc name=source address=" + address + " io-mode=import ! " + kAppSink + " name=sink0";
	case Pair::cudaipc_mmap:
		return "cudaipcsrc name=source address=" + address + " ! " + kAppSink + " name=sink0";
	case Pair::shm:
		// shm carries no caps: they are set by hand after the source.
		return "shmsrc name=source socket-path=" + address + " is-live=true ! " + caps_string(o) + " ! " +
		       kAppSink + " name=sink0";
	case Pair::unixfd:
		return "unixfdsrc name=source socket-path=" + address + " ! " + kAppSink + " name=sink0";
	case Pair::floor:
		break;
	}
	return "";
}

// The producer's appsrc, the same for every pair: live, no timestamps, and at most
// two frames queued before push_buffer() blocks (so an unthrottled producer waits
// for the sink instead of queueing without bound).
constexpr const char *kAppSrc =
	"appsrc name=src is-live=true format=time block=true max-buffers=2 max-bytes=0 max-time=0";

// Errors posted on a pipeline's bus, recorded from any thread.
class BusWatch
{
public:
	explicit BusWatch(GstElement *pipeline)
	{
		GstBus *bus = gst_element_get_bus(pipeline);
		gst_bus_set_sync_handler(bus, on_message, this, nullptr);
		gst_object_unref(bus);
	}
	bool failed() const { return failed_.load(std::memory_order_acquire); }
	bool eos() const { return eos_.load(std::memory_order_acquire); }
	std::string error()
	{
		std::lock_guard lock(lock_);
		return error_;
	}

private:
	static GstBusSyncReply on_message(GstBus *, GstMessage *msg, gpointer data)
	{
		auto *self = static_cast<BusWatch *>(data);
		if (GST_MESSAGE_TYPE(msg) == GST_MESSAGE_ERROR) {
			GError *err = nullptr;
			gchar *debug = nullptr;
			gst_message_parse_error(msg, &err, &debug);
			std::lock_guard lock(self->lock_);
			if (self->error_.empty())
				self->error_ = std::string(GST_OBJECT_NAME(GST_MESSAGE_SRC(msg))) + ": " +
					       err->message + (debug ? std::string(" (") + debug + ")" : "");
			self->failed_.store(true, std::memory_order_release);
			g_error_free(err);
			g_free(debug);
		} else if (GST_MESSAGE_TYPE(msg) == GST_MESSAGE_EOS) {
			self->eos_.store(true, std::memory_order_release);
		}
		return GST_BUS_DROP;
	}

	std::mutex lock_; // guards error_
	std::string error_;
	std::atomic<bool> failed_{ false };
	std::atomic<bool> eos_{ false };
};

// --breakdown: how far a frame has come, and when. A probe on a pad reads the stamp
// of each measured frame that passes it (a few hundred ns, so off by default).
class StageProbe
{
public:
	void attach(GstPad *pad) { gst_pad_add_probe(pad, GST_PAD_PROBE_TYPE_BUFFER, on_buffer, this, nullptr); }
	double p50_us()
	{
		std::lock_guard lock(lock_);
		std::vector<uint64_t> sorted = samples_;
		std::sort(sorted.begin(), sorted.end());
		return percentile_us(sorted, 0.5);
	}

private:
	static GstPadProbeReturn on_buffer(GstPad *, GstPadProbeInfo *info, gpointer data)
	{
		uint64_t now = monotonic_ns();
		Stamp stamp{};
		GstBuffer *buffer = GST_PAD_PROBE_INFO_BUFFER(info);
		if (read_stamp(buffer, stamp) && stamp.magic == kStampMagic && stamp.index != kWarmup) {
			auto *self = static_cast<StageProbe *>(data);
			std::lock_guard lock(self->lock_);
			self->samples_.push_back(now - stamp.timestamp_ns);
		}
		return GST_PAD_PROBE_OK;
	}

	std::mutex lock_; // guards samples_ (streaming thread, then the app's)
	std::vector<uint64_t> samples_;
};

// Consumer side, shared by every pair

// Reads the stamp of each frame an appsink receives. Its callbacks run on the
// appsink's streaming thread; everything else on the app's thread, under lock_
// (the streaming thread takes it only at the first and the last measured frame).
class Recorder
{
public:
	// DEVICE: frames should come in CUDA memory; those that do not are counted.
	Recorder(uint64_t frames, bool count_cpu, bool device) : count_cpu_(count_cpu), device_(device)
	{
		latencies_.reserve(frames);
	}

	void attach(GstElement *appsink)
	{
		GstAppSinkCallbacks callbacks{};
		callbacks.new_sample = on_sample;
		callbacks.eos = on_eos;
		gst_app_sink_set_callbacks(GST_APP_SINK(appsink), &callbacks, this, nullptr);
	}

	// Called once, on the streaming thread, when the first frame arrives.
	std::function<void()> on_first_frame;

	bool seen_first() const { return first_.load(std::memory_order_acquire); }
	uint64_t last_frame_ns() const { return last_frame_ns_.load(std::memory_order_relaxed); }
	bool wait_done(std::chrono::milliseconds timeout)
	{
		std::unique_lock lock(lock_);
		return done_cv_.wait_for(lock, timeout, [this] { return done_; });
	}
	bool done()
	{
		std::lock_guard lock(lock_);
		return done_;
	}

	Report report(std::vector<uint64_t> &latencies)
	{
		std::lock_guard lock(lock_);
		done_ = true; // no more samples from here on
		Report r{};
		r.magic = kReportMagic;
		r.samples = latencies_.size();
		r.corrupt = corrupt_;
		r.host_frames = host_frames_;
		r.cpu_ns = cpu_end_ > cpu_start_ ? cpu_end_ - cpu_start_ : 0;
		r.first_ns = first_ns_;
		r.last_ns = last_ns_;
		std::string threads;
		for (auto &[name, ns] : threads_)
			threads += name + "=" + std::to_string(ns) + ";";
		// Cut to the report's fixed field if longer: the per-thread figures are an aside.
		(void)std::snprintf(r.threads, sizeof(r.threads), "%s", threads.c_str());
		latencies = latencies_;
		return r;
	}

private:
	static GstFlowReturn on_sample(GstAppSink *sink, gpointer data)
	{
		uint64_t now = monotonic_ns();
		GstSample *sample = gst_app_sink_pull_sample(sink);
		if (!sample)
			return GST_FLOW_OK;
		static_cast<Recorder *>(data)->frame(gst_sample_get_buffer(sample), now);
		gst_sample_unref(sample);
		return GST_FLOW_OK;
	}

	static void on_eos(GstAppSink *, gpointer data)
	{
		auto *self = static_cast<Recorder *>(data);
		std::lock_guard lock(self->lock_);
		self->eos_ = true;
		self->done_cv_.notify_all();
	}

	void frame(GstBuffer *buffer, uint64_t now)
	{
		Stamp stamp{};
		bool ok = read_stamp(buffer, stamp) && stamp.magic == kStampMagic;
		last_frame_ns_.store(now, std::memory_order_relaxed);
		if (!first_.load(std::memory_order_relaxed)) {
			first_.store(true, std::memory_order_release);
			if (on_first_frame)
				on_first_frame();
		}
		if (ok && stamp.index == kWarmup)
			return;
		// Uncontended but for the end: the app thread waits on done_cv_.
		std::lock_guard lock(lock_);
		if (!ok) {
			corrupt_++;
			return;
		}
		if (done_)
			return;
		if (device_ && !in_device_memory(buffer))
			host_frames_++;
		if (latencies_.empty()) {
			if (count_cpu_) {
				threads_start_ = thread_cpu_ns();
				cpu_start_ = process_cpu_ns();
			}
			first_ns_ = now;
		}
		latencies_.push_back(now - stamp.timestamp_ns);
		if (stamp.flags & kLastFrame) {
			if (count_cpu_) {
				cpu_end_ = process_cpu_ns();
				threads_ = thread_cpu_since(threads_start_);
			}
			last_ns_ = now;
			done_ = true;
			done_cv_.notify_all();
		}
	}

	const bool count_cpu_;
	const bool device_;
	std::atomic<bool> first_{ false };
	std::atomic<uint64_t> last_frame_ns_{ 0 };

	std::mutex lock_;
	std::condition_variable done_cv_;
	bool done_ = false;
	bool eos_ = false;
	std::vector<uint64_t> latencies_;
	uint64_t corrupt_ = 0;
	uint64_t host_frames_ = 0;
	uint64_t cpu_start_ = 0, cpu_end_ = 0;
	std::map<std::string, uint64_t> threads_start_, threads_;
	uint64_t first_ns_ = 0, last_ns_ = 0;

public:
	// Set under lock_ by on_eos(); the app polls it.
	bool got_eos()
	{
		std::lock_guard lock(lock_);
		return eos_;
	}
};

// Waits until RECORDER has its last measured frame, the stream ends or fails, or
// nothing arrives for a while. False with WHY when no frame came at all.
bool wait_for_stream(Recorder &recorder, BusWatch &bus, uint64_t deadline, std::string &why)
{
	// Frames come every 1/fps or faster: past this silence the producer is gone.
	constexpr uint64_t kIdle = 5'000'000'000;
	for (;;) {
		// Long waits: this thread is the app's, and must cost nothing per frame.
		if (recorder.wait_done(std::chrono::milliseconds(1000)) || recorder.got_eos())
			return true;
		uint64_t now = monotonic_ns();
		if (bus.failed()) {
			why = bus.error();
			return false;
		}
		if (now >= deadline) {
			why = recorder.seen_first() ? "the last frame did not come before the deadline"
						    : "no frame before the deadline";
			return false;
		}
		if (recorder.seen_first() && now - recorder.last_frame_ns() > kIdle) {
			why = "no frame for 5 s";
			return false;
		}
	}
}

// Device frames: whether the source (xmemsrc) handed them over in place or copied them.
void source_counters(GstElement *pipeline, Report &report)
{
	GstElement *source = gst_bin_get_by_name(GST_BIN(pipeline), "source");
	if (!source)
		return;
	if (g_object_class_find_property(G_OBJECT_GET_CLASS(source), "stats")) {
		GstStructure *stats = nullptr;
		g_object_get(source, "stats", &stats, nullptr);
		guint64 zero_copy = 0, copied = 0;
		if (stats && gst_structure_get_uint64(stats, "zero-copy", &zero_copy) &&
		    gst_structure_get_uint64(stats, "copied", &copied)) {
			report.source_zero_copy = zero_copy;
			report.source_copied = copied;
			report.source_counted = 1;
		}
		if (stats)
			gst_structure_free(stats);
	}
	gst_object_unref(source);
}

int run_consumer(const Options &o)
{
	prctl(PR_SET_NAME, "consumer-app");
	// Dies with its producer, whatever happens to it.
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() == 1)
		return 1;
	const uint64_t deadline = monotonic_ns() + uint64_t(o.timeout * 1e9);
	Recorder recorder(o.frames, true, o.memory == Memory::cuda);
	// Ready (streaming thread) strictly before the report (this thread), or not at all.
	std::mutex pipe_lock;
	bool reported = false;
	recorder.on_first_frame = [&] {
		std::lock_guard lock(pipe_lock);
		Ready ready{ kReadyMagic };
		if (!reported)
			write_all(kReportFd, &ready, sizeof(ready));
	};
	Report failure{};
	failure.magic = kReportMagic;
	failure.status = 1;
#ifdef XMEM_BENCH_HAVE_GST_CUDA
	// The stamp's copy calls the driver through GStreamer's CUDA library.
	if (o.memory == Memory::cuda && !gst_cuda_load_library()) {
		(void)std::snprintf(failure.error, sizeof(failure.error), "%s",
				    "GStreamer's CUDA library cannot load the CUDA driver (libcuda.so.1)");
		write_all(kReportFd, &failure, sizeof(failure));
		return 1;
	}
#endif

	std::string description = src_description(o, o.address);
	GError *err = nullptr;
	GstElement *pipeline = gst_parse_launch(description.c_str(), &err);
	if (!pipeline || err) {
		// Cut to the report's fixed field if longer: what is left says enough.
		(void)std::snprintf(failure.error, sizeof(failure.error), "%s: %s", description.c_str(),
				    err ? err->message : "cannot build the pipeline");
		write_all(kReportFd, &failure, sizeof(failure));
		return 1;
	}
	BusWatch bus(pipeline);
	GstElement *sink = gst_bin_get_by_name(GST_BIN(pipeline), "sink0");
	recorder.attach(sink);
	gst_object_unref(sink);
	StageProbe source_probe;
	if (o.breakdown) {
		GstElement *source = gst_bin_get_by_name(GST_BIN(pipeline), "source");
		GstPad *pad = gst_element_get_static_pad(source, "src");
		source_probe.attach(pad);
		gst_object_unref(pad);
		gst_object_unref(source);
	}

	std::string why;
	bool ok = gst_element_set_state(pipeline, GST_STATE_PLAYING) != GST_STATE_CHANGE_FAILURE;
	if (ok)
		ok = wait_for_stream(recorder, bus, deadline, why);
	else
		why = bus.failed() ? bus.error() : "cannot start the pipeline";
	std::vector<uint64_t> latencies;
	Report report = recorder.report(latencies);
	report.source_p50_us = o.breakdown ? source_probe.p50_us() : 0.0;
	if (o.memory == Memory::cuda)
		source_counters(pipeline, report);
	if (!ok) {
		report.status = 1;
		(void)std::snprintf(report.error, sizeof(report.error), "%s", why.c_str()); // cut to fit, as above
	}
	// Reported before the teardown, which must not hold the producer up.
	bool sent;
	{
		std::lock_guard lock(pipe_lock);
		reported = true;
		sent = write_all(kReportFd, &report, sizeof(report)) &&
		       write_all(kReportFd, latencies.data(), latencies.size() * sizeof(uint64_t));
		::close(kReportFd);
	}
	gst_element_set_state(pipeline, GST_STATE_NULL);
	gst_object_unref(pipeline);
	return sent && ok ? 0 : 1;
}

// Producer side

struct Child {
	pid_t pid = -1;
	int report = -1; // read end of its report pipe
	bool ready = false; // its Ready came
	uint64_t pending_magic = 0; // a report's magic, read while waiting for Ready
};

// Every spawned consumer, for the watchdog to kill.
std::mutex children_lock;
std::vector<pid_t> children_pids;

int private_fd(int fd)
{
	int moved = ::fcntl(fd, F_DUPFD_CLOEXEC, kFirstPrivateFd);
	::close(fd);
	return moved;
}

// Spawns this binary again as a consumer: posix_spawn, never fork(), since
// GStreamer's threads are running by now.
bool spawn_consumer(const std::vector<std::string> &args, Child &child)
{
	int fds[2];
	if (::pipe2(fds, O_CLOEXEC) < 0)
		return false;
	int rd = private_fd(fds[0]), wr = private_fd(fds[1]);
	if (rd < 0 || wr < 0)
		return false;
	std::vector<std::string> copy = args;
	std::vector<char *> argv;
	argv.reserve(copy.size() + 1);
	for (auto &a : copy)
		argv.push_back(a.data());
	argv.push_back(nullptr);
	posix_spawn_file_actions_t actions;
	posix_spawn_file_actions_init(&actions);
	posix_spawn_file_actions_adddup2(&actions, wr, kReportFd);
	// XMEM_BENCH_EXE: under valgrind, /proc/self/exe is valgrind's own tool binary.
	// getenv() races only with setenv(), which this program never calls.
	const char *exe = std::getenv("XMEM_BENCH_EXE"); // NOLINT(concurrency-mt-unsafe)
	int err =
		posix_spawn(&child.pid, exe && *exe ? exe : "/proc/self/exe", &actions, nullptr, argv.data(), environ);
	posix_spawn_file_actions_destroy(&actions);
	::close(wr);
	if (err != 0) {
		::close(rd);
		errno = err;
		return false;
	}
	child.report = rd;
	std::lock_guard lock(children_lock);
	children_pids.push_back(child.pid);
	return true;
}

// Where the producer's frames come from: what the sink proposed, or plain memory.
struct Allocation {
	GstBufferPool *pool = nullptr;
	GstAllocator *allocator = nullptr;
	GstAllocationParams params{};
	std::string kind = "none";

	Allocation() = default;
	Allocation(const Allocation &) = delete;
	Allocation &operator=(const Allocation &) = delete;
	~Allocation()
	{
		if (pool) {
			gst_buffer_pool_set_active(pool, FALSE);
			gst_object_unref(pool);
		}
		if (allocator)
			gst_object_unref(allocator);
	}
	void swap(Allocation &other)
	{
		std::swap(pool, other.pool);
		std::swap(allocator, other.allocator);
		std::swap(params, other.params);
		std::swap(kind, other.kind);
	}
};

// What upstream elements do in decide_allocation(): ask downstream with the caps,
// take the first pool (configured and activated) or else the first allocator.
void negotiate_allocation(GstElement *appsrc, GstCaps *caps, gsize size, Allocation &a)
{
	GstPad *pad = gst_element_get_static_pad(appsrc, "src");
	GstQuery *query = gst_query_new_allocation(caps, TRUE);
	bool answered = gst_pad_peer_query(pad, query);
	gst_object_unref(pad);
	if (answered && gst_query_get_n_allocation_pools(query) > 0) {
		GstBufferPool *pool = nullptr;
		guint psize = 0, min = 0, max = 0;
		gst_query_parse_nth_allocation_pool(query, 0, &pool, &psize, &min, &max);
		if (pool) {
			GstStructure *config = gst_buffer_pool_get_config(pool);
			gst_buffer_pool_config_set_params(config, caps, guint(std::max<gsize>(psize, size)), min, max);
			if (gst_buffer_pool_has_option(pool, GST_BUFFER_POOL_OPTION_VIDEO_META))
				gst_buffer_pool_config_add_option(config, GST_BUFFER_POOL_OPTION_VIDEO_META);
			if (gst_buffer_pool_set_config(pool, config) && gst_buffer_pool_set_active(pool, TRUE)) {
				a.pool = pool;
				a.kind = std::string("pool ") + G_OBJECT_TYPE_NAME(pool);
			} else {
				gst_object_unref(pool);
			}
		}
	}
	if (!a.pool && answered && gst_query_get_n_allocation_params(query) > 0) {
		GstAllocator *allocator = nullptr;
		gst_query_parse_nth_allocation_param(query, 0, &allocator, &a.params);
		if (allocator) {
			a.allocator = allocator;
			a.kind = std::string("allocator ") + G_OBJECT_TYPE_NAME(allocator);
		}
	}
	gst_query_unref(query);
}

// unixfdsink proposes an allocator and no pool, and nothing else bounds the frames
// in flight: unthrottled, the consumer falls behind, the socket to it fills up,
// and GStreamer 1.26's unixfdsink (which sends while holding its object lock, the
// lock its thread needs to read the consumer's releases) and unixfdsrc (which
// sends its releases from its streaming thread) wait on each other for good.
// What a GstBaseSrc does with such an answer bounds it: a pool of its own over the
// proposed allocator, as many buffers as xmemsink has slots by default.
constexpr guint kOwnPoolBuffers = 8;

void bound_in_flight(GstCaps *caps, gsize size, Allocation &a)
{
	if (a.pool || !a.allocator)
		return;
	GstBufferPool *pool = gst_buffer_pool_new();
	GstStructure *config = gst_buffer_pool_get_config(pool);
	gst_buffer_pool_config_set_params(config, caps, guint(size), kOwnPoolBuffers, kOwnPoolBuffers);
	gst_buffer_pool_config_set_allocator(config, a.allocator, &a.params);
	if (gst_buffer_pool_set_config(pool, config) && gst_buffer_pool_set_active(pool, TRUE)) {
		a.pool = pool;
		a.kind = std::string("own pool of ") + std::to_string(kOwnPoolBuffers) + " over allocator " +
			 G_OBJECT_TYPE_NAME(a.allocator);
	} else {
		gst_object_unref(pool);
	}
}

GstBuffer *new_frame(const Allocation &a, gsize size)
{
	if (a.pool) {
		GstBuffer *buffer = nullptr;
		return gst_buffer_pool_acquire_buffer(a.pool, &buffer, nullptr) == GST_FLOW_OK ? buffer : nullptr;
	}
	GstAllocationParams params = a.params;
	return gst_buffer_new_allocate(a.allocator, size, a.allocator ? &params : nullptr);
}

// What the producer was doing, for the watchdog's record: set by the producer's
// main thread, read by the watchdog (string literals only).
std::atomic<const char *> producer_stage{ "starting" };
std::atomic<uint64_t> producer_pushed{ 0 }; // frames pushed, start-up included

// Writes STAMP (with the time) into the frame's first bytes and pushes it.
bool push_frame(GstElement *appsrc, GstBuffer *buffer, const Stamp &frame)
{
	if (!buffer)
		return false;
	if (!write_stamp(buffer, frame)) {
		gst_buffer_unref(buffer);
		return false;
	}
	producer_pushed.fetch_add(1, std::memory_order_relaxed);
	return gst_app_src_push_buffer(GST_APP_SRC(appsrc), buffer) == GST_FLOW_OK;
}

// Sleeps to the next frame time at FPS (no sleep when 0).
class Pacer
{
public:
	explicit Pacer(uint32_t fps) : period_(fps ? 1000000000u / fps : 0) { clock_gettime(CLOCK_MONOTONIC, &next_); }
	void wait()
	{
		if (!period_)
			return;
		next_.tv_nsec += long(period_);
		while (next_.tv_nsec >= 1000000000) {
			next_.tv_nsec -= 1000000000;
			next_.tv_sec++;
		}
		while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next_, nullptr) == EINTR) {
		}
	}

private:
	uint64_t period_;
	timespec next_{};
};

struct Result {
	bool ok = true;
	std::string error;
	std::vector<uint64_t> latencies;
	uint64_t samples = 0; // measured frames received, over every consumer
	uint64_t corrupt = 0;
	uint64_t host_frames = 0; // --memory cuda: received in system memory, every consumer
	uint64_t source_zero_copy = 0, source_copied = 0; // the consumers' sources' counters
	bool source_counted = false;
	uint64_t consumers_cpu_ns = 0;
	uint64_t last_ns = 0; // the last consumer's last measured frame
	double source_p50_us = 0; // --breakdown: the consumers' mean
	std::map<std::string, uint64_t> consumer_threads; // CPU ns by thread name, every consumer
	void fail(const std::string &why)
	{
		error += (error.empty() ? "" : "; ") + why;
		ok = false;
	}
};

// A private directory for this run's sockets, removed with everything in it.
class RunDirectory
{
public:
	RunDirectory()
	{
		gchar *dir = g_dir_make_tmp("xmem-bench-gst-XXXXXX", nullptr);
		if (dir)
			path_ = dir;
		g_free(dir);
	}
	~RunDirectory()
	{
		if (path_.empty())
			return;
		if (GDir *d = g_dir_open(path_.c_str(), 0, nullptr)) {
			while (const gchar *name = g_dir_read_name(d))
				::unlink((path_ + "/" + name).c_str());
			g_dir_close(d);
		}
		::rmdir(path_.c_str());
	}
	const std::string &path() const { return path_; }

private:
	std::string path_;
};

// The record for a run that produced no measurement.
std::string failure_record(const Options &o, const std::string &why, bool available = true)
{
	JsonRecord j;
	j.str("pair", o.pair->name);
	j.str("mode", available ? o.mode : "unavailable");
	j.str("memory", memory_name(o));
	j.str("source", o.h264.empty() ? "appsrc" : "h264");
	if (o.h264.empty()) {
		j.str("size", std::to_string(o.width) + "x" + std::to_string(o.height));
		j.num("width", o.width, 0);
		j.num("height", o.height, 0);
	} else {
		j.str("size", "the file's"); // known once decoded
	}
	j.num("fps_target", o.fps, 0);
	j.num("consumers", o.consumers, 0);
	j.boolean("available", available);
	j.str("error", why);
	j.str("command", o.command);
	j.boolean("ok", !available);
	return j.text();
}

// Past the run's timeout: report a failure, kill the consumers, exit. Nothing a
// stuck pipeline does can hold the benchmark up longer than that.
void start_watchdog(const Options &o)
{
	std::thread([o] {
		prctl(PR_SET_NAME, "watchdog");
		std::this_thread::sleep_for(std::chrono::duration<double>(o.timeout));
		std::string line = failure_record(
			o, "no result within --timeout " + std::to_string(int(o.timeout)) + " s (the producer was " +
				   producer_stage.load(std::memory_order_relaxed) + ", " +
				   std::to_string(producer_pushed.load(std::memory_order_relaxed)) + " frames pushed)");
		if (o.json)
			std::printf("%s\n", line.c_str());
		else
			(void)std::fprintf(stderr, "xmem-bench-gst: %s\n", line.c_str());
		(void)std::fflush(stdout); // best effort: the process ends here either way
		std::lock_guard lock(children_lock);
		for (pid_t pid : children_pids)
			::kill(pid, SIGKILL);
		std::_Exit(1);
	}).detach();
}

std::vector<std::string> consumer_args(const Options &o, const std::string &address)
{
	std::vector<std::string> args = { "xmem-bench-gst", "--role", "consumer" };
	args.insert(args.end(), { "--pair", o.pair->name, "--address", address });
	args.insert(args.end(), { "--width", std::to_string(o.width), "--height", std::to_string(o.height) });
	args.insert(args.end(), { "--fps", std::to_string(o.fps), "--frames", std::to_string(o.frames) });
	args.insert(args.end(), { "--timeout", std::to_string(o.timeout), "--memory", memory_name(o) });
	if (o.breakdown)
		args.push_back("--breakdown");
	return args;
}

// Reads what each consumer process sent and reaps it.
void gather(std::vector<Child> &children, uint64_t deadline, Result &r)
{
	for (auto &c : children) {
		// Never started (its spawn failed, or an earlier failure stopped the run):
		// nothing to read or reap, and kill(-1) would signal every process we may.
		if (c.pid <= 0)
			continue;
		Report rep{};
		uint64_t magic = c.pending_magic;
		bool got = magic || read_all(c.report, &magic, sizeof(magic), deadline);
		// Ready comes first, unless the consumer never saw a frame.
		if (got && magic == kReadyMagic)
			got = read_all(c.report, &magic, sizeof(magic), deadline);
		got = got && magic == kReportMagic;
		rep.magic = magic;
		if (got)
			got = read_all(c.report, reinterpret_cast<char *>(&rep) + sizeof(magic),
				       sizeof(rep) - sizeof(magic), deadline);
		got = got && rep.samples <= 100000000;
		size_t at = r.latencies.size();
		if (got) {
			r.latencies.resize(at + rep.samples);
			got = read_all(c.report, r.latencies.data() + at, rep.samples * sizeof(uint64_t), deadline);
		}
		::close(c.report);
		c.report = -1;
		if (!got) {
			r.latencies.resize(at);
			::kill(c.pid, SIGKILL);
			r.fail("consumer " + std::to_string(c.pid) + " sent no report");
		} else {
			if (rep.status != 0) {
				rep.error[sizeof(rep.error) - 1] = '\0';
				r.fail("consumer " + std::to_string(c.pid) + ": " + rep.error);
			}
			r.samples += rep.samples;
			r.corrupt += rep.corrupt;
			r.host_frames += rep.host_frames;
			if (rep.source_counted) {
				r.source_counted = true;
				r.source_zero_copy += rep.source_zero_copy;
				r.source_copied += rep.source_copied;
			}
			r.consumers_cpu_ns += rep.cpu_ns;
			r.source_p50_us += rep.source_p50_us / double(children.size());
			rep.threads[sizeof(rep.threads) - 1] = '\0';
			gchar **parts = g_strsplit(rep.threads, ";", -1);
			for (gchar **part = parts; *part; part++)
				if (const char *eq = std::strchr(*part, '='))
					r.consumer_threads[std::string(*part, size_t(eq - *part))] +=
						std::strtoull(eq + 1, nullptr, 10);
			g_strfreev(parts);
			r.last_ns = std::max(r.last_ns, rep.last_ns);
		}
		int status = 0;
		for (int i = 0; i < 200 && ::waitpid(c.pid, &status, WNOHANG) == 0; i++)
			std::this_thread::sleep_for(std::chrono::milliseconds(10));
		// One that hangs in its teardown (cudaipcsrc's, waiting for its server) gets
		// SIGTERM first: bench/cudacount writes its counts then; SIGKILL after a second.
		if (::waitpid(c.pid, &status, WNOHANG) == 0) {
			::kill(c.pid, SIGTERM);
			for (int i = 0; i < 100 && ::waitpid(c.pid, &status, WNOHANG) == 0; i++)
				std::this_thread::sleep_for(std::chrono::milliseconds(10));
		}
		if (::waitpid(c.pid, &status, WNOHANG) == 0) {
			::kill(c.pid, SIGKILL);
			::waitpid(c.pid, &status, 0);
		}
	}
}

// The sink's own counters, where it has them (xmemsink: zero-copy and copied frames).
void sink_counters(GstElement *pipeline, JsonRecord &j)
{
	GstElement *sink = gst_bin_get_by_name(GST_BIN(pipeline), "sink");
	if (!sink)
		return;
	if (g_object_class_find_property(G_OBJECT_GET_CLASS(sink), "stats")) {
		GstStructure *stats = nullptr;
		g_object_get(sink, "stats", &stats, nullptr);
		guint64 v = 0;
		if (stats && gst_structure_get_uint64(stats, "zero-copy", &v))
			j.num("sink_zero_copy", double(v), 0);
		if (stats && gst_structure_get_uint64(stats, "copied", &v))
			j.num("sink_copied", double(v), 0);
		// Device pools: CUDA input copied device to device into a slot.
		const gchar *memory = stats ? gst_structure_get_string(stats, "memory") : nullptr;
		if (memory && std::string_view(memory) == "cuda") {
			j.str("sink_memory", memory);
			if (gst_structure_get_uint64(stats, "device-copied", &v))
				j.num("sink_device_copied", double(v), 0);
		}
		if (stats)
			gst_structure_free(stats);
	}
	gst_object_unref(sink);
}

// Which frame is which, for the thread that makes the frames (the app's, or the
// decoder's streaming thread): warm-up frames until begin() (every consumer has had a
// frame), then `warmup` more, which touch every slot or block of the sink's memory,
// then the measured ones, the last one flagged. The CPU clocks start at the first
// measured frame.
class Schedule
{
public:
	explicit Schedule(const Options &o) : o_(o) {}

	void begin() { begun_.store(true, std::memory_order_release); }
	bool finished() const { return finished_.load(std::memory_order_acquire); }

	// The next frame's stamp (its time is taken when it is written).
	Stamp next()
	{
		std::lock_guard lock(lock_);
		const uint64_t seq = ++seq_;
		if (!begun_.load(std::memory_order_acquire) || finished_.load(std::memory_order_relaxed) ||
		    n_++ < o_.warmup)
			return { kStampMagic, seq, kWarmup, 0, 0 };
		const uint64_t index = measured_++;
		if (index == 0) {
			threads_start_ = thread_cpu_ns();
			cpu_start_ = process_cpu_ns();
			first_ns_ = monotonic_ns();
		}
		const bool last = index + 1 == o_.frames ||
				  (o_.seconds > 0 && double(monotonic_ns() - first_ns_) >= o_.seconds * 1e9);
		if (last)
			finished_.store(true, std::memory_order_release);
		return { kStampMagic, seq, index, 0, last ? kLastFrame : 0 };
	}

	uint64_t measured()
	{
		std::lock_guard lock(lock_);
		return measured_;
	}
	uint64_t first_ns()
	{
		std::lock_guard lock(lock_);
		return first_ns_;
	}
	uint64_t cpu_start()
	{
		std::lock_guard lock(lock_);
		return cpu_start_;
	}
	std::map<std::string, uint64_t> threads_start()
	{
		std::lock_guard lock(lock_);
		return threads_start_;
	}

private:
	const Options &o_;
	std::atomic<bool> begun_{ false };
	std::atomic<bool> finished_{ false };
	std::mutex lock_; // guards the rest: the frame maker's thread writes, the app's reads
	uint64_t seq_ = 0; // every frame, from 1
	uint64_t n_ = 0; // frames since begin()
	uint64_t measured_ = 0;
	uint64_t first_ns_ = 0, cpu_start_ = 0;
	std::map<std::string, uint64_t> threads_start_;
};

// --source h264: stamps each decoded frame where it enters the sink (the probe is on
// the sink's sink pad, or the tee's), and turns the end of the file into a loop: the
// EOS stops here, and the app thread seeks back to the start (a flushing seek, which
// the streaming thread cannot make on itself). Once the last measured frame has
// passed, the next one waits here until release(), so that decoding does not go on
// counting CPU time while the consumers report.
class DecodedStamper
{
public:
	DecodedStamper(Schedule &schedule, std::function<void()> before_last)
		: schedule_(schedule), before_last_(std::move(before_last))
	{
	}

	void attach(GstPad *pad)
	{
		gst_pad_add_probe(pad, GstPadProbeType(GST_PAD_PROBE_TYPE_BUFFER | GST_PAD_PROBE_TYPE_EVENT_DOWNSTREAM),
				  on_data, this, nullptr);
	}

	// Waits up to TIMEOUT for the file's end or the last measured frame.
	void wait(std::chrono::milliseconds timeout)
	{
		std::unique_lock lock(lock_);
		cv_.wait_for(lock, timeout, [this] { return ended_ || schedule_.finished() || !error_.empty(); });
	}
	// Whether the file ended since the last call, and how many frames came before.
	bool take_end(uint64_t &frames)
	{
		std::lock_guard lock(lock_);
		frames = frames_;
		return std::exchange(ended_, false);
	}
	std::string error()
	{
		std::lock_guard lock(lock_);
		return error_;
	}
	void release()
	{
		std::lock_guard lock(lock_);
		released_ = true;
		cv_.notify_all();
	}

private:
	static GstPadProbeReturn on_data(GstPad *, GstPadProbeInfo *info, gpointer data)
	{
		auto *self = static_cast<DecodedStamper *>(data);
		if (GST_PAD_PROBE_INFO_TYPE(info) & GST_PAD_PROBE_TYPE_BUFFER) {
			self->frame(info);
			return GST_PAD_PROBE_OK;
		}
		GstEvent *event = GST_PAD_PROBE_INFO_EVENT(info);
		if (event && GST_EVENT_TYPE(event) == GST_EVENT_EOS) {
			std::lock_guard lock(self->lock_);
			self->ended_ = true;
			self->cv_.notify_all();
			return GST_PAD_PROBE_DROP;
		}
		if (event && GST_EVENT_TYPE(event) == GST_EVENT_CAPS) {
			GstCaps *caps = nullptr;
			gst_event_parse_caps(event, &caps);
			GstVideoInfo info_out;
			// The stamp must fit in the first row of the luma plane (see parse()).
			if (!caps || !gst_video_info_from_caps(&info_out, caps) ||
			    GST_VIDEO_INFO_WIDTH(&info_out) < gint(sizeof(Stamp))) {
				std::lock_guard lock(self->lock_);
				self->error_ = "the decoded frames are narrower than the 64-byte stamp";
				self->cv_.notify_all();
			}
		}
		return GST_PAD_PROBE_OK;
	}

	void frame(GstPadProbeInfo *info)
	{
		{
			std::unique_lock lock(lock_);
			cv_.wait(lock, [this] { return !holding_ || released_; });
		}
		// Written in place; a buffer that someone else holds too is copied first.
		GstBuffer *buffer = gst_buffer_make_writable(GST_PAD_PROBE_INFO_BUFFER(info));
		GST_PAD_PROBE_INFO_DATA(info) = buffer;
		const Stamp stamp = schedule_.next();
		const bool last = stamp.flags & kLastFrame;
		if (last && before_last_)
			before_last_();
		const bool written = write_stamp(buffer, stamp);
		producer_pushed.fetch_add(1, std::memory_order_relaxed);
		std::lock_guard lock(lock_);
		frames_++;
		if (!written && error_.empty())
			error_ = "cannot write the stamp into a decoded frame";
		if (last || !written) {
			holding_ = last;
			cv_.notify_all();
		}
	}

	Schedule &schedule_;
	const std::function<void()> before_last_;
	std::mutex lock_; // guards the rest (the streaming thread, the app's)
	std::condition_variable cv_;
	bool ended_ = false;
	bool holding_ = false;
	bool released_ = false;
	uint64_t frames_ = 0;
	std::string error_;
};

// What the producer needs of CUDA for --memory cuda: a context, which the pipeline's
// CUDA elements (the sink, the decoder) share, so that no frame is copied from one
// context to another; its own pool where the sink proposes none; and the device
// memory in use. Without GStreamer's CUDA library, device frames are unavailable.
class DeviceSide
{
public:
	DeviceSide() = default;
	DeviceSide(const DeviceSide &) = delete;
	DeviceSide &operator=(const DeviceSide &) = delete;
#ifdef XMEM_BENCH_HAVE_GST_CUDA
	~DeviceSide()
	{
		if (context_)
			gst_object_unref(context_);
	}

	// Why O's pair cannot carry device frames here, or "" once it can.
	std::string prepare(const Options &o)
	{
		if (!gst_cuda_load_library())
			return "GStreamer's CUDA library cannot load the CUDA driver (libcuda.so.1)";
		context_ = gst_cuda_context_new(0);
		if (!context_)
			return "no usable CUDA device 0 (gst_cuda_context_new failed)";
		// The CUDA allocator, which a GstCudaBufferPool needs: registered by the first
		// CUDA element otherwise, and the floor's pipeline has none.
		gst_cuda_memory_init_once();
		if (o.pair->pair == Pair::cudaipc_mmap) {
			// Asked of the context as cudaipcsink does: without both it falls back to
			// legacy IPC (with a warning), which this pair must not measure.
			gboolean vmm = FALSE, fd = FALSE;
			if (g_object_class_find_property(G_OBJECT_GET_CLASS(context_), "virtual-memory") &&
			    g_object_class_find_property(G_OBJECT_GET_CLASS(context_), "os-handle"))
				g_object_get(context_, "virtual-memory", &vmm, "os-handle", &fd, nullptr);
			if (!vmm || !fd)
				return "CUDA device 0 has no virtual memory management or no POSIX file descriptor "
				       "export: cudaipcsink would fall back to legacy IPC";
		}
		if (o.pair->pair == Pair::cudaipc_legacy)
			return legacy_ipc_refused();
		return "";
	}

	void share_with(GstElement *pipeline)
	{
		GstContext *shared = gst_context_new_cuda_context(context_);
		gst_element_set_context(pipeline, shared);
		gst_context_unref(shared);
	}

	// A GstCudaBufferPool of the producer's own, as many buffers as xmemsink has slots
	// by default: the frames before the sink has caps, and all of them where it
	// proposes no pool. False when it cannot be made.
	bool own_pool(GstCaps *caps, gsize size, Allocation &a)
	{
		GstBufferPool *pool = gst_cuda_buffer_pool_new(context_);
		GstStructure *config = gst_buffer_pool_get_config(pool);
		gst_buffer_pool_config_set_params(config, caps, guint(size), kOwnPoolBuffers, kOwnPoolBuffers);
		gst_buffer_pool_config_add_option(config, GST_BUFFER_POOL_OPTION_VIDEO_META);
		if (gst_buffer_pool_set_config(pool, config) && gst_buffer_pool_set_active(pool, TRUE)) {
			a.pool = pool;
			a.kind = "own GstCudaBufferPool of " + std::to_string(kOwnPoolBuffers);
			return true;
		}
		gst_object_unref(pool);
		return false;
	}

	// The sink's pool when it proposes one of CUDA memory (cudaipcsink does, of the
	// memory its IPC mode exports); otherwise the own pool stays. xmemsink proposes
	// none for a device pool (its slots are no GStreamer memory): it copies each frame
	// in, device to device.
	static void adopt_pool(GstElement *appsrc, GstCaps *caps, gsize size, Allocation &a)
	{
		Allocation proposed;
		negotiate_allocation(appsrc, caps, size, proposed);
		if (proposed.pool && GST_IS_CUDA_BUFFER_POOL(proposed.pool))
			a.swap(proposed);
		else
			a.kind += proposed.pool ? " (the sink's " + proposed.kind + " is not CUDA memory)"
						: " (the sink proposed no pool)";
	}

	void sample_before()
	{
		sample(before_);
	}
	void sample_steady()
	{
		sample(steady_);
	}

	// gpu_mem_delta_mib: how much more device memory is in use at the last measured
	// frame than before the pipelines started, device-wide (every process's).
	void memory_delta(JsonRecord &out)
	{
		std::lock_guard lock(lock_);
		if (before_ >= 0 && steady_ >= 0) {
			out.num("gpu_mem_delta_mib", double(steady_ - before_) / double(1u << 20), 1);
			return;
		}
		out.null("gpu_mem_delta_mib");
		out.str("gpu_mem_error", why_.empty() ? "not sampled" : why_);
	}

private:
	// Legacy IPC needs cuIpcGetMemHandle, which some drivers refuse (and the CUDA
	// simulator): asked once of a small allocation, before the run.
	std::string legacy_ipc_refused()
	{
#if GST_CHECK_VERSION(1, 24, 0)
		if (!gst_cuda_context_push(context_))
			return "cannot make the CUDA context current";
		CUdeviceptr probe = 0;
		CUresult result = CuMemAlloc(&probe, 4096);
		if (result == CUDA_SUCCESS) {
			CUipcMemHandle handle{};
			result = CuIpcGetMemHandle(&handle, probe);
			CuMemFree(probe);
		}
		gst_cuda_context_pop(nullptr);
		if (result == CUDA_SUCCESS)
			return "";
		const char *name = nullptr;
		CuGetErrorName(result, &name);
		return std::string("the CUDA driver makes no legacy IPC handle (cuIpcGetMemHandle: ") +
		       (name ? name : std::to_string(int(result))) + ")";
#else
		return "cudaipcsink needs GStreamer 1.24";
#endif
	}

	// Device memory in use on the context's device, every process's (cuMemGetInfo's
	// total - free). GStreamer's CUDA library exports no cuMemGetInfo: it comes from
	// the driver that library loaded (libcuda.so.1, already in the process; never
	// closed, it stays loaded anyway).
	void sample(int64_t &into)
	{
		using GetInfo = CUresult (*)(size_t *, size_t *);
		static const GetInfo get_info = [] {
			void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
			// The ABI name: cuda.h renames cuMemGetInfo to it.
			return driver ? reinterpret_cast<GetInfo>(dlsym(driver, "cuMemGetInfo_v2")) : nullptr;
		}();
		size_t free = 0, total = 0;
		CUresult result = CUDA_ERROR_NOT_FOUND;
		if (get_info && gst_cuda_context_push(context_)) {
			result = get_info(&free, &total);
			gst_cuda_context_pop(nullptr);
		}
		std::lock_guard lock(lock_);
		if (result == CUDA_SUCCESS && total >= free)
			into = int64_t(total - free);
		else if (why_.empty())
			why_ = get_info ? "cuMemGetInfo failed"
					: "the CUDA driver (libcuda.so.1) exports no cuMemGetInfo_v2";
	}

	GstCudaContext *context_ = nullptr;
	std::mutex lock_; // guards the samples (the app's thread, or the decoder's)
	int64_t before_ = -1, steady_ = -1;
	std::string why_;
#else
	~DeviceSide() = default;
	static std::string prepare(const Options &)
	{
		return "this xmem-bench-gst was built without GStreamer's CUDA library (gstreamer-cuda-1.0)";
	}
	static void share_with(GstElement *)
	{
	}
	static bool own_pool(GstCaps *, gsize, Allocation &)
	{
		return false;
	}
	static void adopt_pool(GstElement *, GstCaps *, gsize, Allocation &)
	{
	}
	static void sample_before()
	{
	}
	static void sample_steady()
	{
	}
	static void memory_delta(JsonRecord &out)
	{
		out.null("gpu_mem_delta_mib");
	}
#endif
};

int run_producer(const Options &o)
{
	prctl(PR_SET_NAME, "producer-app");
	start_watchdog(o);
	const uint64_t deadline = monotonic_ns() + uint64_t(o.timeout * 1e9);
	const bool in_process = o.pair->pair == Pair::floor;
	const bool device = o.memory == Memory::cuda;
	const bool decoded = !o.h264.empty();
	for (const char *factory : { o.pair->sink, o.pair->src }) {
		GstElementFactory *f = gst_element_factory_find(factory);
		if (!f) {
			// unixfd came with GStreamer 1.24: where it is missing, say so, not fail.
			// cudaipc too, and exits 77: nvcodec registers it only where a driver loads.
			bool optional = o.pair->pair == Pair::unixfd || is_cudaipc(o.pair);
			std::string why =
				std::string("no element '") + factory + "' in " + gst_version_string() +
				(o.pair->pair == Pair::unixfd ? " (unixfdsink/unixfdsrc need GStreamer 1.24)"
				 : is_cudaipc(o.pair)
					 ? " (cudaipcsink/cudaipcsrc: GStreamer 1.24's nvcodec, which registers them "
					   "only where it loads a CUDA driver)"
					 : " (is GST_PLUGIN_PATH set to the build's gst/ folder?)");
			std::printf("%s\n", failure_record(o, why, !optional).c_str());
			return !optional ? 1 : is_cudaipc(o.pair) ? kUnavailable : 0;
		}
		gst_object_unref(f);
	}
	DeviceSide cuda;
	if (device) {
		std::string why = cuda.prepare(o);
		if (!why.empty()) {
			std::printf("%s\n", failure_record(o, why, false).c_str());
			return kUnavailable;
		}
	}

	RunDirectory dir;
	if (dir.path().empty()) {
		std::printf("%s\n", failure_record(o, "cannot create a temporary directory").c_str());
		return 1;
	}
	const std::string address = dir.path() + "/" + o.pair->name + ".sock";
	gsize size = frame_bytes(o);
	uint32_t width = o.width, height = o.height; // --source h264: the file's, once decoded
	// The decoder's output caps: memory and format; the size is the file's.
	const std::string decoded_caps = std::string(kCudaMedia) + ",format=NV12";
	const std::string producer_description =
		(decoded ? "filesrc name=file ! h264parse ! " + o.decoder + " ! capsfilter name=decoded"
			 : std::string(kAppSrc)) +
		" ! " + sink_description(o, address);
	const std::string consumer_description = in_process ? "" : src_description(o, address);

	GError *err = nullptr;
	GstElement *pipeline = gst_parse_launch(producer_description.c_str(), &err);
	if (!pipeline || err) {
		// A decoder (or anything of device frames) that is not here: unavailable.
		const bool missing =
			device && err && err->domain == GST_PARSE_ERROR && err->code == GST_PARSE_ERROR_NO_SUCH_ELEMENT;
		std::printf(
			"%s\n",
			failure_record(o, producer_description + ": " + (err ? err->message : "cannot build"), !missing)
				.c_str());
		if (err)
			g_error_free(err);
		if (pipeline)
			gst_object_unref(pipeline);
		return missing ? kUnavailable : 1;
	}
	BusWatch bus(pipeline);
	if (device)
		cuda.share_with(pipeline);
	GstElement *appsrc = decoded ? nullptr : gst_bin_get_by_name(GST_BIN(pipeline), "src");
	GstCaps *caps = gst_caps_from_string(decoded ? decoded_caps.c_str() : caps_string(o).c_str());
	if (decoded) {
		GstElement *file = gst_bin_get_by_name(GST_BIN(pipeline), "file");
		g_object_set(file, "location", o.h264.c_str(), nullptr);
		gst_object_unref(file);
		GstElement *filter = gst_bin_get_by_name(GST_BIN(pipeline), "decoded");
		g_object_set(filter, "caps", caps, nullptr);
		gst_object_unref(filter);
	} else {
		gst_app_src_set_caps(GST_APP_SRC(appsrc), caps);
	}
	// The sink's sink pad (the tee's, for the floor's fan-out): where frames are
	// stamped with --source h264, and where --breakdown's first stage ends.
	GstPad *sink_pad = nullptr;
	{
		GstElement *before = gst_bin_get_by_name(GST_BIN(pipeline), decoded ? "decoded" : "src");
		GstPad *src_pad = gst_element_get_static_pad(before, "src");
		sink_pad = gst_pad_get_peer(src_pad);
		gst_object_unref(src_pad);
		gst_object_unref(before);
	}

	std::vector<std::unique_ptr<Recorder>> recorders;
	if (in_process) {
		for (uint32_t i = 0; i < o.consumers; i++) {
			recorders.push_back(std::make_unique<Recorder>(o.frames, false, device));
			GstElement *sink = gst_bin_get_by_name(GST_BIN(pipeline), ("sink" + std::to_string(i)).c_str());
			recorders.back()->attach(sink);
			gst_object_unref(sink);
		}
	}

	Schedule schedule(o);
	DecodedStamper stamper(schedule, [&cuda, device] {
		if (device)
			cuda.sample_steady();
	});
	if (decoded)
		stamper.attach(sink_pad);
	// --breakdown: the first pad after appsrc (or the decoder), i.e. once appsrc's
	// thread has the frame.
	StageProbe sink_probe;
	if (o.breakdown)
		sink_probe.attach(sink_pad);

	Result r;
	std::vector<Child> children(in_process ? 0 : o.consumers);
	Allocation alloc;
	uint64_t foreign = 0, loops = 0, cpu_end = 0;
	std::map<std::string, uint64_t> threads;
	uint64_t acquire_cpu_ns = 0, push_cpu_ns = 0;
	auto ready = [&] {
		if (in_process)
			return std::all_of(recorders.begin(), recorders.end(),
					   [](auto &rec) { return rec->seen_first(); });
		for (auto &c : children) {
			if (c.ready)
				continue;
			pollfd pfd = { c.report, POLLIN, 0 };
			if (::poll(&pfd, 1, 0) <= 0)
				return false;
			uint64_t magic = 0;
			if (!read_all(c.report, &magic, sizeof(magic), deadline) || magic != kReadyMagic) {
				// A report instead: the consumer failed, gather() reads why.
				c.pending_magic = magic ? magic : kReportMagic;
				return false;
			}
			c.ready = true;
		}
		return true;
	};
	// What stops the run before it has its frames, or "" (LATE: what passing the deadline means).
	auto failure = [&](const char *late) -> std::string {
		if (std::any_of(children.begin(), children.end(), [](auto &c) { return c.pending_magic != 0; }))
			return "a consumer failed while starting";
		if (bus.failed())
			return bus.error();
		if (decoded && !stamper.error().empty())
			return stamper.error();
		if (monotonic_ns() >= deadline)
			return late;
		return "";
	};
	// --source h264: at the file's end, back to its start.
	uint64_t frames_at_end = UINT64_MAX;
	auto loop_file = [&] {
		uint64_t frames = 0;
		if (!decoded || !stamper.take_end(frames))
			return;
		if (frames == frames_at_end)
			r.fail(o.h264 + ": the decoder made no frame of it");
		else if (!gst_element_seek_simple(pipeline, GST_FORMAT_TIME, GST_SEEK_FLAG_FLUSH, 0))
			r.fail(o.h264 + ": cannot seek back to its start");
		else
			loops++;
		frames_at_end = frames;
	};

	// Device memory in use before anything of the run allocates: the producer's context
	// exists already, the pipelines have nothing yet.
	if (device)
		cuda.sample_before();
	if (gst_element_set_state(pipeline, GST_STATE_PLAYING) == GST_STATE_CHANGE_FAILURE)
		r.fail(bus.failed() ? bus.error() : "cannot start the producer's pipeline");
	for (auto &c : children) {
		if (r.ok && !spawn_consumer(consumer_args(o, address), c))
			r.fail(std::string("cannot spawn a consumer: ") + error_text(errno));
	}

	producer_stage.store("waiting for every consumer's first frame", std::memory_order_relaxed);
	// 1. Until every consumer has a frame: plain memory (the sink has no caps yet,
	//    so it has nothing to propose; these frames are copied in). unixfdsink
	//    copies nothing before GStreamer 1.28 (a buffer without fd memory is an
	//    error), and its proposal, a memfd allocator, does not depend on caps:
	//    its frames come from that allocator from the first one. Device frames come
	//    from a pool of the producer's own. A decoder makes its frames itself.
	if (device && !decoded) {
		if (r.ok && !cuda.own_pool(caps, size, alloc))
			r.fail("cannot make a GstCudaBufferPool");
	} else if (o.pair->pair == Pair::unixfd) {
		negotiate_allocation(appsrc, caps, size, alloc);
		bound_in_flight(caps, size, alloc);
	}
	Pacer pacer(decoded ? 500 : o.fps ? o.fps : 100);
	while (r.ok && !ready()) {
		if (std::string why = failure("the consumers got no frame before the deadline"); !why.empty())
			r.fail(why);
		else if (decoded)
			loop_file();
		else if (!push_frame(appsrc, new_frame(alloc, size), schedule.next()))
			r.fail("push_buffer failed while starting");
		pacer.wait();
	}

	// 2. The sink has caps now: ask it for memory, as upstream elements do.
	if (r.ok && device && !decoded)
		DeviceSide::adopt_pool(appsrc, caps, size, alloc);
	else if (r.ok && !decoded && !alloc.pool && !alloc.allocator)
		negotiate_allocation(appsrc, caps, size, alloc);
	if (decoded)
		alloc.kind = "the decoder's (" + o.decoder + ")";
	schedule.begin();

	producer_stage.store(decoded ? "decoding frames" : "pushing frames", std::memory_order_relaxed);
	// 3. Warm up every slot or block of that memory, then measure.
	Pacer measured_pacer(o.fps);
	while (r.ok && decoded && !schedule.finished()) {
		// The streaming thread stamps; this one loops the file and watches.
		stamper.wait(std::chrono::milliseconds(100));
		loop_file();
		if (schedule.finished())
			break;
		if (std::string why = failure("the last measured frame was not decoded before the deadline");
		    !why.empty())
			r.fail(why);
	}
	while (r.ok && !decoded) {
		const Stamp stamp = schedule.next();
		const bool measuring = stamp.index != kWarmup;
		const bool last = stamp.flags & kLastFrame;
		if (last && device)
			cuda.sample_steady();
		// --breakdown: the app thread's CPU time getting a buffer, and stamping and pushing it.
		const uint64_t c0 = o.breakdown && measuring ? clock_ns(CLOCK_THREAD_CPUTIME_ID) : 0;
		GstBuffer *buffer = new_frame(alloc, size);
		const uint64_t c1 = o.breakdown && measuring ? clock_ns(CLOCK_THREAD_CPUTIME_ID) : 0;
		if (!buffer) {
			r.fail("no buffer from " + alloc.kind);
			break;
		}
		if (measuring && alloc.allocator && gst_buffer_peek_memory(buffer, 0)->allocator != alloc.allocator)
			foreign++; // shmsink's allocator falls back to system memory when its area is full
		if (!push_frame(appsrc, buffer, stamp)) {
			r.fail(bus.failed() ? bus.error() : "push_buffer failed");
			break;
		}
		if (o.breakdown && measuring) {
			acquire_cpu_ns += c1 - c0;
			push_cpu_ns += clock_ns(CLOCK_THREAD_CPUTIME_ID) - c1;
		}
		if (bus.failed())
			r.fail(bus.error());
		measured_pacer.wait();
		if (last)
			break;
	}
	const uint64_t sent = schedule.measured();
	const uint64_t first_push_ns = schedule.first_ns();
	const uint64_t cpu_start = schedule.cpu_start();
	const std::map<std::string, uint64_t> threads_start = schedule.threads_start();

	producer_stage.store("waiting for the consumers' reports", std::memory_order_relaxed);
	// 4. Everything the consumers measured.
	const uint64_t gather_deadline = std::min(deadline, monotonic_ns() + uint64_t(20'000'000'000));
	if (in_process) {
		for (auto &rec : recorders) {
			std::string why;
			bool ok = r.ok && wait_for_stream(*rec, bus, gather_deadline, why);
			std::vector<uint64_t> latencies;
			Report rep = rec->report(latencies);
			if (!ok && r.ok)
				r.fail(why);
			r.latencies.insert(r.latencies.end(), latencies.begin(), latencies.end());
			r.samples += rep.samples;
			r.corrupt += rep.corrupt;
			r.host_frames += rep.host_frames;
			r.last_ns = std::max(r.last_ns, rep.last_ns);
		}
	} else {
		gather(children, r.ok ? gather_deadline : monotonic_ns() + uint64_t(2'000'000'000), r);
	}
	cpu_end = process_cpu_ns();
	threads = thread_cpu_since(threads_start);
	if (r.ok && bus.failed())
		r.fail(bus.error());
	if (decoded) {
		// The frames' size is the file's.
		GstCaps *negotiated = gst_pad_get_current_caps(sink_pad);
		GstVideoInfo info;
		if (negotiated && gst_video_info_from_caps(&info, negotiated)) {
			width = uint32_t(GST_VIDEO_INFO_WIDTH(&info));
			height = uint32_t(GST_VIDEO_INFO_HEIGHT(&info));
			size = GST_VIDEO_INFO_SIZE(&info);
		}
		if (negotiated)
			gst_caps_unref(negotiated);
	}

	JsonRecord j;
	sink_counters(pipeline, j);
	stamper.release(); // the frame held after the last measured one goes on, into the teardown
	if (appsrc)
		gst_app_src_end_of_stream(GST_APP_SRC(appsrc));
	gst_element_set_state(pipeline, GST_STATE_NULL);
	if (appsrc)
		gst_object_unref(appsrc);
	gst_object_unref(sink_pad);
	gst_caps_unref(caps);

	std::sort(r.latencies.begin(), r.latencies.end());
	const uint64_t expected = sent * o.consumers;
	const uint64_t dropped = expected > r.samples ? expected - r.samples : 0;
	if (r.ok && sent == 0)
		r.fail("no frame measured");
	const double frames = double(std::max<uint64_t>(sent, 1));
	const double producer_cpu = double(cpu_end - cpu_start) / 1000.0 / frames;
	// A consumer's clock runs from its first measured frame to its last: sent - 1 frames.
	const double consumers_cpu = double(r.consumers_cpu_ns) / 1000.0 / double(std::max<uint64_t>(sent, 2) - 1);
	const double wall = r.last_ns > first_push_ns ? double(r.last_ns - first_push_ns) : 0.0;
	// Paced, the frames span (sent - 1) periods; unthrottled, the last one's delivery ends the run.
	const double fps = wall > 0 ? (o.fps ? double(sent - 1) : double(sent)) * 1e9 / wall : 0.0;
	const bool ok = r.ok && dropped == 0 && r.corrupt == 0 && r.host_frames == 0;
	const std::string error = !r.ok				   ? r.error
				  : dropped != 0 || r.corrupt != 0 ? "frames dropped or corrupt"
								   : "frames reached a consumer in system memory";
	if (sent == 0) {
		// Nothing measured: no figures, only why.
		std::string line = failure_record(o, r.error);
		if (o.json)
			std::printf("%s\n", line.c_str());
		else
			std::printf("FAILED: %s\n", r.error.c_str());
		(void)std::fflush(stdout); // on failure run.sh records "printed no result"
		gst_object_unref(pipeline);
		return 1;
	}

	JsonRecord out;
	out.str("pair", o.pair->name);
	out.str("mode", o.mode);
	out.str("memory", memory_name(o));
	out.str("source", decoded ? "h264" : "appsrc");
	out.str("size", std::to_string(width) + "x" + std::to_string(height));
	out.num("width", width, 0);
	out.num("height", height, 0);
	out.num("frame_bytes", double(size), 0);
	out.num("touched_bytes", sizeof(Stamp), 0);
	out.num("fps_target", o.fps, 0);
	out.num("frames", double(sent), 0);
	out.num("warmup", double(o.warmup), 0);
	out.num("consumers", o.consumers, 0);
	out.boolean("available", true);
	out.num("p50_us", percentile_us(r.latencies, 0.50), 1);
	out.num("p99_us", percentile_us(r.latencies, 0.99), 1);
	out.num("max_us", percentile_us(r.latencies, 1.0), 1);
	out.num("fps", fps, 1);
	if (in_process) {
		// One process: its CPU time is the producer's and the consumers' together.
		out.null("producer_cpu_us_per_frame");
		out.null("consumers_cpu_us_per_frame");
		out.num("cpu_us_per_frame", producer_cpu, 2);
	} else {
		out.num("producer_cpu_us_per_frame", producer_cpu, 2);
		out.num("consumers_cpu_us_per_frame", consumers_cpu, 2);
		out.num("cpu_us_per_frame", producer_cpu + consumers_cpu, 2);
	}
	out.raw("producer_threads_us_per_frame", threads_json(threads, frames));
	if (!in_process)
		out.raw("consumers_threads_us_per_frame",
			threads_json(r.consumer_threads, double(std::max<uint64_t>(sent, 2) - 1)));
	out.num("dropped", double(dropped), 0);
	out.num("corrupt", double(r.corrupt), 0);
	if (device) {
		cuda.memory_delta(out);
		out.num("consumers_host_memory_frames", double(r.host_frames), 0);
		if (r.source_counted) {
			out.num("consumers_source_zero_copy", double(r.source_zero_copy), 0);
			out.num("consumers_source_copied", double(r.source_copied), 0);
		}
	} else {
		out.null("gpu_mem_delta_mib");
	}
	if (o.breakdown) {
		out.num("stage_sink_p50_us", sink_probe.p50_us(), 1);
		out.num("app_acquire_cpu_us_per_frame", double(acquire_cpu_ns) / 1000.0 / frames, 2);
		out.num("app_push_cpu_us_per_frame", double(push_cpu_ns) / 1000.0 / frames, 2);
		if (!in_process)
			out.num("stage_source_p50_us", r.source_p50_us, 1);
	}
	out.str("allocation", alloc.kind);
	out.num("foreign_frames", double(foreign), 0);
	if (decoded) {
		out.str("source_file", o.h264);
		out.str("decoder", o.decoder);
		out.num("source_loops", double(loops), 0);
	}
	std::string counters = j.text();
	out.str("producer_pipeline", producer_description);
	if (!in_process)
		out.str("consumer_pipeline", consumer_description);
	out.str("gstreamer", gst_version_string());
	out.str("command", o.command);
	if (!ok)
		out.str("error", error);
	out.boolean("ok", ok);
	std::string line = out.text();
	if (counters.size() > 2) // the sink's counters, spliced in before the end
		line = line.substr(0, line.size() - 1) + ", " + counters.substr(1);

	if (o.json) {
		std::printf("%s\n", line.c_str());
	} else {
		// System memory as it always read; device frames and a decoded file say so.
		const std::string memory = device ? std::string(" in CUDA memory") : std::string();
		const std::string from = decoded ? " decoded from " + o.h264 : std::string();
		std::printf("%s %s %ux%u NV12%s%s, %u consumer(s), %s fps: buffers from %s\n", o.pair->name,
			    o.mode.c_str(), width, height, memory.c_str(), from.c_str(), o.consumers,
			    o.fps ? std::to_string(o.fps).c_str() : "unthrottled", alloc.kind.c_str());
		std::printf("  latency: p50 %.1f us, p99 %.1f us, max %.1f us (%zu samples)\n",
			    percentile_us(r.latencies, 0.5), percentile_us(r.latencies, 0.99),
			    percentile_us(r.latencies, 1.0), r.latencies.size());
		if (o.breakdown)
			std::printf("  p50 from the stamp: %.1f us to the sink's pad, %.1f us to the source's pad\n",
				    sink_probe.p50_us(), r.source_p50_us);
		std::printf("  frames/s %.1f, dropped %llu, corrupt %llu\n", fps, (unsigned long long)dropped,
			    (unsigned long long)r.corrupt);
		std::printf("  CPU us/frame: producer %.2f, consumers %.2f%s\n", producer_cpu, consumers_cpu,
			    in_process ? " (one process: the producer's figure is both)" : "");
		if (!ok)
			std::printf("  FAILED: %s\n", error.c_str());
	}
	(void)std::fflush(stdout); // as above
	gst_object_unref(pipeline);
	return ok ? 0 : 1;
}

} // namespace

int main(int argc, char **argv)
{
	Options o;
	if (!parse(argc, argv, o))
		return usage();
	o.command = "xmem-bench-gst";
	for (int i = 1; i < argc; i++)
		o.command += std::string(" ") + argv[i];
	// GLib names its thread pool's threads "pool-PRGNAME": not "pool-xmem-...", which
	// would read as xmem's in the per-thread CPU figures.
	g_set_prgname("gst-bench");
	gst_init(nullptr, nullptr);
	if (o.consumer)
		return run_consumer(o);
	return run_producer(o);
}
