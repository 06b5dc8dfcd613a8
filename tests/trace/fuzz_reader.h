// The trace reader under arbitrary bytes: it must return (true, or false with an error), never crash,
// hang or allocate without bound, and a successful parse must give a trace whose stacks can be
// walked. fuzz_reader_main.cpp and fuzz_records_main.cpp make libFuzzer targets of them
// (ALLOCSHIM_FUZZ=ON, clang); reader_fuzz_test.cpp runs both as plain tests over seeds and mutations.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace allocshim::analysis::fuzz {

// Empty when the input was handled correctly; otherwise what went wrong.
std::string check_input(const std::uint8_t* data, std::size_t size);

// The same past the compression layer: `data` is a chunk's decoded records (after a first byte that
// says into how many chunks to split them), framed and compressed as the writer does, read by both
// readers (parse_trace and the two passes of TraceFile), which must agree.
std::string check_records(const std::uint8_t* data, std::size_t size);

}  // namespace allocshim::analysis::fuzz
