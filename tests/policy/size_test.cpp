// Sizes, percentages and size conditions.
#include <gtest/gtest.h>

#include "policy/policy.h"
#include "policy/size.h"

namespace allocshim::policy {
namespace {

std::uint64_t size_of(std::string_view s) {
  std::uint64_t v = 0;
  std::string error;
  EXPECT_TRUE(parse_size(s, v, error)) << s << ": " << error;
  return v;
}

std::string size_error(std::string_view s) {
  std::uint64_t v = 0;
  std::string error;
  EXPECT_FALSE(parse_size(s, v, error)) << s << " parsed as " << v;
  return error;
}

TEST(Size, BinaryAndDecimalUnits) {
  EXPECT_EQ(size_of("0"), 0u);
  EXPECT_EQ(size_of("4096"), 4096u);
  EXPECT_EQ(size_of("17B"), 17u);
  EXPECT_EQ(size_of("1KiB"), 1024u);
  EXPECT_EQ(size_of("2MiB"), 2u << 20);
  EXPECT_EQ(size_of("40GiB"), 40ull << 30);
  EXPECT_EQ(size_of("3TiB"), 3ull << 40);
  EXPECT_EQ(size_of("1KB"), 1000u);
  EXPECT_EQ(size_of("5MB"), 5'000'000u);
  EXPECT_EQ(size_of("2GB"), 2'000'000'000u);
  EXPECT_EQ(size_of("1TB"), 1'000'000'000'000u);
}

TEST(Size, UnitsAreCaseInsensitiveAndSpacesAllowed) {
  EXPECT_EQ(size_of("256mib"), 256ull << 20);
  EXPECT_EQ(size_of("256MIB"), 256ull << 20);
  EXPECT_EQ(size_of("  2 GiB "), 2ull << 30);
  EXPECT_EQ(size_of("3mb"), 3'000'000u);
  EXPECT_EQ(size_of("1b"), 1u);
}

TEST(Size, ExactFractions) {
  EXPECT_EQ(size_of("1.5GiB"), 1610612736u);
  EXPECT_EQ(size_of("0.5KiB"), 512u);
  EXPECT_EQ(size_of("1.25MB"), 1'250'000u);
  EXPECT_EQ(size_of("2.0B"), 2u);
  EXPECT_EQ(size_error("1.3B"), "not a whole number of bytes");
  EXPECT_EQ(size_error("0.1KiB"), "not a whole number of bytes");
  EXPECT_EQ(size_error("1.KiB"), "expected digits after the decimal point");
}

TEST(Size, Errors) {
  EXPECT_EQ(size_error(""), "empty size");
  EXPECT_EQ(size_error("   "), "empty size");
  EXPECT_EQ(size_error("-3MiB"), "a size cannot be negative");
  EXPECT_EQ(size_error("12XB"),
            "unknown unit \"XB\" (use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)");
  EXPECT_EQ(size_error("12 M"), "unknown unit \"M\" (use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)");
  EXPECT_EQ(size_error("MiB"),
            "expected a number, then a unit (B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)");
  EXPECT_EQ(size_error("1e3"), "unknown unit \"e3\" (use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)");
  EXPECT_EQ(size_error("1 2MiB"),
            "unknown unit \"2MiB\" (use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)");
}

TEST(Size, SixtyFourBitLimit) {
  EXPECT_EQ(size_of("16777215TiB"), 16777215ull << 40);
  EXPECT_EQ(size_of("18446744073709551615"), ~0ull);
  EXPECT_EQ(size_error("16777216TiB"), "too large for 64 bits");
  EXPECT_EQ(size_error("18446744073709551616"), "too large for 64 bits");
  EXPECT_EQ(size_error("99999999999999999999999999999999999999999999GiB"), "too large for 64 bits");
}

TEST(Size, FormatPicksLargestExactBinaryUnit) {
  EXPECT_EQ(format_size(0), "0B");
  EXPECT_EQ(format_size(1000), "1KB");
  EXPECT_EQ(format_size(1001), "1001B");
  EXPECT_EQ(format_size(3'000'000'000), "3GB");
  EXPECT_EQ(format_size(1024), "1KiB");
  EXPECT_EQ(format_size(1536 * 1024), "1536KiB");
  EXPECT_EQ(format_size(256ull << 20), "256MiB");
  EXPECT_EQ(format_size(40ull << 30), "40GiB");
  EXPECT_EQ(format_size(2ull << 40), "2TiB");
  for (std::uint64_t v :
       {0ull, 1ull, 1000ull, 4097ull, 3ull << 20, 1610612736ull, 5'000'000ull, ~0ull})
    EXPECT_EQ(size_of(format_size(v)), v) << v;
}

TEST(Percent, ParsesZeroToHundred) {
  double p = 0;
  std::string e;
  EXPECT_TRUE(parse_percent("60%", p, e));
  EXPECT_EQ(p, 60.0);
  EXPECT_TRUE(parse_percent(" 12.5 % ", p, e));
  EXPECT_EQ(p, 12.5);
  EXPECT_TRUE(parse_percent("0%", p, e));
  EXPECT_TRUE(parse_percent("100%", p, e));
  EXPECT_FALSE(parse_percent("100.5%", p, e));
  EXPECT_EQ(e, "must be between 0% and 100%");
  EXPECT_FALSE(parse_percent("-1%", p, e));
  EXPECT_EQ(e, "must be between 0% and 100%");
  EXPECT_FALSE(parse_percent("60", p, e));
  EXPECT_EQ(e, "expected a percentage such as \"60%\"");
  EXPECT_FALSE(parse_percent("sixty%", p, e));
  EXPECT_FALSE(parse_percent("%", p, e));
  EXPECT_EQ(format_percent(60), "60%");
  EXPECT_EQ(format_percent(12.5), "12.5%");
}

struct Range {
  std::uint64_t min, max;
};
Range range_of(std::string_view s) {
  Range r{1, 1};
  std::string error;
  EXPECT_TRUE(parse_size_range(s, r.min, r.max, error)) << s << ": " << error;
  return r;
}
std::string range_error(std::string_view s) {
  std::uint64_t a = 0, b = 0;
  std::string error;
  EXPECT_FALSE(parse_size_range(s, a, b, error)) << s;
  return error;
}

TEST(SizeRange, AllSpellings) {
  constexpr std::uint64_t M = 1ull << 20;
  auto r = range_of(">= 256MiB");
  EXPECT_EQ(r.min, 256 * M);
  EXPECT_EQ(r.max, kUnlimited);
  r = range_of("> 1MiB");
  EXPECT_EQ(r.min, M + 1);
  r = range_of("< 1MiB");
  EXPECT_EQ(r.min, 0u);
  EXPECT_EQ(r.max, M - 1);
  r = range_of("<=1MiB");
  EXPECT_EQ(r.max, M);
  r = range_of("= 4KiB");
  EXPECT_EQ(r.min, 4096u);
  EXPECT_EQ(r.max, 4096u);
  r = range_of("== 4KiB");
  EXPECT_EQ(r.min, 4096u);
  EXPECT_EQ(r.max, 4096u);
  // A range includes its lower end and excludes its upper end, so ranges tile without overlap.
  r = range_of("64KiB..16MiB");
  EXPECT_EQ(r.min, 64u * 1024);
  EXPECT_EQ(r.max, 16 * M - 1);
  r = range_of("..16MiB");
  EXPECT_EQ(r.min, 0u);
  EXPECT_EQ(r.max, 16 * M - 1);
  r = range_of("16MiB..");
  EXPECT_EQ(r.min, 16 * M);
  EXPECT_EQ(r.max, kUnlimited);
  r = range_of("1.5KiB .. 2KiB");
  EXPECT_EQ(r.min, 1536u);
}

TEST(SizeRange, Errors) {
  EXPECT_EQ(range_error("1MiB"),
            "needs a comparison: \">= X\", \"< X\", \"= X\" or a range \"A..B\"");
  EXPECT_EQ(range_error("< 0"), "matches no size");
  EXPECT_EQ(range_error("> 18446744073709551615"), "matches no size");
  EXPECT_EQ(range_error("4MiB..1MiB"), "matches no size (the upper end is exclusive)");
  EXPECT_EQ(range_error("1MiB..1MiB"), "matches no size (the upper end is exclusive)");
  EXPECT_EQ(range_error(">= 12XB"),
            "unknown unit \"XB\" (use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)");
  EXPECT_EQ(range_error(">="), "empty size");
}

TEST(SizeRange, FormatRoundTrips) {
  const char* spellings[] = {">= 256MiB", "< 1MiB", "64KiB..16MiB", "= 4KiB", "> 1MiB",
                             "<= 2GiB",   "..1KiB", "1GB..",        "== 0"};
  for (const char* s : spellings) {
    const Range r = range_of(s);
    const std::string canon = format_size_range(r.min, r.max);
    const Range back = range_of(canon);
    EXPECT_EQ(back.min, r.min) << s << " -> " << canon;
    EXPECT_EQ(back.max, r.max) << s << " -> " << canon;
  }
  EXPECT_EQ(format_size_range(0, kUnlimited), "");
  EXPECT_EQ(format_size_range(256ull << 20, kUnlimited), ">= 256MiB");
  EXPECT_EQ(format_size_range(0, (1ull << 20) - 1), "< 1MiB");
  EXPECT_EQ(format_size_range(65536, (16ull << 20) - 1), "64KiB..16MiB");
  EXPECT_EQ(format_size_range(4096, 4096), "= 4KiB");
  // "> X" and "<= X" where they avoid a byte count.
  EXPECT_EQ(format_size_range((1ull << 20) + 1, kUnlimited), "> 1MiB");
  EXPECT_EQ(format_size_range(0, 2ull << 30), "<= 2GiB");
  EXPECT_EQ(format_size_range(1, kUnlimited), ">= 1B");
}

}  // namespace
}  // namespace allocshim::policy
