// format.cpp - fuzzes the format strings xmem parses: set_video_layout() (and the C
// API's), a pool's set_format() and the format's trip through shared memory to a
// consumer, and socket_path()'s pool names. Input: width, height, alignment (u32
// each), a selector byte, then the string.
#include "fuzz.hpp"

#include <xmem/snapshot.hpp>
#include <xmem/xmem.h>

#include <memory>

using namespace std::chrono_literals;
using xmem::fuzz::Input;

namespace {

struct Pools {
	std::shared_ptr<xmem::BufferPool> owner;
	std::shared_ptr<xmem::BufferPool> consumer;
};

// One owner and one attached consumer for the whole run.
Pools &pools()
{
	static Pools p = [] {
		Pools made;
		std::string name = xmem::fuzz::scratch_dir() + "/format";
		xmem::PoolConfig config;
		config.slot_count = 2;
		config.slot_size = 64;
		config.max_consumers = 1;
		auto owner = xmem::BufferPool::create(name, config);
		if (!owner)
			xmem::fuzz::fail("creating the pool", owner.error().message);
		xmem::OpenOptions options;
		options.queue_size = 2;
		auto consumer = xmem::BufferPool::open(name, options);
		if (!consumer)
			xmem::fuzz::fail("attaching to the pool", consumer.error().message);
		made.owner = std::move(owner.value());
		made.consumer = std::move(consumer.value());
		return made;
	}();
	return p;
}

void check_layout(const xmem::FrameMeta &meta, uint64_t size, uint32_t width, uint32_t height, uint32_t alignment)
{
	XMEM_FUZZ_CHECK(meta.n_planes >= 1 && meta.n_planes <= XMEM_MAX_PLANES, std::to_string(meta.n_planes));
	XMEM_FUZZ_CHECK(meta.size == size, "");
	uint64_t end = 0;
	for (uint32_t p = 0; p < meta.n_planes; p++) {
		// Every plane has at least one byte per two pixels and one row per two lines,
		// starts after the one before it, and both are aligned.
		uint64_t min_pitch = (uint64_t{ width } + 1) / 2;
		uint64_t min_rows = (uint64_t{ height } + 1) / 2;
		std::string where = "plane " + std::to_string(p) + " of " + std::to_string(width) + "x" +
				    std::to_string(height) + " align " + std::to_string(alignment);
		XMEM_FUZZ_CHECK(meta.plane_offset[p] >= end, where);
		XMEM_FUZZ_CHECK(meta.plane_offset[p] % alignment == 0, where);
		XMEM_FUZZ_CHECK(meta.plane_stride[p] % alignment == 0, where);
		XMEM_FUZZ_CHECK(meta.plane_stride[p] >= min_pitch, where);
		uint64_t plane_bytes = 0, plane_end = 0;
		bool overflow = __builtin_mul_overflow(uint64_t{ meta.plane_stride[p] }, min_rows, &plane_bytes) ||
				__builtin_add_overflow(meta.plane_offset[p], plane_bytes, &plane_end);
		XMEM_FUZZ_CHECK(!overflow && plane_end <= size,
				where + ": the plane ends past the payload size " + std::to_string(size));
		end = plane_end;
	}
	for (uint32_t p = meta.n_planes; p < XMEM_MAX_PLANES; p++)
		XMEM_FUZZ_CHECK(meta.plane_offset[p] == 0 && meta.plane_stride[p] == 0, "unused plane set");
}

void fuzz_video_layout(uint32_t width, uint32_t height, uint32_t alignment, std::string_view format)
{
	xmem::FrameMeta meta{};
	auto size = xmem::set_video_layout(meta, format, width, height, alignment);
	if (size)
		check_layout(meta, *size, width, height, alignment);

	// The C API on the same string (up to its first NUL, as C sees it).
	std::string c_string(format.substr(0, format.find('\0')));
	xmem_frame_meta c_meta{};
	int status = xmem_set_video_layout(&c_meta, c_string.c_str(), width, height, alignment);
	bool same_string = c_string.size() == format.size();
	if (same_string) {
		XMEM_FUZZ_CHECK((status == XMEM_OK) == size.ok(), c_string);
		if (status == XMEM_OK)
			XMEM_FUZZ_CHECK(std::memcmp(&c_meta, &meta, sizeof(meta)) == 0, c_string);
	}
}

void fuzz_pool_name(std::string_view name)
{
	auto path = xmem::socket_path(name);
	if (!path)
		return;
	XMEM_FUZZ_CHECK(!path->empty() && path->find('\0') == std::string::npos, *path);
	if (xmem::is_abstract(name)) {
		// "@NAME": the abstract socket NAME, as given (no file, no directory).
		XMEM_FUZZ_CHECK(*path == name && name.size() > 1, *path);
	} else if (name.find('/') == std::string_view::npos) {
		XMEM_FUZZ_CHECK(*path == xmem::default_directory() + "/" + std::string(name), *path);
		XMEM_FUZZ_CHECK(name[0] != '.', *path);
	} else {
		XMEM_FUZZ_CHECK(*path == name, *path);
	}
}

// The owner's set_format(), then a frame carrying it to the consumer: what the
// consumer reads back from the slot is what was set, whatever the bytes.
void fuzz_pool_format(std::string_view format, bool publish)
{
	Pools &p = pools();
	auto set = p.owner->set_format(format);
	bool acceptable = format.size() < XMEM_FORMAT_MAX && format.find('\0') == std::string_view::npos;
	XMEM_FUZZ_CHECK(set.ok() == acceptable, set.ok() ? "accepted" : set.error().message);
	if (!set)
		return;
	XMEM_FUZZ_CHECK(p.owner->format() == format, "owner's format differs");
	auto view = xmem::snapshot(*p.owner);
	XMEM_FUZZ_CHECK(view.ok() && view->format && view->format->text == format, "snapshot's format differs");
	if (!publish)
		return;
	auto frame = p.owner->acquire(1s);
	XMEM_FUZZ_CHECK(frame.ok(), frame.ok() ? "" : frame.error().message);
	auto published = p.owner->publish(std::move(frame.value()));
	XMEM_FUZZ_CHECK(published.ok(), published.ok() ? "" : published.error().message);
	auto got = p.consumer->receive(10s);
	XMEM_FUZZ_CHECK(got.ok(), got.ok() ? "" : got.error().message);
	XMEM_FUZZ_CHECK(got->format() == format, "consumer's frame format differs");
	XMEM_FUZZ_CHECK(p.consumer->format() == format, "consumer's pool format differs");
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	Input in(data, size);
	uint32_t width = in.take<uint32_t>();
	uint32_t height = in.take<uint32_t>();
	uint32_t alignment = in.take<uint32_t>();
	uint8_t select = in.take<uint8_t>();
	auto rest = in.rest();
	std::string_view text(reinterpret_cast<const char *>(rest.data()), rest.size());

	fuzz_video_layout(width, height, alignment, text);
	fuzz_pool_name(text);
	if (select & 1)
		fuzz_pool_format(text, select & 2);
	return 0;
}

std::vector<std::vector<uint8_t>> fuzz_seeds()
{
	// Every format set_video_layout() knows, as GStreamer names it in caps, at sizes
	// and alignments the library's own callers use.
	struct Case {
		const char *format;
		uint32_t width, height, alignment;
	};
	const Case cases[] = {
		{ "NV12", 1920, 1080, 256 }, { "I420", 640, 480, 1 },  { "P010_10LE", 3840, 2160, 512 },
		{ "Y444", 17, 9, 4 },	     { "RGBA", 320, 240, 64 }, { "BGRx", 2, 2, 1 },
		{ "GRAY8", 1, 1, 1 },	     { "YV12", 33, 17, 32 },   { "NV21", 720, 576, 16 },
		{ "RGB", 31, 7, 1 },	     { "BGR", 5, 3, 8 },       { "RGBx", 8, 8, 8 },
		{ "BGRA", 1280, 720, 128 },
	};
	std::vector<std::vector<uint8_t>> seeds;
	for (const Case &c : cases) {
		xmem::FrameMeta meta{};
		if (!xmem::set_video_layout(meta, c.format, c.width, c.height, c.alignment))
			xmem::fuzz::fail("seed layout", c.format);
		// Formats as xmemsink sets them on its pool: caps strings.
		std::string caps = std::string("video/x-raw, format=(string)") + c.format + ", width=(int)" +
				   std::to_string(c.width) + ", height=(int)" + std::to_string(c.height) +
				   ", framerate=(fraction)30/1";
		xmem::fuzz::Output plain, pool;
		plain.put(c.width).put(c.height).put(c.alignment).put(uint8_t(0));
		plain.put_bytes(std::as_bytes(std::span(c.format, std::strlen(c.format))));
		seeds.push_back(plain.take());
		pool.put(c.width).put(c.height).put(c.alignment).put(uint8_t(3));
		pool.put_bytes(std::as_bytes(std::span(caps.data(), caps.size())));
		seeds.push_back(pool.take());
	}
	// Pool names, as socket_path() takes them.
	for (const char *name : { "camera0", "/run/user/1000/xmem/cam.front", "a-b_c.d" }) {
		xmem::fuzz::Output out;
		out.put(uint32_t(1)).put(uint32_t(1)).put(uint32_t(1)).put(uint8_t(0));
		out.put_bytes(std::as_bytes(std::span(name, std::strlen(name))));
		seeds.push_back(out.take());
	}
	return seeds;
}
