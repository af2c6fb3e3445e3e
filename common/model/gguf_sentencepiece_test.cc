#include "common/model/gguf_sentencepiece.h"

#include <stdlib.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "common/base/file_util.h"
#include "common/model/gguf.h"
#include "common/model/gguf_tokenizer.h"
#include "common/model/gguf_writer.h"
#include "common/tokenizer/test_tokenizers.h"
#include "common/tokenizer/tokenizer.h"
#include "gtest/gtest.h"

namespace pdserve {
namespace {

// A SentencePiece vocabulary as llama.cpp writes one: "▁" is three bytes and "é" two, so a split
// inside either is not a split Python's str makes.
const std::vector<std::string> kPieces = {
    "<unk>", "<s>",     "</s>",     "<0xE4>",   "<0xB8>",         "<0xAD>", "\u2581",  "h",
    "i",     "\u2581h", "\u2581hi", "\xC3\xA9", "\u2581\xC3\xA9", "hi",     "<|tool|>"};
const std::vector<float> kScores = {0, 0, 0, 0, 0, 0, -10, -11, -12, -1, -2, -13, -4, -3, 0};
const std::vector<int32_t> kTypes = {2, 3, 3, 6, 6, 6, 1, 1, 1, 1, 1, 1, 1, 1, 4};

TEST(SentencePieceMerges, EverySplitOfEachPieceByIdsThenByScore) {
  const std::vector<Merge> want = {{"\u2581", "h"},          // -1
                                   {"\u2581", "hi"},         // -2: ids (6, 13) before (9, 8)
                                   {"\u2581h", "i"},         //
                                   {"h", "i"},               // -3
                                   {"\u2581", "\xC3\xA9"}};  // -4
  EXPECT_EQ(MergesFromScores(kPieces, kScores), want);
}

TEST(SentencePieceMerges, EqualScoresKeepIdOrderAndNanSortsLast) {
  const std::vector<std::string> pieces = {"a", "b", "c", "ab", "bc", "ca"};
  EXPECT_EQ(MergesFromScores(pieces, {0, 0, 0, -1, -1, -1}),
            (std::vector<Merge>{{"a", "b"}, {"b", "c"}, {"c", "a"}}));
  EXPECT_EQ(MergesFromScores(pieces, {0, 0, 0, NAN, -1, -1}),
            (std::vector<Merge>{{"b", "c"}, {"c", "a"}, {"a", "b"}}));
}

TEST(SentencePieceMerges, ScoresFromMergesGiveTheSameMergesBack) {
  std::vector<PieceType> types;
  for (int32_t t : kTypes) types.push_back(static_cast<PieceType>(t));
  const std::vector<Merge> merges = MergesFromScores(kPieces, kScores);
  const std::vector<float> scores = ScoresFromMerges(kPieces, types, merges);
  EXPECT_EQ(scores[9], 0.0f);    // "▁h": the first merge.
  EXPECT_EQ(scores[10], -1.0f);  // "▁hi"
  EXPECT_EQ(scores[13], -3.0f);  // "hi"
  EXPECT_EQ(scores[1], 0.0f);    // Control, byte and unknown pieces: SentencePiece's 0.
  EXPECT_EQ(scores[3], 0.0f);
  EXPECT_EQ(scores[7], -static_cast<float>(merges.size() + 7));  // Made by no merge: below all.
  EXPECT_EQ(MergesFromScores(kPieces, scores), merges);
}

std::string SentencePieceGguf(bool space_prefix_key, bool space_prefix) {
  GgufWriter w;
  w.SetString("tokenizer.ggml.model", "llama");
  w.SetStringArray("tokenizer.ggml.tokens", kPieces);
  w.SetFloat32Array("tokenizer.ggml.scores", kScores);
  w.SetInt32Array("tokenizer.ggml.token_type", kTypes);
  // BOS 1, EOS 2, UNK 0 and add_bos_token true: llama.cpp's defaults, so not written.
  if (space_prefix_key) w.SetBool("tokenizer.ggml.add_space_prefix", space_prefix);
  return w.Serialize();
}

absl::StatusOr<std::unique_ptr<Tokenizer>> FromGgufBytes(const std::string& bytes) {
  auto g = GgufFile::Parse(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "t.gguf");
  if (!g.ok()) return g.status();
  auto files = TokenizerFilesFromGguf(**g);
  if (!files.ok()) return files.status();
  return Tokenizer::FromJson(files->tokenizer_json, files->config_json, "t.gguf");
}

TEST(SentencePieceGguf, EncodesWithSpacePrefixMergesAndByteFallback) {
  auto tok = FromGgufBytes(SentencePieceGguf(false, false));
  ASSERT_TRUE(tok.ok()) << tok.status();
  // "▁hi▁中": ▁+h (rank 0), ▁h+i (rank 2); 中 has no piece: its three bytes.
  auto ids = (*tok)->Encode("hi \xE4\xB8\xAD", /*add_special_tokens=*/true);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*ids, (std::vector<int32_t>{1, 10, 6, 3, 4, 5}));
  EXPECT_EQ(*(*tok)->Decode(*ids, /*skip_special_tokens=*/true), "hi \xE4\xB8\xAD");
  // A user-defined piece splits the text; each part gets its space prefix, as llama.cpp does.
  EXPECT_EQ(*(*tok)->Encode("hi<|tool|>hi", false), (std::vector<int32_t>{10, 14, 10}));
  EXPECT_EQ(*(*tok)->Encode("\xC3\xA9", false), (std::vector<int32_t>{12}));
}

TEST(SentencePieceGguf, WithoutTheSpacePrefix) {
  auto tok = FromGgufBytes(SentencePieceGguf(true, false));
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ(*(*tok)->Encode("hi h", false), (std::vector<int32_t>{13, 9}));
  EXPECT_EQ(*(*tok)->Decode(std::vector<int32_t>{13, 9}, false), "hi h");
}

TEST(SentencePieceGguf, MalformedVocabulariesNameTheKey) {
  auto refused = [](GgufWriter& w) {
    const std::string bytes = w.Serialize();
    auto g =
        GgufFile::Parse(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "t.gguf");
    EXPECT_TRUE(g.ok());
    auto files = TokenizerFilesFromGguf(**g);
    EXPECT_FALSE(files.ok());
    return std::string(files.status().message());
  };
  GgufWriter short_scores;
  short_scores.SetString("tokenizer.ggml.model", "llama");
  short_scores.SetStringArray("tokenizer.ggml.tokens", kPieces);
  short_scores.SetFloat32Array("tokenizer.ggml.scores", {0, 1});
  EXPECT_NE(refused(short_scores).find("tokenizer.ggml.scores must hold one number per token"),
            std::string::npos);
  GgufWriter types_as_strings;
  types_as_strings.SetString("tokenizer.ggml.model", "llama");
  types_as_strings.SetStringArray("tokenizer.ggml.tokens", {"a"});
  types_as_strings.SetStringArray("tokenizer.ggml.token_type", {"normal"});
  EXPECT_NE(refused(types_as_strings).find("tokenizer.ggml.token_type"), std::string::npos);
  GgufWriter extra_ws;
  extra_ws.SetString("tokenizer.ggml.model", "llama");
  extra_ws.SetStringArray("tokenizer.ggml.tokens", kPieces);
  extra_ws.SetBool("tokenizer.ggml.remove_extra_whitespaces", true);
  EXPECT_NE(refused(extra_ws).find("tokenizer.ggml.remove_extra_whitespaces"), std::string::npos);
  GgufWriter not_utf8;  // JSON cannot carry it (this once threw out of the loader).
  not_utf8.SetString("tokenizer.ggml.model", "llama");
  not_utf8.SetStringArray("tokenizer.ggml.tokens", {"a", "\xC3("});
  EXPECT_NE(refused(not_utf8).find("tokenizer.ggml.tokens[1] is not UTF-8"), std::string::npos);
  GgufWriter bert;
  bert.SetString("tokenizer.ggml.model", "bert");
  EXPECT_NE(refused(bert).find("'bert'"), std::string::npos);
}

// An empty token_type array reads as none (it once indexed past its end).
TEST(SentencePieceGguf, EmptyTokenTypesReadAsNormal) {
  for (const char* model : {"llama", "gpt2"}) {
    GgufWriter w;
    w.SetString("tokenizer.ggml.model", model);
    w.SetStringArray("tokenizer.ggml.tokens", {"a", "b", "ab"});
    w.SetStringArray("tokenizer.ggml.merges", {"a b"});
    w.SetInt32Array("tokenizer.ggml.token_type", {});
    auto tok = FromGgufBytes(w.Serialize());
    ASSERT_TRUE(tok.ok()) << model << ": " << tok.status();
  }
}

std::string TempDir() {
  std::string templ = "/tmp/pdserve_spm_XXXXXX";
  return mkdtemp(templ.data());
}

TEST(SentencePieceGguf, TokenizerJsonRoundTripsThroughGguf) {
  const std::string dir = TempDir();
  ASSERT_TRUE(
      WriteStringToFile(JoinPath(dir, "tokenizer.json"), test_tokenizers::kSentencePieceJson).ok());
  ASSERT_TRUE(WriteStringToFile(JoinPath(dir, "tokenizer_config.json"),
                                R"({"bos_token": "<s>", "eos_token": "</s>"})")
                  .ok());
  GgufWriter w;
  ASSERT_TRUE(WriteGgufTokenizer(dir, /*bos_eos=*/true, &w).ok());
  const std::string bytes = w.Serialize();
  auto g = GgufFile::Parse(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "t.gguf");
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(*(*g)->GetString("tokenizer.ggml.model"), "llama");
  EXPECT_TRUE(*(*g)->GetBool("tokenizer.ggml.add_space_prefix"));
  EXPECT_EQ(*(*g)->GetUint("tokenizer.ggml.unknown_token_id"), 0u);
  const GgufValue* types = (*g)->Find("tokenizer.ggml.token_type");
  ASSERT_NE(types, nullptr);
  EXPECT_EQ(types->array[0].i, 2);  // <unk>
  EXPECT_EQ(types->array[1].i, 3);  // <s>
  EXPECT_EQ(types->array[3].i, 6);  // <0xE4>
  EXPECT_EQ(types->array[7].i, 1);  // h
  auto from_json = Tokenizer::FromJson(test_tokenizers::kSentencePieceJson, "", "json");
  auto from_gguf = FromGgufBytes(bytes);
  ASSERT_TRUE(from_json.ok() && from_gguf.ok());
  for (const char* text : {"hi", "hi hi", " h i ", "\xE4\xB8\xAD hi", "<s>hi</s>", ""}) {
    EXPECT_EQ(*(*from_gguf)->Encode(text, true), *(*from_json)->Encode(text, true)) << text;
  }

  // Gemma's layout (Replace normalizer, a Split pre-tokenizer) has no GGUF form here: refused.
  std::string gemma = test_tokenizers::kSentencePieceJson;
  gemma.replace(
      gemma.find("\"pre_tokenizer\": null"), 21,
      R"("pre_tokenizer": {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious"})");
  ASSERT_TRUE(WriteStringToFile(JoinPath(dir, "tokenizer.json"), gemma).ok());
  GgufWriter refused;
  const absl::Status s = WriteGgufTokenizer(dir, true, &refused);
  EXPECT_NE(s.message().find("Llama 2's layout"), std::string::npos) << s;

  // A value of the wrong type (unk_token null) is the file's error, not an exception.
  std::string null_unk = test_tokenizers::kSentencePieceJson;
  const std::string unk_field = "\"unk_token\": \"<unk>\"";
  null_unk.replace(null_unk.find(unk_field), unk_field.size(), "\"unk_token\": null");
  ASSERT_TRUE(WriteStringToFile(JoinPath(dir, "tokenizer.json"), null_unk).ok());
  GgufWriter malformed;
  const absl::Status m = WriteGgufTokenizer(dir, true, &malformed);
  EXPECT_EQ(m.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(m.message().find("malformed tokenizer file"), std::string::npos) << m;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace pdserve
