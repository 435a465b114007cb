// stream.cpp - streams and events of the CUDA driver simulator: one worker thread per
// stream, running copies, memsets, 64-bit stream memory operations and event records late,
// in order, at execution time.
//
// Each operation starts after a random delay, and resolves its addresses only when it
// executes, so a missing wait shows up as stale or torn data and freed or unmapped memory
// as an illegal access, as on a real device.

#include "cudasim.hpp"

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>

namespace cudasim {

namespace {

uint64_t mix(uint64_t x)
{
	// splitmix64: per-stream seeds that differ even for adjacent ids.
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

void worker_main(std::shared_ptr<Stream> stream, uint64_t delay_us, uint64_t seed)
{
	executing_context = stream->ctx; // a worker serves one stream of one context
	std::mt19937_64 random(seed);
	std::uniform_int_distribution<uint64_t> delay(0, delay_us);

	for (;;) {
		Op op;
		{
			std::unique_lock<std::mutex> guard(stream->lock);
			stream->cv.wait(guard, [&] { return !stream->queue.empty() || stream->closing; });
			if (stream->queue.empty())
				break;
			op = std::move(stream->queue.front());
			stream->queue.pop_front();
		}

		if (delay_us)
			std::this_thread::sleep_for(std::chrono::microseconds(delay(random)));
		// A context with a sticky error executes nothing more, as a faulted device, but
		// host callbacks still run to hear of the error.
		if (!stream->abandoned.load(std::memory_order_acquire) &&
		    (op.runs_after_fault || !stream->ctx->sticky.load(std::memory_order_acquire)))
			op.run(*stream);
		op = Op(); // drop what the operation holds before it counts as complete

		{
			std::lock_guard<std::mutex> guard(stream->lock);
			stream->completed++;
		}
		stream->cv.notify_all();
	}
	verbose("stream %" PRIu64 " worker exits", stream->id);
}

// Creates a stream of ctx and starts its worker. Caller holds State::lock.
std::shared_ptr<Stream> start_stream(State &s, Context *ctx)
{
	auto stream = std::make_shared<Stream>();
	stream->id = s.next_stream_id++;
	// Handles are never reused, so a destroyed stream's handle stays invalid.
	stream->handle = reinterpret_cast<CUstream>(uintptr_t(0x5000000) + stream->id * 0x10);
	stream->ctx = ctx;
	stream->device = ctx->device;

	// Detached: the process may exit with a worker blocked in a wait.
	std::thread(worker_main, stream, s.config.delay_us, mix(s.config.seed ^ stream->id)).detach();

	std::erase_if(ctx->streams, [](const std::weak_ptr<Stream> &w) { return w.expired(); });
	ctx->streams.push_back(stream);
	return stream;
}

bool is_default_stream(CUstream handle)
{
	return handle == nullptr || handle == CU_STREAM_LEGACY || handle == CU_STREAM_PER_THREAD;
}

// The stream a call names, in the calling thread's context ctx. The default stream (0,
// CU_STREAM_LEGACY, CU_STREAM_PER_THREAD) is one asynchronous stream per context.
CUresult find_stream(const char *call, Context *ctx, CUstream handle, std::shared_ptr<Stream> &out)
{
	State &s = *state();
	std::lock_guard<std::mutex> guard(s.lock);
	if (is_default_stream(handle)) {
		if (!ctx->default_stream)
			ctx->default_stream = start_stream(s, ctx);
		out = ctx->default_stream;
		return CUDA_SUCCESS;
	}
	auto it = s.streams.find(handle);
	if (it == s.streams.end())
		return fail(CUDA_ERROR_INVALID_HANDLE, call, "unknown stream %p", static_cast<void *>(handle));
	out = it->second;
	return CUDA_SUCCESS;
}

// Queues an operation; returns its ticket, the completed count once it has executed.
uint64_t enqueue(Stream &stream, const char *name, std::function<void(Stream &)> run, bool runs_after_fault = false)
{
	uint64_t ticket;
	{
		std::lock_guard<std::mutex> guard(stream.lock);
		stream.queue.push_back(Op{ name, std::move(run), runs_after_fault });
		ticket = ++stream.enqueued;
	}
	stream.cv.notify_all();
	return ticket;
}

// Waits until the operation with this ticket, and so every one before it, has executed.
void wait_for(Stream &stream, uint64_t ticket)
{
	std::unique_lock<std::mutex> guard(stream.lock);
	stream.cv.wait(guard, [&] { return stream.completed >= ticket; });
}

// Waits until everything enqueued on stream before this call has executed.
void wait_idle(Stream &stream)
{
	uint64_t ticket;
	{
		std::lock_guard<std::mutex> guard(stream.lock);
		ticket = stream.enqueued;
	}
	wait_for(stream, ticket);
}

void copy_segments(const Segments &dst, const Segments &src)
{
	size_t di = 0, doff = 0, si = 0, soff = 0;
	while (di < dst.size() && si < src.size()) {
		size_t n = std::min(dst[di].size - doff, src[si].size - soff);
		std::memmove(dst[di].data + doff, src[si].data + soff, n);
		doff += n;
		soff += n;
		if (doff == dst[di].size) {
			di++;
			doff = 0;
		}
		if (soff == src[si].size) {
			si++;
			soff = 0;
		}
	}
}

// One side of a copy: where its first byte is, and how to look the address up.
struct Endpoint {
	Space space = Space::device;
	uintptr_t addr = 0;
	size_t pitch = 0;
};

void run_copy(Stream &stream, const char *name, Endpoint dst, Endpoint src, size_t width, size_t height)
{
	State &s = *state();
	Segments to, from;
	Fault fault;

	// Most copies are one contiguous piece on each side: look each span up once.
	size_t dst_span = (height - 1) * dst.pitch + width;
	size_t src_span = (height - 1) * src.pitch + width;
	bool whole;
	{
		std::lock_guard<std::mutex> guard(s.lock);
		whole = resolve(s, dst.space, dst.addr, dst_span, stream.device, Access::write, to, fault) &&
			resolve(s, src.space, src.addr, src_span, stream.device, Access::read, from, fault) &&
			to.size() == 1 && from.size() == 1;
	}
	if (whole) {
		for (size_t y = 0; y < height; y++)
			std::memmove(to[0].data + y * dst.pitch, from[0].data + y * src.pitch, width);
		return;
	}

	// Rows that straddle mappings, or a gap between rows: only the bytes a row touches
	// must resolve.
	for (size_t y = 0; y < height; y++) {
		bool ok;
		{
			std::lock_guard<std::mutex> guard(s.lock);
			ok = resolve(s, dst.space, dst.addr + y * dst.pitch, width, stream.device, Access::write, to,
				     fault) &&
			     resolve(s, src.space, src.addr + y * src.pitch, width, stream.device, Access::read, from,
				     fault);
		}
		if (!ok) {
			raise_illegal(stream, name, fault);
			return;
		}
		copy_segments(to, from);
	}
}

void run_memset(Stream &stream, const char *name, uintptr_t dst, uint32_t value, size_t unit, size_t count)
{
	State &s = *state();
	Segments to;
	Fault fault;
	bool ok;
	{
		std::lock_guard<std::mutex> guard(s.lock);
		ok = resolve(s, Space::device, dst, unit * count, stream.device, Access::write, to, fault);
	}
	if (!ok) {
		raise_illegal(stream, name, fault);
		return;
	}

	unsigned char pattern[4];
	std::memcpy(pattern, &value, sizeof(pattern));
	size_t phase = 0; // byte index into the unit, carried across segments
	for (const Segment &seg : to) {
		if (unit == 1) {
			std::memset(seg.data, pattern[0], seg.size);
			continue;
		}
		size_t i = 0;
		for (; i < seg.size && phase != 0; i++, phase = (phase + 1) % unit)
			seg.data[i] = char(pattern[phase]);
		for (; i + unit <= seg.size; i += unit)
			std::memcpy(seg.data + i, pattern, unit);
		for (; i < seg.size; i++, phase = (phase + 1) % unit)
			seg.data[i] = char(pattern[phase]);
	}
}

// Looks up the 64-bit word a memory operation uses. Caller holds State::lock.
uint64_t *memop_word(State &s, Stream &stream, uintptr_t addr, Access access, Fault &fault)
{
	Segments word;
	if (!resolve(s, Space::device, addr, sizeof(uint64_t), stream.device, access, word, fault))
		return nullptr;
	if (word.size() != 1) {
		fault = { addr, "a word that straddles two mappings" };
		return nullptr;
	}
	// The Backing outlives this call: a mapping or registration holds it while the
	// caller keeps State::lock.
	return reinterpret_cast<uint64_t *>(word[0].data);
}

bool wait_satisfied(unsigned condition, uint64_t word, uint64_t value)
{
	switch (condition) {
	case CU_STREAM_WAIT_VALUE_GEQ:
		return int64_t(word - value) >= 0;
	case CU_STREAM_WAIT_VALUE_EQ:
		return word == value;
	case CU_STREAM_WAIT_VALUE_AND:
		return (word & value) != 0;
	case CU_STREAM_WAIT_VALUE_NOR:
		return ~(word | value) != 0;
	default:
		return false;
	}
}

// Blocks the stream until the word satisfies the condition. The word may be host
// shared memory another process writes, so it is polled, re-resolved each time (an
// unregistered or unmapped word faults) and read under State::lock (a concurrent
// unregister cannot pull it away mid-read).
void run_wait(Stream &stream, const char *name, uintptr_t addr, uint64_t value, unsigned condition)
{
	State &s = *state();
	for (unsigned polls = 0;; polls++) {
		if (stream.abandoned.load(std::memory_order_acquire) ||
		    stream.ctx->sticky.load(std::memory_order_acquire))
			return;

		Fault fault;
		uint64_t word = 0;
		bool ok;
		{
			std::lock_guard<std::mutex> guard(s.lock);
			uint64_t *p = memop_word(s, stream, addr, Access::read, fault);
			ok = p != nullptr;
			if (ok)
				word = std::atomic_ref<uint64_t>(*p).load(std::memory_order_acquire);
		}
		if (!ok) {
			raise_illegal(stream, name, fault);
			return;
		}
		if (wait_satisfied(condition, word, value))
			return;

		if (polls < 100)
			std::this_thread::yield();
		else
			std::this_thread::sleep_for(std::chrono::microseconds(polls < 2000 ? 20 : 200));
	}
}

void run_write(Stream &stream, const char *name, uintptr_t addr, uint64_t value, unsigned flags)
{
	State &s = *state();
	Fault fault;
	bool ok;
	{
		std::lock_guard<std::mutex> guard(s.lock);
		uint64_t *p = memop_word(s, stream, addr, Access::write, fault);
		ok = p != nullptr;
		// Earlier operations of the stream ran on this thread before: a release store
		// publishes them to whoever acquires the word.
		if (ok)
			std::atomic_ref<uint64_t>(*p).store(value, flags == CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER
									   ? std::memory_order_relaxed
									   : std::memory_order_release);
	}
	if (!ok)
		raise_illegal(stream, name, fault);
}

// The checks every call on a stream starts with: a usable context and a known stream.
CUresult stream_call(const char *call, CUstream handle, std::shared_ptr<Stream> &stream)
{
	Context *ctx = nullptr;
	if (CUresult r = current_context(call, &ctx))
		return r;
	return find_stream(call, ctx, handle, stream);
}

// The checks every enqueueing call starts with: those of stream_call, and that the
// stream's own context is current. The real driver is not always this strict; here, code
// that pushes the wrong context around a caller's stream fails at once, on every call.
CUresult enqueue_call(const char *call, CUstream handle, std::shared_ptr<Stream> &stream)
{
	Context *ctx = nullptr;
	if (CUresult r = current_context(call, &ctx))
		return r;
	if (CUresult r = find_stream(call, ctx, handle, stream))
		return r;
	if (stream->ctx != ctx) {
		// Always said: the caller's code, not its data, is wrong.
		std::fprintf(stderr, "cudasim: %s: stream %" PRIu64 " belongs to %s, current is %s\n", call, stream->id,
			     describe(*stream->ctx).c_str(), describe(*ctx).c_str());
		return CUDA_ERROR_INVALID_CONTEXT;
	}
	return CUDA_SUCCESS;
}

CUresult memop_call(const char *call, CUstream handle, CUdeviceptr addr, std::shared_ptr<Stream> &stream)
{
	if (CUresult r = enqueue_call(call, handle, stream))
		return r;
	if (state()->config.fail.no_memops)
		return fail(CUDA_ERROR_NOT_SUPPORTED, call, "XMEM_CUDASIM_FAIL=no_memops");
	if (addr == 0 || addr % sizeof(uint64_t))
		return fail(CUDA_ERROR_INVALID_VALUE, call, "address 0x%llx is not 8-byte aligned", addr);
	return CUDA_SUCCESS;
}

// A copy of bytes bytes enqueued on the stream; ticket is 0 when there is nothing to copy.
CUresult linear_copy(const char *call, Endpoint dst, Endpoint src, size_t bytes, CUstream handle,
		     std::shared_ptr<Stream> &stream, uint64_t &ticket)
{
	ticket = 0;
	if (CUresult r = enqueue_call(call, handle, stream))
		return r;
	if (bytes == 0)
		return CUDA_SUCCESS;
	if (!dst.addr || !src.addr)
		return fail(CUDA_ERROR_INVALID_VALUE, call, "null address");
	dst.pitch = src.pitch = bytes;
	ticket = enqueue(*stream, call, [=](Stream &st) { run_copy(st, call, dst, src, bytes, 1); });
	return CUDA_SUCCESS;
}

CUresult async_copy(const char *call, Endpoint dst, Endpoint src, size_t bytes, CUstream handle)
{
	std::shared_ptr<Stream> stream;
	uint64_t ticket;
	return linear_copy(call, dst, src, bytes, handle, stream, ticket);
}

// Waits for the copy with this ticket on the stream a synchronous copy used (none when 0),
// and reports a fault it, or earlier work, caused.
CUresult finish_synchronous(const char *call, Stream &stream, uint64_t ticket)
{
	if (ticket)
		wait_for(stream, ticket);
	if (stream.ctx->sticky.load(std::memory_order_acquire))
		return fail(CUDA_ERROR_ILLEGAL_ADDRESS, call, "sticky error of device %d", stream.device);
	return CUDA_SUCCESS;
}

// cuMemcpy and its HtoD, DtoH and DtoD forms: on the context's default stream, so after the
// work queued there. They return when the copy has executed, except between two device
// addresses, where cuda.h's "API synchronization behavior" promises no host-side
// synchronization: those return at once, and a caller that reads too early sees old bytes.
CUresult synchronous_copy(const char *call, Endpoint dst, Endpoint src, size_t bytes)
{
	if (dst.space == Space::unified || src.space == Space::unified) {
		// Resolved now, for the choice only; the copy looks its addresses up as it runs.
		State &s = *state();
		std::lock_guard<std::mutex> guard(s.lock);
		for (Endpoint *e : { &dst, &src }) {
			if (e->space == Space::unified)
				e->space = in_device_space(s, e->addr, bytes ? bytes : 1) ? Space::device : Space::host;
		}
	}
	std::shared_ptr<Stream> stream;
	uint64_t ticket;
	if (CUresult r = linear_copy(call, dst, src, bytes, nullptr, stream, ticket))
		return r;
	if (dst.space == Space::device && src.space == Space::device)
		ticket = 0;
	return finish_synchronous(call, *stream, ticket);
}

CUresult memset_call(const char *call, CUdeviceptr dst, uint32_t value, size_t unit, size_t count, CUstream handle)
{
	std::shared_ptr<Stream> stream;
	if (CUresult r = enqueue_call(call, handle, stream))
		return r;
	if (count == 0)
		return CUDA_SUCCESS;
	if (!dst || dst % unit)
		return fail(CUDA_ERROR_INVALID_VALUE, call, "address 0x%llx is not %zu-byte aligned", dst, unit);
	size_t bytes;
	if (__builtin_mul_overflow(count, unit, &bytes))
		return CUDA_ERROR_INVALID_VALUE;
	enqueue(*stream, call, [=](Stream &st) { run_memset(st, call, uintptr_t(dst), value, unit, count); });
	return CUDA_SUCCESS;
}

// One side of a cuMemcpy2DAsync, checked at enqueue time.
CUresult plane(const char *call, const char *side, CUmemorytype type, const void *host, CUdeviceptr device, size_t x,
	       size_t y, size_t pitch, size_t width, size_t height, Endpoint &out)
{
	switch (type) {
	case CU_MEMORYTYPE_HOST:
		out.space = Space::host;
		out.addr = reinterpret_cast<uintptr_t>(host);
		break;
	case CU_MEMORYTYPE_DEVICE:
		out.space = Space::device;
		out.addr = uintptr_t(device);
		break;
	case CU_MEMORYTYPE_UNIFIED:
		out.space = Space::unified;
		out.addr = uintptr_t(device);
		break;
	case CU_MEMORYTYPE_ARRAY:
		return fail(CUDA_ERROR_NOT_SUPPORTED, call, "%s: CUDA arrays are not simulated", side);
	default:
		return fail(CUDA_ERROR_INVALID_VALUE, call, "%s: memory type %d", side, int(type));
	}
	if (!out.addr)
		return fail(CUDA_ERROR_INVALID_VALUE, call, "%s: null address", side);
	if (pitch > 2147483647u)
		return fail(CUDA_ERROR_INVALID_VALUE, call, "%s: pitch %zu exceeds CU_DEVICE_ATTRIBUTE_MAX_PITCH", side,
			    pitch);
	if (x > pitch || width > pitch - x)
		return fail(CUDA_ERROR_INVALID_VALUE, call, "%s: X %zu + WidthInBytes %zu exceed pitch %zu", side, x,
			    width, pitch);
	size_t offset, span;
	if (__builtin_mul_overflow(y, pitch, &offset) || __builtin_add_overflow(offset, x, &offset) ||
	    __builtin_mul_overflow(height - 1, pitch, &span) || __builtin_add_overflow(span, width, &span) ||
	    __builtin_add_overflow(out.addr, offset, &out.addr) || out.addr + span < out.addr)
		return fail(CUDA_ERROR_INVALID_VALUE, call, "%s: the copy wraps around the address space", side);
	out.pitch = pitch;
	return CUDA_SUCCESS;
}

// A 2D copy checked at enqueue time, ready for run_copy.
struct Copy2D {
	Endpoint dst, src;
	size_t width = 0, height = 0;
};

// cuMemcpy2D and cuMemcpy2DAsync: enqueues the copy on the stream; ticket is 0 when there
// is nothing to copy.
CUresult copy_2d(const char *call, const CUDA_MEMCPY2D *pCopy, CUstream handle, std::shared_ptr<Stream> &stream,
		 uint64_t &ticket)
{
	ticket = 0;
	if (CUresult r = enqueue_call(call, handle, stream))
		return r;
	if (!pCopy)
		return CUDA_ERROR_INVALID_VALUE;
	const CUDA_MEMCPY2D &c = *pCopy;
	if (c.WidthInBytes == 0 || c.Height == 0)
		return CUDA_SUCCESS;
	Copy2D copy;
	if (CUresult r = plane(call, "source", c.srcMemoryType, c.srcHost, c.srcDevice, c.srcXInBytes, c.srcY,
			       c.srcPitch, c.WidthInBytes, c.Height, copy.src))
		return r;
	if (CUresult r = plane(call, "destination", c.dstMemoryType, c.dstHost, c.dstDevice, c.dstXInBytes, c.dstY,
			       c.dstPitch, c.WidthInBytes, c.Height, copy.dst))
		return r;
	copy.width = c.WidthInBytes;
	copy.height = c.Height;
	ticket = enqueue(*stream, call,
			 [=](Stream &st) { run_copy(st, call, copy.dst, copy.src, copy.width, copy.height); });
	return CUDA_SUCCESS;
}

// The event a handle names. Caller holds State::lock.
Event *find_event(State &s, CUevent handle)
{
	auto it = s.events.find(handle);
	return it == s.events.end() ? nullptr : &it->second;
}

} // namespace

void abandon_streams(State &s, Context &ctx)
{
	auto close = [](Stream &stream) {
		stream.abandoned.store(true, std::memory_order_release);
		{
			std::lock_guard<std::mutex> guard(stream.lock);
			stream.closing = true;
		}
		stream.cv.notify_all();
	};

	for (auto it = s.streams.begin(); it != s.streams.end();) {
		if (it->second->ctx == &ctx)
			it = s.streams.erase(it);
		else
			++it;
	}
	for (const auto &weak : ctx.streams) {
		if (auto stream = weak.lock())
			close(*stream);
	}
	ctx.streams.clear();
	ctx.default_stream.reset();
	std::erase_if(s.events, [&](const auto &entry) { return entry.second.ctx == &ctx; });
}

void synchronize_context(State &s, Context &ctx)
{
	std::vector<std::shared_ptr<Stream>> streams;
	{
		std::lock_guard<std::mutex> guard(s.lock);
		for (const auto &weak : ctx.streams) {
			if (auto stream = weak.lock())
				streams.push_back(std::move(stream));
		}
	}
	for (const auto &stream : streams)
		wait_idle(*stream);
}

void raise_illegal(Stream &stream, const char *op, const Fault &fault)
{
	if (stream.abandoned.load(std::memory_order_acquire))
		return;
	Context &ctx = *stream.ctx;
	// The line is out before any call can return the sticky error.
	if (!ctx.reported.exchange(true, std::memory_order_acq_rel))
		std::fprintf(stderr,
			     "cudasim: illegal address: %s on stream %p (device %d) touched 0x%" PRIxPTR
			     ": %s; every call on this context now fails with CUDA_ERROR_ILLEGAL_ADDRESS\n",
			     op, static_cast<void *>(stream.handle), stream.device, fault.address, fault.why.c_str());
	ctx.sticky.store(true, std::memory_order_release);
}

} // namespace cudasim

using namespace cudasim;

CUresult CUDAAPI cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
	return guarded([&] {
		const char *call = "cuStreamCreate";
		Context *ctx = nullptr;
		if (CUresult r = current_context(call, &ctx))
			return r;
		if (!phStream || (Flags != CU_STREAM_DEFAULT && Flags != CU_STREAM_NON_BLOCKING))
			return fail(CUDA_ERROR_INVALID_VALUE, call, "null phStream or flags 0x%x", Flags);
		State &s = *state();
		std::lock_guard<std::mutex> guard(s.lock);
		auto stream = start_stream(s, ctx);
		s.streams[stream->handle] = stream;
		*phStream = stream->handle;
		return CUDA_SUCCESS;
	});
}

