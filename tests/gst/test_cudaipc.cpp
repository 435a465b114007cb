// test_cudaipc.cpp - GStreamer's cudaipcsink and cudaipcsrc (nvcodec, GStreamer 1.24 and
// later) across processes on the CUDA driver simulator, in both IPC modes: legacy (a
// cuIpcGetMemHandle handle a frame) and mmap (a VMM allocation's fd), straight from
// cudaupload and relayed from an xmem device pool by xmemsrc (which copies each frame out of
// its slot, or, in mmap mode, hands over the slot itself). Every frame must arrive, in
// order, byte for byte. This proves the simulator's legacy IPC and the relay's logic,
// never a GPU's behaviour (tests/cudasim/README.md); gst-cudaipc-gpu runs the same on the
// real driver. Where GStreamer is older than 1.24, the whole program exits 77 (skipped).
#include "gst_common.hpp"

#include <algorithm>
#include <atomic>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>

#include <sys/stat.h>

using namespace std::chrono_literals;
using xmem::gsttest::GstTest;
using xmem::gsttest::Pipeline;
using xmem::test::Process;

namespace {

// Skips the whole program where GStreamer has no cudaipcsink and cudaipcsrc.
class CudaIpcOrSkip : public ::testing::Environment
{
public:
	void SetUp() override
	{
		gst_init(nullptr, nullptr);
		guint major = 0, minor = 0, micro = 0, nano = 0;
		gst_version(&major, &minor, &micro, &nano);
		if (major == 1 && minor < 24)
			skip("cudaipcsink and cudaipcsrc need GStreamer 1.24 or later; this is " +
			     std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(micro));
		GstPlugin *nvcodec = gst_registry_find_plugin(gst_registry_get(), "nvcodec");
		if (!nvcodec)
			skip("GStreamer's nvcodec plugin is not installed (gstreamer1.0-plugins-bad)");
		gst_object_unref(nvcodec);
		// From here on a missing element is a failure: the simulator on LD_LIBRARY_PATH
		// (tests/gst/meson.build) must make nvcodec register them.
	}

private:
	[[noreturn]] static void skip(const std::string &why)
	{
		std::printf("skipped: %s\n", why.c_str());
		std::fflush(stdout);
		std::_Exit(77);
	}
};

// Against the real driver without a usable GPU (gst-cudaipc-gpu), the whole program is skipped.
const auto *const gpu_or_skip = ::testing::AddGlobalTestEnvironment(new xmem::test::RealGpuOrSkip);
const auto *const cudaipc_or_skip = ::testing::AddGlobalTestEnvironment(new CudaIpcOrSkip);

// NV12 with rows a multiple of 4 bytes: cudadownload hands filesink the default layout.
const std::string caps = "video/x-raw,format=NV12,width=160,height=90,framerate=30/1";
constexpr int frame_count = 24;

// How a run shares frames: cudaipcsink's ipc-mode and cudaipcsrc's io-mode (which the mmap
// mode ignores: its frames are always copied).
struct Mode {
	const char *ipc_mode;
	const char *io_mode;
};

std::string mode_name(const ::testing::TestParamInfo<Mode> &info)
{
	return std::string(info.param.ipc_mode) + "_" + info.param.io_mode;
}

// Holds each buffer at cudaipcsink's sink pad until the consumer has written every frame
// before it. cudaipcsink keeps only its newest frame for a client that has not asked yet,
// so without this a consumer slower than the producer (a busy machine) would miss frames;
// with it, a missing frame is a bug. A frame that does not arrive within a minute opens
// the gate for good, and the test fails on the frames that are missing.
class FrameGate
{
public:
	FrameGate(GstElement *sink, std::string file, gsize frame_size)
		: state_(std::make_shared<State>(std::move(file), frame_size))
	{
		// The probe keeps its own reference: the streaming thread may run it until the
		// pipeline stops, after this gate is gone.
		GstPad *pad = gst_element_get_static_pad(sink, "sink");
		gst_pad_add_probe(pad, GST_PAD_PROBE_TYPE_BUFFER, on_buffer, new std::shared_ptr<State>(state_),
				  [](gpointer data) { delete static_cast<std::shared_ptr<State> *>(data); });
		gst_object_unref(pad);
	}
	// Lets everything by, so that a pipeline torn down early never waits on the gate.
	~FrameGate() { state_->open = true; }
	FrameGate(const FrameGate &) = delete;
	FrameGate &operator=(const FrameGate &) = delete;

