#include "common/tokenizer/unicode.h"

#include "gtest/gtest.h"

namespace pdserve {
namespace {

TEST(UnicodeTest, Validity) {
  size_t bad = 99;
  EXPECT_TRUE(IsValidUtf8("héllo 世界 🎉"));
  EXPECT_FALSE(IsValidUtf8("ab\xff", &bad));
  EXPECT_EQ(bad, 2u);
  EXPECT_FALSE(IsValidUtf8("\xc0\xaf"));          // Overlong '/'.
  EXPECT_FALSE(IsValidUtf8("\xed\xa0\x80"));      // Surrogate.
  EXPECT_FALSE(IsValidUtf8("\xf4\x90\x80\x80"));  // Above U+10FFFF.
  EXPECT_FALSE(IsValidUtf8("\xe4\xb8"));          // Truncated.
}

TEST(UnicodeTest, LossyReplacesMaximalInvalidPrefixes) {
  EXPECT_EQ(Utf8Lossy("a\xe4\xb8" "b"), "a\xEF\xBF\xBD" "b");
  EXPECT_EQ(Utf8Lossy("\xff\xfe"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(Utf8Lossy("ok"), "ok");
}

TEST(UnicodeTest, RoundTripsCodePoints) {
  for (uint32_t cp : {0x41u, 0xe9u, 0x4e16u, 0x1f389u}) {
    std::string s;
    AppendUtf8(cp, &s);
    size_t pos = 0;
    EXPECT_EQ(NextCodePoint(s, &pos), cp);
    EXPECT_EQ(pos, s.size());
  }
}

}  // namespace
}  // namespace pdserve
