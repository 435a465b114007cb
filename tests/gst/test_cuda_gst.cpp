// test_cuda_gst.cpp - xmemsink and xmemsrc with CUDA device pools: which memory a pool
// gets, which copies happen, caps with and without memory:CUDAMemory, the pitched
// layout in device slots, GStreamer's CUDA context shared, kills and restarts across
// processes. Run three times: gst-cuda-sim and gst-cuda-nvcodec-sim against the CUDA
// driver simulator (tests/cudasim) in CI, which proves the elements' logic but never
// a GPU's behaviour; and gst-cuda-gpu against the real driver, which exits 77
// (skipped) without a GPU. docs/gpu-results.md records the GPU runs.
#include "gst_common.hpp"

#include <gst/app/gstappsink.h>
#include <gst/app/gstappsrc.h>
#include <gst/base/gstbasesrc.h>
#include <gst/check/gstharness.h>
#ifdef XMEM_TEST_HAVE_GST_CUDA
#define GST_USE_UNSTABLE_API
#include <gst/cuda/cuda-gst.h>
#include <gst/cuda/gstcudabufferpool.h>
#include <gst/cuda/gstcudacontext.h>
#include <gst/cuda/gstcudaloader.h>
#include <gst/cuda/gstcudamemory.h>
#include <gst/cuda/gstcudautils.h>
#endif

#include <fstream>
#include <sstream>

#include <dlfcn.h>
#include <sys/mman.h>

using namespace std::chrono_literals;
using xmem::gsttest::by_offset;
using xmem::gsttest::Consumer;
using xmem::gsttest::GstTest;
using xmem::gsttest::Pipeline;
using xmem::gsttest::stat_u64;
using xmem::test::eventually;
using xmem::test::on_cuda_simulator;
using xmem::test::Process;

namespace {

std::string stat_string(GstElement *element, const char *field)
{
	GstStructure *s = xmem::gsttest::get_stats(element);
	const gchar *v = s ? gst_structure_get_string(s, field) : nullptr;
	std::string out = v ? v : "";
	if (s)
		gst_structure_free(s);
	return out;
}

// Against the real driver without a usable GPU, the whole program is skipped.
const auto *const gpu_or_skip = ::testing::AddGlobalTestEnvironment(new xmem::test::RealGpuOrSkip);

// Whether this plugin was built with GStreamer's CUDA library (set by meson).
bool built_with_gst_cuda()
{
	const char *v = std::getenv("XMEM_TEST_GST_CUDA");
	return v && std::string(v) == "1";
}

class CudaElements : public GstTest
{
protected:
	void SetUp() override
	{
		GstTest::SetUp();
		launch_ = xmem::gsttest::tool_path("GST_LAUNCH");
		if (launch_.empty())
			GTEST_SKIP() << "gst-launch-1.0 not found (GST_LAUNCH unset)";
	}

	// gst-launch-1.0 running LINE (split on spaces) with ENV ("NAME=value") added to
	// its environment; output() has its stdout and stderr.
	Process launch(const std::string &line, std::vector<std::string> env = {}) const
	{
		std::vector<std::string> args = { "/bin/sh", "-c", "exec \"$@\" 2>&1", "sh", "/usr/bin/env" };
		args.insert(args.end(), env.begin(), env.end());
		args.push_back(launch_);
		args.push_back("-q");
		std::istringstream in(line);
		for (std::string word; in >> word;)
			args.push_back(word);
		return Process(args);
	}

	std::string launch_;
};

// Frames written back to back to FILE by a consumer, compared with REFERENCE.
size_t file_mismatches(const std::string &file, const GstVideoInfo &info,
		       const std::vector<std::vector<uint8_t>> &reference, size_t *frames)
{
	std::ifstream in(file, std::ios::binary);
	std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), {});
	*frames = bytes.size() / info.size;
	size_t wrong = bytes.size() % info.size ? 1 : 0;
	for (size_t i = 0; i < *frames && i < reference.size(); i++) {
		GstBuffer *b = gst_buffer_new_memdup(bytes.data() + i * info.size, info.size);
		wrong += xmem::gsttest::visible_bytes(b, info) != reference[i];
		gst_buffer_unref(b);
	}
	return wrong;
}

// The end of a bit-exact run: the producer reaches EOS, and both consumers (HERE in
// this process, OTHER a gst-launch-1.0 writing FILE) got every frame of REFERENCE.
void expect_all_frames(const Pipeline &producer, Consumer &here, Process &other, const std::string &file,
		       const std::vector<std::vector<uint8_t>> &reference)
{
	const size_t n = reference.size();
	EXPECT_EQ(producer.wait_eos(60s), "");
	ASSERT_TRUE(here.join(60s)) << "no EOS; " << here.count() << " frames";
	EXPECT_EQ(here.error(), "");
	auto frames = here.frames();
	ASSERT_EQ(frames.size(), n);
	for (const auto &f : frames)
		EXPECT_TRUE(f.matches) << "frame " << f.offset << " differs from videotestsrc's";
	EXPECT_EQ(other.wait(60s), 0) << other.output();
	GstCaps *caps = gst_pad_get_current_caps(GST_BASE_SRC_PAD(here.src()));
	ASSERT_NE(caps, nullptr);
	GstVideoInfo info;
	ASSERT_TRUE(gst_video_info_from_caps(&info, caps));
	gst_caps_unref(caps);
	size_t got = 0;
	EXPECT_EQ(file_mismatches(file, info, reference, &got), 0u) << "the gst-launch consumer's frames differ";
	EXPECT_EQ(got, n);
}

// Whether element NAME can be made here: a registry shared with runs on another driver
// (the simulator, a GPU) may list features the plugin does not register now.
bool can_make(const char *name)
{
	GstElement *e = gst_element_factory_make(name, nullptr);
	if (!e)
		return false;
	gst_object_unref(e);
	return true;
}

bool template_has_cuda(const char *factory_name, GstPadDirection direction)
{
	GstElementFactory *factory = gst_element_factory_find(factory_name);
	if (!factory)
		return false;
	bool found = false;
	for (const GList *l = gst_element_factory_get_static_pad_templates(factory); l; l = l->next) {
		auto *t = static_cast<GstStaticPadTemplate *>(l->data);
		if (t->direction != direction)
			continue;
		GstCaps *caps = gst_static_caps_get(&t->static_caps);
		for (guint i = 0; i < gst_caps_get_size(caps); i++) {
			GstCapsFeatures *f = gst_caps_get_features(caps, i);
			found |= f && gst_caps_features_contains(f, "memory:CUDAMemory");
		}
		gst_caps_unref(caps);
	}
	gst_object_unref(factory);
	return found;
}

} // namespace

TEST_F(CudaElements, PadTemplatesAdvertiseCudaMemory)
{
	EXPECT_TRUE(template_has_cuda("xmemsink", GST_PAD_SINK));
	EXPECT_TRUE(template_has_cuda("xmemsrc", GST_PAD_SRC));
}

// A decoder that can output either memory asks downstream with a filter; the sink
// answers with the memory its pool will use first, and still takes other data.
TEST_F(CudaElements, SinkCapsQueryPutsThePoolMemoryFirst)
{
	const char *filter_string = "video/x-raw,format=NV12,width=64,height=48; "
				    "video/x-raw(memory:CUDAMemory),format=NV12,width=64,height=48; "
				    "application/x-xmem-test";
	for (const char *memory : { "auto", "cuda", "system" }) {
		SCOPED_TRACE(memory);
		GstElement *sink = gst_element_factory_make("xmemsink", nullptr);
		ASSERT_NE(sink, nullptr);
		gst_util_set_object_arg(G_OBJECT(sink), "memory", memory);
		GstPad *pad = gst_element_get_static_pad(sink, "sink");
		GstCaps *filter = gst_caps_from_string(filter_string);
		GstCaps *caps = gst_pad_query_caps(pad, filter);
		ASSERT_EQ(gst_caps_get_size(caps), 3u) << gst_caps_to_string(caps);
		bool cuda_first = gst_caps_features_contains(gst_caps_get_features(caps, 0), "memory:CUDAMemory");
		bool want_cuda = built_with_gst_cuda() && std::string(memory) != "system";
		EXPECT_EQ(cuda_first, want_cuda) << gst_caps_to_string(caps);
		bool other = false;
		for (guint i = 0; i < gst_caps_get_size(caps); i++)
			other |= gst_structure_has_name(gst_caps_get_structure(caps, i), "application/x-xmem-test");
		EXPECT_TRUE(other) << "other data is taken too: " << gst_caps_to_string(caps);
		// Without a filter: anything.
		GstCaps *any = gst_pad_query_caps(pad, nullptr);
		EXPECT_TRUE(gst_caps_is_any(any));
		gst_caps_unref(any);
		gst_caps_unref(caps);
		gst_caps_unref(filter);
		gst_object_unref(pad);
		gst_object_unref(sink);
	}
}

struct UploadCase {
	const char *caps;
	int frames;
};

void PrintTo(const UploadCase &c, std::ostream *os)
{
	*os << c.caps;
}

