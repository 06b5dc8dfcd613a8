// libFuzzer entry point for the IPC wire (see fuzz_wire.h).
#include <cstdio>
#include <cstdlib>

#include "fuzz_wire.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string failure = allocshim::ipc::fuzz::check_input(data, size);
  if (!failure.empty()) {
    std::fprintf(stderr, "ipc wire fuzz invariant broken: %s\n", failure.c_str());
    std::abort();
  }
  return 0;
}
