// test_cudacount.cpp - the cudacount shim in front of a CUDA driver: child processes
// make known copies through it, and the JSON line each leaves is checked to the call and
// the byte. In front of the simulator (meson test cudacount-sim) it proves the counting
// and the forwarding, not a GPU's behaviour; in front of a GPU's driver (cudacount-gpu,
// skipped without one) it also proves cuGetProcAddress's, which the simulator lacks.
//
//   test-cudacount                      the tests; CUDACOUNT_SHIM: the shim;
//                                       CUDACOUNT_TEST_DRIVER: the driver behind it, or
//                                       empty for the one the shim finds (exit 77: none)
//   test-cudacount --child SCENARIO     one child, run by the tests
#include <cuda.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#include <dlfcn.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ; // NOLINT(readability-redundant-declaration): POSIX declares it nowhere

namespace {

#define CUDACOUNT_STR2(x) #x
#define CUDACOUNT_STR(x) CUDACOUNT_STR2(x)

constexpr std::size_t frame_bytes = std::size_t{ 256 } * 1024; // over the default 65536
constexpr std::size_t small_bytes = 4096;
constexpr std::size_t width_2d = 1024;
constexpr std::size_t height_2d = 128;
constexpr std::size_t host_to_host_width = 64;
constexpr std::size_t host_to_host_height = 2;
constexpr int child_threads = 4;
constexpr int copies_per_thread = 25;
// The child's way of saying "this driver has no cuGetProcAddress".
constexpr int exit_no_proc_address = 77;

enum class Dir { HtoD, DtoH, DtoD, HtoH };
constexpr std::array<std::string_view, 4> dir_names = { "HtoD", "DtoH", "DtoD", "HtoH" };

struct KnownCopy {
	Dir dir;
	std::size_t bytes;
};

// What the "copies" child does, in order (run_copies() below makes these calls).
constexpr std::array<KnownCopy, 9> copies_made = { {
	{ Dir::HtoD, frame_bytes }, // cuMemcpyHtoD
	{ Dir::HtoD, small_bytes }, // cuMemcpyHtoD
	{ Dir::DtoD, frame_bytes }, // cuMemcpyDtoD
	{ Dir::DtoH, frame_bytes }, // cuMemcpyDtoH
	{ Dir::HtoD, width_2d *height_2d }, // cuMemcpy2D
	{ Dir::HtoH, host_to_host_width *host_to_host_height }, // cuMemcpy2D, host to host
	{ Dir::DtoD, frame_bytes }, // cuMemcpy (unified: counted DtoD)
	{ Dir::DtoH, small_bytes }, // cuMemcpyDtoHAsync on a stream
	{ Dir::HtoD, frame_bytes }, // cuMemcpyHtoDAsync on a stream
} };
constexpr std::size_t memset_bytes = small_bytes; // cuMemsetD8Async, once
constexpr int failed_copies = 1; // cuMemcpyDtoH from device address 0

// ---- the child side ----------------------------------------------------------------------

[[noreturn]] void fail(const std::string &what)
{
	(void)std::fprintf(stderr, "child: %s\n", what.c_str());
	std::_Exit(2);
}

// The driver API through the shim, each name looked up as xmem and GStreamer look them up.
struct Cuda {
	void *lib = nullptr;

