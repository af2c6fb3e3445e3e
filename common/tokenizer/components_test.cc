// Normalizers, pre-tokenizers, decoders and the added-token matcher against the behaviour
// documented by Hugging Face tokenizers.
#include <memory>

#include "common/tokenizer/added_tokens.h"
#include "common/tokenizer/decoder.h"
#include "common/tokenizer/normalizer.h"
#include "common/tokenizer/pre_tokenizer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace pdserve {
namespace {

using Json = nlohmann::json;
using V = std::vector<std::string>;

std::string Normalize(const char* config, std::string_view text) {
  auto n = Normalizer::Parse(Json::parse(config));
  EXPECT_TRUE(n.ok()) << n.status();
  return (*n)->Normalize(text);
}

TEST(NormalizerTest, UnicodeFormsAndEdits) {
  EXPECT_EQ(Normalize(R"({"type": "NFC"})", "e\u0301t\u00e9"), "\u00e9t\u00e9");
  EXPECT_EQ(Normalize(R"({"type": "NFD"})", "\u00e9"), "e\u0301");
  EXPECT_EQ(Normalize(R"({"type": "NFKC"})", "\uFB01"), "fi");
  EXPECT_EQ(Normalize(R"({"type": "Prepend", "prepend": "\u2581"})", "hi"), "\u2581hi");
  EXPECT_EQ(Normalize(R"({"type": "Prepend", "prepend": "\u2581"})", ""), "");
  EXPECT_EQ(Normalize(R"({"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"})",
                      " a b "),
            "\u2581a\u2581b\u2581");
  EXPECT_EQ(Normalize(R"({"type": "Replace", "pattern": {"Regex": " +"}, "content": "_"})", "a   b"),
            "a_b");
  EXPECT_EQ(Normalize(R"({"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"},
                          {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]})",
                      "Hi there"),
            "\u2581Hi\u2581there");
  EXPECT_EQ(Normalize(R"({"type": "Lowercase"})", "ÀB"), "àb");
  EXPECT_EQ(Normalize(R"({"type": "Strip", "strip_left": true, "strip_right": true})", " \u3000x y\n"),
            "x y");
  auto bad = Normalizer::Parse(Json::parse(R"({"type": "Precompiled"})"));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(bad.status().message().find("Precompiled"), absl::string_view::npos);
}

V Split(const Json& config, std::string_view text, bool first = true) {
  auto p = PreTokenizer::Parse(config);
  EXPECT_TRUE(p.ok()) << p.status();
  V words;
  (*p)->Split(text, first, &words);
  return words;
}

