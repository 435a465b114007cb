// nvdec_producer.cpp - decodes an H.264 or HEVC elementary stream with NVDEC straight
// into an xmem CUDA pool, without GStreamer: what a video analytics app embeds.
//
//   xmem-nvdec-producer FILE [POOL] [--codec h264|hevc] [--device N] [--slots N]
//                       [--wait N] [--fps N]
//
// NVDEC decodes into its own surfaces; each decoded frame is mapped and copied once,
// device to device, into a slot on one stream, and published with that stream: the
// consumers' GPU work waits for the copy on the GPU. The CPU waits only for the copy
// before the decoder's surface is unmapped (NVDEC's rule). Frames are NV12, rows and
// planes on the pool's pitch alignment, with their timestamps.
//
// The NVIDIA Video Codec SDK headers come from Debian's libffmpeg-nvenc-dev, whose
// loaders open libcuda.so.1 and libnvcuvid.so.1 at run time: where either is missing,
// this says which and exits with status 1.
#include <xmem/xmem.hpp>

#include <ffnvcodec/dynlink_loader.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

struct Options {
	std::string file;
	std::string pool = "nvdec0";
	cudaVideoCodec codec = cudaVideoCodec_H264;
	int device = 0;
	uint32_t slots = 8;
	uint32_t wait = 0;
	unsigned fps = 0; // 0: the stream's own, else 30
};

[[noreturn]] void die(const std::string &message)
{
	(void)std::fprintf(stderr, "xmem-nvdec-producer: %s\n", message.c_str());
	// exit() is unsafe while other threads run static destructors: this tool has no
	// thread of its own (NVDEC's parser calls back on the calling thread).
	std::exit(1); // NOLINT(concurrency-mt-unsafe)
}

const char *codec_name(cudaVideoCodec c)
{
	return c == cudaVideoCodec_HEVC ? "HEVC" : "H.264";
}