class Upload : public CudaElements, public ::testing::WithParamInterface<UploadCase>
{
};

// memory=cuda with system-memory input: each frame is uploaded once into a pitched
// device slot; a gst-launch-1.0 consumer and one in this process download it once,
// and both get what videotestsrc made, byte for byte.
TEST_P(Upload, SystemInputThroughDevicePoolBitExact)
{
	const std::string caps = GetParam().caps;
	const int n = GetParam().frames;
	auto reference = xmem::gsttest::reference_frames(caps, "ball", n);
	ASSERT_EQ(int(reference.size()), n);

	Pipeline producer("videotestsrc num-buffers=" + std::to_string(n) + " pattern=ball ! " + caps +
			  " ! xmemsink name=sink pool-name=up memory=cuda wait-for-consumers=2 policy=block "
			  "block-timeout=30000000000 buffers=4");
	ASSERT_TRUE(producer);
	ASSERT_NE(producer.play(), GST_STATE_CHANGE_FAILURE);
	std::string file = dir_.path() + "/frames.raw";
	Process other = launch("xmemsrc pool-name=up is-live=false ! video/x-raw ! filesink location=" + file);
	Consumer here("xmemsrc name=src pool-name=up is-live=false ! video/x-raw ! appsink name=sink sync=false",
		      by_offset(reference));
	ASSERT_TRUE(here.start());

	expect_all_frames(producer, here, other, file, reference);

	GstElement *sink = producer.by_name("sink");
	EXPECT_EQ(stat_string(sink, "memory"), "cuda");
	EXPECT_EQ(stat_u64(sink, "copied"), guint64(n)) << "one upload a frame";
	EXPECT_EQ(stat_u64(sink, "zero-copy"), 0u);
	EXPECT_EQ(stat_u64(sink, "device-copied"), 0u);
	EXPECT_EQ(stat_string(here.src(), "memory"), "system");
	EXPECT_EQ(stat_u64(here.src(), "copied"), guint64(n)) << "one download a frame";
	EXPECT_EQ(stat_u64(here.src(), "zero-copy"), 0u);
}

INSTANTIATE_TEST_SUITE_P(
	Formats, Upload,
	::testing::Values(UploadCase{ "video/x-raw,format=NV12,width=100,height=74,framerate=30/1", 24 },
			  UploadCase{ "video/x-raw,format=I420,width=98,height=70,framerate=30/1", 24 },
			  UploadCase{ "video/x-raw,format=RGBA,width=64,height=48,framerate=30/1", 24 }));

// The frames in a device pool, as the library sees them: device storage, every row
// and plane on the pool's pitch alignment, the caps without a memory feature.
TEST_F(CudaElements, DeviceSlotsArePitched)
{
	const std::string caps = "video/x-raw,format=NV12,width=100,height=74,framerate=30/1";
	auto reference = xmem::gsttest::reference_frames(caps, "ball", 5);
	Pipeline producer("videotestsrc num-buffers=5 pattern=ball ! " + caps +
			  " ! xmemsink pool-name=pitch memory=cuda wait-for-consumers=1 policy=block "
			  "block-timeout=30000000000");
	ASSERT_NE(producer.play(), GST_STATE_CHANGE_FAILURE);
	xmem::OpenOptions options;
	options.timeout = 20s;
	auto pool = xmem::BufferPool::open("pitch", options);
	ASSERT_TRUE(pool) << pool.error().message;
	EXPECT_EQ((*pool)->storage(), xmem::Storage::cuda);
	uint32_t align = (*pool)->pitch_alignment();
	EXPECT_GE(align, 256u);
	for (int i = 0; i < 5; i++) {
		auto frame = (*pool)->receive(20s);
		ASSERT_TRUE(frame) << frame.error().message;
		GstCaps *format = gst_caps_from_string(frame->format().c_str());
		GstCaps *wanted = gst_caps_from_string(caps.c_str());
		ASSERT_NE(format, nullptr) << frame->format();
		EXPECT_TRUE(gst_caps_is_subset(format, wanted)) << frame->format();
		EXPECT_FALSE(gst_caps_features_contains(gst_caps_get_features(format, 0), "memory:CUDAMemory"))
			<< "a pool's format carries no memory feature: " << frame->format();
		gst_caps_unref(format);
		gst_caps_unref(wanted);
		const auto &m = frame->meta();
		EXPECT_EQ(m.storage_type, uint32_t(XMEM_STORAGE_CUDA));
		EXPECT_NE(frame->device_ptr(), 0u);
		EXPECT_TRUE(frame->data().empty()) << "device bytes must not be visible to the CPU";
		ASSERT_EQ(m.n_planes, 2u);
		for (uint32_t p = 0; p < m.n_planes; p++) {
			EXPECT_EQ(m.plane_stride[p] % align, 0u) << "plane " << p;
			EXPECT_EQ(m.plane_offset[p] % align, 0u) << "plane " << p;
		}
		auto host = frame->private_copy_to_cpu();
		ASSERT_TRUE(host) << host.error().message;
		std::vector<uint8_t> visible;
		for (uint32_t p = 0; p < 2; p++)
			for (uint32_t y = 0; y < (p ? 37u : 74u); y++) {
				auto *row = reinterpret_cast<const uint8_t *>(host->data().data()) + m.plane_offset[p] +
					    size_t(y) * m.plane_stride[p];
				visible.insert(visible.end(), row, row + 100);
			}
		EXPECT_EQ(visible, reference[size_t(m.seq - 1)]) << "frame " << m.seq;
	}
	EXPECT_EQ(producer.wait_eos(30s), "");
}

// A consumer SIGKILLed while it holds device frames gives every slot back.
TEST_F(CudaElements, KilledConsumerGivesDeviceSlotsBack)
{
	Pipeline producer("videotestsrc is-live=true pattern=ball ! "
			  "video/x-raw,format=RGBA,width=64,height=48,framerate=50/1 ! "
			  "xmemsink name=sink pool-name=devkill memory=cuda buffers=12");
	ASSERT_NE(producer.play(), GST_STATE_CHANGE_FAILURE);
	GstElement *sink = producer.by_name("sink");
	Process consumer =
		launch("xmemsrc pool-name=devkill ! video/x-raw ! queue max-size-buffers=4 "
		       "max-size-bytes=0 max-size-time=0 ! identity sleep-time=500000 ! fakesink sync=false");
	ASSERT_TRUE(eventually([&] { return stat_u64(sink, "consumers") == 1; }, 20s)) << "the consumer never attached";
	ASSERT_TRUE(eventually([&] { return stat_u64(sink, "free-slots") <= 9; }, 20s))
		<< "the consumer holds fewer frames than expected: free-slots " << stat_u64(sink, "free-slots");
	consumer.signal(SIGKILL);
	EXPECT_EQ(consumer.wait(10s), 128 + SIGKILL);
	guint64 published = stat_u64(sink, "published");
	EXPECT_TRUE(eventually([&] { return stat_u64(sink, "consumers") == 0; }, 20s)) << "the dead consumer stays";
	EXPECT_TRUE(eventually([&] { return stat_u64(sink, "published") >= published + 25; }, 20s))
		<< "the producer stopped after the consumer died";
	EXPECT_EQ(producer.pop(GST_MESSAGE_ERROR, 0ms), nullptr) << "the producer posted an error";
	gst_element_send_event(producer.get(), gst_event_new_eos());
	EXPECT_EQ(producer.wait_eos(20s), "");
	EXPECT_TRUE(eventually([&] { return stat_u64(sink, "free-slots") == 12; }, 20s))
		<< "free-slots " << stat_u64(sink, "free-slots") << " of 12 after the consumer's death";
}

// A device-pool producer is killed; its successor publishes the same name from system
// memory at another size, then a third from device memory again. The consumer
// follows: downloads from the device pools, zero copy from the system one.
TEST_F(CudaElements, ProducerRestartsSwitchingMemory)
{
	auto producer_line = [](int w, const char *memory) {
		return "videotestsrc is-live=true ! video/x-raw,format=RGBA,width=" + std::to_string(w) +
		       ",height=48,framerate=30/1 ! xmemsink pool-name=switch memory=" + memory;
	};
	Consumer consumer("xmemsrc name=src pool-name=switch ! video/x-raw ! appsink name=sink sync=false");
	ASSERT_TRUE(consumer.start());
	auto count_width = [&](int w) {
		size_t n = 0;
		for (const auto &f : consumer.frames())
			n += f.width == w;
		return n;
	};
	const std::pair<int, const char *> rounds[] = { { 64, "cuda" }, { 96, "system" }, { 128, "cuda" } };
	guint64 copied = 0, zero_copy = 0;
	for (auto [round_width, memory] : rounds) {
		int width = round_width; // clang 14 cannot capture a structured binding
		SCOPED_TRACE(std::string(memory) + " " + std::to_string(width));
		Process producer = launch(producer_line(width, memory));
		EXPECT_TRUE(eventually([&] { return count_width(width) >= 5; }, 30s))
			<< "no " << width << " wide frames from the " << memory << " producer";
		producer.signal(SIGKILL);
		EXPECT_EQ(producer.wait(10s), 128 + SIGKILL);
		ASSERT_EQ(consumer.error(), "") << "the consumer posted an error";
		guint64 now_copied = stat_u64(consumer.src(), "copied");
		guint64 now_zero = stat_u64(consumer.src(), "zero-copy");
		if (std::string(memory) == "cuda")
			EXPECT_GE(now_copied, copied + 5) << "device frames are downloaded";
		else
			EXPECT_GE(now_zero, zero_copy + 5) << "system frames arrive zero-copy";
		copied = now_copied;
		zero_copy = now_zero;
	}
	consumer.stop();
	for (const auto &f : consumer.frames())
		EXPECT_EQ(f.size, f.caps_size) << "a buffer does not match its caps, offset " << f.offset;
}

