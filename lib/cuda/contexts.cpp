// contexts.cpp - the registry of the CUDA contexts behind streams xmem was given, and
// the synchronization of all of them where the API promises "every stream".
#include "contexts.hpp"

#include <algorithm>
#include <mutex>
#include <vector>

namespace xmem::cuda {

namespace {

// Guards `known`; a leaf lock (no driver call is made under it).
std::mutex known_lock;
// Never destroyed: a stream-less call may run during static destruction.
auto *const known = new std::vector<CUcontext>;

} // namespace

void note_context(CUcontext ctx)
{
	if (!ctx)
		return;
	std::lock_guard guard(known_lock);
	if (std::find(known->begin(), known->end(), ctx) == known->end())
		known->push_back(ctx);
}

void note_stream(CUstream stream)
{
	if (!stream || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD)
		return;
	CUcontext ctx = nullptr;
	if (driver().value()->cuStreamGetCtx(stream, &ctx) == CUDA_SUCCESS)
		note_context(ctx);
}

namespace {

// Calls FN(state) in each context of PRIMARY's device that xmem can know of: the
// primary, the calling thread's current one, those noted; each made current for the
// call. STATE is CUDA_SUCCESS, or the error the context answers every call with (a
// sticky one: its device cannot even be asked, so it may be on another). Contexts
// destroyed since they were noted are forgotten. Stops at the first FN that says false.
template<typename Fn>
void for_each_context(const PrimaryContext &primary, Fn fn)
{
	const Driver *d = driver().value();
	CUcontext current = nullptr;
	if (d->cuCtxGetCurrent(&current) != CUDA_SUCCESS)
		current = nullptr;
	std::vector<CUcontext> contexts{ primary.get() };
	if (current && current != primary.get())
		contexts.push_back(current);
	{
		std::lock_guard guard(known_lock);
		for (CUcontext c : *known)
			if (std::find(contexts.begin(), contexts.end(), c) == contexts.end())
				contexts.push_back(c);
	}
	std::vector<CUcontext> gone;
	for (CUcontext c : contexts) {
		if (d->cuCtxPushCurrent(c) != CUDA_SUCCESS) {
			gone.push_back(c);
			continue;
		}
		CUdevice device = -1;
		CUresult r = d->cuCtxGetDevice(&device);
		bool more = true;
		bool destroyed = r == CUDA_ERROR_INVALID_CONTEXT || r == CUDA_ERROR_CONTEXT_IS_DESTROYED;
		bool ours = r == CUDA_SUCCESS && device == primary.device();
		bool faulted = r != CUDA_SUCCESS && !destroyed;
		if (ours || faulted)
			more = fn(r);
		else if (r != CUDA_SUCCESS && c != primary.get())
			gone.push_back(c); // destroyed while it stayed current somewhere
		CUcontext popped;
		d->cuCtxPopCurrent(&popped);
		if (!more)
			break;
	}
	if (!gone.empty()) {
		std::lock_guard guard(known_lock);
		std::erase_if(*known,
			      [&](CUcontext c) { return std::find(gone.begin(), gone.end(), c) != gone.end(); });
	}
}

} // namespace

CUresult synchronize_contexts(const PrimaryContext &primary, const char **failed_call)
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
