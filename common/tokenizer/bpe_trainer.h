// Trains a byte-level BPE tokenizer (tokenizer.json + tokenizer_config.json in the Llama 3 layout)
// on a corpus: the built-in English/code paragraph for `pdserve make-model`'s random test models,
// or a real text for `pdserve train-tokenizer` (the demo model's tokenizer).
#ifndef PDSERVE_COMMON_TOKENIZER_BPE_TRAINER_H_
#define PDSERVE_COMMON_TOKENIZER_BPE_TRAINER_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace pdserve {

struct TrainedTokenizerFiles {
  std::string tokenizer_json;
  std::string tokenizer_config_json;
  int32_t bos_token_id;
  int32_t eos_token_id;
};

struct BpeTrainerOptions {
  int64_t vocab_size = 0;
  // At most this many merges (fewer when the vocabulary or the corpus runs out); < 0: no cap.
  int64_t max_merges = -1;
  // Empty: the built-in paragraph (enough for test fixtures, not for language).
  std::string_view corpus;
  // Special tokens after <|begin_of_text|> and <|end_of_text|>, e.g. chat markers.
  std::vector<std::string> extra_special_tokens;
  // Jinja chat template written as tokenizer_config.json's "chat_template" (empty: none).
  std::string chat_template;
  // eos_token of tokenizer_config.json (empty: <|end_of_text|>).
  std::string eos_token;
};

// Ids: 0..255 the bytes, then the learned merges, then <|begin_of_text|>, <|end_of_text|>, the
// extra special tokens, then <|reserved_special_token_N|> up to vocab_size. Deterministic: the
// most frequent pair wins, ties go to the lexicographically smallest. Cost: one pass over the
// distinct pre-tokenized words per merge. InvalidArgument when the vocabulary cannot hold the
// bytes and the special tokens.
absl::StatusOr<TrainedTokenizerFiles> TrainByteLevelTokenizer(const BpeTrainerOptions& options);

// The built-in corpus, `vocab_size` ids, at most `max_merges` merges (the test fixtures' form).
absl::StatusOr<TrainedTokenizerFiles> TrainByteLevelTokenizer(int64_t vocab_size,
                                                              int64_t max_merges = 2048);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_TOKENIZER_BPE_TRAINER_H_
