// libFuzzer entry point for the trace reader (see fuzz_reader.h).
#include <cstdlib>

#include "fuzz_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (!allocshim::analysis::fuzz::check_input(data, size).empty()) std::abort();
  return 0;
}
