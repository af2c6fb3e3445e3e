#include "common/model/model_config.h"

#include <cmath>

#include "common/base/strings.h"
#include "absl/strings/str_join.h"
#include "common/base/file_util.h"
#include "common/base/status_macros.h"
#include "nlohmann/json.hpp"

namespace pdserve {
namespace {

using Json = nlohmann::json;

// Field readers: every error names the file and the field, and says what was expected.
class FieldReader {
 public:
  FieldReader(const Json& obj, std::string_view source) : obj_(obj), source_(source) {}

  absl::Status Error(std::string_view field, std::string_view what) const {
    return absl::InvalidArgumentError(Str(source_, ": field '", field, "' ", what));
  }

  bool Has(const char* field) const {
    auto it = obj_.find(field);
    return it != obj_.end() && !it->is_null();
  }

  absl::StatusOr<int64_t> PositiveInt(const char* field) const {
    auto it = obj_.find(field);
    if (it == obj_.end() || it->is_null()) return Error(field, "is missing");
    if (!it->is_number_integer() || it->get<int64_t>() <= 0) {
      return Error(field, Str("must be a positive integer, got ", it->dump()));
    }
    return it->get<int64_t>();
  }

  // A positive integer no larger than `max`: the bound no real model comes near, so that an absurd
  // value is refused by name here instead of exhausting memory (or overflowing sizes) later.
  absl::StatusOr<int64_t> PositiveInt(const char* field, int64_t max) const {
    PD_ASSIGN_OR_RETURN(const int64_t v, PositiveInt(field));
    if (v > max) return Error(field, Str("is ", v, "; at most ", max, " is supported"));
    return v;
  }

  absl::StatusOr<int64_t> PositiveIntOr(const char* field, int64_t fallback, int64_t max) const {
    if (!Has(field)) return fallback;
    return PositiveInt(field, max);
  }

  absl::StatusOr<double> PositiveNumberOr(const char* field, double fallback) const {
    if (!Has(field)) return fallback;
    const Json& v = obj_.at(field);
    if (!v.is_number() || !(v.get<double>() > 0) || !std::isfinite(v.get<double>())) {
      return Error(field, Str("must be a positive number, got ", v.dump()));
    }
    return v.get<double>();
  }

  absl::StatusOr<bool> BoolOr(const char* field, bool fallback) const {
    if (!Has(field)) return fallback;
    const Json& v = obj_.at(field);
    if (!v.is_boolean()) return Error(field, Str("must be true or false, got ", v.dump()));
    return v.get<bool>();
  }

  // An int, a list of ints, or null.
  absl::StatusOr<std::vector<int32_t>> TokenIds(const char* field) const {
    std::vector<int32_t> ids;
    if (!Has(field)) return ids;
    const Json& v = obj_.at(field);
    auto one = [&](const Json& x) -> absl::Status {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > INT32_MAX) {
        return Error(field, Str("must hold non-negative token ids, got ", x.dump()));
      }
      ids.push_back(static_cast<int32_t>(x.get<int64_t>()));
      return absl::OkStatus();
    };
    if (v.is_array()) {
      for (const Json& x : v) PD_RETURN_IF_ERROR(one(x));
    } else {
      PD_RETURN_IF_ERROR(one(v));
    }
    return ids;
  }

