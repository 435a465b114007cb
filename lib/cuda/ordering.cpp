// ordering.cpp - the ready/pending/done protocol on GPU streams, and its CPU fallback.
#include "ordering.hpp"
#include "contexts.hpp"

#include <map>
#include <thread>

namespace xmem::cuda {

namespace {

// How long closing a pool waits for writes to its words still queued on streams.
constexpr int64_t kTeardownTimeoutNs = 10'000'000'000;

} // namespace

Ordering::Ordering(const ControlSegment &seg, std::shared_ptr<PrimaryContext> ctx)
	: d_(driver().value()), seg_(seg), ctx_(std::move(ctx))
{
}

namespace {

// The control segment's page-locked registration, one per process and segment: the
// driver pins a range once (registering it again fails with
// CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED), so the Orderings of a pool's devices
// share it. PORTABLE makes it pinned for every context; each Ordering asks for the
// device address in its own.
struct SegmentPin {
	std::shared_ptr<PrimaryContext> ctx; // the context it was registered in
	uint32_t users = 0;
	bool keep = false; // a queued write may still land: never unregistered
};

std::mutex pins_lock;
std::map<void *, SegmentPin> pins;

CUresult pin_segment(const Driver &d, void *base, size_t size, const std::shared_ptr<PrimaryContext> &ctx)
{
	std::lock_guard lock(pins_lock);
	if (auto it = pins.find(base); it != pins.end()) {
		it->second.users++;
		return CUDA_SUCCESS;
	}
	ContextScope scope(*ctx);
	CUresult r = d.cuMemHostRegister(base, size, CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE);
	if (r == CUDA_SUCCESS)
		pins[base] = SegmentPin{ ctx, 1, false };
	return r;
}

// LANDED: every write the caller queued to the segment has landed.
void unpin_segment(const Driver &d, void *base, bool landed)
{
	std::lock_guard lock(pins_lock);
	auto it = pins.find(base);
	if (it == pins.end())
		return;
	SegmentPin &pin = it->second;
	pin.keep |= !landed;
	if (--pin.users != 0)
		return;
	if (!pin.keep) {
		ContextScope scope(*pin.ctx);
		d.cuMemHostUnregister(base);
	}
	pins.erase(it);
}

} // namespace

std::unique_ptr<Ordering> Ordering::create(const ControlSegment &seg, std::shared_ptr<PrimaryContext> ctx,
					   bool use_mem_ops, std::string *fallback)
{
	std::unique_ptr<Ordering> o(new Ordering(seg, std::move(ctx)));
	if (!use_mem_ops)
		return o;
	// The whole segment: the words sit between other records, and registration is
	// by page. Device-mapped, so streams can wait on and write them.
	// The segment is mapped read-write (the driver pins pages for the device to write
	// them, and refuses a read-only mapping). Pinning can fail where the device supports
	// it (the kernel locks no more pages: CUDA_ERROR_OUT_OF_MEMORY); then the CPU orders.
	// A pool with classes on two devices registers it once, for both (pin_segment).
	void *base = const_cast<std::byte *>(seg.bytes().data());
	size_t size = seg.bytes().size();
	CUresult r = pin_segment(*o->d_, base, size, o->ctx_);
	if (r != CUDA_SUCCESS) {
		if (fallback)
			*fallback = "the pool's control segment (" + std::to_string(size) +
				    " bytes) could not be page-locked for stream memory operations: " +
				    o->d_->describe("cuMemHostRegister", r);
		return o;
	}
	ContextScope scope(*o->ctx_);
	CUdeviceptr dev = 0;
	r = o->d_->cuMemHostGetDevicePointer(&dev, base, 0);
	if (r != CUDA_SUCCESS) {
		if (fallback)
			*fallback = "the pool's control segment has no device address: " +
				    o->d_->describe("cuMemHostGetDevicePointer", r);
		// Nothing was queued on it: no stream needs the registration.
		unpin_segment(*o->d_, base, true);
		return o;
	}
	o->registered_ = base;
	o->dev_base_ = dev;
	return o;
}

Ordering::~Ordering()
{
	if (!registered_)
		return;
	// Writes to the words queued on streams land before the words are unregistered:
	// each is seen on the CPU, whatever context its stream is of (xmem keeps none,
	// see contexts.hpp). Every wait xmem queued is followed on its stream by such a
	// write, or was waited for on the CPU (a stream-less publish or release waits for
	// the stream its frame was taken on).
	bool landed;
	{
		std::lock_guard lock(queued_lock_);
		landed = drain(
				 queued_ready_, [this](uint32_t i) -> std::atomic<uint64_t> & { return seg_.ready(i); },
				 deadline_after(kTeardownTimeoutNs)) &&
			 drain(
				 queued_done_,
				 [this](uint32_t i) -> std::atomic<uint64_t> & { return seg_.done(i, queued_holder_); },
				 deadline_after(kTeardownTimeoutNs));
	}
	{
		ContextScope scope(*ctx_);
		synchronize_contexts(*ctx_);
	}
	// A write that never landed (its stream stuck, or its context faulted) may still
	// run: the pages stay registered until the process exits rather than have the GPU
	// write to an address that is gone.
	unpin_segment(*d_, registered_, landed);
}

bool Ordering::drain(std::vector<uint64_t> &queued, const std::function<std::atomic<uint64_t> &(uint32_t)> &word,
		     uint64_t deadline_ns)
{
	for (uint32_t i = 0; i < queued.size(); i++) {
		uint64_t seq = queued[i];
		if (seq == 0)
			continue;
		for (uint32_t polls = 1; !reached(word(i).load(std::memory_order_acquire), seq); polls++) {
			if (monotonic_ns() >= deadline_ns)
				return false;
			// A context with a sticky error never runs the write: stop waiting for it
			// (every ~1 ms). Only the primary and current contexts can be asked.
			if (polls % 50 == 0 && context_fault(*ctx_) != CUDA_SUCCESS)
				return false;
			std::this_thread::sleep_for(std::chrono::microseconds(20));
		}
		queued[i] = 0;
	}
	return true;
}

CUdeviceptr Ordering::device_address(const std::atomic<uint64_t> &word) const
{
	auto offset = reinterpret_cast<const std::byte *>(&word) - seg_.bytes().data();
	return dev_base_ + CUdeviceptr(offset);
}

Result<void> Ordering::synchronize(CUstream stream, CUstream also, const char *why)
{
	ContextScope scope(*ctx_, stream);
	if (stream) {
		if (CUresult r = d_->cuStreamSynchronize(stream); r != CUDA_SUCCESS)
			return cuda_error(why, "cuStreamSynchronize", r);
		return {};
	}
	// "Every stream of this process" that xmem can reach safely: the primary and the
	// current context, and the stream the frame was taken on (its writes or reads
	// may be in another context: GStreamer's, a framework's).
	const char *call = "cuCtxSynchronize";
	if (CUresult r = synchronize_contexts(*ctx_, also, &call); r != CUDA_SUCCESS)
		return cuda_error(why, call, r);
	return {};
}

Result<void> Ordering::mark_ready(uint32_t slot, uint64_t seq, void *stream_arg, void *also)
{
	CUstream stream = static_cast<CUstream>(stream_arg);
	std::atomic<uint64_t> &ready = seg_.ready(slot);
	if (gpu() && stream) {
		ContextScope scope(*ctx_, stream);
		CUresult r =
			d_->cuStreamWriteValue64(stream, device_address(ready), seq, CU_STREAM_WRITE_VALUE_DEFAULT);
		if (r != CUDA_SUCCESS)
			return cuda_error("publish", "cuStreamWriteValue64", r);
		std::lock_guard lock(queued_lock_);
		queued_ready_.resize(seg_.slot_count, 0);
		queued_ready_[slot] = seq;
		return {};
	}
	if (auto r = synchronize(stream, static_cast<CUstream>(also), "publish"); !r)
		return r;
	ready.store(seq, std::memory_order_release);
	return {};
}

template<typename Late>
Result<void> Ordering::await_word(std::atomic<uint64_t> &word, uint64_t seq, CUstream stream, uint64_t deadline_ns,
				  const char *why, Late late)
{
	if (reached(word.load(std::memory_order_acquire), seq))
		return {};
	if (gpu() && stream) {
		ContextScope scope(*ctx_, stream);
		CUresult r = d_->cuStreamWaitValue64(stream, device_address(word), seq, CU_STREAM_WAIT_VALUE_GEQ);
		if (r != CUDA_SUCCESS)
			return cuda_error(why, "cuStreamWaitValue64", r);
		return {};
	}
	// The other side's stream writes the word soon; poll it.
	while (!reached(word.load(std::memory_order_acquire), seq)) {
		if (monotonic_ns() >= deadline_ns)
			return make_error(Errc::timed_out, late());
		std::this_thread::sleep_for(std::chrono::microseconds(20));
	}
	return {};
}

Result<void> Ordering::wait_ready(uint32_t slot, uint64_t seq, void *stream, uint64_t deadline_ns)
{
	return await_word(seg_.ready(slot), seq, static_cast<CUstream>(stream), deadline_ns, "receive", [seq] {
		return "frame " + std::to_string(seq) + " not ready on the GPU within the timeout";
	});
}

Result<void> Ordering::mark_done(uint32_t slot, uint32_t holder, uint64_t seq, void *stream_arg, void *also)
{
	CUstream stream = static_cast<CUstream>(stream_arg);
	std::atomic<uint64_t> &done = seg_.done(slot, holder);
	if (gpu() && stream) {
		// Pending first: the owner reads it after seeing our holder bit go, which
		// happens after this returns.
		seg_.pending(slot, holder).fetch_or(layout::holder_mask(holder), std::memory_order_seq_cst);
		ContextScope scope(*ctx_, stream);
		CUresult r = d_->cuStreamWriteValue64(stream, device_address(done), seq, CU_STREAM_WRITE_VALUE_DEFAULT);
		if (r == CUDA_SUCCESS) {
			std::lock_guard lock(queued_lock_);
			queued_done_.resize(seg_.slot_count, 0);
			queued_done_[slot] = seq;
			queued_holder_ = holder;
			return {};
		}
		// Not queued: fall through to the CPU, so the owner never waits on it.
	}
	auto synced = synchronize(stream, static_cast<CUstream>(also), "release");
	done.store(seq, std::memory_order_release);
	return synced;
}

Result<void> Ordering::wait_done(uint32_t slot, uint64_t seq, void *stream_arg, uint64_t deadline_ns)
{
	CUstream stream = static_cast<CUstream>(stream_arg);
	// The slot's last frame, SEQ, may still have its writes and its ready write queued
	// on the stream it was published on (when nobody took it, no done word says they
	// are over). The new frame's work comes after them, or a late write of the old
	// frame would land on the new one, and its ready write take the word back to SEQ.
	if (auto r = await_word(seg_.ready(slot), seq, stream, deadline_ns, "acquire",
				[=] {
					return "the GPU writes of frame " + std::to_string(seq) + " to slot " +
					       std::to_string(slot) + " did not finish within the timeout";
				});
	    !r)
		return r;
	for (uint32_t w = 0; w < layout::kHolderWords; w++) {
		std::atomic<uint64_t> &pending = seg_.pending(slot, w * 64);
		uint64_t bits = pending.exchange(0, std::memory_order_seq_cst);
		for (uint32_t b = 0; bits && b < 64; b++) {
			if (!(bits & (uint64_t{ 1 } << b)))
				continue;
			uint32_t holder = w * 64 + b;
			if (holder > seg_.max_consumers)
				continue; // scribbled: no such holder
			auto r = await_word(seg_.done(slot, holder), seq, stream, deadline_ns, "acquire", [slot] {
				return "a consumer's GPU reads of slot " + std::to_string(slot) +
				       " did not finish within the timeout";
			});
			if (!r) {
				// Still pending, with the holders not looked at yet.
				if (r.code() == Errc::timed_out)
					pending.fetch_or(bits & (~uint64_t{ 0 } << b), std::memory_order_seq_cst);
				return r;
			}
		}
	}
	return {};
}

void Ordering::release_dead_holder(uint32_t holder, uint64_t seq)
{
	for (uint32_t i = 0; i < seg_.slot_count; i++)
		seg_.done(i, holder).store(seq, std::memory_order_release);
}

bool Ordering::drain_done(uint32_t holder, uint64_t deadline_ns)
{
	std::lock_guard lock(queued_lock_);
	// Our stream's write of the word comes after its reads of the slot.
	return drain(
		queued_done_, [this, holder](uint32_t i) -> std::atomic<uint64_t> & { return seg_.done(i, holder); },
		deadline_ns);
}

bool Ordering::drain_ready(uint64_t deadline_ns)
{
	std::lock_guard lock(queued_lock_);
	return drain(
		queued_ready_, [this](uint32_t i) -> std::atomic<uint64_t> & { return seg_.ready(i); }, deadline_ns);
}

void Ordering::release_dead_owner()
{
	for (uint32_t i = 0; i < seg_.slot_count; i++) {
		uint32_t state = seg_.slots[i].state.load(std::memory_order_acquire);
		if (state != layout::kSlotPublished && state != layout::kSlotExclusive)
			continue;
		uint64_t seq = seg_.slots[i].meta.seq;
		std::atomic<uint64_t> &ready = seg_.ready(i);
		uint64_t v = ready.load(std::memory_order_acquire);
		while (!reached(v, seq) &&
		       !ready.compare_exchange_weak(v, seq + kDiedUnready, std::memory_order_acq_rel))
			;
	}
}

bool Ordering::died_unready(uint32_t slot, uint64_t seq) const
{
	return seg_.ready(slot).load(std::memory_order_acquire) == seq + kDiedUnready;
}

} // namespace xmem::cuda
