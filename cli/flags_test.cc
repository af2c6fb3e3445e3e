#include "cli/flags.h"

#include <cstdlib>

#include "gtest/gtest.h"

namespace pdserve::cli {
namespace {

absl::Status Parse(FlagSet& f, std::vector<std::string> args) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  return f.Parse(static_cast<int>(argv.size()), argv.data());
}

TEST(FlagsTest, ParsesEveryForm) {
  std::string s = "x";
  int64_t i = 1;
  double d = 0.5;
  bool b = false, c = true;
  FlagSet f("t", "test");
  f.String("name", &s, "");
  f.Int("count", &i, "");
  f.Double("ratio", &d, "");
  f.Bool("flag", &b, "");
  f.Bool("other", &c, "");
  f.AllowPositional(1);
  ASSERT_TRUE(Parse(f, {"--name", "abc", "--count=7", "--ratio", "0.25", "--flag", "--no-other",
                        "pos"}).ok());
  EXPECT_EQ(s, "abc");
  EXPECT_EQ(i, 7);
  EXPECT_EQ(d, 0.25);
  EXPECT_TRUE(b);
  EXPECT_FALSE(c);
  EXPECT_TRUE(f.WasSet("count"));
  EXPECT_EQ(f.positional(), std::vector<std::string>{"pos"});
}

TEST(FlagsTest, BooleansAreTrueFalseOneOrZero) {
  bool b = false;
  FlagSet f("t", "test");
  f.Bool("enable-prefix-caching", &b, "");
  ASSERT_TRUE(Parse(f, {"--enable-prefix-caching", "false"}).ok());
  EXPECT_FALSE(b);
  ASSERT_TRUE(Parse(f, {"--enable-prefix-caching", "1"}).ok());
  EXPECT_TRUE(b);
  ASSERT_TRUE(Parse(f, {"--enable-prefix-caching=0"}).ok());
  EXPECT_FALSE(b);
  for (const char* bad : {"--enable-prefix-caching=maybe", "--enable-prefix-caching=yes"}) {
    auto s = Parse(f, {bad});
    EXPECT_NE(s.message().find("--enable-prefix-caching"), absl::string_view::npos) << bad;
  }
  // `--flag maybe`: "maybe" is not a boolean, so it is an argument, which this command refuses.
  auto stray = Parse(f, {"--enable-prefix-caching", "maybe"});
  EXPECT_EQ(stray.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(stray.message().find("'maybe'"), absl::string_view::npos) << stray;
}

TEST(FlagsTest, ErrorsNameTheFlag) {
  int64_t i = 0;
  FlagSet f("t", "test");
  f.Int("count", &i, "");
  auto unknown = Parse(f, {"--bogus", "1"});
  EXPECT_NE(unknown.message().find("--bogus"), absl::string_view::npos);
  FlagSet g("t", "test");
  g.Int("count", &i, "");
  auto bad = Parse(g, {"--count", "seven"});
  EXPECT_NE(bad.message().find("--count"), absl::string_view::npos);
  FlagSet h("t", "test");
  h.Int("count", &i, "");
  EXPECT_FALSE(Parse(h, {"--count"}).ok());
}

TEST(FlagsTest, EnvironmentFallbackAndCommandLineWins) {
  int64_t port = 0;
  setenv("PDSERVE_MAX_NUM_SEQS", "12", 1);
  FlagSet f("t", "test");
  f.Int("max-num-seqs", &port, "");
  ASSERT_TRUE(Parse(f, {}).ok());
  EXPECT_EQ(port, 12);
  FlagSet g("t", "test");
  g.Int("max-num-seqs", &port, "");
  ASSERT_TRUE(Parse(g, {"--max-num-seqs", "3"}).ok());
  EXPECT_EQ(port, 3);
  unsetenv("PDSERVE_MAX_NUM_SEQS");
}

TEST(FlagsTest, IntList) {
  std::vector<int32_t> v;
  ASSERT_TRUE(ParseIntList("1,22,333", "--ids", &v).ok());
  EXPECT_EQ(v, (std::vector<int32_t>{1, 22, 333}));
  EXPECT_NE(ParseIntList("1,x", "--ids", &v).message().find("--ids"), absl::string_view::npos);
  EXPECT_FALSE(ParseIntList("1,,2", "--ids", &v).ok());
}

}  // namespace
}  // namespace pdserve::cli
