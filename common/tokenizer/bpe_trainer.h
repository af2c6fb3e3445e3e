// Builds a small byte-level BPE tokenizer (tokenizer.json + tokenizer_config.json) by training
// merges on a built-in English/code corpus. Used by `pdserve make-model` so that random test
// models come with a real, loadable tokenizer in the Llama 3 layout.
#ifndef PDSERVE_COMMON_TOKENIZER_BPE_TRAINER_H_
#define PDSERVE_COMMON_TOKENIZER_BPE_TRAINER_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace pdserve {

struct TrainedTokenizerFiles {
  std::string tokenizer_json;
  std::string tokenizer_config_json;
  int32_t bos_token_id;
  int32_t eos_token_id;
};

// Ids: 0..255 the bytes, then up to `max_merges` learned merges, then <|begin_of_text|>,
// <|end_of_text|>, then <|reserved_special_token_N|> up to vocab_size. Needs vocab_size >= 258.
absl::StatusOr<TrainedTokenizerFiles> TrainByteLevelTokenizer(int64_t vocab_size,
                                                              int64_t max_merges = 2048);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_TOKENIZER_BPE_TRAINER_H_