	// Frames the consumer has written so far.
	size_t written() const { return state_->written(); }
	// Waits until the consumer has written N frames.
	bool wait_written(size_t n, std::chrono::milliseconds timeout) const
	{
		return xmem::test::eventually([&] { return written() >= n; }, timeout);
	}
	bool gave_up() const { return state_->gave_up.load(); }

private:
	struct State {
		State(std::string file, gsize frame_size) : file(std::move(file)), frame_size(frame_size) {}
		size_t written() const
		{
			struct stat st;
			return ::stat(file.c_str(), &st) == 0 ? size_t(st.st_size) / frame_size : 0;
		}

		const std::string file;
		const gsize frame_size;
		std::atomic<size_t> passed{ 0 }; // buffers let by, touched by the streaming thread only
		std::atomic<bool> gave_up{ false };
		std::atomic<bool> open{ false };
	};

	static GstPadProbeReturn on_buffer(GstPad *, GstPadProbeInfo *, gpointer data)
	{
		State &state = **static_cast<std::shared_ptr<State> *>(data);
		size_t before = state.passed++;
		if (!state.open && !state.gave_up &&
		    !xmem::test::eventually([&] { return state.open || state.written() >= before; }, 60s))
			state.gave_up = true;
		return GST_PAD_PROBE_OK;
	}

	std::shared_ptr<State> state_;
};

class CudaIpc : public GstTest, public ::testing::WithParamInterface<Mode>
{
protected:
	void SetUp() override
	{
		GstTest::SetUp();
		launch_ = xmem::gsttest::tool_path("GST_LAUNCH");
		if (launch_.empty())
			GTEST_SKIP() << "gst-launch-1.0 not found (GST_LAUNCH unset)";
		for (const char *name : { "cudaupload", "cudadownload", "cudaipcsink", "cudaipcsrc" }) {
			GstElement *e = gst_element_factory_make(name, nullptr);
			ASSERT_NE(e, nullptr) << name
					      << " is missing: nvcodec did not load the simulator "
						 "(LD_LIBRARY_PATH) or is older than 1.24";
			gst_object_unref(e);
		}
		address_ = dir_.path() + "/cudaipc";
		file_ = dir_.path() + "/frames.raw";
		info_ = xmem::gsttest::video_info(caps);
		reference_ = xmem::gsttest::reference_frames(caps, "ball", frame_count);
	}

	// gst-launch-1.0 running LINE (split on spaces); output() has its stdout and stderr.
	Process launch(const std::string &line) const
	{
		std::vector<std::string> args = { "/bin/sh", "-c", "exec \"$@\" 2>&1", "sh", launch_, "-q" };
		std::istringstream in(line);
		for (std::string word; in >> word;)
			args.push_back(word);
		return Process(args);
	}

	// cudaipcsink serving address_, rendering each frame as soon as the gate lets it by.
	std::string ipc_sink() const
	{
		return "cudaipcsink name=ipcsink sync=false address=" + address_ + " ipc-mode=" + GetParam().ipc_mode;
	}

	// The consumer: another process that takes the frames from cudaipcsrc to system
	// memory and writes them back to back to file_.
	Process consumer() const
	{
		return launch("cudaipcsrc address=" + address_ + " io-mode=" + GetParam().io_mode +
			      " connection-timeout=60 ! video/x-raw(memory:CUDAMemory) ! cudadownload ! video/x-raw ! "
			      "filesink buffer-mode=unbuffered location=" +
			      file_);
	}

	// The end of a run: the exporting pipeline reached EOS; once the consumer has every
	// frame, stopping it (after BEFORE_STOP) sends the consumer EOS. Then every frame must
	// be in file_, in order, as videotestsrc made it.
	void expect_every_frame(Pipeline &exporter, FrameGate &gate, Process &consumer,
				const std::function<void()> &before_stop = {})
	{
		EXPECT_EQ(exporter.wait_eos(120s), "");
		EXPECT_TRUE(gate.wait_written(frame_count, 60s))
			<< "the consumer wrote " << gate.written() << " of " << frame_count << " frames:\n"
			<< consumer.output();
		EXPECT_FALSE(gate.gave_up()) << "a frame took over a minute to reach the consumer";
		if (before_stop)
			before_stop();
		exporter.stop();
		EXPECT_EQ(consumer.wait(60s), 0) << consumer.output();

		std::ifstream in(file_, std::ios::binary);
		std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), {});
		ASSERT_EQ(bytes.size(), size_t(frame_count) * info_.size)
			<< "frames are missing, or extra, or not whole";
		for (int i = 0; i < frame_count; i++) {
			GstBuffer *b = gst_buffer_new_memdup(bytes.data() + size_t(i) * info_.size, info_.size);
			auto got = xmem::gsttest::visible_bytes(b, info_);
			gst_buffer_unref(b);
			if (got == reference_[size_t(i)])
				continue;
			// Which frame it is instead tells a stale read (an older frame) from garbage.
			auto same = std::find(reference_.begin(), reference_.end(), got);
			ADD_FAILURE() << "frame " << i << " differs from videotestsrc's: "
				      << (same == reference_.end()
						  ? std::string("it is none of its frames")
						  : "it is frame " + std::to_string(same - reference_.begin()));
		}
	}

	void relay(const std::string &src_props, const char *expected_path);

	std::string launch_;
	std::string address_;
	std::string file_;
	GstVideoInfo info_;
	std::vector<std::vector<uint8_t>> reference_;
};

} // namespace

