// `native`: every request goes straight to the driver's own allocation call, every free to the
// matching free. The reference the other backends are measured against, and the fallback when a
// policy cannot be served.
#pragma once

#include <memory>
#include <string>

#include "core/backend.h"

namespace allocshim {

std::unique_ptr<Backend> make_native_backend(std::string name, const Driver& driver);

}  // namespace allocshim