CUresult CUDAAPI cuStreamDestroy(CUstream hStream)
{
	return guarded([&] {
		const char *call = "cuStreamDestroy";
		Context *ctx = nullptr;
		if (CUresult r = current_context(call, &ctx))
			return r;
		if (is_default_stream(hStream))
			return fail(CUDA_ERROR_INVALID_HANDLE, call, "the default stream cannot be destroyed");
		State &s = *state();
		std::shared_ptr<Stream> stream;
		{
			std::lock_guard<std::mutex> guard(s.lock);
			auto it = s.streams.find(hStream);
			if (it == s.streams.end())
				return fail(CUDA_ERROR_INVALID_HANDLE, call, "unknown stream %p",
					    static_cast<void *>(hStream));
			stream = std::move(it->second);
			s.streams.erase(it);
		}
		// Returns at once; the worker finishes what is queued, then exits.
		{
			std::lock_guard<std::mutex> guard(stream->lock);
			stream->closing = true;
		}
		stream->cv.notify_all();
		return CUDA_SUCCESS;
	});
}

CUresult CUDAAPI cuStreamDestroy_v1(CUstream hStream)
{
	return cuStreamDestroy(hStream);
}

CUresult CUDAAPI cuStreamSynchronize(CUstream hStream)
{
	return guarded([&] {
		const char *call = "cuStreamSynchronize";
		std::shared_ptr<Stream> stream;
		if (CUresult r = stream_call(call, hStream, stream))
			return r;
		wait_idle(*stream);
		if (stream->ctx->sticky.load(std::memory_order_acquire))
			return fail(CUDA_ERROR_ILLEGAL_ADDRESS, call, "sticky error of device %d", stream->device);
		return CUDA_SUCCESS;
	});
}

