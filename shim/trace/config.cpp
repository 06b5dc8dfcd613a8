// Trace settings: the policy's [trace] table with the environment on top (see recorder.h).
#include <cstdlib>
#include <cstring>
#include <string>

#include "os/env.h"
#include "trace/recorder.h"

namespace allocshim::trace {
namespace {

bool parse_uint(const char* s, std::uint64_t max, std::uint64_t& out) {
  if (!s || !*s) return false;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(s, &end, 10);
  if (*end != '\0' || v == 0 || v > max) return false;
  out = v;
  return true;
}

}  // namespace

bool config_from(const policy::Trace& policy_trace, Config& out, std::string& error) {
  out.path = policy_trace.path;
  out.stacks = static_cast<StackMode>(policy_trace.stacks);
  out.sample = policy_trace.sample ? policy_trace.sample : 1;
  bool ok = true;
  if (const char* path = os::env("ALLOCSHIM_TRACE")) out.path = path;
  if (const char* s = os::env("ALLOCSHIM_TRACE_STACKS")) {
    if (!std::strcmp(s, "off"))
      out.stacks = StackMode::off;
    else if (!std::strcmp(s, "native"))
      out.stacks = StackMode::native;
    else if (!std::strcmp(s, "python"))
      out.stacks = StackMode::python;
    else if (!std::strcmp(s, "both"))
      out.stacks = StackMode::both;
    else {
      error = std::string("ALLOCSHIM_TRACE_STACKS=") + s + ": expected off, native, python or both";
      ok = false;
    }
  }
  std::uint64_t v = 0;
  if (const char* s = os::env("ALLOCSHIM_TRACE_SAMPLE")) {
    if (parse_uint(s, UINT32_MAX, v)) {
      out.sample = static_cast<std::uint32_t>(v);
    } else {
      error = std::string("ALLOCSHIM_TRACE_SAMPLE=") + s + ": expected a positive integer";
      ok = false;
    }
  }
  if (const char* s = os::env("ALLOCSHIM_TRACE_DEPTH")) {
    if (parse_uint(s, 200, v)) {
      out.max_depth = static_cast<int>(v);
    } else {
      error = std::string("ALLOCSHIM_TRACE_DEPTH=") + s + ": expected 1..200";
      ok = false;
    }
  }
  return ok;
}

}  // namespace allocshim::trace
