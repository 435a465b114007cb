// c_api_buffer.cpp - xmem.h's calls on a buffer handle: its metadata, bytes, tensor
// layout, side data, references and copies, and the CUDA helpers beside them.
#include "c_api.hpp"

#include "frame_check.hpp"

#include <algorithm>
#include <cstring>

using namespace xmem::capi;

namespace {

// The tensor layout xmem_buffer_set_tensor() writes into META, all checked before any
// of it is: a layout the consumers' check (check_frame_layout) would refuse never
// leaves here, and neither does a stride DLPack cannot count in elements.
xmem::Result<void> set_tensor(xmem_frame_meta &meta, uint64_t capacity, uint32_t dtype, uint32_t ndim,
			      const uint64_t *shape, const uint64_t *strides)
{
	auto error = [](xmem::Errc code, const std::string &what) {
		return xmem::Error{ code, "xmem_buffer_set_tensor: " + what };
	};
	uint64_t item = xmem::dtype_size(dtype);
	if (item == 0)
		return error(xmem::Errc::invalid_argument, "dtype " + std::to_string(dtype) + " is not an xmem_dtype");
	if (ndim > XMEM_MAX_DIMS)
		return error(xmem::Errc::invalid_argument,
			     "ndim " + std::to_string(ndim) + " > " + std::to_string(XMEM_MAX_DIMS));
	xmem_frame_meta m = meta;
	m.dtype = uint8_t(dtype);
	m.ndim = uint8_t(ndim);
	std::fill(std::begin(m.shape), std::end(m.shape), 0);
	std::fill(std::begin(m.strides), std::end(m.strides), 0);
	uint64_t contiguous = item; // the next dimension out's stride, C order
	bool overflow = false;
	for (uint32_t d = ndim; d-- > 0;) {
		m.shape[d] = shape[d];
		if (strides && strides[d] % item != 0)
			return error(xmem::Errc::invalid_argument, "stride " + std::to_string(strides[d]) +
									   " of dimension " + std::to_string(d) +
									   " is not a multiple of the element size (" +
									   std::to_string(item) + " bytes)");
		m.strides[d] = strides ? strides[d] : contiguous;
		overflow |= __builtin_mul_overflow(contiguous, shape[d], &contiguous);
	}
	if (ndim == 0) {
		meta = m;
		return {};
	}
	// Where the last element ends; 0 for a tensor without elements.
	uint64_t end = item;
	for (uint32_t d = 0; d < ndim && end != 0; d++) {
		uint64_t step = 0;
		if (m.shape[d] == 0)
			end = 0;
		else
			overflow |= __builtin_mul_overflow(m.shape[d] - 1, m.strides[d], &step) ||
				    __builtin_add_overflow(end, step, &end);
	}
	if (overflow || end > uint64_t(INT64_MAX))
		return error(xmem::Errc::out_of_range, "the tensor spans more bytes than int64 counts");
	if (end > capacity)
		return error(xmem::Errc::out_of_range, "the tensor spans " + std::to_string(end) +
							       " bytes; the buffer holds " + std::to_string(capacity));
	m.size = end;
	if (auto fits = xmem::check_frame_layout(m, capacity); !fits)
		return error(xmem::Errc::invalid_argument, fits.error().message);
	meta = m;
	return {};
}

} // namespace