	template<typename T>
	T need(const char *name) const
	{
		void *p = ::dlsym(lib, name);
		if (!p)
			fail(std::string("the shim has no ") + name);
		return reinterpret_cast<T>(p);
	}
// NOLINTNEXTLINE(bugprone-macro-parentheses): `name` is a declarator, which takes none
#define CUDACOUNT_CALL(name) decltype(&::name) name = need<decltype(&::name)>(CUDACOUNT_STR(name))
	explicit Cuda(void *handle) : lib(handle)
	{
	}
	CUDACOUNT_CALL(cuInit);
	CUDACOUNT_CALL(cuDeviceGet);
	CUDACOUNT_CALL(cuDevicePrimaryCtxRetain);
	CUDACOUNT_CALL(cuCtxPushCurrent);
	CUDACOUNT_CALL(cuMemAlloc);
	CUDACOUNT_CALL(cuMemcpyHtoD);
	CUDACOUNT_CALL(cuMemcpyDtoH);
	CUDACOUNT_CALL(cuMemcpyDtoD);
	CUDACOUNT_CALL(cuMemcpy2D);
	CUDACOUNT_CALL(cuMemcpy);
	CUDACOUNT_CALL(cuStreamCreate);
	CUDACOUNT_CALL(cuStreamSynchronize);
	CUDACOUNT_CALL(cuMemcpyHtoDAsync);
	CUDACOUNT_CALL(cuMemcpyDtoHAsync);
	CUDACOUNT_CALL(cuMemsetD8Async);
#undef CUDACOUNT_CALL
};

// Each process reads its environment before it starts a thread.
std::string env(const char *name)
{
	const char *value = std::getenv(name); // NOLINT(concurrency-mt-unsafe): see above
	return value ? value : "";
}

void check(CUresult r, const char *what)
{
	if (r != CUDA_SUCCESS)
		fail(std::string(what) + " returned " + std::to_string(int(r)));
}

// As GStreamer opens it (GModule: RTLD_GLOBAL), so a driver's calls to its own exports
// (the simulator makes some) bind to the shim's too: none of them may be counted twice.
void *open_shim()
{
	const std::string path = env("CUDACOUNT_SHIM");
	if (path.empty())
		fail("CUDACOUNT_SHIM is not set");
	void *lib = ::dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
	if (!lib)
		fail(std::string("cannot open the shim: ") + ::dlerror()); // NOLINT(concurrency-mt-unsafe): one thread
	return lib;
}

CUcontext start(const Cuda &cu)
{
	check(cu.cuInit(0), "cuInit");
	CUdevice device = 0;
	check(cu.cuDeviceGet(&device, 0), "cuDeviceGet");
	CUcontext context = nullptr;
	check(cu.cuDevicePrimaryCtxRetain(&context, device), "cuDevicePrimaryCtxRetain");
	check(cu.cuCtxPushCurrent(context), "cuCtxPushCurrent");
	return context;
}

std::vector<unsigned char> pattern(std::size_t n)
{
	std::vector<unsigned char> bytes(n);
	for (std::size_t i = 0; i < n; ++i)
		bytes[i] = static_cast<unsigned char>(i * 7 + 3);
	return bytes;
}

int run_copies(const Cuda &cu)
{
	start(cu);
	CUdeviceptr a = 0;
	CUdeviceptr b = 0;
	check(cu.cuMemAlloc(&a, frame_bytes), "cuMemAlloc");
	check(cu.cuMemAlloc(&b, frame_bytes), "cuMemAlloc");
	const std::vector<unsigned char> in = pattern(frame_bytes);
	std::vector<unsigned char> out(frame_bytes);

	check(cu.cuMemcpyHtoD(a, in.data(), frame_bytes), "cuMemcpyHtoD");
	check(cu.cuMemcpyHtoD(a, in.data(), small_bytes), "cuMemcpyHtoD");
	check(cu.cuMemcpyDtoD(b, a, frame_bytes), "cuMemcpyDtoD");
	check(cu.cuMemcpyDtoH(out.data(), b, frame_bytes), "cuMemcpyDtoH");
	if (out != in)
		fail("the bytes did not come back through the shim");

	CUDA_MEMCPY2D plane{};
	plane.srcMemoryType = CU_MEMORYTYPE_HOST;
	plane.srcHost = in.data();
	plane.srcPitch = width_2d;
	plane.dstMemoryType = CU_MEMORYTYPE_DEVICE;
	plane.dstDevice = a;
	plane.dstPitch = width_2d;
	plane.WidthInBytes = width_2d;
	plane.Height = height_2d;
	check(cu.cuMemcpy2D(&plane), "cuMemcpy2D");

	std::vector<unsigned char> host_copy(host_to_host_width * host_to_host_height);
	CUDA_MEMCPY2D on_host{};
	on_host.srcMemoryType = CU_MEMORYTYPE_HOST;
	on_host.srcHost = in.data();
	on_host.srcPitch = host_to_host_width;
	on_host.dstMemoryType = CU_MEMORYTYPE_HOST;
	on_host.dstHost = host_copy.data();
	on_host.dstPitch = host_to_host_width;
	on_host.WidthInBytes = host_to_host_width;
	on_host.Height = host_to_host_height;
	check(cu.cuMemcpy2D(&on_host), "cuMemcpy2D host to host");

	check(cu.cuMemcpy(b, a, frame_bytes), "cuMemcpy");

	// A blocking stream: its work waits for what the legacy stream still has queued. The
	// cuMemcpy above (device to device) and the cuMemcpy2D before it (from pageable memory)
	// may still run when they return; a non-blocking stream's copies of the same buffers
	// would race them, on the real driver as on the simulator (ThreadSanitizer saw it).
	CUstream stream = nullptr;
	check(cu.cuStreamCreate(&stream, CU_STREAM_DEFAULT), "cuStreamCreate");
	check(cu.cuMemcpyDtoHAsync(out.data(), a, small_bytes, stream), "cuMemcpyDtoHAsync");
	check(cu.cuMemcpyHtoDAsync(b, in.data(), frame_bytes, stream), "cuMemcpyHtoDAsync");
	check(cu.cuMemsetD8Async(a, 0x5a, memset_bytes, stream), "cuMemsetD8Async");
	check(cu.cuStreamSynchronize(stream), "cuStreamSynchronize");

	if (cu.cuMemcpyDtoH(out.data(), 0, small_bytes) == CUDA_SUCCESS)
		fail("a copy from device address 0 succeeded");
	return 0;
}

int run_threads(const Cuda &cu)
{
	const CUcontext context = start(cu);
	CUdeviceptr device = 0;
	check(cu.cuMemAlloc(&device, small_bytes * child_threads), "cuMemAlloc");
	std::vector<std::thread> threads;
	threads.reserve(child_threads);
	for (int t = 0; t < child_threads; ++t) {
		threads.emplace_back([&, t] {
			check(cu.cuCtxPushCurrent(context), "cuCtxPushCurrent");
			const std::vector<unsigned char> in = pattern(small_bytes);
			for (int i = 0; i < copies_per_thread; ++i)
				check(cu.cuMemcpyHtoD(device + t * small_bytes, in.data(), small_bytes),
				      "cuMemcpyHtoD");
		});
	}
	for (std::thread &t : threads)
		t.join();
	return 0;
}

// Two copies through pointers cuGetProcAddress handed out (default and per-thread stream),
// one allocation through another (not a copy: the driver's own function).
int run_proc_address(const Cuda &cu)
{
	start(cu);
	const auto get = cu.need<decltype(&cuGetProcAddress)>(CUDACOUNT_STR(cuGetProcAddress));
	void *copy = nullptr;
	CUdriverProcAddressQueryResult found{};
	const CUresult r = get("cuMemcpyHtoD", &copy, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &found);
	if (r == CUDA_ERROR_NOT_FOUND)
		return exit_no_proc_address;
	check(r, "cuGetProcAddress_v2(cuMemcpyHtoD)");
	void *per_thread = nullptr;
	check(get("cuMemcpyHtoD", &per_thread, 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &found),
	      "cuGetProcAddress_v2(cuMemcpyHtoD, per-thread)");
	void *alloc = nullptr;
	check(get("cuMemAlloc", &alloc, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &found), "cuGetProcAddress_v2(cuMemAlloc)");
	if (copy == ::dlsym(cu.lib, "cuMemcpyHtoD_v2"))
		fail("cuGetProcAddress handed out the shim's export, not its counter");

	CUdeviceptr device = 0;
	check(reinterpret_cast<decltype(&cuMemAlloc)>(alloc)(&device, frame_bytes), "cuMemAlloc from cuGetProcAddress");
	const std::vector<unsigned char> in = pattern(frame_bytes);
	check(reinterpret_cast<decltype(&cuMemcpyHtoD)>(copy)(device, in.data(), frame_bytes), "cuMemcpyHtoD");
	check(reinterpret_cast<decltype(&cuMemcpyHtoD)>(per_thread)(device, in.data(), frame_bytes),
	      "cuMemcpyHtoD_v2_ptds");
	return 0;
}

volatile std::sig_atomic_t own_handler_ran = 0;

void own_handler(int)
{
	own_handler_ran = 1;
}

int run_one_frame(const Cuda &cu)
{
	start(cu);
	CUdeviceptr device = 0;
	check(cu.cuMemAlloc(&device, frame_bytes), "cuMemAlloc");
	const std::vector<unsigned char> in = pattern(frame_bytes);
	check(cu.cuMemcpyHtoD(device, in.data(), frame_bytes), "cuMemcpyHtoD");
	return 0;
}

int run_child(std::string_view scenario)
{
	if (scenario == "own-handler") {
		// Installed before the shim loads, as an application's would be.
		struct sigaction mine = {};
		mine.sa_handler = &own_handler;
		sigemptyset(&mine.sa_mask);
		::sigaction(SIGTERM, &mine, nullptr);
	}
	const Cuda cu(open_shim());
	if (scenario == "copies")
		return run_copies(cu);
	if (scenario == "threads")
		return run_threads(cu);
	if (scenario == "proc-address")
		return run_proc_address(cu);
	if (scenario == "sigterm") {
		run_one_frame(cu);
		::kill(::getpid(), SIGTERM);
		fail("SIGTERM did not end the process");
	}
	if (scenario == "own-handler") {
		run_one_frame(cu);
		::kill(::getpid(), SIGTERM);
		return own_handler_ran ? 0 : 3;
	}
	if (scenario == "no-driver") {
		for (int i = 0; i < 2; ++i) {
			if (cu.cuInit(0) != CUDA_ERROR_NO_DEVICE)
				fail("cuInit without a driver did not return CUDA_ERROR_NO_DEVICE");
		}
		const std::vector<unsigned char> in = pattern(small_bytes);
		if (cu.cuMemcpyHtoD(0, in.data(), small_bytes) != CUDA_ERROR_NO_DEVICE)
			fail("a copy without a driver did not return CUDA_ERROR_NO_DEVICE");
		return 0;
	}
	fail("unknown scenario " + std::string(scenario));
}

// ---- the parent side ---------------------------------------------------------------------

// The report line, flattened: "copies.HtoD.frame.calls" -> "3", "driver" -> the path, or
// "null". Only what the shim writes (objects, strings, unsigned numbers, null).
class FlatJson
{
public:
	explicit FlatJson(std::string_view text) : text_(text) { value(""); }
	std::map<std::string, std::string> fields;
	bool ok = true;

private:
	void value(const std::string &path)
	{
		skip_space();
		if (at('{')) {
			++pos_;
			skip_space();
			if (at('}')) {
				++pos_;
				return;
			}
			for (;;) {
				skip_space();
				const std::string key = string();
				skip_space();
				expect(':');
				value(path.empty() ? key : std::string(path).append(".").append(key));
				skip_space();
				if (at(',')) {
					++pos_;
					continue;
				}
				expect('}');
				return;
			}
		}
		if (at('"')) {
			fields[path] = string();
		} else if (text_.substr(pos_, 4) == "null") {
			pos_ += 4;
			fields[path] = "null";
		} else {
			const std::size_t start = pos_;
			while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_])))
				++pos_;
			ok = ok && pos_ > start;
			fields[path] = std::string(text_.substr(start, pos_ - start));
		}
	}
	std::string string()
	{
		std::string s;
		expect('"');
		while (pos_ < text_.size() && text_[pos_] != '"') {
			if (text_[pos_] == '\\' && pos_ + 1 < text_.size())
				++pos_;
			s += text_[pos_++];
		}
		expect('"');
		return s;
	}
	void skip_space()
	{
		while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_])))
			++pos_;
	}
	[[nodiscard]] bool at(char c) const { return pos_ < text_.size() && text_[pos_] == c; }
	void expect(char c)
	{
		if (at(c))
			++pos_;
		else
			ok = false;
		if (!ok)
			pos_ = text_.size();
	}

	std::string_view text_;
	std::size_t pos_ = 0;
};

