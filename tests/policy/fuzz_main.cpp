// libFuzzer entry point for the policy loader; the checks live in fuzz_load.cpp.
// Build and run: see tests/FUZZING.md.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "fuzz_load.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string failure;
  if (!allocshim::policy::test::fuzz_one(data, size, failure)) {
    std::fprintf(stderr, "policy fuzz invariant broken: %s\n", failure.c_str());
    std::abort();
  }
  return 0;
}
