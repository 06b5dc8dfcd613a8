// The node budget's region (shim/node/node_region.h) as another process could leave it: arbitrary
// bytes as the file's contents, or a valid region patched anywhere, then a sequence of operations
// by two members interleaved with more writes and truncations of the file. Every operation must
// return (ok, busy, damaged or closed), never crash, hang or touch memory it should not; a lease it
// grants never exceeds the cap the member passed; an error is one line. node_region_fuzz_main.cpp
// makes it a libFuzzer target (ALLOCSHIM_FUZZ=ON, clang); node_region_test.cpp runs it as a plain
// test over seeds and mutations.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace allocshim::node::fuzz {

// Runs one input in directory `dir` (which it leaves empty). Empty when the input was handled
// correctly; otherwise what went wrong.
std::string check_input(const std::uint8_t* data, std::size_t size, const std::string& dir);

}  // namespace allocshim::node::fuzz