struct Child {
	int status = 0;
	pid_t pid = 0;
	std::vector<std::string> lines; // of XMEM_CUDACOUNT_OUT
	std::string err; // its stderr
	std::string cmdline; // its arguments, joined by spaces
};

class CudaCount : public ::testing::Test
{
protected:
	void SetUp() override
	{
		shim_ = env("CUDACOUNT_SHIM");
		driver_ = env("CUDACOUNT_TEST_DRIVER");
		if (shim_.empty())
			GTEST_SKIP() << "CUDACOUNT_SHIM names the shim (meson test sets it)";
		std::string pattern = (std::filesystem::temp_directory_path() / "cudacount-XXXXXX").string();
		ASSERT_NE(::mkdtemp(pattern.data()), nullptr) << std::generic_category().message(errno);
		dir_ = pattern;
	}
	void TearDown() override
	{
		if (!dir_.empty())
			std::filesystem::remove_all(dir_);
	}

	// Runs this program as `--child scenario` with the shim in front of the driver, and
	// collects what it left.
	Child run(const std::string &scenario, const std::map<std::string, std::string> &extra = {})
	{
		const std::filesystem::path out = dir_ / (scenario + ".jsonl");
		const std::filesystem::path err = dir_ / (scenario + ".err");
		std::map<std::string, std::string> vars = {
			{ "XMEM_CUDACOUNT_DRIVER", driver_ },
			{ "XMEM_CUDACOUNT_OUT", out.string() },
		};
		for (const auto &[k, v] : extra)
			vars[k] = v;
		std::vector<std::string> environment;
		for (char **e = environ; *e; ++e) {
			const std::string_view entry(*e);
			const std::string key(entry.substr(0, entry.find('=')));
			if (!vars.contains(key) && key != "XMEM_CUDACOUNT_MIN_BYTES")
				environment.emplace_back(entry);
		}
		for (const auto &[k, v] : vars) {
			if (!v.empty())
				environment.push_back(std::string(k).append("=").append(v));
		}
		std::vector<char *> envp;
		envp.reserve(environment.size() + 1);
		for (std::string &e : environment)
			envp.push_back(e.data());
		envp.push_back(nullptr);
		std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
		std::string flag = "--child";
		std::string name = scenario;
		std::array<char *, 4> argv = { self.data(), flag.data(), name.data(), nullptr };

		posix_spawn_file_actions_t actions;
		posix_spawn_file_actions_init(&actions);
		posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
						 0644);
		Child child;
		child.cmdline = self + " " + flag + " " + name;
		const int spawned =
			::posix_spawn(&child.pid, self.c_str(), &actions, nullptr, argv.data(), envp.data());
		posix_spawn_file_actions_destroy(&actions);
		EXPECT_EQ(spawned, 0) << std::generic_category().message(spawned);
		if (spawned != 0)
			return child;
		EXPECT_EQ(::waitpid(child.pid, &child.status, 0), child.pid);

