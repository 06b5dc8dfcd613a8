// The real driver table, filled from libcuda by exact symbol name.
#pragma once

#include <string>

#include "base/driver.h"

namespace allocshim {

// How symbols are looked up in libcuda. The preloaded library passes the real dlsym (its own
// exported dlsym would hand back its wrappers); tools pass ::dlsym.
using SymbolLookup = void* (*)(void* handle, const char* name);

// Finds libcuda (already loaded by the program, or loaded now when `may_load`), fills the table
// once and returns it. Null with `error` set when no usable driver is present.
const Driver* load_real_driver(SymbolLookup lookup, bool may_load, std::string& error);
// The dlopen handle of the libcuda the table points into (null before a successful load).
void* real_driver_handle();

}  // namespace allocshim