CUresult CUDAAPI cuStreamQuery(CUstream hStream)
{
	return guarded([&] {
		std::shared_ptr<Stream> stream;
		if (CUresult r = stream_call("cuStreamQuery", hStream, stream))
			return r;
		std::lock_guard<std::mutex> guard(stream->lock);
		return stream->completed < stream->enqueued ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
	});
}

CUresult CUDAAPI cuStreamAddCallback(CUstream hStream, CUstreamCallback callback, void *userData, unsigned int flags)
{
	return guarded([&] {
		const char *call = "cuStreamAddCallback";
		std::shared_ptr<Stream> stream;
		if (CUresult r = enqueue_call(call, hStream, stream))
			return r;
		if (!callback || flags)
			return fail(CUDA_ERROR_INVALID_VALUE, call, "null callback or flags 0x%x", flags);
		// Runs on the stream's worker, after earlier work and before later work, which
		// waits for it. After an illegal access it still runs, and is told so.
		enqueue(
			*stream, call,
			[=](Stream &st) {
				bool faulted = st.ctx->sticky.load(std::memory_order_acquire);
				callback(hStream, faulted ? CUDA_ERROR_ILLEGAL_ADDRESS : CUDA_SUCCESS, userData);
			},
			true);
		return CUDA_SUCCESS;
	});
}

