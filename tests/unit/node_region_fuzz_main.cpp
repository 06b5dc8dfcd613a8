// libFuzzer entry point for the node budget's region (see node_region_fuzz.h).
#include <stdlib.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "node_region_fuzz.h"

namespace {

std::string g_dir;

void remove_dir() { ::rmdir(g_dir.c_str()); }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (g_dir.empty()) {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/allocshim-region-fuzz-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) std::abort();
    g_dir = tmpl;
    std::atexit(remove_dir);
  }
  if (!allocshim::node::fuzz::check_input(data, size, g_dir).empty()) std::abort();
  return 0;
}
