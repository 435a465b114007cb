// spill_copy.cpp - the spill tier of a device pool, the owner's side: frames copied out
// of their device slots into the tier's host memory on a stream of the owner's, ordered
// by the slots' words (docs/design.md, "The spill tier").
#include "../device_sync.hpp"
#include "contexts.hpp"
#include "ordering.hpp"

#include <thread>

namespace xmem {

namespace {

using cuda::ContextScope;
using cuda::cuda_error;
using cuda::reached;

// How long closing the pool waits for the spill stream's copies and word writes.
constexpr int64_t kTeardownTimeoutNs = 10'000'000'000;

class SpillCopier final : public DeviceSpill
{
public:
	SpillCopier(cuda::Ordering &order, std::span<std::byte> tier)
		: d_(cuda::driver().value()), order_(order), tier_(tier)
	{
	}

	~SpillCopier() override;

	Result<void> start(std::string *notice);
	Result<void> spill(uint32_t slot, uint64_t seq, uint64_t from, std::byte *to, uint64_t bytes,
			   layout::SlotRecord &record, uint64_t deadline_ns) override;
	bool queued() const override { return dev_base_ != 0; }
	bool drain(uint64_t deadline_ns) override;

private:
	CUdeviceptr device_address(const std::atomic<uint64_t> &word) const
	{
		return dev_base_ + CUdeviceptr(reinterpret_cast<const std::byte *>(&word) - tier_.data());
	}

