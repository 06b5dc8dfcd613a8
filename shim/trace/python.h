// Python frames of the allocating thread, for programs running under CPython (>= 3.9), taken
// through the C API the interpreter exports: the shim neither links libpython nor needs the
// program to change.
//
// Reading frames needs the GIL. When the allocating thread holds it (a Python extension calling
// cudaMalloc with the GIL held) the frames are read directly. Frameworks usually release the GIL
// around their native work (PyTorch operators, CuPy's malloc): then a helper thread takes the GIL
// and reads the allocating thread's frames while that thread waits. The allocating thread may hold
// locks another GIL holder wants (PyTorch's allocator mutex, say), so it never waits for the GIL
// itself: it waits for the helper a bounded time and records no Python frames if the GIL did not
// come free in time.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace allocshim::trace {

class PythonStacks {
 public:
  // Called once for each new Python function (code object): id, first line, name, file.
  using Define = std::function<void(std::uint32_t id, std::uint32_t first_line,
                                    const std::string& name, const std::string& file)>;

  explicit PythonStacks(Define define);
  ~PythonStacks();
  PythonStacks(const PythonStacks&) = delete;
  PythonStacks& operator=(const PythonStacks&) = delete;

  // True when the process runs an initialized CPython with the API we need. Cheap after the first
  // call (the answer is re-checked until an interpreter appears, at most every few milliseconds).
  bool available();
  // Python frames of the calling thread, innermost first, as python_frame() values. 0 when the
  // thread runs no Python code or its frames could not be read in time.
  int capture(std::uint64_t* out, int max);
  // An address inside the interpreter's code (PyEval_EvalCode): native frames in that module are
  // the interpreter's own, which Python frames replace in `both` stacks. 0 when unavailable.
  std::uint64_t interpreter_address() const { return interpreter_address_; }
  // Waits that timed out because the GIL stayed busy.
  std::uint64_t timeouts() const;
  // In a forked child the helper thread does not exist.
  void after_fork_child();

  struct Api;
  struct Helper;

 private:
  int read_frames(void* tstate, std::uint64_t* out, int max);
  std::uint32_t function_id(void* code);

  Define define_;
  Api* api_ = nullptr;
  Helper* helper_ = nullptr;
  std::uint64_t interpreter_address_ = 0;
  std::uint64_t next_probe_ns_ = 0;
  bool resolved_ = false;
};

}  // namespace allocshim::trace