CUresult CUDAAPI cuStreamWaitValue64(CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags)
{
	return guarded([&] {
		const char *call = "cuStreamWaitValue64";
		std::shared_ptr<Stream> st;
		if (CUresult r = memop_call(call, stream, addr, st))
			return r;
		if (CUresult r = check_wait_flags(call, flags))
			return r;
		unsigned condition = flags & ~unsigned(CU_STREAM_WAIT_VALUE_FLUSH);
		enqueue(*st, call, [=](Stream &s) { run_wait(s, call, uintptr_t(addr), value, condition); });
		return CUDA_SUCCESS;
	});
}

CUresult CUDAAPI cuStreamWriteValue64(CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags)
{
	return guarded([&] {
		const char *call = "cuStreamWriteValue64";
		std::shared_ptr<Stream> st;
		if (CUresult r = memop_call(call, stream, addr, st))
			return r;
		if (CUresult r = check_write_flags(call, flags))
			return r;
		enqueue(*st, call, [=](Stream &s) { run_write(s, call, uintptr_t(addr), value, flags); });
		return CUDA_SUCCESS;
	});
}

CUresult CUDAAPI cuMemcpyHtoDAsync(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream)
{
	return guarded([&] {
		return async_copy("cuMemcpyHtoDAsync", { Space::device, uintptr_t(dstDevice) },
				  { Space::host, reinterpret_cast<uintptr_t>(srcHost) }, ByteCount, hStream);
	});
}

