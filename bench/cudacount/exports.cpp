// exports.cpp - the trampolines: each driver name of driver_symbols.def is exported as
// `jmp *slot(%rip)`, so the caller's arguments reach whatever the slot holds untouched.
//
// Why trampolines and not a dependency on the real driver: both are "libcuda.so.1", and
// callers dlsym() their handle on the shim, which searches the shim and its own
// dependencies only. A name the real driver lacks still resolves here (to a stub that
// returns CUDA_ERROR_NOT_FOUND, see driver.cpp): the exports are fixed at build time.
#include "exports.hpp"

#include <algorithm>
#include <iterator>

#if !defined(__x86_64__)
#error "the cudacount shim's trampolines are x86-64 assembly"
#endif

// The slots: hidden, so the trampolines reach them PC-relative with no GOT entry, and
// constant-initialized (the address of a function), so they are valid before any
// constructor runs.
extern "C" {
#define XMEM_CUDACOUNT_EXPORT(name)                                                                                    \
	__attribute__((visibility("hidden"))) xmem::cudacount::Entry xmem_cudacount_slot_##name =                      \
		&xmem::cudacount::before_load;
#include "driver_symbols.def"
#undef XMEM_CUDACOUNT_EXPORT
}

// The exported names themselves (the version script keeps cu* and nothing else).
#define XMEM_CUDACOUNT_EXPORT(name)                                                                                    \
	asm(".pushsection .text\n"                                                                                     \
	    ".globl " #name "\n"                                                                                       \
	    ".type " #name ", @function\n"                                                                             \
	    ".p2align 4\n" #name ":\n"                                                                                 \
	    "\tjmp *xmem_cudacount_slot_" #name "(%rip)\n"                                                             \
	    ".size " #name ", .-" #name "\n"                                                                           \
	    ".popsection\n");
#include "driver_symbols.def"
#undef XMEM_CUDACOUNT_EXPORT

namespace xmem::cudacount {

namespace {

constexpr Export export_table[] = {
#define XMEM_CUDACOUNT_EXPORT(name) { #name, &xmem_cudacount_slot_##name },
#include "driver_symbols.def"
#undef XMEM_CUDACOUNT_EXPORT
};

constexpr bool sorted_and_unique()
{
	return std::adjacent_find(std::begin(export_table), std::end(export_table),
				  [](const Export &a, const Export &b) {
					  return std::string_view(a.name) >= std::string_view(b.name);
				  }) == std::end(export_table);
}
// find_slot() searches by halves.
static_assert(sorted_and_unique(), "driver_symbols.def must be sorted, each name once (driver_symbols.py does)");

} // namespace

std::span<const Export> exports()
{
	return export_table;
}

Entry *find_slot(std::string_view name)
{
	const auto *it =
		std::lower_bound(std::begin(export_table), std::end(export_table), name,
				 [](const Export &e, std::string_view n) { return std::string_view(e.name) < n; });
	return it != std::end(export_table) && it->name == name ? it->slot : nullptr;
}

int before_load()
{
	return 3; // CUDA_ERROR_NOT_INITIALIZED (this file keeps cuda.h's declarations out)
}

} // namespace xmem::cudacount
