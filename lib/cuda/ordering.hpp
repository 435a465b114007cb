// ordering.hpp - GPU-side ordering of a CUDA pool's slots through the ready, pending
// and done words of its control segment (docs/design.md, "Ordering on the GPU").
#pragma once

#include "../device_sync.hpp"
#include "../segment.hpp"
#include "driver.hpp"

#include <functional>
#include <memory>
#include <mutex>
#include <vector>

namespace xmem::cuda {

// One per process and pool. With stream memory operations, streams wait on and write
// the words themselves, registered with cuMemHostRegister; without them (or when
// registration fails) every wait and write is made by the CPU after synchronizing
// the stream: correct, but a CPU stall per frame.
class Ordering final : public DeviceSync
{
public:
	// USE_MEM_OPS: whether the pool's mode and this device allow the GPU path; a
	// failed registration falls back to the CPU and says why in FALLBACK.
	static std::unique_ptr<Ordering> create(const ControlSegment &seg, std::shared_ptr<PrimaryContext> ctx,
						bool use_mem_ops, std::string *fallback);
	~Ordering() override;

	bool gpu() const { return dev_base_ != 0; }
	layout::SyncMode mode() const override { return gpu() ? layout::kSyncStreamMemOps : layout::kSyncCpu; }

	// Producer, after its writes to SLOT: frame SEQ is ready once STREAM's work so
	// far is done. Without a stream, once every stream of this process is.
	// ALSO: the stream the frame was acquired on, waited for too without STREAM.
	Result<void> mark_ready(uint32_t slot, uint64_t seq, void *stream, void *also) override;
	// Consumer: STREAM waits until frame SEQ of SLOT is ready; without a stream the
	// CPU does, until DEADLINE.
	Result<void> wait_ready(uint32_t slot, uint64_t seq, void *stream, uint64_t deadline_ns) override;
	// Holder HOLDER is done with frame SEQ of SLOT once STREAM's work so far is done
	// (without a stream, once every stream of this process is, ALSO, the stream the
	// frame was received on, included).
	Result<void> mark_done(uint32_t slot, uint32_t holder, uint64_t seq, void *stream, void *also) override;
	// Owner, before rewriting SLOT whose last frame was SEQ: STREAM (or the CPU, until
	// DEADLINE) waits for that frame's own ready write (it may be queued on another
	// stream of the producer's) and for every holder whose done write is pending.
	Result<void> wait_done(uint32_t slot, uint64_t seq, void *stream, uint64_t deadline_ns) override;
	// Owner, reaping HOLDER: its done words become SEQ (the newest frame), so no stream
	// waits on a process that is gone.
	void release_dead_holder(uint32_t holder, uint64_t seq) override;
	bool drain_done(uint32_t holder, uint64_t deadline_ns) override;
	bool drain_ready(uint64_t deadline_ns) override;
	void release_dead_owner() override;
	bool died_unready(uint32_t slot, uint64_t seq) const override;

	PrimaryContext &context() const { return *ctx_; }

private:
	Ordering(const ControlSegment &seg, std::shared_ptr<PrimaryContext> ctx);
	CUdeviceptr device_address(const std::atomic<uint64_t> &word) const;
	Result<void> synchronize(CUstream stream, CUstream also, const char *why);
	// STREAM waits on the GPU until WORD reaches SEQ (a queued wait); without a stream
	// or the GPU path, the CPU polls it until DEADLINE, then fails with LATE()'s
	// message (made only then). WHY names the API call in a driver error.
	template<typename Late>
	Result<void> await_word(std::atomic<uint64_t> &word, uint64_t seq, CUstream stream, uint64_t deadline_ns,
				const char *why, Late late);
	// Waits on the CPU, until DEADLINE at most, for WORDS[slot] to reach every value
	// QUEUED[slot] names (writes queued on streams); true when all landed.
	bool drain(std::vector<uint64_t> &queued, const std::function<std::atomic<uint64_t> &(uint32_t)> &word,
		   uint64_t deadline_ns);

	const Driver *d_;
	const ControlSegment &seg_;
	std::shared_ptr<PrimaryContext> ctx_;
	void *registered_ = nullptr;
	CUdeviceptr dev_base_ = 0;
	// Per slot, the last frame whose done word this process queued on a stream
	// (0: none): what drain_done() waits for.
	std::mutex queued_lock_;
	std::vector<uint64_t> queued_done_;
	uint32_t queued_holder_ = 0;
	// Per slot, the last frame whose ready word this process queued on a stream.
	std::vector<uint64_t> queued_ready_;
	std::string where_;
};

// What release_dead_owner() adds to a frame's sequence number for its ready word: far
// enough to read as reached (GEQ, wrap-around) and to be told apart from seq itself.
inline constexpr uint64_t kDiedUnready = uint64_t{ 1 } << 62;

// Whether sequence word value V has reached SEQ, with wrap-around (as the GPU's GEQ).
inline bool reached(uint64_t v, uint64_t seq)
{
	return int64_t(v - seq) >= 0;
}

} // namespace xmem::cuda