// cudaupload ! cudaipcsink here, cudaipcsrc ! cudadownload in another process: in legacy
// mode each frame's cuMemAlloc memory crosses as a cuIpcGetMemHandle handle that the
// consumer opens (and closes), in mmap mode as a VMM allocation's fd.
TEST_P(CudaIpc, FramesCrossFromCudaupload)
{
	Pipeline exporter("videotestsrc num-buffers=" + std::to_string(frame_count) + " pattern=ball ! " + caps +
			  " ! cudaupload ! video/x-raw(memory:CUDAMemory) ! " + ipc_sink());
	ASSERT_TRUE(exporter);
	FrameGate gate(exporter.by_name("ipcsink"), file_, info_.size);
	ASSERT_NE(exporter.play(), GST_STATE_CHANGE_FAILURE);
	Process other = consumer();
	expect_every_frame(exporter, gate, other);
}

// A gst-launch-1.0 producer fills an xmem device pool; here, xmemsrc (with SRC_PROPS) takes
// its frames as CUDA memory into cudaipcsink, which serves a third process. Every frame
// must have taken xmemsrc's EXPECTED_PATH (the stats counter: copied-held or zero-copy).
void CudaIpc::relay(const std::string &src_props, const char *expected_path)
{
	const char *v = std::getenv("XMEM_TEST_GST_CUDA");
	if (!v || std::string(v) != "1")
		GTEST_SKIP() << "this plugin was built without GStreamer's CUDA library: no CUDA memory out of xmemsrc";
	Process producer =
		launch("videotestsrc num-buffers=" + std::to_string(frame_count) + " pattern=ball ! " + caps +
		       " ! cudaupload ! video/x-raw(memory:CUDAMemory) ! xmemsink pool-name=relay "
		       "wait-for-consumers=1 policy=block block-timeout=60000000000 buffers=4");
	Pipeline relay("xmemsrc name=src pool-name=relay is-live=false timeout=60000000000 " + src_props +
		       " ! video/x-raw(memory:CUDAMemory) ! " + ipc_sink());
	ASSERT_TRUE(relay);
	FrameGate gate(relay.by_name("ipcsink"), file_, info_.size);
	ASSERT_NE(relay.play(), GST_STATE_CHANGE_FAILURE);
	Process other = consumer();
	expect_every_frame(relay, gate, other, [&] {
		EXPECT_EQ(xmem::gsttest::stat_u64(relay.by_name("src"), expected_path), guint64(frame_count))
			<< expected_path;
	});
	EXPECT_EQ(producer.wait(60s), 0) << producer.output();
}

// xmemsrc copies every frame out of its slot (max-held=1) into CUDA memory of its own,
// complete when pushed: cudaipcsink shares that memory (legacy: a handle of it; mmap: its
// copy into VMM memory).
TEST_P(CudaIpc, XmemsrcCopiesADevicePoolIntoCudaipcsink)
{
	relay("max-held=1", "copied-held");
}

// xmemsrc's default: each frame is its slot itself, wrapped as CUDA memory, complete when
// pushed. In mmap mode cudaipcsink copies it into VMM memory of its own
// (gst_cuda_buffer_copy, on its own stream: had xmemsrc pushed the slot with its stream
// still pending, the copy would have read the frame that slot held four frames before).
// In legacy mode GStreamer takes wrapped memory for cuMemAlloc memory and asks
// cuIpcGetMemHandle for the slot, VMM memory, which the driver refuses: there the
// relay needs max-held=1 (above), and the README says so.
TEST_P(CudaIpc, XmemsrcRelaysItsSlotsIntoCudaipcsink)
{
	if (std::string(GetParam().ipc_mode) == "legacy")
		GTEST_SKIP() << "legacy CUDA IPC cannot export VMM memory (xmem's slots): the relay copies "
				"(XmemsrcCopiesADevicePoolIntoCudaipcsink)";
	relay("", "zero-copy");
}

INSTANTIATE_TEST_SUITE_P(Modes, CudaIpc,
			 ::testing::Values(Mode{ "legacy", "copy" }, Mode{ "legacy", "import" },
					   Mode{ "mmap", "copy" }),
			 mode_name);
