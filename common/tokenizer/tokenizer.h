// A Hugging Face tokenizer.json (+ tokenizer_config.json): text <-> token ids.
//
// Pipeline, as Hugging Face tokenizers runs it: added tokens are split out of the raw text first
// (longest match at the leftmost position); each remaining section goes through the normalizer,
// the pre-tokenizer and the BPE model; the post-processor (TemplateProcessing) adds BOS/EOS when
// add_special_tokens is set. Decoding maps ids to token strings (dropping special tokens on
// request) and runs the decoder chain.
//
// Families covered: byte-level BPE (GPT-2, Llama 3, Qwen2/3: ByteLevel + the model's Split regex,
// NFC) and SentencePiece-style BPE (Llama 2, Mistral, Gemma: Prepend/Replace normalizers or
// Metaspace, byte fallback, ByteFallback/Fuse/Strip decoders). Anything else is refused at load
// time with an error naming the unsupported component.
//
// Immutable after load; Encode and Decode are thread-safe.
#ifndef PDSERVE_COMMON_TOKENIZER_TOKENIZER_H_
#define PDSERVE_COMMON_TOKENIZER_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace pdserve {

struct DecodeOptions {
  bool skip_special_tokens = false;
  // Hugging Face's clean_up_tokenization_spaces (" ." -> "." and friends); unset: the value in
  // tokenizer_config.json (false when absent).
  std::optional<bool> clean_up_tokenization_spaces;
};

class Tokenizer {
 public:
  // `path` is a tokenizer.json file or a directory holding one (and maybe tokenizer_config.json).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Load(const std::string& path);
  // `config_json` may be empty. `source` names the file in errors.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromJson(std::string_view tokenizer_json,
                                                             std::string_view config_json,
                                                             std::string_view source);
  ~Tokenizer();

  // InvalidArgument when `text` is not valid UTF-8 (naming the byte offset).
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text,
                                              bool add_special_tokens) const;
  // InvalidArgument naming the first id outside the vocabulary.
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids,
                                     const DecodeOptions& options) const;
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids,
                                     bool skip_special_tokens) const {
    return Decode(ids, DecodeOptions{skip_special_tokens, std::nullopt});
  }

  int32_t vocab_size() const;
  // A bound on the bytes of any text that encodes to at most `max_tokens` tokens: every token's
  // stored string covers at least the bytes it encodes, and the normalizer shrinks text by at
  // most a known factor. A longer text cannot fit, so it can be refused without encoding it.
  // SIZE_MAX when the normalizer may delete text (Strip, Replace by a regex or by less).
  size_t MaxTextBytes(int64_t max_tokens) const;
  std::optional<int32_t> bos_token_id() const;
  std::optional<int32_t> eos_token_id() const;
  bool IsSpecial(int32_t id) const;
  // The token's string as stored (byte-level characters for BPE tokens), or nullopt.
  std::optional<std::string> IdToToken(int32_t id) const;
  // The bytes the token adds to a text in its middle (what a constraint on the text sees):
  // byte-level characters and <0xHH> tokens as their bytes, the metaspace as a space, without
  // Decode's repair of invalid UTF-8 (a token may be part of a character) and without what
  // only a text's start sees (a stripped first space). nullopt for special tokens and ids
  // outside the vocabulary.
  std::optional<std::string> TokenBytes(int32_t id) const;
  std::optional<int32_t> TokenToId(std::string_view token) const;

 private:
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromJsonUnchecked(std::string_view tokenizer_json,
                                                                      std::string_view config_json,
                                                                      std::string_view source);
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_TOKENIZER_TOKENIZER_H_