// memory=cuda without a usable driver or device fails to start, naming the cause.
TEST_F(CudaElements, MemoryCudaWithoutDeviceFailsToStart)
{
	struct Case {
		std::vector<std::string> env;
		const char *property;
		const char *cause;
	};
	const Case cases[] = {
		{ { "XMEM_CUDA_DRIVER=/nonexistent/libcuda.so.1" }, "", "/nonexistent/libcuda.so.1" },
		{ { "XMEM_CUDASIM_FAIL=no_vmm" }, "", "virtual memory management" },
		{ { "XMEM_CUDASIM_DEVICES=1" }, "cuda-device-id=3", "out of range" },
	};
	for (const auto &c : cases) {
		SCOPED_TRACE(c.env[0]);
		if (!on_cuda_simulator() && c.env[0].find("XMEM_CUDASIM") == 0)
			continue; // the simulator's settings
		Process p =
			launch(std::string("videotestsrc num-buffers=5 ! video/x-raw,format=NV12,width=64,height=48 ! "
					   "xmemsink pool-name=nogpu memory=cuda ") +
				       c.property,
			       c.env);
		EXPECT_NE(p.wait(30s), 0) << p.output();
		std::string out = p.output();
		EXPECT_NE(out.find("memory=cuda: no usable CUDA device"), std::string::npos) << out;
		EXPECT_NE(out.find(c.cause), std::string::npos) << out;
	}
}

// memory=auto with system-memory input keeps a system pool, published in place.
TEST_F(CudaElements, AutoWithSystemInputMakesSystemPool)
{
	Pipeline producer("videotestsrc num-buffers=10 ! video/x-raw,format=NV12,width=64,height=48 ! "
			  "xmemsink name=sink pool-name=auto memory=auto");
	ASSERT_NE(producer.play(), GST_STATE_CHANGE_FAILURE);
	EXPECT_EQ(producer.wait_eos(30s), "");
	GstElement *sink = producer.by_name("sink");
	EXPECT_EQ(stat_string(sink, "memory"), "system");
	EXPECT_EQ(stat_u64(sink, "zero-copy"), 10u);
	EXPECT_EQ(stat_u64(sink, "device-copied"), 0u);
}

// Downstream that takes anything gets CUDA memory only where GStreamer's CUDA library
// has a context; where it has none (its libcuda.so.1 is not the simulator, and no
// GPU), system memory.
TEST_F(CudaElements, SourceFallsBackToSystemMemoryWithoutCudaContext)
{
	// nvcodec registers its elements only where GStreamer's CUDA library loads a driver.
	if (can_make("cudaupload")) {
		GTEST_SKIP() << "GStreamer's CUDA library has a driver here: it would make a context";
	}
	const std::string caps = "video/x-raw,format=NV12,width=64,height=48,framerate=30/1";
	auto reference = xmem::gsttest::reference_frames(caps, "ball", 10);
	Pipeline producer("videotestsrc num-buffers=10 pattern=ball ! " + caps +
			  " ! xmemsink pool-name=fallback memory=cuda wait-for-consumers=1 policy=block "
			  "block-timeout=30000000000");
	ASSERT_NE(producer.play(), GST_STATE_CHANGE_FAILURE);
	Consumer consumer("xmemsrc name=src pool-name=fallback is-live=false ! appsink name=sink sync=false",
			  by_offset(reference));
	ASSERT_TRUE(consumer.start());
	ASSERT_TRUE(consumer.join(60s));
	EXPECT_EQ(consumer.error(), "");
	auto frames = consumer.frames();
	EXPECT_EQ(frames.size(), 10u);
	for (const auto &f : frames)
		EXPECT_TRUE(f.matches) << "frame " << f.offset;
	EXPECT_EQ(stat_string(consumer.src(), "memory"), "system");
}

// GStreamer's own CUDA elements (nvcodec's cudaupload, cudadownload, nvh264dec): on a
// GPU, and on the simulator too, where LD_LIBRARY_PATH makes GStreamer's CUDA library
// load it as libcuda.so.1, so memory:CUDAMemory, context sharing and the
// device-to-device paths run in CI. Skipped where nvcodec is not installed.
class Nvcodec : public CudaElements
{
protected:
	void SetUp() override
	{
		CudaElements::SetUp();
		if (IsSkipped())
			return;
		if (!can_make("cudaupload"))
			GTEST_SKIP() << "nvcodec's cudaupload is not available (gstreamer1.0-plugins-bad, with "
					"GStreamer's CUDA library loading the simulator through LD_LIBRARY_PATH)";
		if (!built_with_gst_cuda())
			GTEST_SKIP() << "this plugin was built without GStreamer's CUDA library";
	}
};

// cudaupload ! xmemsink (memory=auto): a device pool, one device-to-device copy a
// frame on the sink's stream. Out through xmemsrc as CUDA memory (one device-to-device
// copy) into cudadownload, here and in a gst-launch-1.0 process: bit-exact.
TEST_F(Nvcodec, CudaMemoryInAndOutBitExact)
{
	const std::string caps = "video/x-raw,format=NV12,width=100,height=74,framerate=30/1";
	const int n = 20;
	auto reference = xmem::gsttest::reference_frames(caps, "ball", n);
	Pipeline producer("videotestsrc num-buffers=" + std::to_string(n) + " pattern=ball ! " + caps +
			  " ! cudaupload ! video/x-raw(memory:CUDAMemory) ! xmemsink name=sink pool-name=nv "
			  "wait-for-consumers=2 policy=block block-timeout=30000000000 buffers=4");
	ASSERT_TRUE(producer);
	ASSERT_NE(producer.play(), GST_STATE_CHANGE_FAILURE);
	std::string file = dir_.path() + "/frames.raw";
	Process other = launch("xmemsrc pool-name=nv is-live=false ! video/x-raw(memory:CUDAMemory) ! cudadownload ! "
			       "video/x-raw ! filesink location=" +
			       file);
	Consumer here("xmemsrc name=src pool-name=nv is-live=false ! video/x-raw(memory:CUDAMemory) ! cudadownload ! "
		      "video/x-raw ! appsink name=sink sync=false",
		      by_offset(reference));
	ASSERT_TRUE(here.start());
	expect_all_frames(producer, here, other, file, reference);

	GstElement *sink = producer.by_name("sink");
	EXPECT_EQ(stat_string(sink, "memory"), "cuda");
	EXPECT_EQ(stat_u64(sink, "device-copied"), guint64(n));
	EXPECT_EQ(stat_u64(sink, "copied"), 0u);
	EXPECT_EQ(stat_string(here.src(), "memory"), "cuda");
#if GST_CHECK_VERSION(1, 24, 0)
	// GStreamer 1.24 and later wrap the slot itself as CUDA memory: no copy.
	EXPECT_EQ(stat_u64(here.src(), "zero-copy"), guint64(n));
	EXPECT_EQ(stat_u64(here.src(), "copied"), 0u);
#else
	EXPECT_EQ(stat_u64(here.src(), "copied"), guint64(n));
	EXPECT_EQ(stat_u64(here.src(), "zero-copy"), 0u);
#endif
}

namespace {

// A producer of N NV12 frames in CUDA memory into a 6-slot pool NAME (it waits for its
// consumer, and for room: policy block), and an xmemsrc (its other properties SRC_PROPS)
// with CUDA caps into an appsink whose samples the test keeps (keep()).
struct KeptCudaFrames {
	KeptCudaFrames(const std::string &name, int n, const std::string &src_props)
		: n(n),
		  producer("videotestsrc num-buffers=" + std::to_string(n) +
			   " pattern=ball ! video/x-raw,format=NV12,width=64,height=48,framerate=30/1 ! cudaupload ! "
			   "video/x-raw(memory:CUDAMemory) ! xmemsink name=sink pool-name=" +
			   name + " wait-for-consumers=1 policy=block block-timeout=30000000000 buffers=6"),
		  consumer("xmemsrc name=src pool-name=" + name + " is-live=false " + src_props +
			   " ! video/x-raw(memory:CUDAMemory) ! appsink name=sink sync=false enable-last-sample=false")
	{
	}
	~KeptCudaFrames()
	{
		for (GstSample *sample : samples)
			gst_sample_unref(sample);
	}
	// Plays both and keeps every sample until the producer's end of stream.
	::testing::AssertionResult keep()
	{
		if (!producer || !consumer || producer.play() == GST_STATE_CHANGE_FAILURE ||
		    consumer.play() == GST_STATE_CHANGE_FAILURE)
			return ::testing::AssertionFailure() << "a pipeline did not start";
		auto *appsink = GST_APP_SINK(consumer.by_name("sink"));
		for (int i = 0; i < n; i++) {
			GstSample *sample = gst_app_sink_try_pull_sample(appsink, 20 * GST_SECOND);
			if (!sample)
				return ::testing::AssertionFailure() << "frame " << i << " never arrived";
#ifdef XMEM_TEST_HAVE_GST_CUDA
			EXPECT_TRUE(gst_is_cuda_memory(gst_buffer_peek_memory(gst_sample_get_buffer(sample), 0)));
#endif
			samples.push_back(sample);
		}
		std::string eos = producer.wait_eos(20s);
		if (!eos.empty())
			return ::testing::AssertionFailure() << "producer: " << eos;
		return ::testing::AssertionSuccess();
	}
	guint64 free_slots() const
	{
		return stat_u64(producer.by_name("sink"), "free-slots");
	}

