// contexts.hpp - what a wait for "every stream of this process" reaches: the primary
// context, the current one, and the stream of the frame in hand.
#pragma once

#include "driver.hpp"

namespace xmem::cuda {

// Which contexts a wait for "every stream" reaches. xmem keeps no context it was
// shown: a context's handle dangles once cuCtxDestroy destroyed it, and the real driver
// takes a dangling handle in cuCtxPushCurrent and crashes in the next call (seen on an
// H200, driver 580.159.04). So a stream-less call reaches the contexts that are alive by
// construction: PRIMARY (xmem holds a reference), the calling thread's current context
// (a destroyed one still current answers CUDA_ERROR_CONTEXT_IS_DESTROYED, as
// documented), and ALSO, a stream the caller handed xmem for the frame in hand (alive
// by the API's contract until that frame is published or released).

// Waits on the CPU for the work of those contexts and of ALSO (nullptr: none; a
// default stream adds nothing). The first failure is returned, after each was waited
// for; FAILED_CALL names its call.
CUresult synchronize_contexts(const PrimaryContext &primary, CUstream also = nullptr,
			      const char **failed_call = nullptr);

// The sticky error of PRIMARY or of the calling thread's current context on its device,
// without waiting: CUDA_SUCCESS when neither has one. A context with a sticky error runs
// none of its queued work ever again.
CUresult context_fault(const PrimaryContext &primary);

} // namespace xmem::cuda
