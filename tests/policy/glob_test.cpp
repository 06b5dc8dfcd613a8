// Callsite globs.
#include <gtest/gtest.h>

#include <string>

#include "policy/glob.h"

namespace allocshim::policy {
namespace {

// Each case: pattern, name, whether the pattern matches the name.
struct GlobCase {
  const char* pattern;
  std::string name;
  bool matches;
};

TEST(Glob, StarsQuestionMarksAndSets) {
  const GlobCase cases[] = {
      {"*thrust*", "thrust::detail::temporary_allocator<char>::allocate", true},
      {"*thrust*", "void cub::DeviceRadixSort<thrust::tag>", true},
      {"*thrust*", "at::native::empty_cuda", false},
      {"*", "", true},
      {"*", "anything/at all::x", true},
      {"lib?.so", "libc.so", true},
      {"lib?.so", "libcc.so", false},
      {"a*b*c", "aXXbYYc", true},
      {"a*b*c", "aXXbYY", false},
      {"*.so*", "/usr/lib/libtorch_cuda.so.2", true},
      {"exact", "exactly", false},
      {"exact", "exact", true},
      {"**a**", "bab", true},
      {"cuda[0-9]", "cuda7", true},
      {"cuda[0-9]", "cudax", false},
      {"[!a]bc", "xbc", true},
      {"[!a]bc", "abc", false},
      {"[^a]bc", "xbc", true},
      {"[]]", "]", true},
      {"[a-cx]*", "xylophone", true},
      {"\\*", "*", true},
      {"\\*", "a", false},
      // An unterminated set is a literal '[' (fnmatch's behaviour); glob_valid rejects it first.
      {"[abc", "[abc", true},
  };
  for (const GlobCase& c : cases)
    EXPECT_EQ(glob_match(c.pattern, c.name), c.matches) << c.pattern << " ~ " << c.name;
}

TEST(Glob, PathologicalPatternStaysFast) {
  const std::string name(10000, 'a');
  EXPECT_FALSE(glob_match("*a*a*a*a*a*a*a*a*b", name));
}

TEST(Glob, CallsiteMatchesAnyFrame) {
  const std::string frames = "main\n/usr/lib/libcupy.so\ncupy::memory::alloc";
  EXPECT_TRUE(callsite_match("main", frames));
  EXPECT_TRUE(callsite_match("*libcupy*", frames));
  EXPECT_TRUE(callsite_match("cupy::*", frames));
  EXPECT_FALSE(callsite_match("*torch*", frames));
  EXPECT_FALSE(callsite_match("main\n/usr", frames));  // never across frames
  EXPECT_FALSE(callsite_match("*", ""));               // no stack: nothing to match
  EXPECT_FALSE(callsite_match("", "main"));
}

TEST(Glob, Validity) {
  std::string e;
  EXPECT_TRUE(glob_valid("*thrust*", e));
  EXPECT_TRUE(glob_valid("[a-z]?\\*", e));
  EXPECT_FALSE(glob_valid("*[abc", e));
  EXPECT_EQ(e, "has a '[' without a closing ']'");
  EXPECT_FALSE(glob_valid("abc\\", e));
  EXPECT_EQ(e, "ends with a lone '\\'");
  EXPECT_TRUE(glob_matches_all("*"));
  EXPECT_TRUE(glob_matches_all("***"));
  EXPECT_FALSE(glob_matches_all("*a"));
  EXPECT_FALSE(glob_matches_all(""));
}

}  // namespace
}  // namespace allocshim::policy
