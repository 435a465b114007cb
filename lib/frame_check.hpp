// frame_check.hpp - what a frame's metadata may say about its layout. Another process
// wrote it (the producer, or any peer that maps the control segment), so every reader
// checks its own copy before a size, shape, stride or plane reaches code that reads
// pixels; the owner checks its own frames at publish with the same rules.
#pragma once

#include <xmem/xmem.hpp>

#include <cstdint>

namespace xmem {

// Bytes of one element of DTYPE (an xmem_dtype); 0 for a value that is none.
uint32_t dtype_size(uint32_t dtype);

// Whether META's layout stays within a slot of CAPACITY bytes: the payload size within
// the slot; the dtype known; the tensor (ndim, shape, strides) within the payload, in
// int64 (numpy's and DLPack's), with no more bytes of elements than the payload has
// (no broadcast or overlapping view, whose reader could loop for ever); each plane
// starting within the payload, with a row stride a signed 32-bit int holds (what
// GStreamer's GstVideoMeta and every reader take). How many rows a plane has depends on
// the format, which the library does not interpret: a reader that knows the format
// checks the planes' ends (xmemsrc against its caps, Python's planes()). The error is
// Errc::bad_frame and says which field is off, by how much.
Result<void> check_frame_layout(const FrameMeta &meta, uint64_t capacity);

} // namespace xmem