extern "C" {

const xmem_frame_meta *xmem_buffer_meta(const xmem_buffer *b)
{
	return b ? &b->guard.meta() : nullptr;
}

uint32_t xmem_buffer_meta_index(const xmem_buffer *b)
{
	return b ? b->guard.meta_index() : XMEM_NO_META_INDEX;
}

int xmem_buffer_forget(xmem_buffer *b)
{
	if (!b)
		return fail(XMEM_EINVAL, "xmem_buffer_forget: null argument");
	return guarded([&] {
		auto forgotten = b->guard.forget();
		if (forgotten)
			delete b;
		return status(forgotten);
	});
}

xmem_frame_meta *xmem_buffer_meta_mut(xmem_buffer *b)
{
	if (!b)
		return nullptr;
	auto r = b->guard.meta_mut();
	return r ? r.value() : nullptr;
}

const void *xmem_buffer_data(const xmem_buffer *b)
{
	return b ? b->guard.data().data() : nullptr;
}

void *xmem_buffer_data_mut(xmem_buffer *b)
{
	if (!b)
		return nullptr;
	auto r = b->guard.data_mut();
	return r ? r.value().data() : nullptr;
}

int xmem_buffer_set_tensor(xmem_buffer *b, uint32_t dtype, uint32_t ndim, const uint64_t *shape,
			   const uint64_t *strides)
{
	if (!b || (ndim > 0 && !shape))
		return fail(XMEM_EINVAL, "xmem_buffer_set_tensor: NULL buffer, or NULL shape with dimensions");
	return guarded([&] {
		auto meta = b->guard.meta_mut();
		if (!meta)
			return fail(meta.error());
		return status(set_tensor(**meta, b->guard.capacity(), dtype, ndim, shape, strides));
	});
}

uint64_t xmem_buffer_capacity(const xmem_buffer *b)
{
	return b ? b->guard.capacity() : 0;
}
const char *xmem_buffer_format(const xmem_buffer *b)
{
	return b ? b->guard.format().c_str() : "";
}
int xmem_buffer_set_side_data(xmem_buffer *b, const void *data, size_t size)
{
	if (!b || (!data && size > 0))
		return fail(XMEM_EINVAL, "xmem_buffer_set_side_data: NULL buffer, or NULL data with a size");
	return guarded([&] { return status(b->guard.set_side_data({ static_cast<const std::byte *>(data), size })); });
}

const void *xmem_buffer_side_data(const xmem_buffer *b, size_t *size)
{
	std::span<const std::byte> side;
	if (b)
		side = b->guard.side_data();
	if (size)
		*size = side.size();
	return side.empty() ? nullptr : side.data();
}

int xmem_buffer_is_writable(const xmem_buffer *b)
{
	return b && b->guard.writable();
}
int xmem_buffer_try_make_writable(xmem_buffer *b)
{
	if (!b)
		return 0;
	// A lock that fails to take (never, in practice) leaves the buffer read-only.
	return guarded([&] { return int(b->guard.try_make_writable()); }) == 1 ? 1 : 0;
}
int xmem_buffer_is_copy(const xmem_buffer *b)
{
	return b && b->guard.is_copy();
}
int xmem_buffer_spilled(const xmem_buffer *b)
{
	return b && b->guard.spilled();
}

int xmem_buffer_clone(const xmem_buffer *b, xmem_buffer **out)
{
	if (!b || !out)
		return fail(XMEM_EINVAL, "xmem_buffer_clone: null argument");
	return guarded([&] { return put_buffer(b->guard.clone_ref(), out); });
}

void xmem_buffer_release(xmem_buffer *b)
{
	delete b;
}

int xmem_buffer_release_on_stream(xmem_buffer *b, void *cuda_stream)
{
	if (!b)
		return fail(XMEM_EINVAL, "xmem_buffer_release_on_stream: null argument");
	// The handle goes in all cases: on error the guard is already empty.
	std::unique_ptr<xmem_buffer> owned(b);
	return guarded([&] { return status(owned->guard.release(cuda_stream)); });
}

uint32_t xmem_buffer_storage(const xmem_buffer *b)
{
	return b ? uint32_t(b->guard.storage()) : uint32_t(XMEM_STORAGE_SYSTEM);
}
uint32_t xmem_buffer_device(const xmem_buffer *b)
{
	return b ? b->guard.device() : 0;
}
uint64_t xmem_buffer_device_ptr(const xmem_buffer *b)
{
	return b ? b->guard.device_ptr() : 0;
}
int xmem_buffer_is_incomplete(const xmem_buffer *b)
{
	return b && b->guard.incomplete() ? 1 : 0;
}

int xmem_buffer_private_copy(const xmem_buffer *b, uint32_t storage, uint32_t device, void *cuda_stream,
			     xmem_buffer **out)
{
	if (!b || !out)
		return fail(XMEM_EINVAL, "xmem_buffer_private_copy: null argument");
	if (storage == XMEM_STORAGE_SYSTEM)
		return guarded([&] { return put_buffer(b->guard.private_copy_to_cpu(cuda_stream), out); });
	if (storage == XMEM_STORAGE_CUDA)
		return guarded([&] { return put_buffer(b->guard.private_copy_to_cuda(device, cuda_stream), out); });
	return fail(XMEM_EINVAL, "xmem_buffer_private_copy: an unknown storage (XMEM_STORAGE_SYSTEM or "
				 "XMEM_STORAGE_CUDA)");
}

int xmem_buffer_copy_to_cpu(const xmem_buffer *b, void *cuda_stream, xmem_buffer **out)
{
	if (!b || !out)
		return fail(XMEM_EINVAL, "xmem_buffer_copy_to_cpu: null argument");
	return guarded([&] { return put_buffer(b->guard.copy_to_cpu(cuda_stream), out); });
}

int xmem_buffer_copy_to_cuda(const xmem_buffer *b, uint32_t device, void *cuda_stream, xmem_buffer **out)
{
	if (!b || !out)
		return fail(XMEM_EINVAL, "xmem_buffer_copy_to_cuda: null argument");
	return guarded([&] { return put_buffer(b->guard.copy_to_cuda(device, cuda_stream), out); });
}

int xmem_buffer_copy_to_device(const xmem_buffer *b, uint32_t device, void *cuda_stream, xmem_buffer **out)
{
	if (!b || !out)
		return fail(XMEM_EINVAL, "xmem_buffer_copy_to_device: null argument");
	return guarded([&] { return put_buffer(b->guard.copy_to_device(device, cuda_stream), out); });
}

int xmem_cuda_copy_2d(uint64_t dst, uint64_t dst_pitch, int dst_device, uint64_t src, uint64_t src_pitch,
		      int src_device, uint64_t width_bytes, uint64_t height, uint32_t device, void *cuda_stream)
{
	return guarded([&] {
		return status(xmem::cuda_copy_2d({ dst, dst_pitch, dst_device != 0 },
						 { src, src_pitch, src_device != 0 }, width_bytes, height, device,
						 cuda_stream));
	});
}

int xmem_cuda_stream_done(uint32_t device, void *cuda_stream)
{
	return guarded([&] {
		auto done = xmem::cuda_stream_done(device, cuda_stream);
		return done ? int(*done) : fail(done.error());
	});
}

int xmem_cuda_synchronize(uint32_t device, void *cuda_stream)
{
	return guarded([&] { return status(xmem::cuda_synchronize(device, cuda_stream)); });
}

} // extern "C"
