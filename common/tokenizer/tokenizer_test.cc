#include "common/tokenizer/tokenizer.h"

#include "common/tokenizer/bpe_trainer.h"
#include "gtest/gtest.h"

namespace pdserve {
namespace {

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

}  // namespace
}  // namespace pdserve
