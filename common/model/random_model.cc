#include "common/model/random_model.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <new>
#include <tuple>
#include <vector>

#include "common/base/strings.h"
#include "absl/strings/str_format.h"
#include "common/base/file_util.h"
#include "common/base/rng.h"
#include "common/base/status_macros.h"
#include "common/model/model_config.h"
#include "common/model/safetensors_writer.h"
#include "common/tokenizer/bpe_trainer.h"
#include "nlohmann/json.hpp"

namespace pdserve {
namespace {

struct Tensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> values;
};

// Scales chosen so activations stay O(1) through the layers and attention is far from uniform,
// which makes the parity tests sensitive to mistakes (a uniform softmax would hide them).
Tensor Normal(SplitMix64& rng, std::string name, std::vector<int64_t> shape, double std,
              double mean = 0.0) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  Tensor t{std::move(name), std::move(shape), std::vector<float>(n)};
  for (float& v : t.values) v = static_cast<float>(mean + std * rng.Normal());
  return t;
}

std::string ArchName(const std::string& arch) {
  if (arch == "llama") return "LlamaForCausalLM";
  if (arch == "mistral") return "MistralForCausalLM";
  if (arch == "qwen2") return "Qwen2ForCausalLM";
  if (arch == "qwen3") return "Qwen3ForCausalLM";
  return "";
}

// Everything that can be known before a file is written: the shape against the bounds pdserve
// loads (model_config.h), and the memory the tensors take while they are made (f32 values and
// the writer's copy in the output dtype), against the machine's.
absl::Status CheckSpec(const RandomModelSpec& s) {
  if (ArchName(s.arch).empty()) {
    return absl::InvalidArgumentError(
        Str("--arch '", s.arch, "' is not one of llama, mistral, qwen2, qwen3"));
  }
  for (auto [name, v, max] :
       {std::tuple{"--layers", s.layers, kMaxLayers}, {"--hidden", s.hidden, kMaxHiddenSize},
        {"--heads", s.heads, kMaxHeads}, {"--kv-heads", s.kv_heads, kMaxHeads},
        {"--intermediate", s.intermediate, kMaxIntermediateSize},
        {"--vocab", s.vocab, kMaxVocabSize}, {"--head-dim", std::max<int64_t>(s.head_dim, 1),
                                              kMaxHeadDim}}) {
    if (v <= 0) return absl::InvalidArgumentError(Str(name, " must be positive"));
    if (v > max) {
      return absl::InvalidArgumentError(Str(name, " is ", v, "; pdserve loads at most ", max));
    }
  }
  if (s.heads % s.kv_heads != 0) {
    return absl::InvalidArgumentError("--kv-heads must divide --heads");
  }
  const int64_t head_dim = s.head_dim > 0 ? s.head_dim : s.hidden / s.heads;
  if (head_dim <= 0 || head_dim % 2 != 0) {
    return absl::InvalidArgumentError("head dimension must be a positive even number");
  }
  if (s.shards < 1) return absl::InvalidArgumentError("--shards must be at least 1");
  const double h = static_cast<double>(s.hidden), q = static_cast<double>(s.heads) * head_dim,
               kv = static_cast<double>(s.kv_heads) * head_dim;
  const double per_layer = h * q * 2 + h * kv * 2 + 3 * h * static_cast<double>(s.intermediate);
  const double params =
      static_cast<double>(s.layers) * per_layer + h * s.vocab * (s.tie_embeddings ? 1 : 2);
  const double bytes = params * (sizeof(float) + DTypeSize(s.dtype));
  const double memory = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
  if (memory > 0 && bytes > memory * 0.8) {
    return absl::ResourceExhaustedError(
        Str("a model of ", static_cast<int64_t>(params / 1e6), "M parameters needs ",
            static_cast<int64_t>(bytes / (1 << 30)), " GiB of memory to be made; this machine has ",
            static_cast<int64_t>(memory / (1 << 30)), " GiB"));
  }
  return absl::OkStatus();
}