	const int n;
	Pipeline producer;
	Pipeline consumer;
	std::vector<GstSample *> samples;
};

} // namespace

// Near its cap (the default for 6 slots and a queue of 4: 5, one kept spare), a source
// whose downstream keeps device frames copies the next one into CUDA memory of its own
// and gives its slot back at once (GStreamer 1.24 and later wrap slots; before, every
// frame is copied anyway).
TEST_F(Nvcodec, NearItsCapCudaFramesAreCopiedIntoCudaMemoryAndTheSlotGoesBack)
{
#if !defined(XMEM_TEST_HAVE_GST_CUDA) || !GST_CHECK_VERSION(1, 24, 0)
	GTEST_SKIP() << "GStreamer before 1.24 wraps no device slot: every frame is a copy";
#else
	KeptCudaFrames kept("near-cap", 5, "");
	ASSERT_TRUE(kept.keep());
	GstElement *src = kept.consumer.by_name("src");
	EXPECT_EQ(stat_u64(src, "max-held"), 5u);
	EXPECT_EQ(stat_u64(src, "zero-copy"), 3u) << "three kept in their slots, the cap's spare left free";
	EXPECT_EQ(stat_u64(src, "copied-held"), 2u);
	EXPECT_EQ(stat_u64(src, "copied"), 2u);
	EXPECT_TRUE(eventually([&] { return kept.free_slots() == 3; }))
		<< kept.free_slots() << " free: a copied frame's slot was kept";
	for (GstSample *sample : kept.samples)
		gst_sample_unref(sample);
	kept.samples.clear();
	EXPECT_TRUE(eventually([&] { return kept.free_slots() == 6; }));
#endif
}

// xmemsrc's CUDA output holds its frames' slots for as long as any GstMemory of them
// lives: with GStreamer 1.24 and later the memory is the slot itself (wrapped), before
// it a copy that frees the slot at once. Four frames held here as samples keep four
// slots from the producer on 1.24 and later; each comes back as its memory goes. (Four
// of six is past xmemsrc's default cap, under which it would copy the fourth: max-held
// 6 lets it keep them all; the test before has the default.)
TEST_F(Nvcodec, CudaOutputHoldsItsSlotsUntilTheLastMemoryGoes)
{
	const int n = 4;
	KeptCudaFrames kept("held", n, "max-held=6");
	ASSERT_TRUE(kept.keep());
	Pipeline &producer = kept.producer;
	Pipeline &consumer = kept.consumer;
	std::vector<GstSample *> &held = kept.samples;
	GstElement *sink = producer.by_name("sink");
#if GST_CHECK_VERSION(1, 24, 0)
	EXPECT_EQ(stat_u64(consumer.by_name("src"), "zero-copy"), guint64(n));
	EXPECT_EQ(stat_u64(consumer.by_name("src"), "copied"), 0u);
	// Give a release that should not happen the time to happen.
	std::this_thread::sleep_for(200ms);
	EXPECT_EQ(stat_u64(sink, "free-slots"), guint64(6 - n)) << "a slot went back while its memory lives";
#else
	EXPECT_EQ(stat_u64(consumer.by_name("src"), "copied"), guint64(n));
#endif
#if defined(XMEM_TEST_HAVE_GST_CUDA) && GST_CHECK_VERSION(1, 24, 0)
	// Work reading the last frame, queued on another stream of the context (as a
	// downstream element's own stream would; late on the simulator): the slot may go
	// back to the producer only once that work is done, so dropping the last reference
	// waits for it.
	{
		GstMemory *mem = gst_buffer_peek_memory(gst_sample_get_buffer(held[1]), 0);
		auto *cmem = GST_CUDA_MEMORY_CAST(mem);
		auto *mctx = GST_CUDA_CONTEXT(gst_object_ref(cmem->context));
		GstCudaStream *reader = gst_cuda_stream_new(mctx);
		ASSERT_NE(reader, nullptr);
		CUstream handle = gst_cuda_stream_get_handle(reader);
		GstMapInfo map;
		ASSERT_TRUE(gst_memory_map(mem, &map, GstMapFlags(GST_MAP_READ | GST_MAP_CUDA)));
		ASSERT_TRUE(gst_cuda_context_push(mctx));
		CUdeviceptr scratch = 0;
		ASSERT_EQ(CuMemAlloc(&scratch, guint(map.size)), CUDA_SUCCESS);
		for (int k = 0; k < 40; k++)
			ASSERT_EQ(CuMemcpyDtoDAsync(scratch, CUdeviceptr(map.data), map.size, handle), CUDA_SUCCESS);
		gst_cuda_context_pop(nullptr);
		gst_memory_unmap(mem, &map);
		auto busy = xmem::cuda_stream_done(0, xmem::CudaStream(handle));
		ASSERT_TRUE(busy);
		EXPECT_FALSE(*busy) << "the reads finished before the test could drop the frame";
		gst_sample_unref(held[1]);
		held.erase(held.begin() + 1);
		auto done = xmem::cuda_stream_done(0, xmem::CudaStream(handle));
		ASSERT_TRUE(done);
		EXPECT_TRUE(*done) << "the slot went back while reads of it were still queued";
		ASSERT_TRUE(gst_cuda_context_push(mctx));
		EXPECT_EQ(CuMemFree(scratch), CUDA_SUCCESS);
		gst_cuda_context_pop(nullptr);
		gst_cuda_stream_unref(reader);
		gst_object_unref(mctx);
	}
#endif
	// Our samples gone, only what the running pipeline itself still references (appsink
	// keeps its preroll buffer) may hold a slot; stopped, it holds none.
	for (GstSample *sample : held)
		gst_sample_unref(sample);
	held.clear();
	EXPECT_TRUE(eventually([&] { return stat_u64(sink, "free-slots") >= 5; }, 20s))
		<< "free-slots " << stat_u64(sink, "free-slots") << " of 6 after the samples were dropped";
	consumer.stop();
	EXPECT_TRUE(eventually([&] { return stat_u64(sink, "free-slots") == 6; }, 20s))
		<< "free-slots " << stat_u64(sink, "free-slots") << " of 6 after the consumer stopped";
}

// CudaElements.KilledConsumerGivesDeviceSlotsBack, with the consumer taking CUDA memory: with GStreamer 1.24 and later
// the frames it holds when killed are wrapped slots, and they come back all the same.
TEST_F(Nvcodec, KilledConsumerOfCudaMemoryGivesDeviceSlotsBack)
{
	Pipeline producer("videotestsrc is-live=true pattern=ball ! "
			  "video/x-raw,format=RGBA,width=64,height=48,framerate=50/1 ! "
			  "xmemsink name=sink pool-name=devkillcuda memory=cuda buffers=12");
	ASSERT_NE(producer.play(), GST_STATE_CHANGE_FAILURE);
	GstElement *sink = producer.by_name("sink");
	Process consumer = launch("xmemsrc pool-name=devkillcuda ! video/x-raw(memory:CUDAMemory) ! queue "
				  "max-size-buffers=4 max-size-bytes=0 max-size-time=0 ! identity sleep-time=500000 ! "
				  "fakesink sync=false");
	ASSERT_TRUE(eventually([&] { return stat_u64(sink, "consumers") == 1; }, 20s)) << "the consumer never attached";
#if GST_CHECK_VERSION(1, 24, 0)
	ASSERT_TRUE(eventually([&] { return stat_u64(sink, "free-slots") <= 9; }, 20s))
		<< "the consumer holds fewer wrapped frames than expected: free-slots " << stat_u64(sink, "free-slots");
#else
	std::this_thread::sleep_for(500ms); // copies: the consumer holds no slot for long
#endif
	consumer.signal(SIGKILL);
	EXPECT_EQ(consumer.wait(10s), 128 + SIGKILL);
	guint64 published = stat_u64(sink, "published");
	EXPECT_TRUE(eventually([&] { return stat_u64(sink, "consumers") == 0; }, 20s)) << "the dead consumer stays";
	EXPECT_TRUE(eventually([&] { return stat_u64(sink, "published") >= published + 25; }, 20s))
		<< "the producer stopped after the consumer died";
	EXPECT_EQ(producer.pop(GST_MESSAGE_ERROR, 0ms), nullptr) << "the producer posted an error";
	gst_element_send_event(producer.get(), gst_event_new_eos());
	EXPECT_EQ(producer.wait_eos(20s), "");
	EXPECT_TRUE(eventually([&] { return stat_u64(sink, "free-slots") == 12; }, 20s))
		<< "free-slots " << stat_u64(sink, "free-slots") << " of 12 after the consumer's death";
}