bool ends_with(const std::string &s, const char *suffix)
{
	size_t n = std::strlen(suffix);
	return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

Options parse(int argc, char **argv)
{
	Options o;
	std::vector<std::string> positional;
	bool codec_given = false;
	for (int i = 1; i < argc; i++) {
		std::string a = argv[i];
		auto value = [&]() -> std::string {
			if (i + 1 >= argc)
				die(a + " needs a value");
			return argv[++i];
		};
		auto number = [&]() -> unsigned long {
			std::string v = value();
			char *end = nullptr;
			unsigned long n = std::strtoul(v.c_str(), &end, 10);
			if (v.empty() || *end || n > 1000000)
				die(a + ": not a number: " += v);
			return n;
		};
		if (a == "--codec") {
			std::string c = value();
			if (c == "h264")
				o.codec = cudaVideoCodec_H264;
			else if (c == "hevc" || c == "h265")
				o.codec = cudaVideoCodec_HEVC;
			else
				die("--codec: h264 or hevc, not " + c);
			codec_given = true;
		} else if (a == "--device") {
			o.device = int(number());
		} else if (a == "--slots") {
			o.slots = uint32_t(number());
		} else if (a == "--wait") {
			o.wait = uint32_t(number());
		} else if (a == "--fps") {
			o.fps = unsigned(number());
		} else if (a == "-h" || a == "--help") {
			std::printf("usage: xmem-nvdec-producer FILE [POOL] [--codec h264|hevc] [--device N] "
				    "[--slots N] [--wait N] [--fps N]\n");
			std::exit(0); // NOLINT(concurrency-mt-unsafe): see die()
		} else if (!a.empty() && a[0] == '-') {
			die("unknown option " + a);
		} else {
			positional.push_back(a);
		}
	}
	if (positional.empty() || positional.size() > 2)
		die("usage: xmem-nvdec-producer FILE [POOL] [options] (--help)");
	o.file = positional[0];
	if (positional.size() == 2)
		o.pool = positional[1];
	if (!codec_given && (ends_with(o.file, ".h265") || ends_with(o.file, ".265") || ends_with(o.file, ".hevc")))
		o.codec = cudaVideoCodec_HEVC;
	return o;
}

// The driver's and NVDEC's entry points, and the device's primary context, which
// libxmem uses too: one context for the decoder, the copies and the pool.
class Gpu
{
public:
	explicit Gpu(int device)
	{
		// NVDEC first: without it nothing here can work, and it says the most.
		if (cuvid_load_functions(&cuvid_, nullptr) != 0)
			die("cannot load libnvcuvid.so.1 or one of its entry points (NVDEC, part of NVIDIA's "
			    "driver): no video decoder here");
		if (cuda_load_functions(&cu_, nullptr) != 0)
			die("cannot load libcuda.so.1 or one of its entry points (NVIDIA's CUDA driver)");
		check(cu_->cuInit(0), "cuInit");
		check(cu_->cuDeviceGet(&dev_, device), "cuDeviceGet");
		check(cu_->cuDevicePrimaryCtxRetain(&ctx_, dev_), "cuDevicePrimaryCtxRetain");
		check(cu_->cuCtxPushCurrent(ctx_), "cuCtxPushCurrent");
		check(cu_->cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
	}
	~Gpu()
	{
		if (stream_)
			cu_->cuStreamDestroy(stream_);
		CUcontext popped;
		cu_->cuCtxPopCurrent(&popped);
		cu_->cuDevicePrimaryCtxRelease(dev_);
		cuvid_free_functions(&cuvid_);
		cuda_free_functions(&cu_);
	}
	Gpu(const Gpu &) = delete;
	Gpu &operator=(const Gpu &) = delete;

	void check(CUresult r, const char *call) const
	{
		if (r == CUDA_SUCCESS)
			return;
		const char *name = nullptr;
		if (cu_->cuGetErrorName)
			cu_->cuGetErrorName(r, &name);
		die(std::string(call) + " failed: " + (name ? name : "CUDA error " + std::to_string(int(r))));
	}

	CudaFunctions *cu() const { return cu_; }
	CuvidFunctions *cuvid() const { return cuvid_; }
	CUstream stream() const { return stream_; }

private:
	CudaFunctions *cu_ = nullptr;
	CuvidFunctions *cuvid_ = nullptr;
	CUdevice dev_ = 0;
	CUcontext ctx_ = nullptr;
	CUstream stream_ = nullptr;
};

class Producer
{
public:
	Producer(const Options &o, Gpu &gpu) : o_(o), gpu_(gpu)
	{
		// Asked before the first byte: an old GPU or a stub library says no here.
		CUVIDDECODECAPS caps{};
		caps.eCodecType = o.codec;
		caps.eChromaFormat = cudaVideoChromaFormat_420;
		caps.nBitDepthMinus8 = 0;
		gpu.check(gpu.cuvid()->cuvidGetDecoderCaps(&caps), "cuvidGetDecoderCaps");
		if (!caps.bIsSupported)
			die(std::string("NVDEC on CUDA device ") + std::to_string(o.device) + " cannot decode " +
			    codec_name(o.codec) + " (8-bit 4:2:0)");
		CUVIDPARSERPARAMS p{};
		p.CodecType = o.codec;
		p.ulMaxNumDecodeSurfaces = 1; // raised by the sequence callback
		p.ulClockRate = 1000000000; // timestamps in nanoseconds
		p.ulMaxDisplayDelay = 1;
		p.pUserData = this;
		p.pfnSequenceCallback = [](void *self, CUVIDEOFORMAT *f) {
			return static_cast<Producer *>(self)->sequence(f);
		};
		p.pfnDecodePicture = [](void *self, CUVIDPICPARAMS *pic) {
			return static_cast<Producer *>(self)->decode(pic);
		};
		p.pfnDisplayPicture = [](void *self, CUVIDPARSERDISPINFO *d) {
			return static_cast<Producer *>(self)->display(d);
		};
		gpu.check(gpu.cuvid()->cuvidCreateVideoParser(&parser_, &p), "cuvidCreateVideoParser");
	}
	~Producer()
	{
		if (parser_)
			gpu_.cuvid()->cuvidDestroyVideoParser(parser_);
		if (decoder_)
			gpu_.cuvid()->cuvidDestroyDecoder(decoder_);
	}

	// Feeds the whole file, then the end of the stream.
	void run()
	{
		std::ifstream in(o_.file, std::ios::binary);
		if (!in)
			die("cannot read " + o_.file);
		std::vector<char> chunk(1 << 16);
		while (in && !failed_) {
			in.read(chunk.data(), std::streamsize(chunk.size()));
			feed(reinterpret_cast<const unsigned char *>(chunk.data()), size_t(in.gcount()), 0);
		}
		feed(nullptr, 0, CUVID_PKT_ENDOFSTREAM);
		if (failed_)
			die(failure_);
		if (pool_) {
			if (auto r = pool_->end_of_stream(); !r)
				die(r.error().message);
		}
		(void)std::fprintf(stderr, "xmem-nvdec-producer: %llu frames of %ux%u published into pool '%s'\n",
				   static_cast<unsigned long long>(published_), width_, height_, o_.pool.c_str());
	}

private:
	void feed(const unsigned char *data, size_t size, unsigned long flags)
	{
		CUVIDSOURCEDATAPACKET packet{};
		packet.payload = data;
		packet.payload_size = static_cast<unsigned long>(size);
		packet.flags = flags;
		gpu_.check(gpu_.cuvid()->cuvidParseVideoData(parser_, &packet), "cuvidParseVideoData");
	}

	// Errors inside callbacks end the decode; run() reports them.
	int fail(const std::string &why)
	{
		failed_ = true;
		failure_ = why;
		return 0;
	}

	int sequence(CUVIDEOFORMAT *f)
	{
		if (f->chroma_format != cudaVideoChromaFormat_420 || f->bit_depth_luma_minus8 != 0)
			return fail(std::string(codec_name(o_.codec)) + " stream is not 8-bit 4:2:0");
		unsigned width = unsigned(f->display_area.right - f->display_area.left);
		unsigned height = unsigned(f->display_area.bottom - f->display_area.top);
		unsigned surfaces = std::max<unsigned>(f->min_num_decode_surfaces, 4) + 2;
		if (decoder_) {
			gpu_.cuvid()->cuvidDestroyDecoder(decoder_);
			decoder_ = nullptr;
		}
		CUVIDDECODECREATEINFO info{};
		info.ulWidth = f->coded_width;
		info.ulHeight = f->coded_height;
		info.ulNumDecodeSurfaces = surfaces;
		info.CodecType = f->codec;
		info.ChromaFormat = f->chroma_format;
		info.ulCreationFlags = cudaVideoCreate_PreferCUVID;
		info.bitDepthMinus8 = 0;
		info.display_area.left = short(f->display_area.left);
		info.display_area.top = short(f->display_area.top);
		info.display_area.right = short(f->display_area.right);
		info.display_area.bottom = short(f->display_area.bottom);
		info.OutputFormat = cudaVideoSurfaceFormat_NV12;
		info.DeinterlaceMode =
			f->progressive_sequence ? cudaVideoDeinterlaceMode_Weave : cudaVideoDeinterlaceMode_Adaptive;
		info.ulTargetWidth = width;
		info.ulTargetHeight = height;
		info.ulNumOutputSurfaces = 2;
		if (CUresult r = gpu_.cuvid()->cuvidCreateDecoder(&decoder_, &info); r != CUDA_SUCCESS)
			return fail("cuvidCreateDecoder failed (error " + std::to_string(int(r)) + ") for " +
				    std::to_string(width) + "x" + std::to_string(height));
		width_ = width;
		height_ = height;
		unsigned num = o_.fps ? o_.fps : f->frame_rate.numerator;
		unsigned den = o_.fps ? 1 : f->frame_rate.denominator;
		if (!num || !den)
			num = 30, den = 1;
		duration_ = uint64_t(1000000000ull) * den / num;
		std::string format = "video/x-raw,format=NV12,width=" + std::to_string(width) +
				     ",height=" + std::to_string(height) + ",framerate=" + std::to_string(num) + "/" +
				     std::to_string(den);
		if (!make_pool(format))
			return 0;
		return int(surfaces);
	}

	// A pool for FORMAT: the first one, or a new one when the frames outgrow the slots.
	bool make_pool(const std::string &format)
	{
		xmem::FrameMeta probe{};
		uint32_t align = pool_ ? pool_->pitch_alignment() : 512;
		auto size = xmem::set_video_layout(probe, "NV12", width_, height_, align);
		if (!size) {
			fail(size.error().message);
			return false;
		}
		if (pool_ && *size <= pool_->slot_size()) {
			if (auto r = pool_->set_format(format); !r) {
				fail(r.error().message);
				return false;
			}
			return true;
		}
		if (pool_)
			pool_->close();
		xmem::PoolConfig config;
		config.storage = xmem::Storage::cuda;
		config.device = uint32_t(o_.device);
		config.slot_count = o_.slots;
		config.slot_size = *size;
		config.format = format;
		config.producer = "xmem-nvdec-producer";
		auto pool = xmem::BufferPool::create(o_.pool, config);
		if (!pool) {
			fail(pool.error().message);
			return false;
		}
		pool_ = *pool;
		(void)std::fprintf(stderr, "xmem-nvdec-producer: pool '%s' (%s): %u device slots of %llu bytes, %s\n",
				   o_.pool.c_str(), pool_->path().c_str(), o_.slots,
				   static_cast<unsigned long long>(config.slot_size), format.c_str());
		while (pool_->stats().consumers < o_.wait)
			std::this_thread::sleep_for(std::chrono::milliseconds(5));
		return true;
	}

	int decode(CUVIDPICPARAMS *pic)
	{
		if (CUresult r = gpu_.cuvid()->cuvidDecodePicture(decoder_, pic); r != CUDA_SUCCESS)
			return fail("cuvidDecodePicture failed (error " + std::to_string(int(r)) + ")");
		return 1;
	}

	int display(CUVIDPARSERDISPINFO *d)
	{
		if (!d)
			return 1; // end of stream
		CUVIDPROCPARAMS proc{};
		proc.progressive_frame = d->progressive_frame;
		proc.top_field_first = d->top_field_first;
		proc.unpaired_field = d->repeat_first_field < 0;
		proc.output_stream = gpu_.stream();
		CUdeviceptr surface = 0;
		unsigned int pitch = 0;
		if (CUresult r = gpu_.cuvid()->cuvidMapVideoFrame(decoder_, d->picture_index, &surface, &pitch, &proc);
		    r != CUDA_SUCCESS)
			return fail("cuvidMapVideoFrame failed (error " + std::to_string(int(r)) + ")");
		bool ok = publish(surface, pitch);
		// The copy must be done before the surface goes back to the decoder.
		gpu_.cu()->cuStreamSynchronize(gpu_.stream());
		gpu_.cuvid()->cuvidUnmapVideoFrame(decoder_, surface);
		return ok ? 1 : 0;
	}

	// One device-to-device copy per plane into a slot, published on the stream.
	bool publish(CUdeviceptr surface, unsigned pitch)
	{
		auto stream = static_cast<xmem::CudaStream>(gpu_.stream());
		auto slot = pool_->acquire(std::chrono::seconds(5), stream);
		if (!slot)
			return fail(slot.error().message);
		xmem::FrameMeta &m = *slot->meta_mut().value();
		if (auto size = xmem::set_video_layout(m, "NV12", width_, height_, pool_->pitch_alignment()); !size)
			return fail(size.error().message);
		// NVDEC's NV12: the chroma plane follows the luma's (even) height.
		uint64_t chroma = surface + uint64_t(pitch) * ((height_ + 1) & ~1u);
		const uint64_t sources[2] = { surface, chroma };
		const unsigned rows[2] = { height_, (height_ + 1) / 2 };
		for (int p = 0; p < 2; p++) {
			auto r = xmem::cuda_copy_2d({ slot->device_ptr() + m.plane_offset[p], m.plane_stride[p], true },
						    { sources[p], pitch, true }, width_, rows[p], uint32_t(o_.device),
						    stream);
			if (!r)
				return fail(r.error().message);
		}
		// Frames in display order at the stream's rate; the clock time for live consumers
		// (xmemsrc is-live=true), on the monotonic clock as xmemsink publishes it.
		m.pts = published_ * duration_;
		m.dts = m.pts;
		m.duration = duration_;
		timespec now{};
		clock_gettime(CLOCK_MONOTONIC, &now);
		m.timestamp = uint64_t(now.tv_sec) * 1000000000ull + uint64_t(now.tv_nsec);
		std::strncpy(m.content_type, "video/x-raw", sizeof(m.content_type) - 1);
		if (auto r = pool_->publish(std::move(*slot), stream); !r)
			return fail(r.error().message);
		published_++;
		return true;
	}

	const Options &o_;
	Gpu &gpu_;
	CUvideoparser parser_ = nullptr;
	CUvideodecoder decoder_ = nullptr;
	std::shared_ptr<xmem::BufferPool> pool_;
	unsigned width_ = 0;
	unsigned height_ = 0;
	uint64_t duration_ = 0;
	uint64_t published_ = 0;
	bool failed_ = false;
	std::string failure_;
};

} // namespace

int main(int argc, char **argv)
{
	Options o = parse(argc, argv);
	if (!std::ifstream(o.file))
		die("cannot read " + o.file);
	Gpu gpu(o.device);
	Producer producer(o, gpu);
	producer.run();
	return 0;
}
