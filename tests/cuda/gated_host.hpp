// gated_host.hpp - page-locked host memory for the CUDA tests and their peer: a gate
// word a stream can be held on, then data.
#pragma once

#include "cuda/driver.hpp"

#include <cstddef>
#include <cstdint>

#include <sys/mman.h>
#include <unistd.h>

namespace xmem::test {

// A page of page-locked host memory: a gate word streams wait on (device address
// gate_dev) and a destination for asynchronous copies that stay asynchronous on a real
// GPU (a pageable destination makes a device-to-host copy synchronous there).
struct GatedHost {
	explicit GatedHost(size_t bytes) : size(page + bytes)
	{
		d = xmem::cuda::driver().value();
		base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		ok = base != MAP_FAILED &&
		     d->cuMemHostRegister(base, size, CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE) ==
			     CUDA_SUCCESS &&
		     d->cuMemHostGetDevicePointer(&gate_dev, base, 0) == CUDA_SUCCESS;
	}
	~GatedHost()
	{
		if (base == MAP_FAILED)
			return;
		d->cuMemHostUnregister(base);
		munmap(base, size);
	}
	uint64_t *gate() const { return static_cast<uint64_t *>(base); }
	uint32_t *data() const { return reinterpret_cast<uint32_t *>(static_cast<char *>(base) + page); }
	void open() const { __atomic_store_n(gate(), 1, __ATOMIC_RELEASE); }

	const size_t page = size_t(sysconf(_SC_PAGESIZE));
	size_t size;
	const xmem::cuda::Driver *d = nullptr;
	void *base = MAP_FAILED;
	CUdeviceptr gate_dev = 0;
	bool ok = false;
};

} // namespace xmem::test
