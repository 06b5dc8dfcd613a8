// The trace reader under arbitrary bytes: it must return (true, or false with an error), never crash,
// hang or allocate without bound, and a successful parse must give a trace whose stacks can be
// walked. fuzz_reader_main.cpp makes it a libFuzzer target (ALLOCSHIM_FUZZ=ON, clang);
// reader_fuzz_test.cpp runs it as a plain test over seeds and mutations.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace allocshim::trace::fuzz {

// Empty when the input was handled correctly; otherwise what went wrong.
std::string check_input(const std::uint8_t* data, std::size_t size);

}  // namespace allocshim::trace::fuzz
