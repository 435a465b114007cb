// video.cpp - the plane layout of raw video frames in a slot: which planes a format
// has, and their offsets and pitches for a given row alignment.
#include "system.hpp"

#include <xmem/xmem.hpp>

#include <array>

namespace xmem {

namespace {

struct PlaneShape {
	uint32_t bytes; // per sample (a pair of U and V in a semi-planar chroma plane)
	uint32_t x_divisor; // chroma subsampling: samples = ceil(width / x_divisor)
	uint32_t y_divisor; // rows = ceil(height / y_divisor)
};

struct VideoFormat {
	std::string_view name;
	uint32_t n_planes;
	std::array<PlaneShape, XMEM_MAX_PLANES> planes;
};

constexpr VideoFormat kFormats[] = {
	{ "NV12", 2, { { { 1, 1, 1 }, { 2, 2, 2 } } } },
	{ "NV21", 2, { { { 1, 1, 1 }, { 2, 2, 2 } } } },
	{ "I420", 3, { { { 1, 1, 1 }, { 1, 2, 2 }, { 1, 2, 2 } } } },
	{ "YV12", 3, { { { 1, 1, 1 }, { 1, 2, 2 }, { 1, 2, 2 } } } },
	{ "P010_10LE", 2, { { { 2, 1, 1 }, { 4, 2, 2 } } } },
	{ "Y444", 3, { { { 1, 1, 1 }, { 1, 1, 1 }, { 1, 1, 1 } } } },
	{ "GRAY8", 1, { { { 1, 1, 1 } } } },
	{ "RGB", 1, { { { 3, 1, 1 } } } },
	{ "BGR", 1, { { { 3, 1, 1 } } } },
	{ "RGBA", 1, { { { 4, 1, 1 } } } },
	{ "BGRA", 1, { { { 4, 1, 1 } } } },
	{ "RGBx", 1, { { { 4, 1, 1 } } } },
	{ "BGRx", 1, { { { 4, 1, 1 } } } },
};

const VideoFormat *find_format(std::string_view name)
{
	for (const VideoFormat &candidate : kFormats)
		if (candidate.name == name)
			return &candidate;
	return nullptr;
}

} // namespace

Result<VideoPlane> video_plane(std::string_view format, uint32_t plane)
{
	const VideoFormat *f = find_format(format);
	if (!f)
		return make_error(Errc::invalid_argument, "video layout: unknown format '" + std::string(format) + "'");
	if (plane >= f->n_planes)
		return make_error(Errc::invalid_argument, "video layout: " + std::string(format) + " has " +
								  std::to_string(f->n_planes) + " planes, not " +
								  std::to_string(plane + 1));
	const PlaneShape &shape = f->planes[plane];
	return VideoPlane{ f->n_planes, shape.bytes, shape.x_divisor, shape.y_divisor };
}

Result<uint64_t> set_video_layout(FrameMeta &meta, std::string_view format, uint32_t width, uint32_t height,
				  uint32_t alignment)
{
	if (width == 0 || height == 0)
		return make_error(Errc::invalid_argument,
				  "video layout: empty frame " + std::to_string(width) + "x" + std::to_string(height));
	if (alignment == 0 || (alignment & (alignment - 1)) != 0)
		return make_error(Errc::invalid_argument,
				  "video layout: alignment " + std::to_string(alignment) + " is not a power of two");
	const VideoFormat *f = find_format(format);
	if (!f)
		return make_error(Errc::invalid_argument, "video layout: unknown format '" + std::string(format) + "'");
	auto align = [&](uint64_t v) {
		return (v + alignment - 1) / alignment * alignment;
	};
	uint64_t offset = 0;
	meta.n_planes = f->n_planes;
	for (uint32_t p = 0; p < XMEM_MAX_PLANES; p++) {
		meta.plane_offset[p] = 0;
		meta.plane_stride[p] = 0;
	}
	for (uint32_t p = 0; p < f->n_planes; p++) {
		const PlaneShape &shape = f->planes[p];
		uint64_t samples = (uint64_t{ width } + shape.x_divisor - 1) / shape.x_divisor;
		uint64_t row = samples * shape.bytes;
		uint64_t pitch = align(row);
		if (pitch > UINT32_MAX)
			return make_error(Errc::out_of_range,
					  "video layout: rows of " + std::to_string(pitch) + " bytes");
		uint64_t rows = (uint64_t{ height } + shape.y_divisor - 1) / shape.y_divisor;
		meta.plane_offset[p] = offset;
		meta.plane_stride[p] = uint32_t(pitch);
		// Sizes near 2^64 must fail, not wrap to a small payload that "fits" a slot.
		uint64_t bytes = 0;
		if (__builtin_mul_overflow(pitch, rows, &bytes) || __builtin_add_overflow(offset, bytes, &offset) ||
		    offset > UINT64_MAX - alignment)
			return make_error(Errc::out_of_range,
					  "video layout: a " + std::to_string(width) + "x" + std::to_string(height) +
						  " " + std::string(format) + " frame is larger than 2^64 bytes");
		offset = align(offset);
	}
	meta.size = offset;
	return offset;
}

} // namespace xmem
