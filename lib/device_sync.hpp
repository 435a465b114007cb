// device_sync.hpp - the seam between a pool's roles and GPU ordering: what a
// publisher and a subscriber ask of device slots, with no CUDA type in sight.
#pragma once

#include "layout.hpp"
#include "system.hpp"

#include <memory>
#include <span>
#include <string>

namespace xmem {

class Arena;
class ControlSegment;

// Orders GPU work on device slots (see lib/cuda/ordering.hpp). A STREAM is a
// CUstream, or nullptr for "every stream of this process" that xmem can reach (a CPU
// stall; see cuda/contexts.hpp).
class DeviceSync
{
public:
	virtual ~DeviceSync() = default;
	virtual layout::SyncMode mode() const = 0;
	// ALSO, without STREAM: the stream the frame was taken on, waited for too.
	virtual Result<void> mark_ready(uint32_t slot, uint64_t seq, void *stream, void *also) = 0;
	virtual Result<void> wait_ready(uint32_t slot, uint64_t seq, void *stream, uint64_t deadline_ns) = 0;
	virtual Result<void> mark_done(uint32_t slot, uint32_t holder, uint64_t seq, void *stream, void *also) = 0;
	virtual Result<void> wait_done(uint32_t slot, uint64_t seq, void *stream, uint64_t deadline_ns) = 0;
	virtual void release_dead_holder(uint32_t holder, uint64_t seq) = 0;
	// A consumer closing its pool: waits on the CPU, until DEADLINE_NS at most, for
	// the done words its streams have still to write (queued by mark_done), so that
	// its GPU reads are over before its socket closes. Otherwise the owner, reaping
	// it on the hang-up, would store those words from the CPU and write the slots
	// under reads still running (found by the model, tests/model).
	// True when every such word was written: nothing of this holder's can land later.
	virtual bool drain_done(uint32_t holder, uint64_t deadline_ns) = 0;
	// The owner closing its pool: waits on the CPU, until DEADLINE_NS at most, for the ready
	// words its streams have still to write (queued by mark_ready), so that no consumer
	// takes the hang-up that follows for the owner's death while its frames are still
	// being written (model, Finding 7). True when every such word was written.
	virtual bool drain_ready(uint64_t deadline_ns) = 0;
	// Consumer, when the owner is gone: every slot's ready word reaches the frame
	// published in it, so no stream waits forever on writes that died with the owner.
	// A frame whose writes had not completed is marked: its bytes are whatever those
	// writes left (died_unready()).
	virtual void release_dead_owner() = 0;
	// Whether frame SEQ of SLOT was released that way rather than completed.
	virtual bool died_unready(uint32_t slot, uint64_t seq) const = 0;
};

// The spill tier's GPU side, in the owner of a device pool (lib/cuda/spill_copy.cpp):
// the tier's memfd page-locked and device-mapped, and a stream of the owner's on which
// frames are copied out of their slots (docs/design.md, "The spill tier").
class DeviceSpill
{
public:
	virtual ~DeviceSpill() = default;
	// Queues on the spill stream, in order: a wait for frame SEQ of SLOT to be ready (its
	// producer's GPU writes); the copy of BYTES from the slot's device address FROM into
	// TO, the buffer's payload in the tier; RECORD's spill_ready = its spill_seq (set by
	// the caller); the owner's done word of SLOT = SEQ, which acquire() waits for before
	// the slot is written again. Where the GPU cannot write the words (no stream memory
	// operations, the tier not page-locked) the CPU waits, until DEADLINE_NS for the
	// frame, and writes them: complete on return.
	virtual Result<void> spill(uint32_t slot, uint64_t seq, uint64_t from, std::byte *to, uint64_t bytes,
				   layout::SlotRecord &record, uint64_t deadline_ns) = 0;
	// Whether spills are queued on the GPU (false: each completes on the CPU).
	virtual bool queued() const = 0;
	// Waits on the CPU, until DEADLINE_NS at most, for every queued spill's spill_ready
	// write (the owner closing: before it hangs up on its consumers). True when landed.
	virtual bool drain(uint64_t deadline_ns) = 0;
};

// The owner of a device pool with a spill tier: copies of SYNC's slots into TIER (the
// tier's whole memfd mapping). NOTICE gets why spills complete on the CPU, if they do.
// Errors when this libxmem was built without CUDA, or the stream cannot be made.
Result<std::unique_ptr<DeviceSpill>> make_device_spill(DeviceSync &sync, std::span<std::byte> tier,
						       std::string *notice);

// The DeviceSync of a CUDA pool, for the process mapping ARENA; MEM_OPS says whether
// the pool's mode lets this process use stream memory operations. FALLBACK receives
// why the GPU path could not be used, if it could not. Errors when this libxmem was
// built without CUDA.
Result<std::unique_ptr<DeviceSync>> make_device_sync(const ControlSegment &seg, const Arena &arena, bool mem_ops,
						     std::string *fallback);
// Whether the device a CUDA pool would use supports 64-bit stream memory operations.
bool device_has_stream_mem_ops(uint32_t device);
// The UUID of this process's CUDA device ORDINAL. WHERE names the pool in errors.
Result<DeviceUuid> device_uuid(uint32_t ordinal, const std::string &where);
// This process's ordinal of the CUDA device UUID: an error that names the device
// and CUDA_VISIBLE_DEVICES when this process does not see it.
Result<uint32_t> device_ordinal(const DeviceUuid &uuid, const std::string &where);

// That UUID is a MIG device's (a compute instance of a GPU in MIG mode): learnt from the
// driver (cuda::read_device_uuid) or from a pool's segment, it is true in every process,
// since no GPU shares a MIG device's UUID. Thread-safe.
void note_mig_device(const DeviceUuid &uuid);
bool is_mig_device(const DeviceUuid &uuid);

// UUID as nvidia-smi -L prints it: "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", or "MIG-…"
// for a MIG device (what CUDA_VISIBLE_DEVICES takes too).
inline std::string format_device_uuid(const DeviceUuid &uuid, bool mig)
{
	static constexpr char kHex[] = "0123456789abcdef";
	std::string s = mig ? "MIG-" : "GPU-";
	for (size_t i = 0; i < uuid.size(); i++) {
		if (i == 4 || i == 6 || i == 8 || i == 10)
			s += '-';
		s += kHex[uuid[i] >> 4];
		s += kHex[uuid[i] & 0xf];
	}
	return s;
}

// The same, "MIG-…" where this process knows the UUID for a MIG device's (is_mig_device).
inline std::string format_device_uuid(const DeviceUuid &uuid)
{
	return format_device_uuid(uuid, is_mig_device(uuid));
}

// Private device memory for copies (copy-on-write, copy_to_*): BYTES on DEVICE, freed
// when the last owner lets go, once the primary and current contexts' work and
// STREAM's (the stream the copy is made on, nullptr: none) are done.
Result<std::shared_ptr<void>> device_allocate(uint32_t device, uint64_t bytes, uint64_t *address, void *stream);
// Copies BYTES on DEVICE's context between device (CUdeviceptr) or host addresses,
// queued on STREAM; without a stream, complete on return. A device source DEVICE may not
// read (another GPU's mapping) is staged through host memory: then the copy waits for
// STREAM's earlier work and is complete on return.
Result<void> device_copy(uint32_t device, uint64_t dst, bool dst_device, uint64_t src, bool src_device, uint64_t bytes,
			 void *stream);
// Page-locks MEMORY (host memory of this process) for copies with DEVICE, so they are
// asynchronous DMA; unlocked when the last owner lets go, once the primary context's and
// the current one's work is done. Fails where the driver cannot pin it.
Result<std::shared_ptr<void>> device_pin(uint32_t device, std::span<std::byte> memory);
// Waits on the CPU for STREAM (nullptr: the primary context's and the calling thread's
// current context's streams on DEVICE, see cuda::synchronize_contexts).
Result<void> device_synchronize(uint32_t device, void *stream);

} // namespace xmem
