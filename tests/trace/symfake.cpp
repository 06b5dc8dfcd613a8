// A tiny library built twice with different build-ids and function names at the same offsets
// (tests/trace/CMakeLists.txt): symbolize_test records a stack through one build and reads it
// against the other.
extern "C" __attribute__((noinline, visibility("default"))) void SYMFAKE_NAME(
    void (*callback)(void*), void* arg) {
  callback(arg);
  asm volatile("" ::: "memory");  // keeps the call from becoming a tail call
}
