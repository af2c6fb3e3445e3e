// Small tokenizer.json fixtures shared by the tokenizer tests (test-only).
#ifndef PDSERVE_COMMON_TOKENIZER_TEST_TOKENIZERS_H_
#define PDSERVE_COMMON_TOKENIZER_TEST_TOKENIZERS_H_

namespace pdserve::test_tokenizers {

// A SentencePiece-style BPE (Llama 2 / Mistral layout): Metaspace by normalizer, byte fallback
// for "中" (E4 B8 AD), a decoder that strips the first space.
inline constexpr char kSentencePieceJson[] = R"({
  "added_tokens": [
    {"id": 0, "content": "<unk>", "special": true},
    {"id": 1, "content": "<s>", "special": true},
    {"id": 2, "content": "</s>", "special": true}],
  "normalizer": {"type": "Sequence", "normalizers": [
    {"type": "Prepend", "prepend": "\u2581"},
    {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
  "pre_tokenizer": null,
  "post_processor": {"type": "TemplateProcessing",
    "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
    "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
  "decoder": {"type": "Sequence", "decoders": [
    {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
    {"type": "ByteFallback"}, {"type": "Fuse"},
    {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
  "model": {"type": "BPE", "unk_token": "<unk>", "byte_fallback": true, "fuse_unk": true,
    "vocab": {"<unk>": 0, "<s>": 1, "</s>": 2, "<0xE4>": 3, "<0xB8>": 4, "<0xAD>": 5,
              "\u2581": 6, "h": 7, "i": 8, "\u2581h": 9, "\u2581hi": 10},
    "merges": ["\u2581 h", "\u2581h i"]}})";

}  // namespace pdserve::test_tokenizers

#endif  // PDSERVE_COMMON_TOKENIZER_TEST_TOKENIZERS_H_
