// exports.hpp - the shim's exported driver entry points: one trampoline per name of
// driver_symbols.def, each jumping through a slot that the loader fills.
#pragma once

#include <span>
#include <string_view>

namespace xmem::cudacount {

// Any driver entry point. Slots hold them and trampolines jump through them with the
// caller's arguments untouched, so the type is never called as such.
using Entry = int (*)();

// Casts between an entry and its real type, through void (*)(), the type GCC's
// -Wcast-function-type lets stand for any function.
template<typename Function>
Function entry_as(Entry entry)
{
	return reinterpret_cast<Function>(reinterpret_cast<void (*)()>(entry));
}
template<typename Function>
Entry as_entry(Function function)
{
	return reinterpret_cast<Entry>(reinterpret_cast<void (*)()>(function));
}

struct Export {
	const char *name;
	Entry *slot;
};

// Every export, sorted by name. The slots are written only while the shim loads (its
// constructor, inside the dlopen() that loads it) and read by the trampolines after.
std::span<const Export> exports();

// The slot of an exported name, or nullptr.
Entry *find_slot(std::string_view name);

// What a slot holds before the shim's constructor has filled it: a call there (the
// driver calling one of its own exports while it loads) gets CUDA_ERROR_NOT_INITIALIZED.
int before_load();

} // namespace xmem::cudacount
