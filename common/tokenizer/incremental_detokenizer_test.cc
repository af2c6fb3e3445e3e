#include "common/tokenizer/incremental_detokenizer.h"

#include "common/tokenizer/bpe_trainer.h"
#include "gtest/gtest.h"

namespace pdserve {
namespace {

std::string StreamAll(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip,
                      std::vector<std::string>* pieces = nullptr) {
  IncrementalDetokenizer d(&tok, skip);
  std::string out;
  for (int32_t id : ids) {
    auto delta = d.Next(id);
    EXPECT_TRUE(delta.ok());
    // Never a broken character in the stream.
    EXPECT_EQ(delta->find("\xEF\xBF\xBD"), std::string::npos);
    if (pieces && !delta->empty()) pieces->push_back(*delta);
    out += *delta;
  }
  out += d.Finish();
  return out;
}

TEST(IncrementalDetokenizerTest, ByteLevelMultibyteCharactersWaitUntilComplete) {
  auto files = TrainByteLevelTokenizer(600);
  ASSERT_TRUE(files.ok());
  auto tok = Tokenizer::FromJson(files->tokenizer_json, files->tokenizer_config_json, "t");
  ASSERT_TRUE(tok.ok());
  for (std::string text : {"héllo 世界 🎉👨‍👩‍👧 ok", "  spaces\n\n\ttabs", "plain words here", "🇫🇷🇩🇪"}) {
    auto ids = (*tok)->Encode(text, /*add_special_tokens=*/true);
    ASSERT_TRUE(ids.ok());
    std::vector<std::string> pieces;
    EXPECT_EQ(StreamAll(**tok, *ids, true, &pieces), text);
    auto full = (*tok)->Decode(*ids, false);
    EXPECT_EQ(StreamAll(**tok, *ids, false), *full);
  }
}

TEST(IncrementalDetokenizerTest, FinishFlushesAnIncompleteCharacter) {
  auto files = TrainByteLevelTokenizer(600);
  auto tok = Tokenizer::FromJson(files->tokenizer_json, files->tokenizer_config_json, "t");
  // Byte tokens of the first two bytes of "世" (E4 B8 96): the byte-level ids of 0xE4 and 0xB8.
  std::vector<int32_t> ids = {0xE4, 0xB8};
  IncrementalDetokenizer d(tok->get(), false);
  EXPECT_EQ(*d.Next(ids[0]), "");
  EXPECT_EQ(*d.Next(ids[1]), "");
  // from_utf8_lossy: one U+FFFD for the truncated sequence.
  EXPECT_EQ(d.Finish(), "\xEF\xBF\xBD");
}

TEST(IncrementalDetokenizerTest, BadIdIsAnErrorAndConsumesNothing) {
  auto files = TrainByteLevelTokenizer(600);
  auto tok = Tokenizer::FromJson(files->tokenizer_json, files->tokenizer_config_json, "t");
  IncrementalDetokenizer d(tok->get(), false);
  EXPECT_EQ(*d.Next('h'), "h");
  EXPECT_EQ(d.Next(100000).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*d.Next('i'), "i");
}

}  // namespace
}  // namespace pdserve
