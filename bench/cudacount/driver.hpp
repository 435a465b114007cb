// driver.hpp - finding and loading the real CUDA driver behind the shim, never the shim
// itself, and filling every exported slot from it.
#pragma once

#include <string>

namespace xmem::cudacount {

struct LoadedDriver {
	void *handle = nullptr; // dlopen()ed for the life of the process; nullptr: none found
	std::string path; // the file loaded
	std::string why_none; // with no handle: each place tried and why it would not do
};

// XMEM_CUDACOUNT_DRIVER (an absolute path) when set, and only that; otherwise the usual
// places: /usr/lib/x86_64-linux-gnu, /usr/lib64, /usr/local/cuda/compat, then every
// libcuda.so.1 the ld.so cache lists. A file that is this shim (same inode) is skipped.
LoadedDriver load_driver();

// Points every exported slot at the driver's function of that name, or at a stub that
// returns CUDA_ERROR_NOT_FOUND where the driver has none. With no driver, at stubs that
// return CUDA_ERROR_NO_DEVICE, cuInit's saying `why_none` on stderr the first time.
void fill_slots(const LoadedDriver &driver);

// The stubs, so that cuGetProcAddress can tell them from a driver's function.
int missing_in_driver();
int no_driver();

} // namespace xmem::cudacount
