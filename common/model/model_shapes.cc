#include "common/model/model_shapes.h"

#include "common/model/gguf_model.h"

#include <sys/stat.h>

#include <utility>

#include "absl/strings/str_join.h"
#include "common/base/file_util.h"
#include "common/base/strings.h"

namespace pdserve {
namespace {

// The fields of each model's published config.json that shape the computation.
const std::vector<std::pair<std::string, std::string>>& Shapes() {
  static const auto* shapes = new std::vector<std::pair<std::string, std::string>>{
      {"llama3-8b", R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 128256,
          "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
          "num_attention_heads": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-5,
          "rope_theta": 500000.0, "max_position_embeddings": 8192, "bos_token_id": 128000,
          "eos_token_id": 128001, "tie_word_embeddings": false})"},
      {"llama3.1-8b", R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 128256,
          "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
          "num_attention_heads": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-5,
          "rope_theta": 500000.0, "max_position_embeddings": 131072,
          "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                           "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
          "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009],
          "tie_word_embeddings": false})"},
      {"mistral-7b", R"({"architectures": ["MistralForCausalLM"], "vocab_size": 32000,
          "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
          "num_attention_heads": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-5,
          "rope_theta": 10000.0, "max_position_embeddings": 32768, "sliding_window": 4096,
          "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": false})"},
      {"qwen2.5-7b", R"({"architectures": ["Qwen2ForCausalLM"], "vocab_size": 152064,
          "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
          "num_attention_heads": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-6,
          "rope_theta": 1000000.0, "max_position_embeddings": 32768, "bos_token_id": 151643,
          "eos_token_id": 151645, "tie_word_embeddings": false})"},
      {"qwen3-8b", R"({"architectures": ["Qwen3ForCausalLM"], "vocab_size": 151936,
          "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
          "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
          "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 40960,
          "bos_token_id": 151643, "eos_token_id": 151645, "tie_word_embeddings": false})"},
      {"smollm-135m", R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 49152,
          "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
          "num_attention_heads": 9, "num_key_value_heads": 3, "rms_norm_eps": 1e-5,
          "rope_theta": 10000.0, "max_position_embeddings": 2048, "bos_token_id": 0,
          "eos_token_id": 0, "tie_word_embeddings": true})"},
  };
  return *shapes;
}

}  // namespace

std::vector<std::string> ModelShapeNames() {
  std::vector<std::string> names;
  for (const auto& [name, json] : Shapes()) names.push_back(name);
  return names;
}

absl::StatusOr<ModelConfig> ModelShape(const std::string& name_or_path) {
  for (const auto& [name, json] : Shapes()) {
    if (name == name_or_path) return ModelConfig::FromJson(json, Str("shape '", name, "'"));
  }
  struct stat st;
  if (::stat(name_or_path.c_str(), &st) == 0) {
    if (IsGgufPath(name_or_path)) return LoadModelConfig(name_or_path);
    return ModelConfig::FromFile(S_ISDIR(st.st_mode) ? JoinPath(name_or_path, "config.json")
                                                     : name_or_path);
  }
  return absl::NotFoundError(Str("'", name_or_path, "' is neither a model shape (",
                                 absl::StrJoin(ModelShapeNames(), ", "),
                                 ") nor a config.json or model directory"));
}

}  // namespace pdserve