// cudaupload ! xmemsink: each frame is published on the sink's stream, before its
// device-to-device copy has run (the simulator runs stream work late). xmemsrc with
// system-memory output receives without a stream and without blocking (receive(0),
// then a poll of the pool's fd): every frame must still arrive, bit-exact. Issue 15:
// a frame whose copy had not run at the first receive was released and lost.
TEST_F(Nvcodec, SystemMemoryConsumerOfADevicePoolGetsEveryFrame)
{
	const std::string caps = "video/x-raw,format=NV12,width=100,height=74,framerate=30/1";
	const int n = 60;
	auto reference = xmem::gsttest::reference_frames(caps, "ball", n);
	Pipeline producer("videotestsrc num-buffers=" + std::to_string(n) + " pattern=ball ! " + caps +
			  " ! cudaupload ! video/x-raw(memory:CUDAMemory) ! xmemsink name=sink pool-name=late "
			  "memory=cuda wait-for-consumers=1 policy=block block-timeout=30000000000 buffers=4");
	ASSERT_TRUE(producer);
	ASSERT_NE(producer.play(), GST_STATE_CHANGE_FAILURE);
	Consumer here("xmemsrc name=src pool-name=late is-live=false ! video/x-raw ! appsink name=sink sync=false",
		      by_offset(reference));
	ASSERT_TRUE(here.start());
	EXPECT_EQ(producer.wait_eos(60s), "");
	ASSERT_TRUE(here.join(60s)) << "no EOS; " << here.count() << " frames";
	EXPECT_EQ(here.error(), "");
	auto frames = here.frames();
	EXPECT_EQ(frames.size(), size_t(n)) << "frames were lost between the queue and the consumer";
	for (const auto &f : frames)
		EXPECT_TRUE(f.matches) << "frame " << f.offset << " differs from videotestsrc's";
	GstElement *sink = producer.by_name("sink");
	EXPECT_EQ(stat_u64(sink, "device-copied"), guint64(n)) << "published on the sink's stream";
	EXPECT_EQ(stat_u64(sink, "dropped"), 0u);
	EXPECT_EQ(stat_string(here.src(), "memory"), "system");
	EXPECT_EQ(stat_u64(here.src(), "dropped"), 0u);
}

#ifdef XMEM_TEST_HAVE_GST_CUDA
// Upstream's CUDA buffers come from a pool of two (as a decoder's fixed pool would):
// the sink keeps a buffer while its copy is queued on the sink's stream, but never the
// last one, which upstream needs to make the next frame; held buffers only go back in
// a later render(), so holding both would stop the stream for good.
TEST_F(Nvcodec, SinkNeverHoldsTheLastBufferOfABoundedUpstreamPool)
{
	const char *caps_text = "video/x-raw(memory:CUDAMemory),format=NV12,width=64,height=48,framerate=30/1";
	ASSERT_TRUE(gst_cuda_load_library());
	GstCudaContext *ctx = gst_cuda_context_new(0);
	ASSERT_NE(ctx, nullptr);
	GstCaps *caps = gst_caps_from_string(caps_text);
	GstVideoInfo info;
	ASSERT_TRUE(gst_video_info_from_caps(&info, caps));
	GstBufferPool *upstream = gst_cuda_buffer_pool_new(ctx);
	GstStructure *config = gst_buffer_pool_get_config(upstream);
	gst_buffer_pool_config_set_params(config, caps, guint(info.size), 2, 2);
	ASSERT_TRUE(gst_buffer_pool_set_config(upstream, config));
	ASSERT_TRUE(gst_buffer_pool_set_active(upstream, TRUE));

	GstHarness *h = gst_harness_new_parse("xmemsink name=sink pool-name=bounded");
	ASSERT_NE(h, nullptr);
	GstContext *shared = gst_context_new_cuda_context(ctx);
	gst_element_set_context(h->element, shared);
	gst_context_unref(shared);
	gst_harness_set_src_caps(h, gst_caps_ref(caps));
	const int n = 12;
	int pushed = 0;
	for (int i = 0; i < n; i++) {
		GstBuffer *buffer = nullptr;
		GstBufferPoolAcquireParams params{};
		params.flags = GST_BUFFER_POOL_ACQUIRE_FLAG_DONTWAIT;
		auto deadline = std::chrono::steady_clock::now() + 10s;
		while (gst_buffer_pool_acquire_buffer(upstream, &buffer, &params) == GST_FLOW_EOS &&
		       std::chrono::steady_clock::now() < deadline)
			std::this_thread::sleep_for(1ms);
		if (!buffer) {
			ADD_FAILURE() << "frame " << i << ": upstream's pool of 2 ran dry: the sink holds both buffers";
			break;
		}
		GST_BUFFER_PTS(buffer) = GST_SECOND * guint64(i) / 30;
		ASSERT_EQ(gst_harness_push(h, buffer), GST_FLOW_OK) << "frame " << i;
		pushed++;
	}
	EXPECT_EQ(pushed, n);
	GstElement *sink = gst_bin_get_by_name(GST_BIN(h->element), "sink");
	ASSERT_NE(sink, nullptr);
	EXPECT_EQ(stat_string(sink, "memory"), "cuda");
	EXPECT_EQ(stat_u64(sink, "device-copied"), guint64(pushed));
	gst_object_unref(sink);
	gst_harness_teardown(h);
	gst_buffer_pool_set_active(upstream, FALSE);
	gst_object_unref(upstream);
	gst_caps_unref(caps);
	gst_object_unref(ctx);
}

// The driver entry points a consumer's gate needs beyond GStreamer's loader, from the
// libcuda.so.1 GStreamer and xmem loaded (one module: the same file).
struct GateDriver {
	decltype(&::cuStreamCreate) stream_create = nullptr;
	decltype(&::cuStreamDestroy) stream_destroy = nullptr;
	decltype(&::cuStreamSynchronize) stream_synchronize = nullptr;
	decltype(&::cuStreamWaitValue64) wait_value = nullptr;
	decltype(&::cuMemHostRegister) host_register = nullptr;
	decltype(&::cuMemHostUnregister) host_unregister = nullptr;
	decltype(&::cuMemHostGetDevicePointer) host_device_pointer = nullptr;

