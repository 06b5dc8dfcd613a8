// A tiny library a Python test loads with ctypes to drive the recorder from Python code: the
// allocation "happens" inside a C call, as cudaMalloc does under PyTorch or CuPy. ctypes.CDLL
// releases the GIL around the call (the helper-thread path), ctypes.PyDLL keeps it (the direct path).
#include <string>

#include "trace/recorder.h"

using namespace allocshim;

extern "C" {

__attribute__((visibility("default"))) int pycap_start(const char* path, int stacks) {
  trace::Config c;
  c.path = path;
  c.stacks = static_cast<trace::StackMode>(stacks);
  std::string error;
  return trace::Recorder::start(c, error) ? 0 : -1;
}

__attribute__((visibility("default"))) void pycap_alloc(unsigned long long addr,
                                                        unsigned long long size) {
  if (trace::Recorder* r = trace::recorder()) r->on_alloc(addr, size, 0, 0, Api::alloc, 100);
}

__attribute__((visibility("default"))) void pycap_stop() { trace::Recorder::stop(); }
}
