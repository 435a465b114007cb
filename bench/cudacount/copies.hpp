// copies.hpp - the counting wrappers of the driver's copy and memset entry points, and
// the cuGetProcAddress that hands them out.
#pragma once

namespace xmem::cudacount {

// After fill_slots(): each copy and memset name's slot gets its counting wrapper (which
// calls what the slot held), and cuGetProcAddress's and cuGetProcAddress_v2's get the
// wrappers that swap the driver's copy functions for counting ones.
void install_counters();

} // namespace xmem::cudacount