// The examples of SplitDelimiterBehavior in the tokenizers documentation.
TEST(PreTokenizerTest, SplitBehaviours) {
  auto split = [](const char* behavior) {
    return Split({{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", behavior},
                  {"invert", false}},
                 "the-final--countdown");
  };
  EXPECT_EQ(split("Removed"), (V{"the", "final", "countdown"}));
  EXPECT_EQ(split("Isolated"), (V{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(split("MergedWithPrevious"), (V{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(split("MergedWithNext"), (V{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(split("Contiguous"), (V{"the", "-", "final", "--", "countdown"}));
}

TEST(PreTokenizerTest, Metaspace) {
  const Json always = {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "always"},
                       {"split", true}};
  EXPECT_EQ(Split(always, "Hey friend!"), (V{"\u2581Hey", "\u2581friend!"}));
  EXPECT_EQ(Split(always, "Hey  you", false), (V{"\u2581Hey", "\u2581", "\u2581you"}));
  const Json first = {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "first"},
                      {"split", false}};
  EXPECT_EQ(Split(first, "a b", true), (V{"\u2581a\u2581b"}));
  EXPECT_EQ(Split(first, "a b", false), (V{"a\u2581b"}));
}

TEST(PreTokenizerTest, ByteLevelMapsBytes) {
  const Json j = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
  EXPECT_EQ(Split(j, "Hi you"), (V{"\u0120Hi", "\u0120you"}));
  EXPECT_EQ(Split({{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}, "a\nb"),
            (V{"a\u010ab"}));
}

std::string DecodeChain(const Json& config, V tokens) {
  auto d = Decoder::Parse(config);
  EXPECT_TRUE(d.ok()) << d.status();
  (*d)->DecodeChain(&tokens);
  std::string out;
  for (const auto& t : tokens) out += t;
  return out;
}

TEST(DecoderTest, SentencePieceChain) {
  // Llama 2's decoder.
  const Json llama2 = Json::parse(R"({"type": "Sequence", "decoders": [
      {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
      {"type": "ByteFallback"}, {"type": "Fuse"},
      {"type": "Strip", "content": " ", "start": 1, "stop": 0}]})");
  EXPECT_EQ(DecodeChain(llama2, {"\u2581Hello", "\u2581w", "or", "ld"}), "Hello world");
  // "中" is E4 B8 AD.
  EXPECT_EQ(DecodeChain(llama2, {"\u2581a", "<0xE4>", "<0xB8>", "<0xAD>"}), "a中");
  // An invalid byte run becomes one U+FFFD per byte, as Hugging Face does.
  EXPECT_EQ(DecodeChain(llama2, {"\u2581a", "<0xE4>", "<0xB8>"}), "a\uFFFD\uFFFD");
}

TEST(DecoderTest, ByteLevelAndMetaspace) {
  EXPECT_EQ(DecodeChain({{"type", "ByteLevel"}}, {"\u0120Hi", "\u0120\u00e4\u00b8\u0143"}), " Hi 中");
  EXPECT_EQ(DecodeChain({{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "always"}},
                        {"\u2581Hey", "\u2581friend"}),
            "Hey friend");
  EXPECT_EQ(Decoder::Parse(Json::parse(R"({"type": "WordPiece"})")).status().code(),
            absl::StatusCode::kUnimplemented);
}

TEST(AddedTokenMatcherTest, LongestMatchAtTheLeftmostPosition) {
  std::vector<AddedToken> tokens = {{1, "<s>", true}, {2, "<s>x", true}, {3, "</s>", true},
                                    {4, "\n\n", false}, {5, "\n", false}};
  AddedTokenMatcher m(tokens);
  AddedTokenMatcher::Match match;
  const std::string text = "a</s>b<s>xy\n\n\nz";
  ASSERT_TRUE(m.FindNext(text, 0, &match));
  EXPECT_EQ(tokens[match.token].id, 3);
  EXPECT_EQ(match.begin, 1u);
  ASSERT_TRUE(m.FindNext(text, match.end, &match));
  EXPECT_EQ(tokens[match.token].id, 2);  // "<s>x" beats "<s>".
  ASSERT_TRUE(m.FindNext(text, match.end, &match));
  EXPECT_EQ(tokens[match.token].id, 4);  // "\n\n" then "\n".
  ASSERT_TRUE(m.FindNext(text, match.end, &match));
  EXPECT_EQ(tokens[match.token].id, 5);
  EXPECT_FALSE(m.FindNext(text, match.end, &match));
}

TEST(AddedTokenMatcherTest, StripAndSingleWord) {
  std::vector<AddedToken> tokens = {{7, "<mask>", true, /*lstrip=*/true, /*rstrip=*/true},
                                    {8, "cat", false, false, false, /*single_word=*/true}};
  AddedTokenMatcher m(tokens);
  AddedTokenMatcher::Match match;
  const std::string text = "a  <mask>  b concat cat";
  ASSERT_TRUE(m.FindNext(text, 0, &match));
  EXPECT_EQ(match.begin, 1u);
  EXPECT_EQ(match.end, 11u);
  ASSERT_TRUE(m.FindNext(text, match.end, &match));
  EXPECT_EQ(match.begin, 20u);  // Not inside "concat".
}

}  // namespace
}  // namespace pdserve
