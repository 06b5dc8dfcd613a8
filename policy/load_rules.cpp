// [[rules]]: conditions on an allocation (size, api, device, callsite) and what serves it. First
// match wins, so a rule that an earlier rule covers entirely can never match: that is reported as
// an error rather than left for the user to discover in a trace.
#include <algorithm>
#include <iterator>
#include <map>

#include "policy/glob.h"
#include "policy/loader.h"
#include "policy/size.h"

namespace allocshim::policy::detail {
namespace {

constexpr std::string_view kRuleKeys[] = {"size",     "api",     "device",
                                          "callsite", "backend", "free_sync"};
// Only these APIs are served by a backend; host and create are accounted, never matched.
constexpr std::string_view kApis[] = {"alloc", "pitch", "managed", "async"};
constexpr std::uint32_t kRuleApiMask = (1u << kApiCount) - 1;
constexpr std::string_view kFreeSync[] = {"device", "barrier", "none"};
constexpr std::int64_t kMaxDeviceId = static_cast<std::int64_t>(kMaxDevices) - 1;

// Calls `each` for a scalar or for every element of an array; false (reported) when empty.
template <typename Each>
bool for_each_item(const toml::node& v, std::string_view key, Loader& L, Each each) {
  if (const auto* a = v.as_array()) {
    if (a->empty()) {
      L.report.at(v, quoted(key) + " is an empty list: the rule could never match");
      return false;
    }
    bool ok = true;
    for (const toml::node& e : *a) ok = each(e) && ok;
    return ok;
  }
  return each(v);
}

void load_size(const toml::node& v, Rule& r, Loader& L) {
  const auto* s = v.as_string();
  if (!s) {
    L.report.at(v, "\"size\" must be a condition such as \">= 256MiB\", \"< 1MiB\" or " +
                       std::string("\"64KiB..16MiB\", not ") + type_name(v));
    return;
  }
  std::string error;
  if (!parse_size_range(s->get(), r.size_min, r.size_max, error))
    L.report.at(v, "bad size condition " + toml_quote(s->get()) + ": " + error);
}

void load_api(const toml::node& v, Rule& r, Loader& L) {
  std::uint32_t mask = 0;
  const bool ok = for_each_item(v, "api", L, [&](const toml::node& e) {
    const auto i = get_enum(e, "api", kApis, L);
    if (i) mask |= 1u << static_cast<unsigned>(*i);  // kApis follows the order of enum Api
    return i.has_value();
  });
  if (ok) r.api_mask = mask;
}

void load_device(const toml::node& v, Rule& r, Loader& L) {
  if (!v.is_integer() && !v.is_array()) {
    L.report.at(
        v, "\"device\" must be a device id or a list of them such as [0, 1], not " + type_name(v));
    return;
  }
  std::uint64_t mask = 0;
  const bool ok = for_each_item(v, "device", L, [&](const toml::node& e) {
    const auto id = get_int(e, "device", 0, kMaxDeviceId, L);
    if (id) mask |= 1ull << *id;
    return id.has_value();
  });
  if (ok) r.device_mask = mask;
}

void load_callsite(const toml::node& v, Rule& r, Loader& L) {
  const auto s = get_string(v, "callsite", L);
  if (!s) return;
  std::string error;
  if (s->empty())
    L.report.at(v, "\"callsite\" is empty; leave it out to match any call stack");
  else if (!glob_valid(*s, error))
    L.report.at(v, "bad callsite glob " + toml_quote(*s) + ": " + error);
  else
    r.callsite = *s;
}

// True when `earlier`'s conditions other than the size hold for every allocation `later` matches.
bool conditions_cover(const Rule& earlier, const Rule& later) {
  const std::uint32_t ea = earlier.api_mask & kRuleApiMask, la = later.api_mask & kRuleApiMask;
  if ((la & ~ea) != 0) return false;
  if ((later.device_mask & ~earlier.device_mask) != 0) return false;
  if (earlier.callsite.empty()) return true;
  // Glob inclusion in general is not decided here; equal globs and all-star globs are.
  if (later.callsite.empty()) return false;
  return earlier.callsite == later.callsite || glob_matches_all(earlier.callsite);
}

// True when every allocation `later` matches is also matched by `earlier`.
bool covers(const Rule& earlier, const Rule& later) {
  return earlier.size_min <= later.size_min && earlier.size_max >= later.size_max &&
         conditions_cover(earlier, later);
}

// Rules with the same api, device and callsite conditions, by size range: the ranges none of which
// an earlier one covers, kept as a staircase (size_min ascending, size_max ascending), so that
// "does an earlier rule of this shape cover [min, max]" is one lookup.
struct Shape {
  const Rule* rule;                               // any of them: the conditions besides the size
  std::map<std::uint64_t, std::uint64_t> stairs;  // size_min -> size_max
  bool covers(std::uint64_t lo, std::uint64_t hi) const {
    auto it = stairs.upper_bound(lo);
    return it != stairs.begin() && std::prev(it)->second >= hi;
  }
  void add(std::uint64_t lo, std::uint64_t hi) {
    auto it = stairs.lower_bound(lo);
    while (it != stairs.end() && it->second <= hi) it = stairs.erase(it);
    stairs[lo] = hi;
  }
};

// Reports each valid rule that an earlier valid rule covers entirely, naming the first such rule.
// Linear in the rules times the distinct shapes (api, device, callsite), not quadratic in the rules;
// only a rule found covered is compared with the earlier ones one by one, for the message.
void report_shadowed(const std::vector<Rule>& all, const std::vector<bool>& valid, Loader& L) {
  std::vector<Shape> shapes;
  for (std::size_t j = 0; j < all.size(); ++j) {
    if (!valid[j]) continue;
    const Rule& r = all[j];
    bool covered = false;
    Shape* own = nullptr;
    for (Shape& s : shapes) {
      if (!covered && s.covers(r.size_min, r.size_max) && conditions_cover(*s.rule, r))
        covered = true;
      if (s.rule->api_mask == r.api_mask && s.rule->device_mask == r.device_mask &&
          s.rule->callsite == r.callsite)
        own = &s;
    }
    if (!covered) {
      if (!own) own = &shapes.emplace_back(Shape{&r, {}});
      own->add(r.size_min, r.size_max);
      continue;
    }
    for (std::size_t i = 0; i < j; ++i) {
      if (!valid[i] || !covers(all[i], r)) continue;
      L.report.at(r.line, r.column,
                  "rule " + std::to_string(j + 1) + " can never match: rule " +
                      std::to_string(i + 1) + " (line " + std::to_string(all[i].line) +
                      ") matches every allocation it would");
      break;
    }
  }
}

}  // namespace

void load_rules(const toml::node& node, Loader& L) {
  const auto* rules = node.as_array();
  if (!rules || !rules->is_array_of_tables()) {
    L.report.at(node, "\"rules\" must be an array of tables ([[rules]]), not " +
                          (rules ? std::string("an array of values") : type_name(node)));
    return;
  }
  std::vector<bool> valid;
  int number = 0;
  for (const toml::node& e : *rules) {
    ++number;
    const toml::table& t = *e.as_table();
    const std::size_t errors_before = L.report.count();
    const std::string where = "in rule " + std::to_string(number);
    check_keys(t, kRuleKeys, where, L);

    Rule r;
    r.line = static_cast<int>(t.source().begin.line);
    r.column = static_cast<int>(t.source().begin.column);
    r.backend = -1;  // the default backend, unless the rule names one
    if (const auto* v = t.get("size")) load_size(*v, r, L);
    if (const auto* v = t.get("api")) load_api(*v, r, L);
    if (const auto* v = t.get("device")) load_device(*v, r, L);
    if (const auto* v = t.get("callsite")) load_callsite(*v, r, L);
    if (const auto* v = t.get("backend")) r.backend = resolve_backend(*v, L);
    if (const auto* v = t.get("free_sync"))
      if (const auto x = get_enum(*v, "free_sync", kFreeSync, L))
        r.free_sync = static_cast<FreeSync>(*x);
    if (!t.get("backend") && !t.get("free_sync"))
      L.report.at(t, "rule " + std::to_string(number) +
                         " sets neither \"backend\" nor \"free_sync\": it would change nothing");

    valid.push_back(L.report.count() == errors_before);
    L.policy.rules.push_back(std::move(r));
  }

  report_shadowed(L.policy.rules, valid, L);
}

}  // namespace allocshim::policy::detail