 private:
  const Json& obj_;
  std::string_view source_;
};

absl::StatusOr<ModelFamily> FamilyFromArchitecture(std::string_view arch, std::string_view source) {
  if (arch == "LlamaForCausalLM") return ModelFamily::kLlama;
  if (arch == "MistralForCausalLM") return ModelFamily::kMistral;
  if (arch == "Qwen2ForCausalLM") return ModelFamily::kQwen2;
  if (arch == "Qwen3ForCausalLM") return ModelFamily::kQwen3;
  return absl::InvalidArgumentError(Str(
      source, ": unknown architecture '", arch,
      "' (supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM)"));
}

absl::StatusOr<RopeScaling> ParseRopeScaling(const Json& j, std::string_view source,
                                             const char* field) {
  RopeScaling rs;
  if (j.is_null()) return rs;
  auto err = [&](std::string_view what) {
    return absl::InvalidArgumentError(Str(source, ": field '", field, "' ", what));
  };
  if (!j.is_object()) return err("must be an object or null");
  std::string type;
  if (j.contains("rope_type") && j["rope_type"].is_string()) {
    type = j["rope_type"].get<std::string>();
  } else if (j.contains("type") && j["type"].is_string()) {
    type = j["type"].get<std::string>();
  } else {
    return err("has no 'rope_type'");
  }
  FieldReader r(j, source);
  if (type == "default") return rs;
  if (type == "linear") {
    rs.type = RopeScaling::Type::kLinear;
    PD_ASSIGN_OR_RETURN(rs.factor, r.PositiveNumberOr("factor", 1.0));
    return rs;
  }
  if (type == "llama3") {
    rs.type = RopeScaling::Type::kLlama3;
    PD_ASSIGN_OR_RETURN(rs.factor, r.PositiveNumberOr("factor", 8.0));
    PD_ASSIGN_OR_RETURN(rs.low_freq_factor, r.PositiveNumberOr("low_freq_factor", 1.0));
    PD_ASSIGN_OR_RETURN(rs.high_freq_factor, r.PositiveNumberOr("high_freq_factor", 4.0));
    PD_ASSIGN_OR_RETURN(rs.original_max_position,
                        r.PositiveInt("original_max_position_embeddings", kMaxPositions));
    if (!(rs.high_freq_factor > rs.low_freq_factor)) {
      return err("needs high_freq_factor > low_freq_factor");
    }
    return rs;
  }
  return err(Str("has rope type '", type,
                          "', which is not supported (supported: default, linear, llama3)"));
}

}  // namespace

std::string_view ModelFamilyName(ModelFamily family) {
  switch (family) {
    case ModelFamily::kLlama: return "llama";
    case ModelFamily::kMistral: return "mistral";
    case ModelFamily::kQwen2: return "qwen2";
    case ModelFamily::kQwen3: return "qwen3";
  }
  return "?";
}

