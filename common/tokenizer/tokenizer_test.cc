#include "common/tokenizer/tokenizer.h"

#include "common/tokenizer/bpe_trainer.h"
#include "common/tokenizer/split_regex.h"
#include "common/tokenizer/test_tokenizers.h"
#include "gtest/gtest.h"

namespace pdserve {
namespace {

using test_tokenizers::kSentencePieceJson;

std::unique_ptr<Tokenizer> Trained(int64_t vocab) {
  auto files = TrainByteLevelTokenizer(vocab);
  EXPECT_TRUE(files.ok()) << files.status();
  auto tok = Tokenizer::FromJson(files->tokenizer_json, files->tokenizer_config_json, "test");
  EXPECT_TRUE(tok.ok()) << tok.status();
  return std::move(*tok);
}

TEST(TokenizerTest, TrainedTokenizerRoundTripsText) {
  auto tok = Trained(1000);
  EXPECT_EQ(tok->vocab_size(), 1000);
  for (std::string text : {"The quick brown fox.", "  leading spaces\n\nand\ttabs  ",
                           "héllo wörld 世界 🎉🎉", "x = f(3.14159) + 65536;", ""}) {
    auto ids = tok->Encode(text, /*add_special_tokens=*/false);
    ASSERT_TRUE(ids.ok()) << ids.status();
    auto back = tok->Decode(*ids, false);
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, text);
  }
}

// tokenizer_encode_fuzz's artifact (fuzz/corpus/tokenizer_encode_fuzz/b4e9bc7a...): runs of spaces
// around punctuation and digits round-trip through the fuzzers' tokenizer.
TEST(TokenizerTest, FuzzerArtifactRoundTrips) {
  auto files = TrainByteLevelTokenizer(1024, 512);
  ASSERT_TRUE(files.ok());
  auto tok = Tokenizer::FromJson(files->tokenizer_json, files->tokenizer_config_json, "trained");
  ASSERT_TRUE(tok.ok());
  const std::string text = "def .f(xn  1** 2  # ok";
  auto ids = (*tok)->Encode(text, false);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*(*tok)->Decode(*ids, DecodeOptions{false, false}), text);
}

TEST(TokenizerTest, MergesCompressKnownWords) {
  auto tok = Trained(1000);
  auto ids = tok->Encode("the server", false);
  ASSERT_TRUE(ids.ok());
  // "the" and " server" occur in the training corpus: far fewer tokens than bytes.
  EXPECT_LT(ids->size(), 5u);
}

TEST(TokenizerTest, SpecialTokensAndBos) {
  auto tok = Trained(600);
  ASSERT_TRUE(tok->bos_token_id().has_value());
  ASSERT_TRUE(tok->eos_token_id().has_value());
  auto ids = tok->Encode("hi<|end_of_text|>", /*add_special_tokens=*/true);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(ids->front(), *tok->bos_token_id());
  EXPECT_EQ(ids->back(), *tok->eos_token_id());
  EXPECT_TRUE(tok->IsSpecial(*tok->eos_token_id()));
  EXPECT_EQ(*tok->Decode(*ids, /*skip_special_tokens=*/true), "hi");
  EXPECT_EQ(*tok->Decode(*ids, false), "<|begin_of_text|>hi<|end_of_text|>");
}

TEST(TokenizerTest, BadInputIsAClearError) {
  auto tok = Trained(600);
  auto bad_text = tok->Encode("ok\xff", false);
  ASSERT_FALSE(bad_text.ok());
  EXPECT_EQ(bad_text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad_text.status().message().find("UTF-8"), std::string::npos);
  std::vector<int32_t> ids = {1, 600};
  auto bad_id = tok->Decode(ids, false);
  ASSERT_FALSE(bad_id.ok());
  EXPECT_NE(bad_id.status().message().find("600"), std::string::npos);
}

TEST(TokenizerTest, UnsupportedComponentsAreNamed) {
  auto wordpiece = Tokenizer::FromJson(R"({"model": {"type": "WordPiece", "vocab": {}}})", "", "t.json");
  ASSERT_FALSE(wordpiece.ok());
  EXPECT_EQ(wordpiece.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(wordpiece.status().message().find("WordPiece"), std::string::npos);
  auto not_json = Tokenizer::FromJson("{", "", "t.json");
  EXPECT_EQ(not_json.status().code(), absl::StatusCode::kInvalidArgument);
}

// A SentencePiece-style BPE in the Llama 2 layout, small enough to reason about by hand.

// Wrong JSON types inside a component are refused with the file named, never thrown out of
// FromJson (tokenizer_json_fuzz found a special token whose id was a number).
TEST(TokenizerTest, WrongTypesInsideComponentsAreErrors) {
  const std::string good = kSentencePieceJson;
  auto with = [&](const std::string& from, const std::string& to) {
    std::string text = good;
    const size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return Tokenizer::FromJson(text.replace(at, from.size(), to), "", "t.json");
  };
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {R"({"SpecialToken": {"id": "<s>", "type_id": 0}})", R"({"SpecialToken": {"id": 1}})"},
           {R"("ids": [1])", R"("ids": ["one"])"},
           {R"("merges": [)", R"("merges": [7, )"}}) {
    auto t = with(from, to);
    ASSERT_FALSE(t.ok()) << to;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << t.status();
    EXPECT_NE(t.status().message().find("t.json"), std::string::npos) << t.status();
  }
  ASSERT_TRUE(Tokenizer::FromJson(good, "", "t.json").ok());
}