CUresult CUDAAPI cuMemcpyDtoHAsync(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream)
{
	return guarded([&] {
		return async_copy("cuMemcpyDtoHAsync", { Space::host, reinterpret_cast<uintptr_t>(dstHost) },
				  { Space::device, uintptr_t(srcDevice) }, ByteCount, hStream);
	});
}

CUresult CUDAAPI cuMemcpyDtoDAsync(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream)
{
	return guarded([&] {
		return async_copy("cuMemcpyDtoDAsync", { Space::device, uintptr_t(dstDevice) },
				  { Space::device, uintptr_t(srcDevice) }, ByteCount, hStream);
	});
}

CUresult CUDAAPI cuMemcpy2DAsync(const CUDA_MEMCPY2D *pCopy, CUstream hStream)
{
	return guarded([&] {
		std::shared_ptr<Stream> stream;
		uint64_t ticket;
		return copy_2d("cuMemcpy2DAsync", pCopy, hStream, stream, ticket);
	});
}

CUresult CUDAAPI cuMemcpy2D(const CUDA_MEMCPY2D *pCopy)
{
	return guarded([&] {
		const char *call = "cuMemcpy2D";
		// On the context's default stream, so after the work queued there, as the legacy
		// stream orders it; then wait for it.
		std::shared_ptr<Stream> stream;
		uint64_t ticket;
		if (CUresult r = copy_2d(call, pCopy, nullptr, stream, ticket))
			return r;
		return finish_synchronous(call, *stream, ticket);
	});
}

