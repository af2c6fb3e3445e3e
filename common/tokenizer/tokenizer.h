// A Hugging Face tokenizer.json (+ tokenizer_config.json): text <-> token ids.
//
// Supported now: the BPE model with the ByteLevel pre-tokenizer/decoder (GPT-2, Llama 3, Qwen),
// Split pre-tokenizers with the model's own regex, added/special tokens, TemplateProcessing.
// Anything else is refused at load time with an error naming the unsupported component.
//
// Immutable after load; Encode/Decode are thread-safe.
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
                                     bool skip_special_tokens) const;

  int32_t vocab_size() const;
  std::optional<int32_t> bos_token_id() const;
  std::optional<int32_t> eos_token_id() const;
  bool IsSpecial(int32_t id) const;
  // The token's string as stored (byte-level characters for BPE tokens), or nullopt.
  std::optional<std::string> IdToToken(int32_t id) const;
  std::optional<int32_t> TokenToId(std::string_view token) const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_TOKENIZER_TOKENIZER_H_