		std::ifstream lines(out);
		for (std::string line; std::getline(lines, line);)
			child.lines.push_back(line);
		std::ifstream errors(err);
		std::stringstream text;
		text << errors.rdbuf();
		child.err = text.str();
		return child;
	}

	// The one line a child left, parsed, with the fields every line has checked.
	static std::map<std::string, std::string> report(const Child &child, std::string_view at = "exit")
	{
		EXPECT_EQ(child.lines.size(), 1U) << "one line per process; stderr:\n" << child.err;
		if (child.lines.size() != 1)
			return {};
		const FlatJson json(child.lines[0]);
		EXPECT_TRUE(json.ok) << child.lines[0];
		auto fields = json.fields;
		EXPECT_EQ(fields["pid"], std::to_string(child.pid));
		EXPECT_EQ(fields["comm"], "test-cudacount");
		EXPECT_EQ(fields["at"], at);
		EXPECT_EQ(fields["argv0"], child.cmdline.substr(0, child.cmdline.find(' ')));
		EXPECT_EQ(fields["cmdline"], child.cmdline);
		return fields;
	}

	static void expect_exit(const Child &child, int code)
	{
		EXPECT_TRUE(WIFEXITED(child.status) && WEXITSTATUS(child.status) == code)
			<< "status " << child.status << "; stderr:\n"
			<< child.err;
	}

	// The counts `copies_made` gives with this threshold, against the line's.
	static void expect_copies(std::map<std::string, std::string> &fields, std::span<const KnownCopy> made,
				  std::uint64_t min_bytes)
	{
		std::uint64_t frame_calls_total = 0, frame_bytes_total = 0;
		for (const KnownCopy &c : made) {
			frame_calls_total += c.bytes >= min_bytes ? 1 : 0;
			frame_bytes_total += c.bytes >= min_bytes ? c.bytes : 0;
		}
		EXPECT_EQ(fields["frame_calls_total"], std::to_string(frame_calls_total));
		EXPECT_EQ(fields["frame_bytes_total"], std::to_string(frame_bytes_total));
		for (std::size_t d = 0; d < dir_names.size(); ++d) {
			std::uint64_t frame_calls = 0, frame_sum = 0, small_calls = 0, small_sum = 0;
			for (const KnownCopy &c : made) {
				if (static_cast<std::size_t>(c.dir) != d)
					continue;
				(c.bytes >= min_bytes ? frame_calls : small_calls) += 1;
				(c.bytes >= min_bytes ? frame_sum : small_sum) += c.bytes;
			}
			const std::string at = "copies." + std::string(dir_names[d]);
			EXPECT_EQ(fields[at + ".frame.calls"], std::to_string(frame_calls)) << at;
			EXPECT_EQ(fields[at + ".frame.bytes"], std::to_string(frame_sum)) << at;
			EXPECT_EQ(fields[at + ".small.calls"], std::to_string(small_calls)) << at;
			EXPECT_EQ(fields[at + ".small.bytes"], std::to_string(small_sum)) << at;
		}
	}

	std::string shim_;
	std::string driver_; // empty: the shim looks for it
	std::filesystem::path dir_;
};

