#include "common/tokenizer/split_regex.h"

#include "gtest/gtest.h"

namespace pdserve {
namespace {

std::vector<std::string> Split(std::string_view pattern, std::string_view text) {
  auto re = SplitRegex::Create(pattern);
  EXPECT_TRUE(re.ok()) << re.status();
  std::vector<std::string> out;
  for (auto [b, e] : (*re)->FindAll(text)) out.emplace_back(text.substr(b, e - b));
  return out;
}

using V = std::vector<std::string>;

// Expected values follow the look-ahead semantics of the original (fancy-regex) patterns.
TEST(SplitRegexTest, Gpt2Pattern) {
  EXPECT_EQ(Split(kGpt2SplitPattern, "Hello world"), (V{"Hello", " world"}));
  EXPECT_EQ(Split(kGpt2SplitPattern, "Hello   world"), (V{"Hello", "  ", " world"}));
  EXPECT_EQ(Split(kGpt2SplitPattern, "Hello\n\nworld"), (V{"Hello", "\n", "\n", "world"}));
  EXPECT_EQ(Split(kGpt2SplitPattern, "I'll pay $100!  "), (V{"I", "'ll", " pay", " $", "100", "!", "  "}));
  // Unicode whitespace (U+3000) counts as \s.
  EXPECT_EQ(Split(kGpt2SplitPattern, "a\u3000\u3000b"), (V{"a", "\u3000", "\u3000", "b"}));
}

TEST(SplitRegexTest, Llama3Pattern) {
  EXPECT_EQ(Split(kLlama3SplitPattern, "Hello\n\nworld"), (V{"Hello", "\n\n", "world"}));
  EXPECT_EQ(Split(kLlama3SplitPattern, "12345 apples"), (V{"123", "45", " apples"}));
  EXPECT_EQ(Split(kLlama3SplitPattern, "DON'T   stop"), (V{"DON", "'T", "  ", " stop"}));
  EXPECT_EQ(Split(kLlama3SplitPattern, "x  "), (V{"x", "  "}));
}

TEST(SplitRegexTest, RefusesWhatRe2CannotRun) {
  EXPECT_EQ(SplitRegex::Create("a(?=b)").status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(SplitRegex::Create("a++").status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(SplitRegex::Create("(unclosed").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pdserve