	bool load()
	{
		const char *path = std::getenv("XMEM_CUDA_DRIVER");
		void *module = dlopen(path ? path : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
		if (!module)
			return false;
			// cuda.h renames most of these (cuStreamWaitValue64 to cuStreamWaitValue64_v2):
			// the strings are the ABI names.
#define XMEM_ABI_NAME(fn) #fn
#define XMEM_LOAD(field, fn) field = reinterpret_cast<decltype(field)>(dlsym(module, XMEM_ABI_NAME(fn)))
		XMEM_LOAD(stream_create, cuStreamCreate);
		XMEM_LOAD(stream_destroy, cuStreamDestroy);
		XMEM_LOAD(stream_synchronize, cuStreamSynchronize);
		XMEM_LOAD(wait_value, cuStreamWaitValue64);
		XMEM_LOAD(host_register, cuMemHostRegister);
		XMEM_LOAD(host_unregister, cuMemHostUnregister);
		XMEM_LOAD(host_device_pointer, cuMemHostGetDevicePointer);
#undef XMEM_LOAD
#undef XMEM_ABI_NAME
		return stream_create && stream_destroy && stream_synchronize && wait_value && host_register &&
		       host_unregister && host_device_pointer;
	}
};

// A consumer released a frame on its own stream, which a wait holds back, so its done word
// is not written yet; xmemsink takes the slot again and its stream waits (on the GPU) for
// that word. Meanwhile GStreamer maps CUDA memory of the same context for the CPU, a copy on
// the legacy default stream: it must not wait for the sink. It would on a blocking sink
// stream, which the legacy stream synchronizes with: every legacy copy in the pipeline's
// context would stall for as long as any consumer's stream holds a frame.
TEST_F(Nvcodec, LegacyStreamWorkDoesNotWaitForTheSinksHeldStream)
{
	GateDriver cu;
	ASSERT_TRUE(cu.load()) << "the CUDA driver's stream memory operations cannot be loaded";
	const char *caps_text = "video/x-raw(memory:CUDAMemory),format=NV12,width=64,height=48,framerate=30/1";
	ASSERT_TRUE(gst_cuda_load_library());
	GstCudaContext *ctx = gst_cuda_context_new(0);
	ASSERT_NE(ctx, nullptr);
	GstCaps *caps = gst_caps_from_string(caps_text);
	GstVideoInfo info;
	ASSERT_TRUE(gst_video_info_from_caps(&info, caps));
	GstBufferPool *upstream = gst_cuda_buffer_pool_new(ctx);
	GstStructure *config = gst_buffer_pool_get_config(upstream);
	gst_buffer_pool_config_set_params(config, caps, guint(info.size), 2, 0);
	ASSERT_TRUE(gst_buffer_pool_set_config(upstream, config));
	ASSERT_TRUE(gst_buffer_pool_set_active(upstream, TRUE));
	GstHarness *h = gst_harness_new_parse("xmemsink pool-name=held memory=cuda buffers=1");
	ASSERT_NE(h, nullptr);
	GstContext *shared = gst_context_new_cuda_context(ctx);
	gst_element_set_context(h->element, shared);
	gst_context_unref(shared);
	gst_harness_set_src_caps(h, gst_caps_ref(caps));
	auto push = [&](int i) {
		GstBuffer *buffer = nullptr;
		if (gst_buffer_pool_acquire_buffer(upstream, &buffer, nullptr) != GST_FLOW_OK)
			return GST_FLOW_ERROR;
		GST_BUFFER_PTS(buffer) = GST_SECOND * guint64(i) / 30;
		return gst_harness_push(h, buffer);
	};
	ASSERT_EQ(push(0), GST_FLOW_OK); // makes the pool

	// The consumer's stream and gate live in GStreamer's context; the stream does not
	// block the legacy stream itself.
	xmem::OpenOptions options;
	options.timeout = 5s;
	auto consumer = xmem::BufferPool::open("held", options);
	ASSERT_TRUE(consumer.ok()) << xmem::test::why(consumer);
	if (std::string((*consumer)->gpu_ordering()) != "stream-memops")
		GTEST_SKIP() << "no GPU ordering here: the sink would wait on the CPU";
	ASSERT_TRUE(gst_cuda_context_push(ctx));
	CUstream held = nullptr;
	ASSERT_EQ(cu.stream_create(&held, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	const size_t page = size_t(sysconf(_SC_PAGESIZE));
	void *host = mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ASSERT_NE(host, MAP_FAILED);
	ASSERT_EQ(cu.host_register(host, page, CU_MEMHOSTREGISTER_DEVICEMAP), CUDA_SUCCESS);
	auto *gate = static_cast<uint64_t *>(host);
	CUdeviceptr gate_dev = 0;
	ASSERT_EQ(cu.host_device_pointer(&gate_dev, gate, 0), CUDA_SUCCESS);
	ASSERT_TRUE(gst_cuda_context_pop(nullptr));

	// No ASSERT from here until the gate opens: the streams would stay held.
	EXPECT_EQ(push(1), GST_FLOW_OK);
	auto frame = (*consumer)->receive(5s, held);
	EXPECT_TRUE(frame.ok()) << xmem::test::why(frame);
	gst_cuda_context_push(ctx);
	EXPECT_EQ(cu.wait_value(held, gate_dev, 1, CU_STREAM_WAIT_VALUE_GEQ), CUDA_SUCCESS);
	gst_cuda_context_pop(nullptr);
	if (frame.ok()) {
		EXPECT_TRUE(frame->release(held).ok());
	}
	// The sink's only slot again: its stream waits for the consumer's release.
	EXPECT_EQ(push(2), GST_FLOW_OK);

	// GStreamer's CPU map of CUDA memory written on the device: a download on the legacy
	// stream.
	GstBuffer *other = nullptr;
	EXPECT_EQ(gst_buffer_pool_acquire_buffer(upstream, &other, nullptr), GST_FLOW_OK);
	GstMapInfo map;
	if (other && gst_buffer_map(other, &map, GstMapFlags(GST_MAP_WRITE | GST_MAP_CUDA)))
		gst_buffer_unmap(other, &map);
	std::atomic<bool> mapped{ false };
	std::thread reader([&] {
		GstMapInfo cpu;
		if (other && gst_buffer_map(other, &cpu, GST_MAP_READ))
			gst_buffer_unmap(other, &cpu);
		mapped.store(true);
	});
	bool in_time = eventually([&] { return mapped.load(); }, 3s);
	EXPECT_TRUE(in_time) << "a legacy-stream copy waited for the sink's stream, held by a consumer";
	__atomic_store_n(gate, 1, __ATOMIC_RELEASE);
	reader.join();
	if (other)
		gst_buffer_unref(other);

	gst_cuda_context_push(ctx);
	EXPECT_EQ(cu.stream_synchronize(held), CUDA_SUCCESS);
	EXPECT_EQ(cu.stream_destroy(held), CUDA_SUCCESS);
	EXPECT_EQ(cu.host_unregister(host), CUDA_SUCCESS);
	gst_cuda_context_pop(nullptr);
	munmap(host, page);
	consumer = xmem::Error{};
	gst_harness_teardown(h);
	gst_buffer_pool_set_active(upstream, FALSE);
	gst_object_unref(upstream);
	gst_caps_unref(caps);
	gst_object_unref(ctx);
}
#endif

// memory=system with CUDA input: one download straight into the shared slot; the
// consumer then reads the slot itself.
TEST_F(Nvcodec, CudaInputIntoSystemPool)
{
	const std::string caps = "video/x-raw,format=I420,width=98,height=70,framerate=30/1";
	const int n = 15;
	auto reference = xmem::gsttest::reference_frames(caps, "ball", n);
	Pipeline producer("videotestsrc num-buffers=" + std::to_string(n) + " pattern=ball ! " + caps +
			  " ! cudaupload ! video/x-raw(memory:CUDAMemory) ! xmemsink name=sink pool-name=down "
			  "memory=system wait-for-consumers=1 policy=block block-timeout=30000000000");
	ASSERT_NE(producer.play(), GST_STATE_CHANGE_FAILURE);
	Consumer here("xmemsrc name=src pool-name=down is-live=false ! appsink name=sink sync=false",
		      by_offset(reference));
	ASSERT_TRUE(here.start());
	EXPECT_EQ(producer.wait_eos(60s), "");
	ASSERT_TRUE(here.join(60s));
	auto frames = here.frames();
	ASSERT_EQ(frames.size(), size_t(n));
	for (const auto &f : frames)
		EXPECT_TRUE(f.matches) << "frame " << f.offset;
	GstElement *sink = producer.by_name("sink");
	EXPECT_EQ(stat_string(sink, "memory"), "system");
	EXPECT_EQ(stat_u64(sink, "copied"), guint64(n));
	EXPECT_EQ(stat_u64(sink, "device-copied"), 0u);
	EXPECT_EQ(stat_u64(here.src(), "zero-copy"), guint64(n));
}

// The GstCudaContext an element answers a CUDA context query on PAD with (borrowed).
GObject *cuda_context_of(GstPad *pad)
{
	GstQuery *q = gst_query_new_context("gst.cuda.context");
	GObject *ctx = nullptr;
	if (gst_pad_query(pad, q)) {
		GstContext *context = nullptr;
		gst_query_parse_context(q, &context);
		const GstStructure *s = context ? gst_context_get_structure(context) : nullptr;
		const GValue *v = s ? gst_structure_get_value(s, "gst.cuda.context") : nullptr;
		ctx = v && G_VALUE_HOLDS_OBJECT(v) ? G_OBJECT(g_value_get_object(v)) : nullptr;
	}
	gst_query_unref(q);
	return ctx;
}

// xmemsink reads upstream's CUDA memory on upstream's context: one context, shared.
TEST_F(Nvcodec, SinkSharesUpstreamsContext)
{
	Pipeline producer("videotestsrc num-buffers=5 ! video/x-raw,format=NV12,width=64,height=48 ! "
			  "cudaupload name=up ! video/x-raw(memory:CUDAMemory) ! xmemsink name=sink pool-name=ctx");
	// A context of the sink's own, announced to the pipeline, would be dropped as soon
	// as cudaupload's arrives: the sink must adopt cudaupload's without making one.
	std::atomic<int> sink_contexts{ 0 };
	GstBus *bus = gst_element_get_bus(producer.get());
	gst_bus_set_sync_handler(
		bus,
		[](GstBus *, GstMessage *msg, gpointer data) {
			if (GST_MESSAGE_TYPE(msg) == GST_MESSAGE_HAVE_CONTEXT &&
			    g_strcmp0(GST_OBJECT_NAME(GST_MESSAGE_SRC(msg)), "sink") == 0)
				(*static_cast<std::atomic<int> *>(data))++;
			return GST_BUS_PASS;
		},
		&sink_contexts, nullptr);
	ASSERT_NE(producer.play(), GST_STATE_CHANGE_FAILURE);
	EXPECT_EQ(producer.wait_eos(30s), "");
	EXPECT_EQ(sink_contexts.load(), 0) << "xmemsink made a CUDA context of its own besides cudaupload's";
	GstPad *sink_pad = gst_element_get_static_pad(producer.by_name("sink"), "sink");
	GstPad *up_pad = gst_element_get_static_pad(producer.by_name("up"), "src");
	GObject *ours = cuda_context_of(sink_pad);
	GObject *theirs = cuda_context_of(up_pad);
	EXPECT_NE(ours, nullptr) << "xmemsink answers no CUDA context query";
	EXPECT_NE(theirs, nullptr) << "cudaupload answers no CUDA context query";
	EXPECT_EQ(ours, theirs) << "xmemsink uses another context than cudaupload";
	gst_object_unref(sink_pad);
	gst_object_unref(up_pad);
	// Contexts are queried while the elements still hold them (before NULL); the
	// handler's counter goes out of scope before the pipeline.
	gst_bus_set_sync_handler(bus, nullptr, nullptr, nullptr);
	gst_object_unref(bus);
}

#if defined(XMEM_TEST_HAVE_GST_CUDA) && GST_CHECK_VERSION(1, 24, 0)
// GStreamer 1.24 and later hand CUDA memory downstream while it is still being written
// on a stream of its own (GST_CUDA_MEMORY_TRANSFER_NEED_SYNC), as decoders do: mapping
// it does not wait. xmemsink must order its copy after that stream. Here each frame is
// filled by thirty memsets queued on the pool's stream (late on the simulator, whose
// stream work runs up to 300 us behind) when it is pushed; the consumer must see only
// the last value, never a frame before it.
TEST_F(Nvcodec, SinkWaitsForItsInputsOwnStream)
{
	const int n = 12;
	const int width = 64, height = 48;
	GstCudaContext *ctx = gst_cuda_context_new(0);
	ASSERT_NE(ctx, nullptr);
	GstCudaStream *stream = gst_cuda_stream_new(ctx);
	ASSERT_NE(stream, nullptr);
	std::string caps = "video/x-raw,format=RGBA,width=" + std::to_string(width) +
			   ",height=" + std::to_string(height) + ",framerate=30/1";
	GstCaps *cuda_caps = gst_caps_from_string(caps.c_str());
	gst_caps_set_features_simple(cuda_caps, gst_caps_features_new_single(GST_CAPS_FEATURE_MEMORY_CUDA_MEMORY));
	GstVideoInfo info;
	ASSERT_TRUE(gst_video_info_from_caps(&info, cuda_caps));
	GstBufferPool *pool = gst_cuda_buffer_pool_new(ctx);
	GstStructure *config = gst_buffer_pool_get_config(pool);
	gst_buffer_pool_config_set_params(config, cuda_caps, guint(info.size), 3, 0);
	gst_buffer_pool_config_set_cuda_stream(config, stream);
	ASSERT_TRUE(gst_buffer_pool_set_config(pool, config));
	ASSERT_TRUE(gst_buffer_pool_set_active(pool, TRUE));

	Pipeline producer("appsrc name=src format=time ! xmemsink name=sink pool-name=late wait-for-consumers=1 "
			  "policy=block block-timeout=30000000000 buffers=4");
	ASSERT_TRUE(producer);
	GstElement *src = producer.by_name("src");
	g_object_set(src, "caps", cuda_caps, nullptr);
	GstContext *shared = gst_context_new_cuda_context(ctx);
	gst_element_set_context(producer.by_name("sink"), shared);
	gst_context_unref(shared);
	ASSERT_NE(producer.play(), GST_STATE_CHANGE_FAILURE);
	std::vector<std::vector<uint8_t>> reference;
	for (int i = 0; i < n; i++)
		reference.emplace_back(size_t(width * 4 * height), uint8_t(i + 1));
	Consumer here("xmemsrc name=src pool-name=late is-live=false ! video/x-raw ! appsink name=sink sync=false",
		      by_offset(reference));
	ASSERT_TRUE(here.start());

	for (int i = 0; i < n; i++) {
		GstBuffer *buf = nullptr;
		ASSERT_EQ(gst_buffer_pool_acquire_buffer(pool, &buf, nullptr), GST_FLOW_OK);
		GstMemory *mem = gst_buffer_peek_memory(buf, 0);
		GstMapInfo map;
		ASSERT_TRUE(gst_memory_map(mem, &map, GstMapFlags(GST_MAP_WRITE | GST_MAP_CUDA)));
		auto *cmem = GST_CUDA_MEMORY_CAST(mem);
		ASSERT_TRUE(gst_cuda_context_push(ctx));
		CUstream handle = gst_cuda_stream_get_handle(stream);
		for (int k = 0; k < 30; k++)
			ASSERT_EQ(CuMemsetD2D8Async(CUdeviceptr(map.data),
						    size_t(GST_VIDEO_INFO_PLANE_STRIDE(&cmem->info, 0)),
						    (unsigned char)(k == 29 ? i + 1 : 0xee), size_t(width * 4),
						    size_t(height), handle),
				  CUDA_SUCCESS);
		gst_cuda_context_pop(nullptr);
		gst_memory_unmap(mem, &map);
		EXPECT_TRUE(GST_MEMORY_FLAG_IS_SET(mem, GST_CUDA_MEMORY_TRANSFER_NEED_SYNC));
		GST_BUFFER_PTS(buf) = i * GST_SECOND / 30;
		ASSERT_EQ(gst_app_src_push_buffer(GST_APP_SRC(src), buf), GST_FLOW_OK);
	}
	gst_app_src_end_of_stream(GST_APP_SRC(src));
	EXPECT_EQ(producer.wait_eos(30s), "");
	ASSERT_TRUE(here.join(30s));
	EXPECT_EQ(here.error(), "");
	auto frames = here.frames();
	ASSERT_EQ(frames.size(), size_t(n));
	for (const auto &f : frames)
		EXPECT_TRUE(f.matches) << "frame " << f.offset << " was copied before its own stream had written it";
	gst_buffer_pool_set_active(pool, FALSE);
	gst_object_unref(pool);
	gst_caps_unref(cuda_caps);
	gst_cuda_stream_unref(stream);
	gst_object_unref(ctx);
}
#endif

// Three consumers of CUDA memory, one of them its own gst-launch-1.0 process, all
// bit-exact; the slots are free again at the end.
TEST_F(Nvcodec, FanOutToThreeCudaConsumers)
{
	const std::string caps = "video/x-raw,format=NV12,width=160,height=90,framerate=30/1";
	const int n = 20;
	auto reference = xmem::gsttest::reference_frames(caps, "ball", n);
	Pipeline producer("videotestsrc num-buffers=" + std::to_string(n) + " pattern=ball ! " + caps +
			  " ! cudaupload ! video/x-raw(memory:CUDAMemory) ! xmemsink name=sink pool-name=fan3 "
			  "wait-for-consumers=3 policy=block block-timeout=30000000000 buffers=4");
	ASSERT_NE(producer.play(), GST_STATE_CHANGE_FAILURE);
	const std::string line = "xmemsrc name=src pool-name=fan3 is-live=false ! video/x-raw(memory:CUDAMemory) ! "
				 "cudadownload ! video/x-raw ! ";
	std::string file = dir_.path() + "/third.raw";
	Process third = launch(line + "filesink location=" + file);
	Consumer first(line + "appsink name=sink sync=false", by_offset(reference));
	Consumer second(line + "queue ! identity sleep-time=2000 ! appsink name=sink sync=false", by_offset(reference));
	ASSERT_TRUE(first.start());
	ASSERT_TRUE(second.start());
	expect_all_frames(producer, first, third, file, reference);
	ASSERT_TRUE(second.join(60s));
	auto frames = second.frames();
	EXPECT_EQ(frames.size(), size_t(n));
	for (const auto &f : frames)
		EXPECT_TRUE(f.matches) << "frame " << f.offset;
	GstElement *sink = producer.by_name("sink");
	EXPECT_EQ(stat_u64(sink, "device-copied"), guint64(n));
	EXPECT_TRUE(eventually([&] { return stat_u64(sink, "free-slots") == 4; }, 20s))
		<< "free-slots " << stat_u64(sink, "free-slots");
}

// A device pool's recorder and detector, each with its own policy: the recorder
// (fifo-spill, slow) gets every frame in CUDA memory, spilled ones copied back to the
// device from the pool's spill tier; the detector (latest) beside it and the producer are
// never held back.
TEST_F(Nvcodec, DevicePoolRecorderAndDetectorEachWithItsOwnPolicy)
{
	const std::string caps = "video/x-raw,format=NV12,width=160,height=90,framerate=100/1";
	const int n = 40;
	auto reference = xmem::gsttest::reference_frames(caps, "ball", n);
	const std::string line = "xmemsrc name=src pool-name=devspill is-live=false ";
	const std::string cuda_out = " ! video/x-raw(memory:CUDAMemory) ! cudadownload ! video/x-raw ! ";
	Consumer recorder(line + "policy=fifo-spill" + cuda_out +
				  "identity sleep-time=20000 ! appsink name=sink sync=false",
			  by_offset(reference));
	Consumer detector(line + "policy=latest" + cuda_out + "appsink name=sink sync=false", by_offset(reference));
	ASSERT_TRUE(recorder.start());
	ASSERT_TRUE(detector.start());
	Pipeline producer("videotestsrc is-live=true num-buffers=" + std::to_string(n) + " pattern=ball ! " + caps +
			  " ! cudaupload ! video/x-raw(memory:CUDAMemory) ! xmemsink name=sink pool-name=devspill "
			  "wait-for-consumers=2 buffers=4 spill-size=4000000");
	ASSERT_NE(producer.play(), GST_STATE_CHANGE_FAILURE);
	EXPECT_EQ(producer.wait_eos(60s), "");
	size_t when_producer_ended = recorder.count();
	ASSERT_TRUE(recorder.join(60s)) << "no EOS; " << recorder.count() << " frames";
	ASSERT_TRUE(detector.join(60s)) << "no EOS; " << detector.count() << " frames";
	EXPECT_EQ(recorder.error(), "");
	EXPECT_EQ(detector.error(), "");
	auto recorded = recorder.frames();
	EXPECT_EQ(recorded.size(), size_t(n));
	for (const auto &f : recorded)
		EXPECT_TRUE(f.matches) << "frame " << f.offset << " differs from videotestsrc's";
	EXPECT_LT(when_producer_ended, size_t(n)) << "the producer waited for the recorder";
	EXPECT_GT(stat_u64(recorder.src(), "spilled"), 0u);
	EXPECT_EQ(stat_u64(recorder.src(), "lost"), 0u);
	for (const auto &f : detector.frames())
		EXPECT_TRUE(f.matches) << "detector frame " << f.offset;
}

// nvh264dec decodes a file made here straight into CUDA memory; xmemsink copies each
// frame device to device. Needs NVDEC: a GPU (the simulator decodes nothing).
TEST_F(Nvcodec, DecoderIntoDevicePool)
{
	if (!can_make("nvh264dec"))
		GTEST_SKIP() << "nvh264dec is not available (NVDEC needs a GPU and libnvcuvid.so.1)";
	const char *encoder = nullptr;
	for (const char *e : { "nvh264enc", "x264enc", "openh264enc" })
		if (!encoder && can_make(e))
			encoder = e;
	if (!encoder)
		GTEST_SKIP() << "no H.264 encoder (nvh264enc, x264enc, openh264enc)";
	std::string clip = dir_.path() + "/clip.mp4";
	Pipeline encode(std::string("videotestsrc num-buffers=60 pattern=ball ! "
				    "video/x-raw,format=I420,width=320,height=240,framerate=30/1 ! ") +
			encoder + " ! h264parse ! mp4mux ! filesink location=" + clip);
	ASSERT_NE(encode.play(), GST_STATE_CHANGE_FAILURE);
	ASSERT_EQ(encode.wait_eos(60s), "");
	Pipeline producer("filesrc location=" + clip +
			  " ! parsebin ! nvh264dec ! video/x-raw(memory:CUDAMemory) ! xmemsink name=sink "
			  "pool-name=dec wait-for-consumers=1 policy=block block-timeout=30000000000");
	ASSERT_NE(producer.play(), GST_STATE_CHANGE_FAILURE);
	Consumer consumer("xmemsrc name=src pool-name=dec is-live=false ! video/x-raw(memory:CUDAMemory) ! "
			  "cudadownload ! video/x-raw ! appsink name=sink sync=false");
	ASSERT_TRUE(consumer.start());
	EXPECT_EQ(producer.wait_eos(60s), "");
	ASSERT_TRUE(consumer.join(60s));
	EXPECT_EQ(consumer.error(), "");
	EXPECT_EQ(consumer.count(), 60u);
	GstElement *sink = producer.by_name("sink");
	EXPECT_EQ(stat_string(sink, "memory"), "cuda");
	EXPECT_EQ(stat_u64(sink, "device-copied"), 60u);
}

// In a process where no nvcodec element loaded GStreamer's CUDA library, xmemsrc loads
// it itself and makes its own context: CUDA memory out, nothing else CUDA around.
TEST_F(Nvcodec, SourceAloneMakesItsOwnContext)
{
	Pipeline producer("videotestsrc is-live=true ! video/x-raw,format=NV12,width=64,height=48,framerate=30/1 ! "
			  "xmemsink pool-name=alone memory=cuda");
	ASSERT_NE(producer.play(), GST_STATE_CHANGE_FAILURE);
	Process consumer = launch("xmemsrc pool-name=alone num-buffers=5 ! video/x-raw(memory:CUDAMemory) ! "
				  "fakesink");
	EXPECT_EQ(consumer.wait(30s), 0) << consumer.output();
}

// Caps change twice within the device slots, then frames outgrow them (a size class
// of device slots added to the pool, preallocated or, with memory-cap, made on demand):
// each frame arrives with the caps it was made in, and the consumer never reattaches.
TEST_F(CudaElements, CapsChangesInDevicePools)
{
	xmem::gsttest::run_caps_changes("devchange", { { 640, 480 }, { 320, 240 }, { 640, 480 } }, 4, 0, 1,
					"memory=cuda", "video/x-raw");
	xmem::gsttest::run_caps_changes("devgrow", { { 320, 240 }, { 640, 480 }, { 320, 240 } }, 4, 0, 2, "memory=cuda",
					"video/x-raw");
	// With memory-cap, the larger frames get device slots made on demand: the consumer
	// maps each slot's memory as its first frame comes.
	xmem::gsttest::run_caps_changes("devgrowcap", { { 320, 240 }, { 640, 480 }, { 320, 240 } }, 4, 0, 2,
					"memory=cuda memory-cap=67108864", "video/x-raw");
}

// A device pool that also holds a class of system memory (a C++ producer made it: the
// sink never does), taken by xmemsrc as CUDA memory: its device frames are wrapped or
// copied as always, and its system frames are uploaded, never passed on as system
// memory under CUDA caps. Every byte arrives, in order.
TEST_F(Nvcodec, CudaOutputOfAMixedPoolUploadsItsSystemFrames)
{
	constexpr guint width = 64, height = 48, size = width * height * 3 / 2;
	xmem::PoolConfig config;
	config.storage = xmem::Storage::cuda;
	config.slot_size = size;
	config.slot_count = 3;
	config.policy = xmem::Policy::fifo;
	config.block_timeout = 10s;
	auto owner = xmem::BufferPool::create("mixedout", config);
	ASSERT_TRUE(owner.ok()) << xmem::test::why(owner);
	ASSERT_TRUE((*owner)->preallocate(size, 3, xmem::Storage::system).ok());
	ASSERT_TRUE((*owner)->set_format("video/x-raw,format=NV12,width=64,height=48,framerate=30/1").ok());

	const int n = 6;
	Pipeline consumer("xmemsrc name=src pool-name=mixedout is-live=false num-buffers=" + std::to_string(n) +
			  " ! video/x-raw(memory:CUDAMemory) ! cudadownload ! video/x-raw,format=NV12 ! "
			  "appsink name=sink sync=false");
	ASSERT_TRUE(consumer);
	ASSERT_NE(consumer.play(), GST_STATE_CHANGE_FAILURE);
	ASSERT_TRUE(eventually([&] { return (*owner)->stats().consumers == 1; }));
	for (int i = 1; i <= n; i++) {
		auto host = (*owner)->acquire(size, xmem::Storage::system, 0, 10s);
		ASSERT_TRUE(host.ok()) << xmem::test::why(host);
		auto bytes = host->data_mut().value();
		std::memset(bytes.data(), 10 * i, size);
		host->meta_mut().value()->size = size;
		if (i % 2 == 0) {
			// A device frame: the same bytes, copied into a device slot.
			auto device = (*owner)->copy(*host, xmem::Storage::cuda, 0, 10s);
			ASSERT_TRUE(device.ok()) << xmem::test::why(device);
			host->reset();
			ASSERT_TRUE((*owner)->publish(std::move(*device)).ok());
		} else {
			ASSERT_TRUE((*owner)->publish(std::move(*host)).ok());
		}
	}
	auto *appsink = GST_APP_SINK(consumer.by_name("sink"));
	for (int i = 1; i <= n; i++) {
		GstSample *sample = gst_app_sink_try_pull_sample(appsink, 20 * GST_SECOND);
		ASSERT_NE(sample, nullptr) << "frame " << i << " never arrived";
		GstMapInfo map;
		ASSERT_TRUE(gst_buffer_map(gst_sample_get_buffer(sample), &map, GST_MAP_READ));
		std::vector<guint8> want(size, guint8(10 * i));
		EXPECT_EQ(map.size, gsize(size));
		EXPECT_TRUE(map.size >= size && std::memcmp(map.data, want.data(), size) == 0) << "frame " << i;
		gst_buffer_unmap(gst_sample_get_buffer(sample), &map);
		gst_sample_unref(sample);
	}
	EXPECT_EQ(stat_string(consumer.by_name("src"), "memory"), "cuda");
	// Three system frames uploaded; the device ones wrapped (1.24 and later) or copied.
#if GST_CHECK_VERSION(1, 24, 0)
	EXPECT_EQ(stat_u64(consumer.by_name("src"), "copied"), 3u);
	EXPECT_EQ(stat_u64(consumer.by_name("src"), "zero-copy"), 3u);
#else
	EXPECT_EQ(stat_u64(consumer.by_name("src"), "copied"), guint64(n));
#endif
}