constexpr std::uint64_t default_min_bytes = 65536;

TEST_F(CudaCount, KnownCopiesAreCountedByDirectionAndSize)
{
	const Child child = run("copies");
	expect_exit(child, 0);
	auto fields = report(child);
	if (driver_.empty())
		EXPECT_NE(fields["driver"], "null");
	else
		EXPECT_EQ(fields["driver"], driver_);
	EXPECT_EQ(fields["min_bytes"], std::to_string(default_min_bytes));
	expect_copies(fields, copies_made, default_min_bytes);
	EXPECT_EQ(fields["memsets.calls"], "1");
	EXPECT_EQ(fields["memsets.bytes"], std::to_string(memset_bytes));
	EXPECT_EQ(fields["failed.copies"], std::to_string(failed_copies));
	EXPECT_EQ(fields["failed.memsets"], "0");
	EXPECT_EQ(child.err.find("cudacount"), std::string::npos) << child.err;
}

// At the threshold a copy is frame-sized: the 4096-byte ones are, the 128-byte one is not.
TEST_F(CudaCount, MinBytesSetsWhatIsFrameSized)
{
	const Child child = run("copies", { { "XMEM_CUDACOUNT_MIN_BYTES", std::to_string(small_bytes) } });
	expect_exit(child, 0);
	auto fields = report(child);
	EXPECT_EQ(fields["min_bytes"], std::to_string(small_bytes));
	expect_copies(fields, copies_made, small_bytes);
}

