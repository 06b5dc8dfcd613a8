// The context guard (see scoped_context.h).
#include "base/scoped_context.h"

namespace allocshim {

ScopedContext::ScopedContext(const Driver& driver, Context ctx) : driver_(driver) {
  if (ctx == nullptr) return;
  Context current = nullptr;
  if (driver_.ctx_get_current(&current) != res::ok || current == ctx) return;
  if (driver_.ctx_set_current(ctx) == res::ok) {
    saved_ = current;
    switched_ = true;
  }
}

ScopedContext::~ScopedContext() {
  if (switched_) driver_.ctx_set_current(saved_);
}

}  // namespace allocshim
