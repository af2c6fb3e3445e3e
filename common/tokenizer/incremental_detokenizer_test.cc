#include "common/tokenizer/incremental_detokenizer.h"

#include "common/base/rng.h"
#include "common/tokenizer/bpe_trainer.h"
#include "common/tokenizer/test_tokenizers.h"
#include "common/tokenizer/unicode.h"
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

// Random ids streamed one at a time and cut at every length: each piece is valid UTF-8 and the
// pieces plus Finish() equal the decode of the ids (after the context's own decode). Byte-level
// ids 0..255 are single bytes, so random sequences are mostly broken UTF-8: stray continuation
// bytes, characters cut short, lead bytes followed by ASCII, and contexts that end mid-character
// (the prompt that showed the router's streamed text cut inside a character).
void CheckRandomStreams(const Tokenizer& tok, int32_t vocab, int sequences, bool use_context,
                        uint64_t seed) {
  SplitMix64 rng(seed);
  for (int n = 0; n < sequences; ++n) {
    const bool skip = rng.Next() % 2 == 0;
    std::vector<int32_t> context;
    if (use_context) {
      for (size_t i = 0, len = rng.Next() % 8; i < len; ++i) {
        context.push_back(static_cast<int32_t>(rng.Next() % vocab));
      }
    }
    std::vector<int32_t> ids;
    for (size_t i = 0, len = 1 + rng.Next() % 24; i < len; ++i) {
      ids.push_back(static_cast<int32_t>(rng.Next() % vocab));
    }
    IncrementalDetokenizer d(&tok, skip, context);
    std::string streamed;
    for (size_t len = 1; len <= ids.size(); ++len) {
      auto piece = d.Next(ids[len - 1]);
      ASSERT_TRUE(piece.ok()) << piece.status();
      ASSERT_TRUE(IsValidUtf8(*piece)) << "sequence " << n << " length " << len;
      streamed += *piece;
      // Cut here: a copy finishes the stream as if the sequence ended at this length.
      IncrementalDetokenizer cut = d;
      const std::string rest = cut.Finish();
      ASSERT_TRUE(IsValidUtf8(rest)) << "sequence " << n << " length " << len;
      const std::vector<int32_t> prefix(ids.begin(), ids.begin() + len);
      std::vector<int32_t> with_context = context;
      with_context.insert(with_context.end(), prefix.begin(), prefix.end());
      auto full = tok.Decode(prefix, DecodeOptions{skip, false});
      ASSERT_TRUE(full.ok());
      ASSERT_EQ(streamed + rest, *full)
          << "sequence " << n << " length " << len << " context " << context.size();
    }
  }
}

TEST(IncrementalDetokenizerTest, RandomByteLevelStreamsAreValidUtf8AndEqualTheDecode) {
  auto files = TrainByteLevelTokenizer(600);
  auto tok = Tokenizer::FromJson(files->tokenizer_json, files->tokenizer_config_json, "t");
  ASSERT_TRUE(tok.ok());
  CheckRandomStreams(**tok, 600, 3000, /*use_context=*/false, 1);
  CheckRandomStreams(**tok, 600, 3000, /*use_context=*/true, 2);
  // Bytes only: nearly every sequence is broken UTF-8.
  CheckRandomStreams(**tok, 256, 3000, /*use_context=*/true, 3);
}

TEST(IncrementalDetokenizerTest, RandomSentencePieceStreamsAreValidUtf8AndEqualTheDecode) {
  auto tok = Tokenizer::FromJson(test_tokenizers::kSentencePieceJson,
                                 R"({"bos_token": "<s>", "eos_token": "</s>"})", "sp");
  ASSERT_TRUE(tok.ok()) << tok.status();
  // Byte-fallback tokens of a cut "中" among words; no context (the first space is stripped).
  CheckRandomStreams(**tok, 11, 3000, /*use_context=*/false, 4);
}

// The report's case: a prompt that ends with a lead byte (0xC6, byte-level id 198) and output
// that starts with continuation bytes. The text used to stay empty until the end and then lose
// its first bytes; now it is the output's own decode, piece by piece.
TEST(IncrementalDetokenizerTest, ContextEndingMidCharacterIsNotCompletedByTheOutput) {
  auto files = TrainByteLevelTokenizer(600);
  auto tok = Tokenizer::FromJson(files->tokenizer_json, files->tokenizer_config_json, "t");
  ASSERT_TRUE(tok.ok());
  const std::vector<int32_t> context = {0xC6};
  IncrementalDetokenizer d(tok->get(), true, context);
  // A stray continuation byte ends in U+FFFD, which waits for the next complete character.
  EXPECT_EQ(*d.Next(0x86), "");
  EXPECT_EQ(*d.Next('a'), "\xEF\xBF\xBD" "a");
  EXPECT_EQ(*d.Next(0xE4), "");
  EXPECT_EQ(*d.Next(0xB8), "");
  EXPECT_EQ(*d.Next(0x96), "\xE4\xB8\x96");
  EXPECT_EQ(d.Finish(), "");
}

}  // namespace
}  // namespace pdserve
