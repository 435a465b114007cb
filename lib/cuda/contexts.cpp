// contexts.cpp - the contexts a stream-less call waits for, where the API promises
// "every stream": the primary, the caller's current one, and the frame's own stream.
#include "contexts.hpp"

namespace xmem::cuda {

namespace {

// Calls FN(state) in the calling thread's current context when it is a context of
// PRIMARY's device, then in PRIMARY (pushed for the call) when that is another. STATE
// is CUDA_SUCCESS, or the error the context answers every call with: a sticky one, or
// CUDA_ERROR_CONTEXT_IS_DESTROYED for a destroyed context still current here, whose
// work is gone with it (skipped). The current context is used where it is, never
// pushed: a destroyed one's handle must not be handed back to the driver. Stops at the
// first FN that says false.
template<typename Fn>
void for_each_context(const PrimaryContext &primary, Fn fn)
{
	const Driver *d = driver().value();
	CUcontext current = nullptr;
	if (d->cuCtxGetCurrent(&current) != CUDA_SUCCESS)
		current = nullptr;
	auto visit = [&]() {
		CUdevice device = -1;
		CUresult r = d->cuCtxGetDevice(&device);
		bool destroyed = r == CUDA_ERROR_INVALID_CONTEXT || r == CUDA_ERROR_CONTEXT_IS_DESTROYED;
		if ((r == CUDA_SUCCESS && device == primary.device()) || (r != CUDA_SUCCESS && !destroyed))
			return fn(r);
		return true;
	};
	if (current && current != primary.get() && !visit())
		return;
	if (d->cuCtxPushCurrent(primary.get()) != CUDA_SUCCESS)
		return;
	visit();
	CUcontext popped;
	d->cuCtxPopCurrent(&popped);
}

} // namespace

CUresult synchronize_contexts(const PrimaryContext &primary, CUstream also, const char **failed_call)
{
	const Driver *d = driver().value();
	CUresult first = CUDA_SUCCESS;
	for_each_context(primary, [&](CUresult state) {
		CUresult r = state == CUDA_SUCCESS ? d->cuCtxSynchronize() : state;
		if (first == CUDA_SUCCESS && r != CUDA_SUCCESS) {
			first = r;
			if (failed_call)
				*failed_call = "cuCtxSynchronize";
		}
		return true;
	});
	if (also && also != CU_STREAM_LEGACY && also != CU_STREAM_PER_THREAD) {
		// Its own context's synchronization would do too, but the stream is the
		// handle the caller vouches for.
		ContextScope scope(primary, also);
		CUresult r = d->cuStreamSynchronize(also);
		if (first == CUDA_SUCCESS && r != CUDA_SUCCESS) {
			first = r;
			if (failed_call)
				*failed_call = "cuStreamSynchronize";
		}
	}
	return first;
}

CUresult context_fault(const PrimaryContext &primary)
{
	const Driver *d = driver().value();
	CUresult fault = CUDA_SUCCESS;
	for_each_context(primary, [&](CUresult state) {
		// The context's legacy stream always exists; querying it never waits, and
		// returns the context's sticky error where it has one.
		CUresult r = state == CUDA_SUCCESS ? d->cuStreamQuery(CU_STREAM_LEGACY) : state;
		if (r != CUDA_SUCCESS && r != CUDA_ERROR_NOT_READY)
			fault = r;
		return fault == CUDA_SUCCESS;
	});
	return fault;
}

} // namespace xmem::cuda
