// stream.cpp - streams and events of the CUDA driver simulator: one worker thread per
// stream, running copies, memsets, 64-bit stream memory operations and event records late,
// in order, at execution time, with the legacy default stream's implicit synchronization.
//
// Each operation starts after a random delay, and resolves its addresses only when it
// executes, so a missing wait shows up as stale or torn data and freed or unmapped memory
// as an illegal access, as on a real device.

#include "cudasim.hpp"

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
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

// Holds an operation of stream until other has completed ticket: the legacy stream's
// implicit synchronization. Both are streams of one context, so abandoning it wakes this.
void wait_for_other(const Stream &stream, Stream &other, uint64_t ticket)
{
	std::unique_lock<std::mutex> guard(other.lock);
	other.cv.wait(guard, [&] {
		return other.completed >= ticket || other.abandoned.load(std::memory_order_acquire) ||
		       stream.abandoned.load(std::memory_order_acquire);
	});
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

		for (const auto &[other, ticket] : op.after)
			wait_for_other(*stream, *other, ticket);
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
std::shared_ptr<Stream> start_stream(State &s, Context *ctx, bool blocking, bool legacy = false)
{
	auto stream = std::make_shared<Stream>();
	stream->id = s.next_stream_id++;
	// Handles are never reused, so a destroyed stream's handle stays invalid. Above
	// 2^32, as the real driver's (pointers): a caller that passes one through 32 bits
	// (a ctypes call without argtypes did, found on an H200) fails here too.
	stream->handle = reinterpret_cast<CUstream>(uintptr_t(0x7e5000000000) + stream->id * 0x10);
	stream->ctx = ctx;
	stream->device = ctx->device;
	stream->blocking = blocking;
	stream->legacy = legacy;

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

// The per-thread default streams this thread made. When it exits they close: the work
// queued on them still runs, and a later thread that gets the same id gets a new stream.
struct ThreadStreams {
	std::vector<std::weak_ptr<Stream>> streams;
	~ThreadStreams()
	{
		for (const auto &weak : streams) {
			if (auto stream = weak.lock()) {
				{
					std::lock_guard<std::mutex> guard(stream->lock);
					stream->closing = true;
				}
				stream->cv.notify_all();
			}
		}
	}
};
thread_local ThreadStreams thread_streams;

bool is_closing(Stream &stream)
{
	std::lock_guard<std::mutex> guard(stream.lock);
	return stream.closing;
}

// A stream handle cuStreamDestroy destroyed, named again: in the real driver a handle is a
// pointer to the stream's object, freed by then, so the call is undefined behaviour (its
// contexts' dangling handles crash the next call: H200, driver 580.159.04). The simulator
// stops the process, naming the call, rather than answer CUDA_ERROR_INVALID_HANDLE, an
// answer the driver does not promise. Caller holds State::lock.
void check_not_destroyed(const State &s, const char *call, CUstream handle)
{
	if (!s.destroyed_streams.count(handle))
		return;
	std::fprintf(stderr, "cudasim: %s(%p): the stream was destroyed; its handle dangles in the real driver\n", call,
		     static_cast<void *>(handle));
	std::abort();
}

// The stream a call names, in the calling thread's context ctx: 0 and CU_STREAM_LEGACY
// are the context's legacy stream, CU_STREAM_PER_THREAD this thread's own blocking stream
// of the context.
CUresult find_stream(const char *call, Context *ctx, CUstream handle, std::shared_ptr<Stream> &out)
{
	State &s = *state();
	std::lock_guard<std::mutex> guard(s.lock);
	if (handle == CU_STREAM_PER_THREAD) {
		std::shared_ptr<Stream> &mine = ctx->per_thread[std::this_thread::get_id()];
		if (!mine || is_closing(*mine)) {
			mine = start_stream(s, ctx, true);
			thread_streams.streams.push_back(mine);
		}
		out = mine;
		return CUDA_SUCCESS;
	}
	if (is_default_stream(handle)) {
		if (!ctx->legacy_stream)
			ctx->legacy_stream = start_stream(s, ctx, true, true);
		out = ctx->legacy_stream;
		return CUDA_SUCCESS;
	}
	auto it = s.streams.find(handle);
	if (it == s.streams.end()) {
		check_not_destroyed(s, call, handle);
		return fail(CUDA_ERROR_INVALID_HANDLE, call, "unknown stream %p", static_cast<void *>(handle));
	}
	out = it->second;
	return CUDA_SUCCESS;
}

// The ticket of the last operation queued on stream when it has not executed yet, else 0.
uint64_t pending(Stream &stream)
{
	std::lock_guard<std::mutex> guard(stream.lock);
	return stream.completed < stream.enqueued ? stream.enqueued : 0;
}

// Queues an operation; returns its ticket, the completed count once it has executed. An
// operation on the legacy stream starts after the work queued so far on every blocking
// stream of its context; one on a blocking stream after the work queued so far on the
// legacy stream. Those tickets are taken now, under State::lock, which the caller holds:
// each names work queued before this operation, so the waits never form a cycle.
uint64_t enqueue_locked(State &, Stream &stream, const char *name, std::function<void(Stream &)> run,
			bool runs_after_fault = false,
			std::vector<std::pair<std::shared_ptr<Stream>, uint64_t>> after = {})
{
	Op op{ name, std::move(run), runs_after_fault, std::move(after) };
	Context &ctx = *stream.ctx;
	if (stream.legacy) {
		for (const auto &weak : ctx.streams) {
			auto other = weak.lock();
			if (!other || other.get() == &stream || !other->blocking)
				continue;
			if (uint64_t ticket = pending(*other))
				op.after.emplace_back(std::move(other), ticket);
		}
	} else if (stream.blocking && ctx.legacy_stream) {
		if (uint64_t ticket = pending(*ctx.legacy_stream))
			op.after.emplace_back(ctx.legacy_stream, ticket);
	}

	uint64_t ticket;
	{
		std::lock_guard<std::mutex> guard(stream.lock);
		stream.queue.push_back(std::move(op));
		ticket = ++stream.enqueued;
	}
	stream.cv.notify_all();
	return ticket;
}

uint64_t enqueue(Stream &stream, const char *name, std::function<void(Stream &)> run, bool runs_after_fault = false)
{
	State &s = *state();
	std::lock_guard<std::mutex> guard(s.lock);
	return enqueue_locked(s, stream, name, std::move(run), runs_after_fault);
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

// Copies height rows; false after an illegal access.
bool run_copy(Stream &stream, const char *name, Endpoint dst, Endpoint src, size_t width, size_t height)
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
		return true;
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
			return false;
		}
		copy_segments(to, from);
	}
	return true;
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

// Waits for the operation with this ticket on the stream a call used (none when 0), and
// reports a fault it, or earlier work, caused.
CUresult finish_synchronous(const char *call, Stream &stream, uint64_t ticket)
{
	if (ticket)
		wait_for(stream, ticket);
	if (stream.ctx->sticky.load(std::memory_order_acquire))
		return fail(CUDA_ERROR_ILLEGAL_ADDRESS, call, "sticky error of device %d", stream.device);
	return CUDA_SUCCESS;
}

unsigned portable_flags(const HostRegistration &reg)
{
	return reg.flags;
}

unsigned portable_flags(const HostAllocation &)
{
	return 0; // cuMemAllocHost: no flags, so not portable
}

// The first entry of MAP that covers POS, as pinned memory for CTX: how many bytes from
// POS on (0: none). Memory registered or allocated without PORTABLE is page-locked for
// the context that made it only; to any other it is pageable (cuMemHostRegister,
// cuMemHostAlloc).
template<typename Map>
uintptr_t pinned_for(const Map &map, uintptr_t pos, const Context *ctx)
{
	auto it = map.upper_bound(pos);
	if (it == map.begin())
		return 0;
	--it;
	if (pos - it->first >= it->second.size)
		return 0;
	if (it->second.owner != ctx && !(portable_flags(it->second) & CU_MEMHOSTREGISTER_PORTABLE))
		return 0;
	return it->first + it->second.size - pos;
}

// Whether every byte of [addr, addr + size) is page-locked for CTX: cuMemAllocHost memory
// or a cuMemHostRegister range, its own or PORTABLE. Caller holds State::lock.
bool page_locked(const State &s, uintptr_t addr, size_t size, const Context *ctx)
{
	for (uintptr_t pos = addr, end = addr + size; pos < end;) {
		uintptr_t n = pinned_for(s.host_allocations, pos, ctx);
		if (!n)
			n = pinned_for(s.host_registrations, pos, ctx);
		if (!n)
			return false;
		pos += std::min(n, end - pos);
	}
	return true;
}

// One side of a copy as the call sees it: host memory (unified addresses looked up now),
// and then whether any byte of it is pageable.
struct Side {
	bool host = false;
	bool pageable = false;
};

Side side_of(const State &s, const Endpoint &e, size_t width, size_t height, const Context *ctx)
{
	size_t span = (height - 1) * e.pitch + width;
	Side side;
	side.host = e.space == Space::host || (e.space == Space::unified && !in_device_space(s, e.addr, span));
	side.pageable = side.host && !page_locked(s, e.addr, span, ctx);
	return side;
}

// Queues a copy of height rows of width bytes on the stream and returns as cuda.h's "API
// synchronization behavior" says for its sides; synchronous is true for cuMemcpy,
// cuMemcpyHtoD, cuMemcpyDtoH, cuMemcpyDtoD and cuMemcpy2D, false for the Async calls.
// - Device to device: no host-side synchronization, either way.
// - Device to host: an Async call into page-locked memory returns at once; into pageable
//   memory, or from a synchronous call, once the copy has executed.
// - Host to device: an Async call from page-locked memory returns at once; a synchronous
//   one once the copy has executed. From pageable memory either returns once the stream
//   has run its earlier work and the source has been read into a staging buffer, whose
//   bytes reach the device later, as a DMA the driver has not finished.
// - Host to host: once the copy has executed.
// So a pageable copy behind a stream that waits blocks the calling thread, as it does on
// a GPU, and page-locked memory is what makes a copy asynchronous.
CUresult submit_copy(const char *call, Stream &stream, Endpoint dst, Endpoint src, size_t width, size_t height,
		     bool synchronous)
{
	State &s = *state();
	uint64_t wait = 0;
	// Set when a pageable source was read into the staging buffer without a fault.
	std::shared_ptr<std::atomic<bool>> staged;
	{
		std::lock_guard<std::mutex> guard(s.lock);
		Side to = side_of(s, dst, width, height, stream.ctx);
		Side from = side_of(s, src, width, height, stream.ctx);
		if (from.pageable && !to.host) {
			size_t bytes;
			if (__builtin_mul_overflow(width, height, &bytes))
				return fail(CUDA_ERROR_INVALID_VALUE, call, "%zu rows of %zu bytes", height, width);
			std::shared_ptr<char[]> staging(new char[bytes]);
			Endpoint buffer{ Space::host, reinterpret_cast<uintptr_t>(staging.get()), width };
			staged = std::make_shared<std::atomic<bool>>(false);
			// Both operations keep the buffer.
			wait = enqueue_locked(s, stream, call, [=, keep = staging](Stream &st) {
				if (run_copy(st, call, buffer, src, width, height))
					staged->store(true, std::memory_order_release);
			});
			enqueue_locked(s, stream, call, [=, keep = staging](Stream &st) {
				run_copy(st, call, dst, buffer, width, height);
			});
		} else {
			uint64_t ticket = enqueue_locked(
				s, stream, call, [=](Stream &st) { run_copy(st, call, dst, src, width, height); });
			bool device_to_device = !to.host && !from.host;
			if ((synchronous && !device_to_device) || (to.host && from.host) || to.pageable)
				wait = ticket;
		}
	}
	if (staged) {
		// The call reports a fault of its own staging, or of earlier work (which skips
		// the staging), but not one of the copy to the device: that may still be queued.
		wait_for(stream, wait);
		if (!staged->load(std::memory_order_acquire))
			return fail(CUDA_ERROR_ILLEGAL_ADDRESS, call, "sticky error of device %d", stream.device);
		return CUDA_SUCCESS;
	}
	if (!wait && !synchronous)
		return CUDA_SUCCESS;
	return finish_synchronous(call, stream, wait);
}

// cuMemcpyHtoDAsync, cuMemcpyDtoHAsync, cuMemcpyDtoDAsync and cuMemcpyAsync, and with
// synchronous the calls without Async, which use the context's legacy stream.
CUresult linear_copy(const char *call, Endpoint dst, Endpoint src, size_t bytes, CUstream handle, bool synchronous)
{
	std::shared_ptr<Stream> stream;
	if (CUresult r = enqueue_call(call, handle, stream))
		return r;
	if (bytes == 0)
		return synchronous ? finish_synchronous(call, *stream, 0) : CUDA_SUCCESS;
	if (!dst.addr || !src.addr)
		return fail(CUDA_ERROR_INVALID_VALUE, call, "null address");
	dst.pitch = src.pitch = bytes;
	return submit_copy(call, *stream, dst, src, bytes, 1, synchronous);
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

// cuMemsetD2D8/16/32 and their Async forms: HEIGHT rows of WIDTH units, PITCH bytes
// apart. As the driver says, the address and the pitch must be aligned to the unit, and
// a row may not be wider than the pitch. The synchronous forms run on the legacy default
// stream and, for device memory, return before the rows are written, as the driver may.
CUresult memset_2d_call(const char *call, CUdeviceptr dst, size_t pitch, uint32_t value, size_t unit, size_t width,
			size_t height, CUstream handle)
{
	std::shared_ptr<Stream> stream;
	if (CUresult r = enqueue_call(call, handle, stream))
		return r;
	if (width == 0 || height == 0)
		return CUDA_SUCCESS;
	if (!dst || dst % unit)
		return fail(CUDA_ERROR_INVALID_VALUE, call, "address 0x%llx is not %zu-byte aligned", dst, unit);
	size_t row;
	if (__builtin_mul_overflow(width, unit, &row))
		return CUDA_ERROR_INVALID_VALUE;
	if (height > 1 && (pitch % unit || row > pitch))
		return fail(CUDA_ERROR_INVALID_VALUE, call, "pitch %zu for rows of %zu bytes of %zu-byte units", pitch,
			    row, unit);
	size_t span;
	if (__builtin_mul_overflow(pitch, height - 1, &span) || __builtin_add_overflow(span, row, &span) ||
	    __builtin_add_overflow(uintptr_t(dst), span, &span))
		return CUDA_ERROR_INVALID_VALUE;
	enqueue(*stream, call, [=](Stream &st) {
		for (size_t y = 0; y < height && !st.ctx->sticky.load(std::memory_order_acquire); y++)
			run_memset(st, call, uintptr_t(dst) + y * pitch, value, unit, width);
	});
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

// cuMemcpy2D (synchronous, on the legacy stream) and cuMemcpy2DAsync.
CUresult copy_2d(const char *call, const CUDA_MEMCPY2D *pCopy, CUstream handle, bool synchronous)
{
	std::shared_ptr<Stream> stream;
	if (CUresult r = enqueue_call(call, handle, stream))
		return r;
	if (!pCopy)
		return CUDA_ERROR_INVALID_VALUE;
	const CUDA_MEMCPY2D &c = *pCopy;
	if (c.WidthInBytes == 0 || c.Height == 0)
		return synchronous ? finish_synchronous(call, *stream, 0) : CUDA_SUCCESS;
	Endpoint dst, src;
	if (CUresult r = plane(call, "source", c.srcMemoryType, c.srcHost, c.srcDevice, c.srcXInBytes, c.srcY,
			       c.srcPitch, c.WidthInBytes, c.Height, src))
		return r;
	if (CUresult r = plane(call, "destination", c.dstMemoryType, c.dstHost, c.dstDevice, c.dstXInBytes, c.dstY,
			       c.dstPitch, c.WidthInBytes, c.Height, dst))
		return r;
	return submit_copy(call, *stream, dst, src, c.WidthInBytes, c.Height, synchronous);
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
	ctx.legacy_stream.reset();
	ctx.per_thread.clear();
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
		// A blocking stream unless CU_STREAM_NON_BLOCKING: it synchronizes with the
		// legacy stream.
		auto stream = start_stream(s, ctx, Flags != CU_STREAM_NON_BLOCKING);
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
			if (it == s.streams.end()) {
				check_not_destroyed(s, call, hStream);
				return fail(CUDA_ERROR_INVALID_HANDLE, call, "unknown stream %p",
					    static_cast<void *>(hStream));
			}
			stream = std::move(it->second);
			s.streams.erase(it);
			s.destroyed_streams.insert(hStream);
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
		return linear_copy("cuMemcpyHtoDAsync", { Space::device, uintptr_t(dstDevice) },
				   { Space::host, reinterpret_cast<uintptr_t>(srcHost) }, ByteCount, hStream, false);
	});
}

CUresult CUDAAPI cuMemcpyDtoHAsync(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream)
{
	return guarded([&] {
		return linear_copy("cuMemcpyDtoHAsync", { Space::host, reinterpret_cast<uintptr_t>(dstHost) },
				   { Space::device, uintptr_t(srcDevice) }, ByteCount, hStream, false);
	});
}

CUresult CUDAAPI cuMemcpyDtoDAsync(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream)
{
	return guarded([&] {
		return linear_copy("cuMemcpyDtoDAsync", { Space::device, uintptr_t(dstDevice) },
				   { Space::device, uintptr_t(srcDevice) }, ByteCount, hStream, false);
	});
}

CUresult CUDAAPI cuMemcpy2DAsync(const CUDA_MEMCPY2D *pCopy, CUstream hStream)
{
	return guarded([&] { return copy_2d("cuMemcpy2DAsync", pCopy, hStream, false); });
}

CUresult CUDAAPI cuMemcpy2D(const CUDA_MEMCPY2D *pCopy)
{
	// On the context's legacy stream, so after the work queued there and on the blocking
	// streams.
	return guarded([&] { return copy_2d("cuMemcpy2D", pCopy, nullptr, true); });
}

CUresult CUDAAPI cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream)
{
	return guarded([&] {
		// Unified addressing: each side is looked up, device or host, now to choose how
		// the call returns, and again as the copy runs.
		return linear_copy("cuMemcpyAsync", { Space::unified, uintptr_t(dst) },
				   { Space::unified, uintptr_t(src) }, ByteCount, hStream, false);
	});
}