	const cuda::Driver *d_;
	cuda::Ordering &order_;
	std::span<std::byte> tier_;
	CUstream stream_ = nullptr;
	// The tier page-locked and device-mapped (none: spills complete on the CPU).
	CUdeviceptr dev_base_ = 0;
	// The last spill queued: its record and spill_seq, what closing waits for (the
	// stream runs in order, so every earlier one landed before it).
	std::atomic<uint64_t> *last_word_ = nullptr;
	uint64_t last_seq_ = 0;
};

Result<void> SpillCopier::start(std::string *notice)
{
	ContextScope scope(order_.context());
	// Non-blocking: the spill stream must not wait for the legacy default stream, which
	// a producer may use (the copies are ordered by the words, not by the streams).
	if (CUresult r = d_->cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING); r != CUDA_SUCCESS)
		return cuda_error("spill tier", "cuStreamCreate", r);
	if (!order_.gpu()) {
		if (notice)
			*notice = "the pool orders GPU work on the CPU, so each spill's copy completes on the CPU";
		return {};
	}
	// Page-locked, so the copies are asynchronous DMA, and device-mapped, so the stream
	// writes a buffer's spill_ready itself. The whole tier: it is pinned at its cap.
	CUresult r = d_->cuMemHostRegister(tier_.data(), tier_.size(),
					   CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE);
	if (r != CUDA_SUCCESS) {
		if (notice)
			*notice = "the spill tier (" + std::to_string(tier_.size()) +
				  " bytes) could not be page-locked, so each spill's copy completes on the CPU: " +
				  d_->describe("cuMemHostRegister", r);
		return {};
	}
	CUdeviceptr dev = 0;
	if (r = d_->cuMemHostGetDevicePointer(&dev, tier_.data(), 0); r != CUDA_SUCCESS) {
		if (notice)
			*notice = "the spill tier has no device address, so each spill's copy completes on the CPU: " +
				  d_->describe("cuMemHostGetDevicePointer", r);
		d_->cuMemHostUnregister(tier_.data());
		return {};
	}
	dev_base_ = dev;
	return {};
}

bool SpillCopier::drain(uint64_t deadline_ns)
{
	// The stream runs in order: the last spill's word landing means every one did.
	while (last_word_ && !reached(last_word_->load(std::memory_order_acquire), last_seq_)) {
		if (monotonic_ns() >= deadline_ns)
			return false;
		std::this_thread::sleep_for(std::chrono::microseconds(20));
	}
	return true;
}

SpillCopier::~SpillCopier()
{
	if (!stream_)
		return;
	ContextScope scope(order_.context(), stream_);
	// Every copy into the tier lands before the tier's pages are unregistered and
	// unmapped; a stream that never gets there (a faulted context) keeps them
	// registered, as the segment's words are kept (ordering.cpp).
	bool landed = d_->cuStreamSynchronize(stream_) == CUDA_SUCCESS;
	if (last_word_) {
		uint64_t deadline = deadline_after(kTeardownTimeoutNs);
		while (!reached(last_word_->load(std::memory_order_acquire), last_seq_) && landed) {
			if (monotonic_ns() >= deadline)
				landed = false;
			std::this_thread::sleep_for(std::chrono::microseconds(20));
		}
	}
	d_->cuStreamDestroy(stream_);
	if (dev_base_ && landed)
		d_->cuMemHostUnregister(tier_.data());
}

Result<void> SpillCopier::spill(uint32_t slot, uint64_t seq, uint64_t from, std::byte *to, uint64_t bytes,
				layout::SlotRecord &record, uint64_t deadline_ns)
{
	uint64_t spill_seq = record.spill_seq;
	if (!queued()) {
		// The CPU orders: the frame is ready, then the copy completes on return (into
		// pageable memory, cuMemcpyDtoHAsync returns once it has executed; the stream
		// is synchronized anyway, for memory that happens to be page-locked).
		if (auto r = order_.wait_ready(slot, seq, nullptr, deadline_ns); !r)
			return r;
		ContextScope scope(order_.context(), stream_);
		if (CUresult r = d_->cuMemcpyDtoHAsync(to, from, bytes, stream_); r != CUDA_SUCCESS)
			return cuda_error("spill", "cuMemcpyDtoHAsync", r);
		if (CUresult r = d_->cuStreamSynchronize(stream_); r != CUDA_SUCCESS)
			return cuda_error("spill", "cuStreamSynchronize", r);
		record.spill_ready.store(spill_seq, std::memory_order_release);
		return {};
	}
	if (auto r = order_.wait_ready(slot, seq, stream_, deadline_ns); !r)
		return r;
	ContextScope scope(order_.context(), stream_);
	if (CUresult r = d_->cuMemcpyDtoHAsync(to, from, bytes, stream_); r != CUDA_SUCCESS)
		return cuda_error("spill", "cuMemcpyDtoHAsync", r);
	if (CUresult r = d_->cuStreamWriteValue64(stream_, device_address(record.spill_ready), spill_seq,
						  CU_STREAM_WRITE_VALUE_DEFAULT);
	    r != CUDA_SUCCESS) {
		// The copy is queued but nothing will say it is done: wait for it here.
		if (CUresult s = d_->cuStreamSynchronize(stream_); s != CUDA_SUCCESS)
			return cuda_error("spill", "cuStreamSynchronize", s);
		record.spill_ready.store(spill_seq, std::memory_order_release);
	} else {
		last_word_ = &record.spill_ready;
		last_seq_ = spill_seq;
	}
	// The slot is written again only after the copy read it: the owner is a holder of
	// it, done once this stream is.
	return order_.mark_done(slot, layout::kOwnerBit, seq, stream_, nullptr);
}

} // namespace

Result<std::unique_ptr<DeviceSpill>> make_device_spill(DeviceSync &sync, std::span<std::byte> tier, std::string *notice)
{
	auto *order = dynamic_cast<cuda::Ordering *>(&sync);
	if (!order)
		return make_error(Errc::invalid_argument, "the spill tier of a device pool needs its GPU ordering");
	auto copier = std::make_unique<SpillCopier>(*order, tier);
	if (auto r = copier->start(notice); !r)
		return r.error();
	return std::unique_ptr<DeviceSpill>(std::move(copier));
}

} // namespace xmem
