// The context guard: every backend wraps driver calls that act on the current context in it.
#pragma once

#include "base/driver.h"
#include "base/types.h"

namespace allocshim {

// Makes `ctx` current on this thread for the scope and restores the previous context after. Events,
// streams and cuCtxSynchronize act on the *current* context, but a thread may free memory of
// another device than its current one. One ctx_get_current when no switch is needed; a null `ctx`
// (not known) does nothing.
class ScopedContext {
 public:
  ScopedContext(const Driver& driver, Context ctx);
  ~ScopedContext();
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;

 private:
  const Driver& driver_;
  Context saved_ = nullptr;
  bool switched_ = false;
};

}  // namespace allocshim