absl::StatusOr<ModelConfig> ModelConfig::FromJson(std::string_view json, std::string_view source) {
  Json j = Json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(Str(source, ": not valid JSON"));
  if (!j.is_object()) {
    return absl::InvalidArgumentError(Str(source, ": top level must be a JSON object"));
  }
  ModelConfig c;
  FieldReader r(j, source);
  if (!j.contains("architectures") || !j["architectures"].is_array() ||
      j["architectures"].empty() || !j["architectures"][0].is_string()) {
    return r.Error("architectures", "must be a non-empty list of names");
  }
  c.architecture = j["architectures"][0].get<std::string>();
  PD_ASSIGN_OR_RETURN(c.family, FamilyFromArchitecture(c.architecture, source));

  PD_ASSIGN_OR_RETURN(c.vocab_size, r.PositiveInt("vocab_size", kMaxVocabSize));
  PD_ASSIGN_OR_RETURN(c.hidden_size, r.PositiveInt("hidden_size", kMaxHiddenSize));
  PD_ASSIGN_OR_RETURN(c.intermediate_size, r.PositiveInt("intermediate_size", kMaxIntermediateSize));
  PD_ASSIGN_OR_RETURN(c.num_layers, r.PositiveInt("num_hidden_layers", kMaxLayers));
  PD_ASSIGN_OR_RETURN(c.num_heads, r.PositiveInt("num_attention_heads", kMaxHeads));
  PD_ASSIGN_OR_RETURN(c.num_kv_heads,
                      r.PositiveIntOr("num_key_value_heads", c.num_heads, kMaxHeads));
  if (c.num_heads % c.num_kv_heads != 0) {
    return r.Error("num_key_value_heads",
                   Str("(", c.num_kv_heads, ") must divide num_attention_heads (",
                                c.num_heads, ")"));
  }
  const int64_t default_head_dim =
      c.family == ModelFamily::kQwen3 && !r.Has("head_dim") ? 128 : c.hidden_size / c.num_heads;
  PD_ASSIGN_OR_RETURN(c.head_dim, r.PositiveIntOr("head_dim", default_head_dim, kMaxHeadDim));
  if (c.head_dim % 2 != 0) return r.Error("head_dim", "must be even (rotary embedding)");
  if (!r.Has("head_dim") && c.hidden_size % c.num_heads != 0) {
    return r.Error("hidden_size", "must be divisible by num_attention_heads when head_dim is unset");
  }
  PD_ASSIGN_OR_RETURN(c.rms_norm_eps, r.PositiveNumberOr("rms_norm_eps", 1e-6));
  PD_ASSIGN_OR_RETURN(c.max_position_embeddings,
                      r.PositiveIntOr("max_position_embeddings", 4096, kMaxPositions));

  // Newer transformers write rope settings under "rope_parameters"; older under rope_theta and
  // rope_scaling.
  if (r.Has("rope_parameters") && j["rope_parameters"].is_object()) {
    const Json& rp = j["rope_parameters"];
    FieldReader rr(rp, source);
    PD_ASSIGN_OR_RETURN(c.rope_theta, rr.PositiveNumberOr("rope_theta", 10000.0));
    PD_ASSIGN_OR_RETURN(c.rope_scaling, ParseRopeScaling(rp, source, "rope_parameters"));
  } else {
    PD_ASSIGN_OR_RETURN(c.rope_theta, r.PositiveNumberOr("rope_theta", 10000.0));
    if (r.Has("rope_scaling")) {
      PD_ASSIGN_OR_RETURN(c.rope_scaling, ParseRopeScaling(j["rope_scaling"], source,
                                                           "rope_scaling"));
    }
  }

  if (r.Has("hidden_act")) {
    if (!j["hidden_act"].is_string() || j["hidden_act"].get<std::string>() != "silu") {
      return r.Error("hidden_act", Str("is ", j["hidden_act"].dump(),
                                                "; only \"silu\" is supported"));
    }
  }
  PD_ASSIGN_OR_RETURN(c.tie_word_embeddings, r.BoolOr("tie_word_embeddings", false));

  switch (c.family) {
    case ModelFamily::kLlama: {
      PD_ASSIGN_OR_RETURN(const bool attention_bias, r.BoolOr("attention_bias", false));
      c.qkv_bias = c.o_bias = attention_bias;
      PD_ASSIGN_OR_RETURN(c.mlp_bias, r.BoolOr("mlp_bias", false));
      break;
    }
    case ModelFamily::kMistral:
      // Transformers' MistralConfig defaults to a 4096-token window when the key is absent;
      // an explicit null turns it off (Mistral v0.2 and later).
      if (!j.contains("sliding_window")) {
        c.sliding_window = 4096;
      } else if (r.Has("sliding_window")) {
        PD_ASSIGN_OR_RETURN(c.sliding_window, r.PositiveInt("sliding_window", kMaxPositions));
      }
      break;
    case ModelFamily::kQwen2:
    case ModelFamily::kQwen3: {
      if (c.family == ModelFamily::kQwen2) {
        c.qkv_bias = true;
      } else {
        c.qk_norm = true;
        PD_ASSIGN_OR_RETURN(const bool attention_bias, r.BoolOr("attention_bias", false));
        c.qkv_bias = c.o_bias = attention_bias;
      }
      PD_ASSIGN_OR_RETURN(const bool use_sliding, r.BoolOr("use_sliding_window", false));
      if (use_sliding) {
        return r.Error("use_sliding_window",
                       "is true; per-layer sliding windows of Qwen models are not supported");
      }
      break;
    }
  }

  PD_ASSIGN_OR_RETURN(std::vector<int32_t> bos, r.TokenIds("bos_token_id"));
  if (!bos.empty()) c.bos_token_id = bos[0];
  PD_ASSIGN_OR_RETURN(c.eos_token_ids, r.TokenIds("eos_token_id"));
  for (int32_t id : c.eos_token_ids) {
    if (id >= c.vocab_size) {
      return r.Error("eos_token_id", Str("holds ", id, ", outside the vocabulary of ",
                                                  c.vocab_size));
    }
  }
  if (r.Has("torch_dtype") && j["torch_dtype"].is_string()) {
    c.torch_dtype = j["torch_dtype"].get<std::string>();
  }
  return c;
}

absl::StatusOr<ModelConfig> ModelConfig::FromFile(const std::string& path) {
  PD_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  return FromJson(text, path);
}

int64_t ModelConfig::NumParameters() const {
  const int64_t attn = hidden_size * q_size() + 2 * hidden_size * kv_size() + q_size() * hidden_size;
  const int64_t mlp = 3 * hidden_size * intermediate_size;
  const int64_t per_layer = attn + mlp + 2 * hidden_size;
  const int64_t embed = vocab_size * hidden_size;
  return num_layers * per_layer + embed * (tie_word_embeddings ? 1 : 2) + hidden_size;
}

}  // namespace pdserve
