// frame_check.cpp - the layout rules of frame metadata (frame_check.hpp).
#include "frame_check.hpp"

#include <climits>
#include <string>

namespace xmem {

namespace {

Error layout_error(const FrameMeta &m, const std::string &what)
{
	// Unpublished frames (the owner's check at publish) have no sequence number yet.
	std::string frame = m.seq ? "frame " + std::to_string(m.seq) + " in slot " : "the frame in slot ";
	return { Errc::bad_frame, frame + std::to_string(m.index) + ": its layout does not fit the slot: " + what };
}

// Where the tensor ends and how many bytes its elements are, counted apart (an element
// of a broadcast or overlapping view counts each time a reader visits it): false when
// either leaves what numpy and DLPack hold (int64), even beside a dimension of 0.
bool tensor_extent(const FrameMeta &m, uint64_t item, uint64_t *end, uint64_t *bytes)
{
	constexpr uint64_t kMax = INT64_MAX;
	uint64_t at = item, count = item;
	bool empty = false;
	for (uint32_t d = 0; d < m.ndim; d++) {
		if (m.shape[d] > kMax || m.strides[d] > kMax)
			return false;
		if (m.shape[d] == 0) {
			empty = true;
			continue;
		}
		uint64_t step;
		if (__builtin_mul_overflow(m.shape[d] - 1, m.strides[d], &step) ||
		    __builtin_add_overflow(at, step, &at) || __builtin_mul_overflow(count, m.shape[d], &count))
			return false;
	}
	if (at > kMax || count > kMax)
		return false;
	*end = empty ? 0 : at;
	*bytes = empty ? 0 : count;
	return true;
}

} // namespace

uint32_t dtype_size(uint32_t dtype)
{
	switch (dtype) {
	case XMEM_DTYPE_U8:
	case XMEM_DTYPE_I8:
		return 1;
	case XMEM_DTYPE_U16:
	case XMEM_DTYPE_I16:
	case XMEM_DTYPE_F16:
	case XMEM_DTYPE_BF16:
		return 2;
	case XMEM_DTYPE_U32:
	case XMEM_DTYPE_I32:
	case XMEM_DTYPE_F32:
		return 4;
	case XMEM_DTYPE_U64:
	case XMEM_DTYPE_I64:
	case XMEM_DTYPE_F64:
		return 8;
	default:
		return 0;
	}
}

Result<void> check_frame_layout(const FrameMeta &m, uint64_t capacity)
{
	if (m.size > capacity)
		return layout_error(m, "size " + std::to_string(m.size) + " > slot size " + std::to_string(capacity));
	uint32_t item = dtype_size(m.dtype);
	if (item == 0)
		return layout_error(m, "dtype " + std::to_string(m.dtype) + " is not an xmem_dtype");
	if (m.ndim > XMEM_MAX_DIMS)
		return layout_error(m, "ndim " + std::to_string(m.ndim) + " > " + std::to_string(XMEM_MAX_DIMS));
	if (m.ndim > 0) {
		uint64_t end, bytes;
		if (!tensor_extent(m, item, &end, &bytes))
			return layout_error(m, "its shape and strides overflow int64");
		if (end > m.size)
			return layout_error(m, "its shape and strides reach byte " + std::to_string(end) + " of a " +
						       std::to_string(m.size) + "-byte payload");
		// A view that visits more bytes than the payload has shares them (a stride of 0,
		// overlapping dimensions): a reader of every element could loop for ever.
		if (bytes > m.size)
			return layout_error(m, "its shape has " + std::to_string(bytes) + " bytes of elements in a " +
						       std::to_string(m.size) +
						       "-byte payload (a broadcast or overlap)");
	}
	if (m.n_planes > XMEM_MAX_PLANES)
		return layout_error(m,
				    "n_planes " + std::to_string(m.n_planes) + " > " + std::to_string(XMEM_MAX_PLANES));
	for (uint32_t p = 0; p < m.n_planes; p++) {
		if (m.plane_offset[p] >= m.size)
			return layout_error(m, "plane " + std::to_string(p) + " starts at byte " +
						       std::to_string(m.plane_offset[p]) + " of a " +
						       std::to_string(m.size) + "-byte payload");
		if (m.plane_stride[p] > uint32_t(INT32_MAX))
			return layout_error(m, "plane " + std::to_string(p) + "'s stride " +
						       std::to_string(m.plane_stride[p]) + " > " +
						       std::to_string(INT32_MAX));
	}
	return {};
}

} // namespace xmem
