#include "common/model/gguf_model.h"

#include <sys/stat.h>

#include <cmath>
#include <cstdio>
#include <cstring>

#include "common/base/file_util.h"
#include "common/base/status_macros.h"
#include "common/base/strings.h"
#include "kernels/cpu/quant_blocks.h"
#include "nlohmann/json.hpp"

namespace pdserve {
namespace {

using Json = nlohmann::ordered_json;

std::string HfArchitecture(const std::string& arch) {
  if (arch == "llama") return "LlamaForCausalLM";
  if (arch == "qwen2") return "Qwen2ForCausalLM";
  if (arch == "qwen3") return "Qwen3ForCausalLM";
  return "";
}

}  // namespace

bool IsGgufPath(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return path.size() > 5 && path.substr(path.size() - 5) == ".gguf";
  // A model is a directory or a GGUF file: any other file (but a config.json) is read as GGUF,
  // whose reader then says what is wrong with it ("not a GGUF file (wrong magic)").
  return S_ISREG(st.st_mode) && !(path.size() >= 5 && path.substr(path.size() - 5) == ".json");
}

bool GgufPermutesQk(const GgufFile& file) {
  auto arch = file.GetString("general.architecture");
  return arch.ok() && *arch == "llama";
}

absl::StatusOr<ModelConfig> ModelConfigFromGguf(const GgufFile& g) {
  PD_ASSIGN_OR_RETURN(const std::string arch, g.GetString("general.architecture"));
  const std::string hf = HfArchitecture(arch);
  if (hf.empty()) {
    return absl::InvalidArgumentError(Str(g.source(), ": general.architecture '", arch,
                                          "' is not supported (llama, qwen2, qwen3)"));
  }
  const std::string a = arch + ".";
  // The same fields config.json would hold, so one validator checks both kinds of model.
  Json c = Json::object();
  c["architectures"] = Json::array({hf});
  c["model_type"] = arch;
  auto put_uint = [&](const char* field, const std::string& key, bool required) -> absl::Status {
    auto v = g.GetUint(key);
    if (v.ok()) {
      c[field] = *v;
      return absl::OkStatus();
    }
    if (!required && v.status().code() == absl::StatusCode::kNotFound) return absl::OkStatus();
    return v.status();
  };
  PD_RETURN_IF_ERROR(put_uint("num_hidden_layers", a + "block_count", true));
  PD_RETURN_IF_ERROR(put_uint("hidden_size", a + "embedding_length", true));
  PD_RETURN_IF_ERROR(put_uint("intermediate_size", a + "feed_forward_length", true));
  PD_RETURN_IF_ERROR(put_uint("num_attention_heads", a + "attention.head_count", true));
  PD_RETURN_IF_ERROR(put_uint("num_key_value_heads", a + "attention.head_count_kv", false));
  PD_RETURN_IF_ERROR(put_uint("head_dim", a + "attention.key_length", false));
  PD_RETURN_IF_ERROR(put_uint("max_position_embeddings", a + "context_length", true));
  if (auto v = g.GetUint(a + "attention.value_length"); v.ok() && c.contains("head_dim") &&
                                                          *v != c["head_dim"].get<uint64_t>()) {
    return absl::InvalidArgumentError(Str(g.source(), ": ", a, "attention.value_length ", *v,
                                          " differs from the key length (not supported)"));
  }
  auto eps = g.GetFloat(a + "attention.layer_norm_rms_epsilon");
  if (!eps.ok()) return eps.status();
  c["rms_norm_eps"] = *eps;
  if (auto theta = g.GetFloat(a + "rope.freq_base"); theta.ok()) {
    c["rope_theta"] = *theta;
  } else if (theta.status().code() != absl::StatusCode::kNotFound) {
    return theta.status();
  }
  if (auto type = g.GetString(a + "rope.scaling.type"); type.ok() && *type != "none") {
    if (*type != "linear") {
      return absl::InvalidArgumentError(Str(g.source(), ": ", a, "rope.scaling.type '", *type,
                                            "' is not supported (none, linear)"));
    }
    PD_ASSIGN_OR_RETURN(const double factor, g.GetFloat(a + "rope.scaling.factor"));
    c["rope_scaling"] = {{"rope_type", "linear"}, {"factor", factor}};
  }
  if (g.Find("pdserve.rope.scaling.type") != nullptr) {
    PD_ASSIGN_OR_RETURN(const std::string type, g.GetString("pdserve.rope.scaling.type"));
    if (type != "llama3") {
      return absl::InvalidArgumentError(Str(g.source(), ": pdserve.rope.scaling.type '", type,
                                            "' (llama3)"));
    }
    Json rs = {{"rope_type", "llama3"}};
    for (const char* key : {"factor", "low_freq_factor", "high_freq_factor"}) {
      PD_ASSIGN_OR_RETURN(rs[key], g.GetFloat(Str("pdserve.rope.scaling.", key)));
    }
    PD_ASSIGN_OR_RETURN(rs["original_max_position_embeddings"],
                        g.GetUint("pdserve.rope.scaling.original_max_position_embeddings"));
    c["rope_scaling"] = rs;
  }
  if (auto window = g.GetUint(a + "attention.sliding_window"); window.ok() && *window > 0) {
    if (arch != "llama") {
      return absl::InvalidArgumentError(Str(g.source(), ": a sliding window in a ", arch,
                                            " file is not supported"));
    }
    c["architectures"] = Json::array({"MistralForCausalLM"});
    c["model_type"] = "mistral";
    c["sliding_window"] = *window;
  }
  const GgufTensor* embd = g.FindTensor("token_embd.weight");
  if (embd == nullptr || embd->dims.size() != 2) {
    return absl::InvalidArgumentError(Str(g.source(), ": no 2-D tensor token_embd.weight"));
  }
  c["vocab_size"] = embd->dims[1];
  c["tie_word_embeddings"] = g.FindTensor("output.weight") == nullptr;
  if (arch == "llama") {
    c["attention_bias"] = g.FindTensor("blk.0.attn_q.bias") != nullptr;
    c["mlp_bias"] = g.FindTensor("blk.0.ffn_gate.bias") != nullptr;
  }
  if (auto bos = g.GetUint("tokenizer.ggml.bos_token_id"); bos.ok()) c["bos_token_id"] = *bos;
  if (auto eos = g.GetUint("tokenizer.ggml.eos_token_id"); eos.ok()) c["eos_token_id"] = *eos;
  c["torch_dtype"] = std::string(GgmlTypeName(embd->type));
  PD_ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::FromJson(c.dump(), g.source()));
  if (auto rot = g.GetUint(a + "rope.dimension_count");
      rot.ok() && static_cast<int64_t>(*rot) != config.head_dim) {
    return absl::InvalidArgumentError(Str(g.source(), ": ", a, "rope.dimension_count ", *rot,
                                          " is not the head size ", config.head_dim,
                                          " (partial rotary embeddings are not supported)"));
  }
  // llama.cpp's converter writes Llama 3.1's scaling as per-frequency factors.
  if (const GgufTensor* f = g.FindTensor("rope_freqs.weight");
      f != nullptr && config.rope_scaling.type == RopeScaling::Type::kNone) {
    if (f->elements() != config.head_dim / 2 || GgmlQuantized(f->type)) {
      return absl::InvalidArgumentError(Str(g.source(), ": rope_freqs.weight must hold ",
                                            config.head_dim / 2, " float factors"));
    }
    config.rope_scaling.type = RopeScaling::Type::kFactors;
    config.rope_scaling.freq_factors.resize(static_cast<size_t>(f->elements()));
    kernels::DequantizeRow(f->type, f->data, config.rope_scaling.freq_factors.data(), f->elements());
    for (float x : config.rope_scaling.freq_factors) {
      if (!(x > 0) || !std::isfinite(x)) {
        return absl::InvalidArgumentError(Str(g.source(), ": rope_freqs.weight holds ", x));
      }
    }
  }
  return config;
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& path) {
  if (!IsGgufPath(path)) return ModelConfig::FromFile(JoinPath(path, "config.json"));
  PD_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> g, GgufFile::Open(path));
  return ModelConfigFromGguf(*g);
}

}  // namespace pdserve
