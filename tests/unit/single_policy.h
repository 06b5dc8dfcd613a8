// The policy most core tests on the fake driver start from: one backend of `kind` serving every
// allocation, freed with `sync`.
#pragma once

#include "policy/policy.h"

namespace allocshim::testing {

inline policy::Policy single(BackendKind kind, FreeSync sync = FreeSync::device) {
  policy::Policy p;
  policy::BackendSpec s;
  s.name = backend_kind_name(kind);
  s.kind = kind;
  p.backends.push_back(s);
  p.default_backend = 0;
  p.default_free_sync = sync;
  p.source = "<test>";
  return p;
}

}  // namespace allocshim::testing