CUresult CUDAAPI cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream)
{
	return guarded([&] {
		// Unified addressing: each side is looked up, device or host, as the copy runs.
		return async_copy("cuMemcpyAsync", { Space::unified, uintptr_t(dst) },
				  { Space::unified, uintptr_t(src) }, ByteCount, hStream);
	});
}

CUresult CUDAAPI cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount)
{
	return guarded([&] {
		return synchronous_copy("cuMemcpy", { Space::unified, uintptr_t(dst) },
					{ Space::unified, uintptr_t(src) }, ByteCount);
	});
}

CUresult CUDAAPI cuMemcpyHtoD(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
	return guarded([&] {
		return synchronous_copy("cuMemcpyHtoD", { Space::device, uintptr_t(dstDevice) },
					{ Space::host, reinterpret_cast<uintptr_t>(srcHost) }, ByteCount);
	});
}

CUresult CUDAAPI cuMemcpyDtoH(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
	return guarded([&] {
		return synchronous_copy("cuMemcpyDtoH", { Space::host, reinterpret_cast<uintptr_t>(dstHost) },
					{ Space::device, uintptr_t(srcDevice) }, ByteCount);
	});
}

CUresult CUDAAPI cuMemcpyDtoD(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount)
{
	return guarded([&] {
		return synchronous_copy("cuMemcpyDtoD", { Space::device, uintptr_t(dstDevice) },
					{ Space::device, uintptr_t(srcDevice) }, ByteCount);
	});
}

