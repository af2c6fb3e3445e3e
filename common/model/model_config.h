// The architecture of a model, parsed from a Hugging Face config.json.
#ifndef PDSERVE_COMMON_MODEL_MODEL_CONFIG_H_
#define PDSERVE_COMMON_MODEL_MODEL_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace pdserve {

// The decoder-only families pdserve runs. They share one forward pass; the differences are the
// flags on ModelConfig (q/k/v bias, q/k norm, sliding window, rope scaling).
enum class ModelFamily { kLlama, kMistral, kQwen2, kQwen3 };
std::string_view ModelFamilyName(ModelFamily family);

struct RopeScaling {
  // kFactors: each frequency divided by a factor of its own (a GGUF file's rope_freqs tensor,
  // which is how llama.cpp's converter writes Llama 3.1's scaling).
  enum class Type { kNone, kLinear, kLlama3, kFactors };
  Type type = Type::kNone;
  double factor = 1.0;
  double low_freq_factor = 1.0;        // llama3
  double high_freq_factor = 4.0;       // llama3
  int64_t original_max_position = 0;   // llama3
  std::vector<float> freq_factors;     // kFactors: [head_dim / 2]
};

// Upper bounds of config.json sizes, each far above any released model (largest seen: vocabulary
// 262k, hidden 18k, MLP 53k, 126 layers, 128 heads, head_dim 256, 10M positions). A value beyond
// one is refused by name at load; within them every size product fits in int64.
inline constexpr int64_t kMaxVocabSize = int64_t{1} << 22;
inline constexpr int64_t kMaxHiddenSize = int64_t{1} << 16;
inline constexpr int64_t kMaxIntermediateSize = int64_t{1} << 18;
inline constexpr int64_t kMaxLayers = 1024;
inline constexpr int64_t kMaxHeads = 1024;
inline constexpr int64_t kMaxHeadDim = 1024;
inline constexpr int64_t kMaxPositions = int64_t{1} << 24;

struct ModelConfig {
  std::string architecture;  // e.g. "LlamaForCausalLM"
  ModelFamily family = ModelFamily::kLlama;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  int64_t max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;   // Qwen2 always; Llama with attention_bias.
  bool o_bias = false;     // Llama with attention_bias.
  bool mlp_bias = false;   // Llama with mlp_bias.
  bool qk_norm = false;    // Qwen3.
  int64_t sliding_window = 0;  // 0: full attention (Mistral v0.1 sets 4096).
  std::optional<int32_t> bos_token_id;
  std::vector<int32_t> eos_token_ids;
  std::string torch_dtype;  // As written in config.json; informational.

  // Parses config.json text. `source` names the file in error messages.
  static absl::StatusOr<ModelConfig> FromJson(std::string_view json, std::string_view source);
  static absl::StatusOr<ModelConfig> FromFile(const std::string& path);

  int64_t q_size() const { return num_heads * head_dim; }
  int64_t kv_size() const { return num_kv_heads * head_dim; }
  // Parameters in the checkpoint's matrices (embeddings and lm_head counted once each).
  int64_t NumParameters() const;
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_MODEL_MODEL_CONFIG_H_
