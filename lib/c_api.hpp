// c_api.hpp - what the C API's files share: the handles behind xmem.h's opaque types,
// and how a C++ result becomes a status code and a per-thread message.
#pragma once

#include <xmem/xmem.h>
#include <xmem/xmem.hpp>

#include <chrono>
#include <memory>
#include <new>
#include <string>

struct xmem_pool {
	std::shared_ptr<xmem::BufferPool> pool;
	std::string format; // backs xmem_pool_format()
};

struct xmem_buffer {
	xmem::BufferGuard guard;
};

namespace xmem::capi {

// Sets this thread's message (xmem_last_error) and returns the status.
int fail(const Error &e);
int fail(int code, const char *message);

template<size_t N>
bool all_zero(const uint32_t (&words)[N])
{
	for (uint32_t w : words)
		if (w != 0)
			return false;
	return true;
}

template<typename T>
int status(const Result<T> &r)
{
	return r ? XMEM_OK : fail(r.error());
}

// A new handle for R's guard in *OUT, or R's error.
int put_buffer(Result<BufferGuard> &&r, xmem_buffer **out);

// F's status; an exception is turned into one here: none crosses the C API.
template<typename F>
int guarded(F f)
{
	try {
		return f();
	} catch (const std::bad_alloc &) {
		return fail(XMEM_ENOMEM, "out of memory");
	} catch (const std::exception &e) {
		return fail(XMEM_ESYSTEM, e.what());
	}
}

inline std::chrono::nanoseconds ns(int64_t v)
{
	return std::chrono::nanoseconds(v);
}

} // namespace xmem::capi