CUresult CUDAAPI cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream)
{
	return guarded([&] { return memset_call("cuMemsetD8Async", dstDevice, uc, 1, N, hStream); });
}

CUresult CUDAAPI cuMemsetD32Async(CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream)
{
	return guarded([&] { return memset_call("cuMemsetD32Async", dstDevice, ui, 4, N, hStream); });
}

CUresult CUDAAPI cuStreamGetCtx(CUstream hStream, CUcontext *pctx)
{
	return guarded([&] {
		const char *call = "cuStreamGetCtx";
		if (!pctx)
			return CUDA_ERROR_INVALID_VALUE;
		if (is_default_stream(hStream)) {
			// The special streams are the current context's.
			Context *ctx = nullptr;
			if (CUresult r = current_context(call, &ctx))
				return r;
			*pctx = reinterpret_cast<CUcontext>(ctx);
			return CUDA_SUCCESS;
		}
		// A named stream knows its context: no current context is needed.
		State *s = state();
		if (!s)
			return fail(CUDA_ERROR_NOT_INITIALIZED, call, "cuInit has not succeeded");
		std::lock_guard<std::mutex> guard(s->lock);
		auto it = s->streams.find(hStream);
		if (it == s->streams.end())
			return fail(CUDA_ERROR_INVALID_HANDLE, call, "unknown stream %p", static_cast<void *>(hStream));
		Context *ctx = it->second->ctx;
		if (ctx->sticky.load(std::memory_order_acquire))
			return fail(CUDA_ERROR_ILLEGAL_ADDRESS, call, "sticky error of device %d", ctx->device);
		*pctx = reinterpret_cast<CUcontext>(ctx);
		return CUDA_SUCCESS;
	});
}

