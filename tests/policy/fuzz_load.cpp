// See fuzz_load.h.
#include "fuzz_load.h"

#include <string_view>
#include <vector>

#include "policy/policy.h"

namespace allocshim::policy::test {
namespace {

bool located(const std::vector<Diagnostic>& errors, const char* file, std::size_t max_column,
             std::string& failure) {
  if (errors.empty()) {
    failure = "rejected without an error";
    return false;
  }
  for (const Diagnostic& d : errors) {
    if (d.file != file || d.line < 1 || d.column < 1 ||
        static_cast<std::size_t>(d.column) > max_column || d.message.empty()) {
      failure = "badly located error: " + d.str();
      return false;
    }
  }
  return true;
}

bool decisions_valid(const Policy& p, std::string& failure) {
  const std::uint64_t sizes[] = {0, 1, 4096, 1ull << 20, 1ull << 30, ~0ull};
  for (std::uint64_t s : sizes)
    for (int api = 0; api < 4; ++api) {
      const Decision d = match(p, s, static_cast<Api>(api), 0, "main\nthrust::x");
      if (d.backend < 0 || static_cast<std::size_t>(d.backend) >= p.backends.size()) {
        failure = "decision names no backend";
        return false;
      }
    }
  return true;
}

bool round_trips(const Policy& p, std::string& failure) {
  const std::string once = to_toml(p);
  Policy again;
  std::vector<Diagnostic> errors;
  LoadOptions all;
  all.kinds = kAllKinds;
  if (!load_string(once, p.source, again, errors, all)) {
    failure = "normalized form does not load: " + errors[0].str() + "\n" + once;
    return false;
  }
  if (to_toml(again) != once) {
    failure = "normalized form is not stable:\n" + once + "---\n" + to_toml(again);
    return false;
  }
  return true;
}

}  // namespace

bool fuzz_one(const std::uint8_t* data, std::size_t size, std::string& failure) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const std::size_t nul = input.find('\0');
  const std::string_view text = input.substr(0, nul);

  LoadOptions all;
  all.kinds = kAllKinds;
  Policy p;
  std::vector<Diagnostic> errors;
  if (load_string(text, "fuzz.toml", p, errors, all)) {
    if (!errors.empty()) {
      failure = "loaded but reported " + errors[0].str();
      return false;
    }
    if (!round_trips(p, failure) || !decisions_valid(p, failure)) return false;
  } else {
    // Columns count bytes from 1; a line is never longer than the input.
    if (!located(errors, "fuzz.toml", text.size() + 1, failure)) return false;
    p = default_policy();
  }

  if (nul == std::string_view::npos) return true;
  const std::string conf(input.substr(nul + 1));
  if (conf.find('\0') != std::string::npos) return true;  // not a C string: the shell can't pass it
  const std::string before = to_toml(p);
  errors.clear();
  if (apply_overrides(p, nullptr, conf.c_str(), errors, all)) {
    return round_trips(p, failure) && decisions_valid(p, failure);
  }
  if (!located(errors, "ALLOCSHIM_CONF", conf.size() + 1, failure)) return false;
  if (to_toml(p) != before) {
    failure = "failed overrides changed the policy";
    return false;
  }
  return true;
}

}  // namespace allocshim::policy::test
