// The policy fuzzer's checks, shared by the libFuzzer target (fuzz_main.cpp) and the plain test
// that runs its seed corpus (corpus_test.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace allocshim::policy::test {

// Loads `data` as a policy; the bytes after the first NUL, if any, are applied as ALLOCSHIM_CONF.
// Returns false with `failure` set when an invariant breaks: a valid policy whose normalized form
// does not load back to itself, an error without a position, an override that fails but changes
// the policy, a decision that names no backend.
bool fuzz_one(const std::uint8_t* data, std::size_t size, std::string& failure);

}  // namespace allocshim::policy::test
