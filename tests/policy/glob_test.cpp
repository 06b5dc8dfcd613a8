// Callsite globs.
#include <gtest/gtest.h>

#include "policy/glob.h"

namespace allocshim::policy {
namespace {

TEST(Glob, StarsAndQuestionMarks) {
  EXPECT_TRUE(glob_match("*thrust*", "thrust::detail::temporary_allocator<char>::allocate"));
  EXPECT_TRUE(glob_match("*thrust*", "void cub::DeviceRadixSort<thrust::tag>"));
  EXPECT_FALSE(glob_match("*thrust*", "at::native::empty_cuda"));
  EXPECT_TRUE(glob_match("*", ""));
  EXPECT_TRUE(glob_match("*", "anything/at all::x"));
  EXPECT_TRUE(glob_match("lib?.so", "libc.so"));
  EXPECT_FALSE(glob_match("lib?.so", "libcc.so"));
  EXPECT_TRUE(glob_match("a*b*c", "aXXbYYc"));
  EXPECT_FALSE(glob_match("a*b*c", "aXXbYY"));
  EXPECT_TRUE(glob_match("*.so*", "/usr/lib/libtorch_cuda.so.2"));
  EXPECT_FALSE(glob_match("exact", "exactly"));
  EXPECT_TRUE(glob_match("exact", "exact"));
  EXPECT_TRUE(glob_match("**a**", "bab"));
}

TEST(Glob, Sets) {
  EXPECT_TRUE(glob_match("cuda[0-9]", "cuda7"));
  EXPECT_FALSE(glob_match("cuda[0-9]", "cudax"));
  EXPECT_TRUE(glob_match("[!a]bc", "xbc"));
  EXPECT_FALSE(glob_match("[!a]bc", "abc"));
  EXPECT_TRUE(glob_match("[^a]bc", "xbc"));
  EXPECT_TRUE(glob_match("[]]", "]"));
  EXPECT_TRUE(glob_match("[a-cx]*", "xylophone"));
  EXPECT_TRUE(glob_match("\\*", "*"));
  EXPECT_FALSE(glob_match("\\*", "a"));
  // An unterminated set is a literal '[' (fnmatch's behaviour); glob_valid rejects it first.
  EXPECT_TRUE(glob_match("[abc", "[abc"));
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
  EXPECT_FALSE(callsite_match("*", ""));                // no stack: nothing to match
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