TEST(TokenizerTest, SentencePieceStyleBpe) {
  auto tok = Tokenizer::FromJson(kSentencePieceJson, R"({"bos_token": "<s>", "eos_token": "</s>"})", "sp");
  ASSERT_TRUE(tok.ok()) << tok.status();
  // "hi hi" -> "▁hi▁hi"; "中" (E4 B8 AD) is not in the vocab: byte fallback.
  EXPECT_EQ(*(*tok)->Encode("hi hi", false), (std::vector<int32_t>{10, 10}));
  EXPECT_EQ(*(*tok)->Encode("hi中", true), (std::vector<int32_t>{1, 10, 3, 4, 5}));
  EXPECT_EQ(*(*tok)->Decode(std::vector<int32_t>{1, 10, 3, 4, 5}, true), "hi中");
  EXPECT_EQ(*(*tok)->Decode(std::vector<int32_t>{10, 6, 10}, false), "hi  hi");
  // Special tokens are split out first; the text after one is a new section (Prepend again).
  EXPECT_EQ(*(*tok)->Encode("<s>hi</s>", false), (std::vector<int32_t>{1, 10, 2}));
}

// TokenBytes: a text's tokens' bytes, joined, are the text (byte-level: exactly, including
// tokens that hold part of a character; SentencePiece-style: with the leading space the decoder
// strips from a whole text only); special tokens have none.
TEST(TokenizerTest, TokenBytesJoinedAreTheText) {
  auto tok = Trained(1000);
  int partial = 0;
  for (std::string text : {"The quick brown fox.", "  leading spaces\n\nand\ttabs  ",
                           "héllo wörld 世界 🎉🎉 ∀x∈ℝ", "x = f(3.14159) + 65536;"}) {
    auto ids = tok->Encode(text, false);
    ASSERT_TRUE(ids.ok());
    std::string joined;
    for (int32_t id : *ids) {
      const auto b = tok->TokenBytes(id);
      ASSERT_TRUE(b.has_value()) << id;
      const auto one = tok->Decode(std::vector<int32_t>{id}, false);
      if (*one != *b) ++partial;  // Decode alone repairs a partial character; TokenBytes not.
      joined += *b;
    }
    EXPECT_EQ(joined, text);
  }
  EXPECT_GT(partial, 0) << "no token held part of a character: the UTF-8 path went untested";
  for (int32_t id = 0; id < tok->vocab_size(); ++id) {
    EXPECT_EQ(tok->TokenBytes(id).has_value(), !tok->IsSpecial(id)) << id;
  }
  EXPECT_FALSE(tok->TokenBytes(tok->vocab_size() + 5).has_value());

  auto sp = Tokenizer::FromJson(kSentencePieceJson, R"({"bos_token": "<s>", "eos_token": "</s>"})", "sp");
  ASSERT_TRUE(sp.ok());
  EXPECT_EQ(*(*sp)->TokenBytes(10), " hi");  // Mid-text: the metaspace is a space.
  EXPECT_EQ(*(*sp)->TokenBytes(6), " ");
  EXPECT_EQ(*(*sp)->TokenBytes(3), "\xE4");  // A byte token: its byte, not U+FFFD.
  EXPECT_FALSE((*sp)->TokenBytes(1).has_value());
  const std::vector<int32_t> sp_ids = *(*sp)->Encode("hi中 hi", false);
  std::string joined;
  for (int32_t id : sp_ids) joined += *(*sp)->TokenBytes(id);
  EXPECT_EQ(joined, " hi中 hi");
}

TEST(TokenizerTest, LlamaConfigFlagsDecideBosAndEos) {
  auto tok = Tokenizer::FromJson(
      kSentencePieceJson,
      R"({"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>",
          "add_bos_token": false, "add_eos_token": true})", "sp");
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ(*(*tok)->Encode("hi", true), (std::vector<int32_t>{10, 2}));
}

TEST(TokenizerTest, CleanUpTokenizationSpacesFollowsTheConfig) {
  auto files = TrainByteLevelTokenizer(600);
  ASSERT_TRUE(files.ok());
  auto plain = Tokenizer::FromJson(files->tokenizer_json, "{}", "t");
  auto clean = Tokenizer::FromJson(files->tokenizer_json, R"({"clean_up_tokenization_spaces": true})", "t");
  const std::string text = "Hello , world . I 'm here";
  auto ids = (*plain)->Encode(text, false);
  EXPECT_EQ(*(*plain)->Decode(*ids, false), text);
  EXPECT_EQ(*(*clean)->Decode(*ids, false), "Hello, world. I'm here");
  DecodeOptions off;
  off.clean_up_tokenization_spaces = false;
  EXPECT_EQ(*(*clean)->Decode(*ids, off), text);
}

// U+0085 (NEL) is White_Space for Hugging Face tokenizers (Oniguruma) and tiktoken, U+FEFF is
// not; JavaScript's \s says the opposite, which is why the oracle corpus leaves both out.
TEST(TokenizerTest, NextLineIsWhitespaceAndBomIsNot) {
  auto nel = SplitRegex::Create(kGpt2SplitPattern);
  ASSERT_TRUE(nel.ok());
  const std::string a = "x\u0085\u0085y";
  EXPECT_EQ((*nel)->FindAll(a).size(), 4u);  // "x", NEL, NEL, "y": \s+(?!\S) keeps one back.
  const std::string b = "x \uFEFFy";
  // " \uFEFF" is one ` ?[^\s\p{L}\p{N}]+` piece: the BOM is not whitespace.
  EXPECT_EQ((*nel)->FindAll(b).size(), 3u);
}

}  // namespace
}  // namespace pdserve