// Removes what a failed WriteRandomModel wrote: the directory when it made it, else its files.
void RemovePartialModel(const std::string& dir, bool made_dir) {
  std::error_code ec;
  if (made_dir) {
    std::filesystem::remove_all(dir, ec);
    return;
  }
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const bool ours = name.rfind("tokenizer.json", 0) == 0 ||
                      name.rfind("tokenizer_config.json", 0) == 0 ||
                      name.rfind("config.json", 0) == 0 ||
                      name.rfind("generation_config.json", 0) == 0 ||
                      (name.rfind("model", 0) == 0 && name.find(".safetensors") != std::string::npos);
    if (ours) std::filesystem::remove(entry.path(), ec);
  }
}

absl::Status WriteRandomModelFiles(const RandomModelSpec& s, const std::string& dir) {
  const std::string arch_name = ArchName(s.arch);
  const int64_t head_dim = s.head_dim > 0 ? s.head_dim : s.hidden / s.heads;

  PD_ASSIGN_OR_RETURN(TrainedTokenizerFiles tok, TrainByteLevelTokenizer(s.vocab));
  PD_RETURN_IF_ERROR(WriteStringToFile(JoinPath(dir, "tokenizer.json"), tok.tokenizer_json));
  PD_RETURN_IF_ERROR(
      WriteStringToFile(JoinPath(dir, "tokenizer_config.json"), tok.tokenizer_config_json));

  const bool qkv_bias = s.arch == "qwen2";
  const bool qk_norm = s.arch == "qwen3";
  nlohmann::ordered_json config;
  config["architectures"] = {arch_name};
  config["model_type"] = s.arch;
  config["vocab_size"] = s.vocab;
  config["hidden_size"] = s.hidden;
  config["intermediate_size"] = s.intermediate;
  config["num_hidden_layers"] = s.layers;
  config["num_attention_heads"] = s.heads;
  config["num_key_value_heads"] = s.kv_heads;
  if (s.head_dim > 0 || qk_norm) config["head_dim"] = head_dim;
  config["hidden_act"] = "silu";
  config["max_position_embeddings"] = s.max_position;
  config["rms_norm_eps"] = 1e-5;
  config["tie_word_embeddings"] = s.tie_embeddings;
  config["bos_token_id"] = tok.bos_token_id;
  config["eos_token_id"] = tok.eos_token_id;
  config["torch_dtype"] = s.dtype == DType::kF32 ? "float32" : s.dtype == DType::kBF16 ? "bfloat16" : "float16";
  if (s.arch == "llama") {
    // Llama 3.1's rope: theta 500000 and llama3 scaling, so the scaling path is exercised.
    config["rope_theta"] = 500000.0;
    config["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                              {"high_freq_factor", 4.0},
                              {"original_max_position_embeddings", 8192}};
    config["attention_bias"] = false;
    config["mlp_bias"] = false;
  } else if (s.arch == "mistral") {
    config["rope_theta"] = 1000000.0;
    config["sliding_window"] = s.sliding_window > 0 ? nlohmann::ordered_json(s.sliding_window)
                                                    : nlohmann::ordered_json(nullptr);
  } else {
    config["rope_theta"] = 1000000.0;
    config["use_sliding_window"] = false;
    config["sliding_window"] = nullptr;
    if (qk_norm) config["attention_bias"] = false;
  }
  PD_RETURN_IF_ERROR(WriteStringToFile(JoinPath(dir, "config.json"), config.dump(2)));
  nlohmann::ordered_json gen;
  gen["bos_token_id"] = tok.bos_token_id;
  gen["eos_token_id"] = tok.eos_token_id;
  PD_RETURN_IF_ERROR(WriteStringToFile(JoinPath(dir, "generation_config.json"), gen.dump(2)));

  // Tensors, in the order Hugging Face writes them.
  SplitMix64 rng(s.seed * 0x9e3779b97f4a7c15ull + 12345);
  const int64_t h = s.hidden, q = s.heads * head_dim, kv = s.kv_heads * head_dim;
  const double in_h = 1.0 / std::sqrt(double(h));
  std::vector<Tensor> tensors;
  tensors.push_back(Normal(rng, "model.embed_tokens.weight", {s.vocab, h}, 1.0));
  for (int64_t i = 0; i < s.layers; ++i) {
    const std::string p = Str("model.layers.", i, ".");
    tensors.push_back(Normal(rng, p + "input_layernorm.weight", {h}, 0.1, 1.0));
    tensors.push_back(Normal(rng, p + "self_attn.q_proj.weight", {q, h}, in_h));
    tensors.push_back(Normal(rng, p + "self_attn.k_proj.weight", {kv, h}, in_h));
    tensors.push_back(Normal(rng, p + "self_attn.v_proj.weight", {kv, h}, in_h));
    if (qkv_bias) {
      tensors.push_back(Normal(rng, p + "self_attn.q_proj.bias", {q}, 0.1));
      tensors.push_back(Normal(rng, p + "self_attn.k_proj.bias", {kv}, 0.1));
      tensors.push_back(Normal(rng, p + "self_attn.v_proj.bias", {kv}, 0.1));
    }
    if (qk_norm) {
      tensors.push_back(Normal(rng, p + "self_attn.q_norm.weight", {head_dim}, 0.1, 1.0));
      tensors.push_back(Normal(rng, p + "self_attn.k_norm.weight", {head_dim}, 0.1, 1.0));
    }
    tensors.push_back(Normal(rng, p + "self_attn.o_proj.weight", {h, q}, 1.0 / std::sqrt(double(q))));
    tensors.push_back(Normal(rng, p + "post_attention_layernorm.weight", {h}, 0.1, 1.0));
    tensors.push_back(Normal(rng, p + "mlp.gate_proj.weight", {s.intermediate, h}, in_h));
    tensors.push_back(Normal(rng, p + "mlp.up_proj.weight", {s.intermediate, h}, in_h));
    tensors.push_back(Normal(rng, p + "mlp.down_proj.weight", {h, s.intermediate},
                             1.0 / std::sqrt(double(s.intermediate))));
  }
  tensors.push_back(Normal(rng, "model.norm.weight", {h}, 0.1, 1.0));
  if (!s.tie_embeddings) tensors.push_back(Normal(rng, "lm_head.weight", {s.vocab, h}, in_h * 2));

  // Shards: contiguous runs of tensors of about equal byte size.
  size_t total = 0;
  for (const Tensor& t : tensors) total += t.values.size() * DTypeSize(s.dtype);
  const int shards = std::min<int>(s.shards, static_cast<int>(tensors.size()));
  std::vector<SafetensorsWriter> writers(shards);
  size_t running = 0;
  for (const Tensor& t : tensors) {
    const size_t bytes = t.values.size() * DTypeSize(s.dtype);
    int shard = static_cast<int>(running * shards / std::max<size_t>(total, 1));
    shard = std::min(shard, shards - 1);
    writers[shard].Add(t.name, s.dtype, t.shape, t.values);
    running += bytes;
  }
  if (shards == 1) {
    return writers[0].WriteFile(JoinPath(dir, "model.safetensors"));
  }
  nlohmann::ordered_json index;
  index["metadata"] = {{"total_size", total}};
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  for (int i = 0; i < shards; ++i) {
    const std::string file = absl::StrFormat("model-%05d-of-%05d.safetensors", i + 1, shards);
    if (writers[i].empty()) continue;
    PD_RETURN_IF_ERROR(writers[i].WriteFile(JoinPath(dir, file)));
    for (const std::string& name : writers[i].names()) weight_map[name] = file;
  }
  index["weight_map"] = weight_map;
  return WriteStringToFile(JoinPath(dir, "model.safetensors.index.json"), index.dump(2));
}

}  // namespace

absl::Status WriteRandomModel(const RandomModelSpec& s, const std::string& dir) {
  PD_RETURN_IF_ERROR(CheckSpec(s));
  const bool made_dir = !FileExists(dir);
  PD_RETURN_IF_ERROR(MakeDirectories(dir));
  absl::Status status;
  try {
    status = WriteRandomModelFiles(s, dir);
  } catch (const std::bad_alloc&) {
    status = absl::ResourceExhaustedError("out of memory while making the model's tensors");
  }
  if (!status.ok()) RemovePartialModel(dir, made_dir);
  return status;
}

}  // namespace pdserve
