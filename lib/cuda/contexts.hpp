// contexts.hpp - the CUDA contexts this process's streams have come from, so that a
// wait for "every stream of this process" reaches more than the current context.
#pragma once

#include "driver.hpp"

namespace xmem::cuda {

// Records CTX, the context of a stream a caller handed to xmem (GStreamer's, a
// framework's). A leaf lock and a look through the few contexts known.
void note_context(CUcontext ctx);

// Records the context of STREAM, a stream a caller handed to xmem (nothing for the
// legacy and per-thread default streams, which are the current context's).
void note_stream(CUstream stream);

// Waits on the CPU for every stream of PRIMARY's device that xmem can know of: those
// of the primary context, of the calling thread's current context, and of every
// context noted so far on that device. cuCtxSynchronize alone waits for the current
// context only. Contexts destroyed since they were noted are forgotten (their work is
// gone with them). The first failure is returned, after every context was waited for.
CUresult synchronize_contexts(const PrimaryContext &primary, const char **failed_call = nullptr);

// The sticky error of a context of PRIMARY's device that xmem can know of (those
// synchronize_contexts() waits for), without waiting: CUDA_SUCCESS when none has one.
// A context with a sticky error runs none of its queued work ever again.
CUresult context_fault(const PrimaryContext &primary);

} // namespace xmem::cuda