CUresult CUDAAPI cuEventCreate(CUevent *phEvent, unsigned int Flags)
{
	return guarded([&] {
		const char *call = "cuEventCreate";
		Context *ctx = nullptr;
		if (CUresult r = current_context(call, &ctx))
			return r;
		constexpr unsigned known = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
		if (!phEvent || (Flags & ~known))
			return fail(CUDA_ERROR_INVALID_VALUE, call, "null phEvent or flags 0x%x", Flags);
		if (Flags & CU_EVENT_INTERPROCESS)
			return fail(CUDA_ERROR_NOT_SUPPORTED, call, "CU_EVENT_INTERPROCESS is not simulated");
		State &s = *state();
		std::lock_guard<std::mutex> guard(s.lock);
		// Handles are never reused, so a destroyed event's handle stays invalid.
		auto handle = reinterpret_cast<CUevent>(uintptr_t(0x6000000) + s.next_event_id++ * 0x10);
		s.events[handle] = Event{ ctx, Flags, nullptr, 0 };
		*phEvent = handle;
		return CUDA_SUCCESS;
	});
}

CUresult CUDAAPI cuEventRecord(CUevent hEvent, CUstream hStream)
{
	return guarded([&] {
		const char *call = "cuEventRecord";
		std::shared_ptr<Stream> stream;
		if (CUresult r = enqueue_call(call, hStream, stream))
			return r;
		State &s = *state();
		std::lock_guard<std::mutex> guard(s.lock);
		Event *event = find_event(s, hEvent);
		if (!event)
			return fail(CUDA_ERROR_INVALID_HANDLE, call, "unknown event %p", static_cast<void *>(hEvent));
		if (event->ctx != stream->ctx) {
			std::fprintf(stderr, "cudasim: %s: event %p belongs to %s, stream %" PRIu64 " to %s\n", call,
				     static_cast<void *>(hEvent), describe(*event->ctx).c_str(), stream->id,
				     describe(*stream->ctx).c_str());
			return CUDA_ERROR_INVALID_HANDLE;
		}
		// A marker in the stream: the event completes when the worker gets past it.
		event->ticket = enqueue(*stream, call, [](Stream &) {});
		event->stream = std::move(stream);
		return CUDA_SUCCESS;
	});
}

namespace {

// The stream and ticket an event waits for; false when the handle is unknown.
bool event_target(CUevent handle, std::shared_ptr<Stream> &stream, uint64_t &ticket)
{
	State &s = *state();
	std::lock_guard<std::mutex> guard(s.lock);
	Event *event = find_event(s, handle);
	if (!event)
		return false;
	stream = event->stream;
	ticket = event->ticket;
	return true;
}

} // namespace

CUresult CUDAAPI cuEventQuery(CUevent hEvent)
{
	return guarded([&] {
		const char *call = "cuEventQuery";
		if (!state())
			return fail(CUDA_ERROR_NOT_INITIALIZED, call, "cuInit has not succeeded");
		std::shared_ptr<Stream> stream;
		uint64_t ticket = 0;
		if (!event_target(hEvent, stream, ticket))
			return fail(CUDA_ERROR_INVALID_HANDLE, call, "unknown event %p", static_cast<void *>(hEvent));
		if (!stream)
			return CUDA_SUCCESS; // never recorded
		if (stream->ctx->sticky.load(std::memory_order_acquire))
			return fail(CUDA_ERROR_ILLEGAL_ADDRESS, call, "sticky error of device %d", stream->device);
		std::lock_guard<std::mutex> guard(stream->lock);
		return stream->completed < ticket ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
	});
}

CUresult CUDAAPI cuEventSynchronize(CUevent hEvent)
{
	return guarded([&] {
		const char *call = "cuEventSynchronize";
		if (!state())
			return fail(CUDA_ERROR_NOT_INITIALIZED, call, "cuInit has not succeeded");
		std::shared_ptr<Stream> stream;
		uint64_t ticket = 0;
		if (!event_target(hEvent, stream, ticket))
			return fail(CUDA_ERROR_INVALID_HANDLE, call, "unknown event %p", static_cast<void *>(hEvent));
		if (!stream)
			return CUDA_SUCCESS;
		wait_for(*stream, ticket);
		if (stream->ctx->sticky.load(std::memory_order_acquire))
			return fail(CUDA_ERROR_ILLEGAL_ADDRESS, call, "sticky error of device %d", stream->device);
		return CUDA_SUCCESS;
	});
}

CUresult CUDAAPI cuEventDestroy(CUevent hEvent)
{
	return guarded([&] {
		const char *call = "cuEventDestroy";
		State *s = state();
		if (!s)
			return fail(CUDA_ERROR_NOT_INITIALIZED, call, "cuInit has not succeeded");
		// Returns at once, even when the last record has not completed.
		std::lock_guard<std::mutex> guard(s->lock);
		if (!s->events.erase(hEvent))
			return fail(CUDA_ERROR_INVALID_HANDLE, call, "unknown event %p", static_cast<void *>(hEvent));
		return CUDA_SUCCESS;
	});
}