TEST_F(CudaCount, CopiesFromManyThreadsAreAllCounted)
{
	const Child child = run("threads");
	expect_exit(child, 0);
	auto fields = report(child);
	const std::vector<KnownCopy> made(std::size_t(child_threads) * copies_per_thread, { Dir::HtoD, small_bytes });
	expect_copies(fields, made, default_min_bytes);
}

TEST_F(CudaCount, CuGetProcAddressHandsOutCountingCopies)
{
	const Child child = run("proc-address");
	if (WIFEXITED(child.status) && WEXITSTATUS(child.status) == exit_no_proc_address)
		GTEST_SKIP() << "the driver behind the shim (" << (driver_.empty() ? "found by the shim" : driver_)
			     << ") exports no cuGetProcAddress_v2";
	expect_exit(child, 0);
	auto fields = report(child);
	const std::array<KnownCopy, 2> made = { { { Dir::HtoD, frame_bytes }, { Dir::HtoD, frame_bytes } } };
	expect_copies(fields, made, default_min_bytes);
}

TEST_F(CudaCount, SigtermWritesTheCountsAndStillEndsTheProcess)
{
	const Child child = run("sigterm");
	EXPECT_TRUE(WIFSIGNALED(child.status) && WTERMSIG(child.status) == SIGTERM) << "status " << child.status;
	auto fields = report(child, "SIGTERM");
	const std::array<KnownCopy, 1> made = { { { Dir::HtoD, frame_bytes } } };
	expect_copies(fields, made, default_min_bytes);
}

