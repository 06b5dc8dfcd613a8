// libFuzzer entry point for the trace reader past the compression layer (see fuzz_reader.h).
#include <cstdio>
#include <cstdlib>

#include "fuzz_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string failure = allocshim::analysis::fuzz::check_records(data, size);
  if (!failure.empty()) {
    std::fprintf(stderr, "trace records fuzz invariant broken: %s\n", failure.c_str());
    std::abort();
  }
  return 0;
}