CUresult CUDAAPI cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount)
{
	return guarded([&] {
		return linear_copy("cuMemcpy", { Space::unified, uintptr_t(dst) }, { Space::unified, uintptr_t(src) },
				   ByteCount, nullptr, true);
	});
}

CUresult CUDAAPI cuMemcpyHtoD(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
	return guarded([&] {
		return linear_copy("cuMemcpyHtoD", { Space::device, uintptr_t(dstDevice) },
				   { Space::host, reinterpret_cast<uintptr_t>(srcHost) }, ByteCount, nullptr, true);
	});
}

CUresult CUDAAPI cuMemcpyDtoH(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
	return guarded([&] {
		return linear_copy("cuMemcpyDtoH", { Space::host, reinterpret_cast<uintptr_t>(dstHost) },
				   { Space::device, uintptr_t(srcDevice) }, ByteCount, nullptr, true);
	});
}

CUresult CUDAAPI cuMemcpyDtoD(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount)
{
	return guarded([&] {
		return linear_copy("cuMemcpyDtoD", { Space::device, uintptr_t(dstDevice) },
				   { Space::device, uintptr_t(srcDevice) }, ByteCount, nullptr, true);
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

CUresult CUDAAPI cuMemsetD2D8Async(CUdeviceptr dstDevice, size_t dstPitch, unsigned char uc, size_t Width,
				   size_t Height, CUstream hStream)
{
	return guarded([&] {
		return memset_2d_call("cuMemsetD2D8Async", dstDevice, dstPitch, uc, 1, Width, Height, hStream);
	});
}

CUresult CUDAAPI cuMemsetD2D16Async(CUdeviceptr dstDevice, size_t dstPitch, unsigned short us, size_t Width,
				    size_t Height, CUstream hStream)
{
	return guarded([&] {
		return memset_2d_call("cuMemsetD2D16Async", dstDevice, dstPitch, us, 2, Width, Height, hStream);
	});
}

CUresult CUDAAPI cuMemsetD2D32Async(CUdeviceptr dstDevice, size_t dstPitch, unsigned int ui, size_t Width,
				    size_t Height, CUstream hStream)
{
	return guarded([&] {
		return memset_2d_call("cuMemsetD2D32Async", dstDevice, dstPitch, ui, 4, Width, Height, hStream);
	});
}

CUresult CUDAAPI cuMemsetD2D8(CUdeviceptr dstDevice, size_t dstPitch, unsigned char uc, size_t Width, size_t Height)
{
	return guarded(
		[&] { return memset_2d_call("cuMemsetD2D8", dstDevice, dstPitch, uc, 1, Width, Height, nullptr); });
}

CUresult CUDAAPI cuMemsetD2D16(CUdeviceptr dstDevice, size_t dstPitch, unsigned short us, size_t Width, size_t Height)
{
	return guarded(
		[&] { return memset_2d_call("cuMemsetD2D16", dstDevice, dstPitch, us, 2, Width, Height, nullptr); });
}

CUresult CUDAAPI cuMemsetD2D32(CUdeviceptr dstDevice, size_t dstPitch, unsigned int ui, size_t Width, size_t Height)
{
	return guarded(
		[&] { return memset_2d_call("cuMemsetD2D32", dstDevice, dstPitch, ui, 4, Width, Height, nullptr); });
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
		if (it == s->streams.end()) {
			check_not_destroyed(*s, call, hStream);
			return fail(CUDA_ERROR_INVALID_HANDLE, call, "unknown stream %p", static_cast<void *>(hStream));
		}
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
		event->ticket = enqueue_locked(s, *stream, call, [](Stream &) {});
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

// The stream's later work waits for the event's last record as it stood at this call; an
// event never recorded is no wait. The event may be of another context, as the driver
// allows.
CUresult CUDAAPI cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
	return guarded([&] {
		const char *call = "cuStreamWaitEvent";
		std::shared_ptr<Stream> stream;
		if (CUresult r = enqueue_call(call, hStream, stream))
			return r;
		if (Flags != CU_EVENT_WAIT_DEFAULT && Flags != CU_EVENT_WAIT_EXTERNAL)
			return fail(CUDA_ERROR_INVALID_VALUE, call, "flags 0x%x", Flags);
		State &s = *state();
		std::lock_guard<std::mutex> guard(s.lock);
		Event *event = find_event(s, hEvent);
		if (!event)
			return fail(CUDA_ERROR_INVALID_HANDLE, call, "unknown event %p", static_cast<void *>(hEvent));
		if (!event->stream)
			return CUDA_SUCCESS;
		enqueue_locked(s, *stream, call, [](Stream &) {}, false, { { event->stream, event->ticket } });
		return CUDA_SUCCESS;
	});
}

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