TEST_F(CudaCount, TheProcesssOwnSigtermHandlerIsLeftAlone)
{
	const Child child = run("own-handler");
	expect_exit(child, 0);
	auto fields = report(child);
	const std::array<KnownCopy, 1> made = { { { Dir::HtoD, frame_bytes } } };
	expect_copies(fields, made, default_min_bytes);
}

TEST_F(CudaCount, WithoutADriverEveryCallFailsAndCuInitSaysWhyOnce)
{
	const std::string nowhere = (dir_ / "nowhere" / "libcuda.so.1").string();
	const Child child = run("no-driver", { { "XMEM_CUDACOUNT_DRIVER", nowhere } });
	expect_exit(child, 0);
	const std::string why = "cudacount: no CUDA driver behind the shim: XMEM_CUDACOUNT_DRIVER=" + nowhere;
	const std::size_t first = child.err.find(why);
	EXPECT_NE(first, std::string::npos) << child.err;
	EXPECT_EQ(child.err.find("cudacount:", first + 1), std::string::npos) << "said more than once:\n" << child.err;
	auto fields = report(child);
	EXPECT_EQ(fields["driver"], "null");
	EXPECT_EQ(fields["failed.copies"], "1");
	expect_copies(fields, {}, default_min_bytes);
}

TEST_F(CudaCount, TheShimNeverLoadsItselfAsTheDriver)
{
	const Child child = run("no-driver", { { "XMEM_CUDACOUNT_DRIVER", shim_ } });
	expect_exit(child, 0);
	EXPECT_NE(child.err.find(shim_ + ": that is this shim"), std::string::npos) << child.err;
	auto fields = report(child);
	EXPECT_EQ(fields["driver"], "null");
}

TEST_F(CudaCount, NothingIsWrittenWithoutXmemCudacountOut)
{
	const Child child = run("copies", { { "XMEM_CUDACOUNT_OUT", "" } });
	expect_exit(child, 0);
	EXPECT_TRUE(child.lines.empty());
	EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir_), {}), 1) << "only the child's stderr";
}

} // namespace

// With no driver named, the tests need one the shim finds by itself that starts: a GPU's.
bool driver_found_by_the_shim()
{
	void *lib = ::dlopen(env("CUDACOUNT_SHIM").c_str(), RTLD_NOW | RTLD_LOCAL);
	if (!lib)
		return false;
	const Cuda cu(lib);
	const CUresult r = cu.cuInit(0);
	if (r != CUDA_SUCCESS)
		(void)std::fprintf(stderr, "test-cudacount: cuInit through the shim returned %d\n", int(r));
	return r == CUDA_SUCCESS;
}

int main(int argc, char **argv)
{
	if (argc == 3 && std::string_view(argv[1]) == "--child")
		return run_child(argv[2]);
	if (!env("CUDACOUNT_SHIM").empty() && env("CUDACOUNT_TEST_DRIVER").empty() && !driver_found_by_the_shim()) {
		(void)std::fprintf(stderr, "test-cudacount: skipped: no usable CUDA driver where the shim looks\n");
		return 77;
	}
	::testing::InitGoogleTest(&argc, argv);
	return RUN_ALL_TESTS();
}
