// Writes a random model in exactly the Hugging Face layout: config.json, generation_config.json,
// model.safetensors (or shards + model.safetensors.index.json), tokenizer.json and
// tokenizer_config.json. The fixture of every engine test and the demo default.
#ifndef PDSERVE_COMMON_MODEL_RANDOM_MODEL_H_
#define PDSERVE_COMMON_MODEL_RANDOM_MODEL_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "common/base/dtype.h"

namespace pdserve {

struct RandomModelSpec {
  std::string arch = "llama";  // llama | mistral | qwen2 | qwen3
  int64_t layers = 2;
  int64_t hidden = 64;
  int64_t heads = 4;
  int64_t kv_heads = 2;
  int64_t head_dim = 0;  // 0: hidden / heads (qwen3 always writes it explicitly).
  int64_t intermediate = 128;
  int64_t vocab = 512;
  int64_t max_position = 4096;
  int64_t sliding_window = 0;  // mistral only; 0 writes null.
  bool tie_embeddings = false;
  DType dtype = DType::kF32;
  int shards = 1;
  uint64_t seed = 0;
};

absl::Status WriteRandomModel(const RandomModelSpec& spec, const std::string& dir);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_MODEL_RANDOM_MODEL_H_
