#include "common/model/lora_adapter.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <optional>

#define XXH_STATIC_LINKING_ONLY  // For XXH3_state_t on the stack.
#include <xxhash.h>

#include "absl/strings/str_join.h"
#include "common/base/dtype.h"
#include "common/base/file_util.h"
#include "common/base/status_macros.h"
#include "common/base/strings.h"
#include "common/model/safetensors.h"
#include "kernels/cpu/linear_bf16.h"
#include "nlohmann/json.hpp"

namespace pdserve {
namespace {

using Json = nlohmann::json;

constexpr std::array<std::string_view, kNumLoraTargets> kTargetNames = {
    "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};

// A projection's [out, in] in the base model.
std::pair<int64_t, int64_t> ProjectionShape(const ModelConfig& c, LoraTarget t) {
  switch (t) {
    case LoraTarget::kQ: return {c.q_size(), c.hidden_size};
    case LoraTarget::kK:
    case LoraTarget::kV: return {c.kv_size(), c.hidden_size};
    case LoraTarget::kO: return {c.hidden_size, c.q_size()};
    case LoraTarget::kGate:
    case LoraTarget::kUp: return {c.intermediate_size, c.hidden_size};
    case LoraTarget::kDown: return {c.hidden_size, c.intermediate_size};
  }
  return {0, 0};
}

std::optional<LoraTarget> TargetByName(std::string_view name) {
  for (int i = 0; i < kNumLoraTargets; ++i) {
    if (kTargetNames[static_cast<size_t>(i)] == name) return static_cast<LoraTarget>(i);
  }
  return std::nullopt;
}

struct TensorSite {
  int64_t layer = 0;
  LoraTarget target = LoraTarget::kQ;
  bool is_b = false;
};

// "<prefix>layers.<i>.self_attn.q_proj.lora_A.weight" (PEFT's names: the prefix is
// "base_model.model.model."), or why a tensor is not one pdserve runs.
absl::StatusOr<TensorSite> ParseTensorName(std::string_view name, std::string_view source) {
  auto refuse = [&](std::string_view why) {
    return absl::InvalidArgumentError(Str(source, ": tensor '", name, "' ", why));
  };
  if (name.find("lora_magnitude_vector") != std::string_view::npos) {
    return refuse("is a DoRA magnitude: DoRA adapters are not supported");
  }
  if (name.find("lora_embedding") != std::string_view::npos ||
      name.find("embed_tokens") != std::string_view::npos ||
      name.find("lm_head") != std::string_view::npos) {
    return refuse("adapts the embeddings or lm_head: only the attention and MLP projections "
                  "(q/k/v/o/gate/up/down_proj) are supported");
  }
  TensorSite site;
  constexpr std::string_view kA = ".lora_A.weight", kB = ".lora_B.weight";
  std::string_view module;
  if (name.size() > kA.size() && name.substr(name.size() - kA.size()) == kA) {
    module = name.substr(0, name.size() - kA.size());
  } else if (name.size() > kB.size() && name.substr(name.size() - kB.size()) == kB) {
    module = name.substr(0, name.size() - kB.size());
    site.is_b = true;
  } else if (name.find(".bias") != std::string_view::npos) {
    return refuse("is a bias: adapters with bias other than \"none\" are not supported");
  } else {
    return refuse("is not a LoRA matrix (lora_A.weight or lora_B.weight) of a projection; "
                  "modules_to_save and other trained weights are not supported");
  }
  const size_t at = module.rfind("layers.");
  if (at == std::string_view::npos || (at > 0 && module[at - 1] != '.')) {
    return refuse("names no decoder layer (expected ...layers.<i>.self_attn|mlp.<proj>)");
  }
  std::string_view rest = module.substr(at + 7);
  size_t digits = 0;
  while (digits < rest.size() && digits < 6 && rest[digits] >= '0' && rest[digits] <= '9') ++digits;
  if (digits == 0 || digits >= rest.size() || rest[digits] != '.') {
    return refuse("names no decoder layer (expected ...layers.<i>.self_attn|mlp.<proj>)");
  }
  site.layer = std::stoll(std::string(rest.substr(0, digits)));
  rest = rest.substr(digits + 1);
  std::string_view block, proj;
  if (rest.substr(0, 10) == "self_attn.") {
    block = "self_attn";
    proj = rest.substr(10);
  } else if (rest.substr(0, 4) == "mlp.") {
    block = "mlp";
    proj = rest.substr(4);
  } else {
    return refuse("targets a module that is not an attention or MLP projection");
  }
  const std::optional<LoraTarget> target = TargetByName(proj);
  const bool attn = target && static_cast<int>(*target) <= static_cast<int>(LoraTarget::kO);
  if (!target || attn != (block == "self_attn")) {
    return refuse(Str("targets '", block, ".", proj,
                      "': only q/k/v/o_proj (self_attn) and gate/up/down_proj (mlp) are supported"));
  }
  site.target = *target;
  return site;
}

std::vector<float> ToF32(const SafetensorsTensor& t) {
  const size_t n = t.nbytes / DTypeSize(*t.dtype);
  std::vector<float> out(n);
  const uint8_t* p = t.data;
  for (size_t i = 0; i < n; ++i) {
    switch (*t.dtype) {
      case DType::kF32: std::memcpy(&out[i], p + 4 * i, 4); break;
      case DType::kBF16: {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = Bf16ToF32(h);
        break;
      }
      case DType::kF16: {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = F16ToF32(h);
        break;
      }
    }
  }
  return out;
}

}  // namespace

std::string_view LoraTargetName(LoraTarget t) { return kTargetNames[static_cast<size_t>(t)]; }

void LoraAdapter::PackBf16(MatrixLayout layout) const {
  absl::call_once(packed_once_, [&] {
    for (auto& layer : layers_) {
      for (Matrices& m : layer) {
        if (m.rank() == 0) continue;
        m.a_bf16.resize(kernels::Bf16PanelsBytes(m.a_ref.rows, m.a_ref.cols) / 2);
        m.b_bf16.resize(kernels::Bf16PanelsBytes(m.b_ref.rows, m.b_ref.cols) / 2);
        m.a_panels = kernels::PackBf16Panels(m.a_ref, m.a_bf16.data(), layout);
        m.b_panels = kernels::PackBf16Panels(m.b_ref, m.b_bf16.data(), layout);
      }
    }
  });
}

BlockHash LoraAdapter::KvRoot(const LoraAdapter& a, int64_t num_layers) {
  XXH3_state_t state;
  XXH3_128bits_reset(&state);
  static constexpr char kScheme[] = "lora-kv-root-v1";
  XXH3_128bits_update(&state, kScheme, sizeof(kScheme) - 1);
  for (int64_t l = 0; l < num_layers; ++l) {
    for (int i = 0; i < kNumLoraTargets; ++i) {
      const Matrices& m = a.layers_[static_cast<size_t>(l)][static_cast<size_t>(i)];
      const int64_t head[3] = {l, i, m.rank()};
      XXH3_128bits_update(&state, head, sizeof(head));
      XXH3_128bits_update(&state, m.a.data(), m.a.size() * sizeof(float));
      XXH3_128bits_update(&state, m.b.data(), m.b.size() * sizeof(float));
    }
  }
  const XXH128_hash_t h = XXH3_128bits_digest(&state);
  return BlockHash{h.low64, h.high64};
}

absl::StatusOr<std::shared_ptr<const LoraAdapter>> LoraAdapter::Load(std::string name,
                                                                     const std::string& dir,
                                                                     const ModelConfig& base,
                                                                     int64_t max_rank) {
  const std::string config_path = dir + "/adapter_config.json";
  const std::string weights_path = dir + "/adapter_model.safetensors";
  std::error_code ec;
  if (!std::filesystem::is_regular_file(config_path, ec)) {
    return absl::NotFoundError(Str("LoRA adapter '", name, "': ", config_path, " not found (a PEFT "
                                   "adapter directory holds adapter_config.json and "
                                   "adapter_model.safetensors)"));
  }
  if (!std::filesystem::is_regular_file(weights_path, ec)) {
    return absl::NotFoundError(Str("LoRA adapter '", name, "': ", weights_path,
                                   " not found (adapter_model.bin, PyTorch's pickle, is not read: "
                                   "save with safe_serialization)"));
  }
  PD_ASSIGN_OR_RETURN(const std::string text, ReadFileToString(config_path));
  const Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  auto field_error = [&](std::string_view field, std::string_view what) {
    return absl::InvalidArgumentError(Str(config_path, ": field '", field, "' ", what));
  };
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(Str(config_path, ": not a JSON object"));
  }
  auto has = [&](const char* f) { return j.contains(f) && !j[f].is_null(); };
  if (has("peft_type") && j["peft_type"] != "LORA") {
    return field_error("peft_type", Str("is ", j["peft_type"].dump(), "; only LORA is supported"));
  }
  std::shared_ptr<LoraAdapter> a(new LoraAdapter());
  a->name_ = std::move(name);
  a->path_ = dir;
  if (has("base_model_name_or_path")) {
    if (!j["base_model_name_or_path"].is_string()) {
      return field_error("base_model_name_or_path", "must be a string");
    }
    a->base_model_ = j["base_model_name_or_path"].get<std::string>();
  }
  if (!has("r")) return field_error("r", "is missing");
  if (!j["r"].is_number_integer() || j["r"].get<int64_t>() < 1) {
    return field_error("r", Str("must be a positive integer, got ", j["r"].dump()));
  }
  a->rank_ = j["r"].get<int64_t>();
  if (a->rank_ > max_rank) {
    return field_error("r", Str("is ", a->rank_, ", above this server's --max-lora-rank ", max_rank));
  }
  a->alpha_ = 8;  // PEFT's default.
  if (has("lora_alpha")) {
    if (!j["lora_alpha"].is_number() || !std::isfinite(j["lora_alpha"].get<double>())) {
      return field_error("lora_alpha", Str("must be a number, got ", j["lora_alpha"].dump()));
    }
    a->alpha_ = j["lora_alpha"].get<double>();
  }
  for (const char* f : {"use_rslora", "use_dora", "fan_in_fan_out"}) {
    if (has(f) && !j[f].is_boolean()) return field_error(f, "must be true or false");
  }
  a->rslora_ = has("use_rslora") && j["use_rslora"].get<bool>();
  if (has("use_dora") && j["use_dora"].get<bool>()) {
    return field_error("use_dora", "is true: DoRA adapters are not supported");
  }
  if (has("fan_in_fan_out") && j["fan_in_fan_out"].get<bool>()) {
    return field_error("fan_in_fan_out", "is true: only nn.Linear's [out, in] layout is supported");
  }
  if (has("bias") && j["bias"] != "none") {
    return field_error("bias", Str("is ", j["bias"].dump(), "; only \"none\" is supported"));
  }
  if (has("modules_to_save") && !(j["modules_to_save"].is_array() && j["modules_to_save"].empty())) {
    return field_error("modules_to_save",
                       Str("is ", j["modules_to_save"].dump(), ": adapters that retrain whole "
                           "modules are not supported"));
  }
  for (const char* f : {"rank_pattern", "alpha_pattern"}) {
    if (has(f) && !(j[f].is_object() && j[f].empty())) {
      return field_error(f, Str("is ", j[f].dump(), ": per-module ranks and alphas are not supported"));
    }
  }
  std::vector<std::string> listed;
  if (has("target_modules")) {
    const Json& t = j["target_modules"];
    if (t.is_array()) {
      for (const Json& m : t) {
        if (!m.is_string()) return field_error("target_modules", "must hold module names");
        const std::string s = m.get<std::string>();
        if (!TargetByName(s)) {
          return field_error("target_modules",
                             Str("names '", s, "': only q_proj, k_proj, v_proj, o_proj, gate_proj, "
                                 "up_proj and down_proj are supported"));
        }
        listed.push_back(s);
      }
    } else if (!t.is_string()) {
      return field_error("target_modules", "must be a list of module names or a string");
    }
  }
  a->scale_ = a->rslora_ ? a->alpha_ / std::sqrt(static_cast<double>(a->rank_))
                         : a->alpha_ / static_cast<double>(a->rank_);

  auto file = SafetensorsFile::Open(weights_path);
  if (!file.ok()) return absl::InvalidArgumentError(file.status().message());
  a->layers_.resize(static_cast<size_t>(base.num_layers));
  // Which of A and B each (layer, target) has, to find a half missing.
  std::vector<std::array<uint8_t, kNumLoraTargets>> seen(static_cast<size_t>(base.num_layers));
  for (const SafetensorsTensor& t : (*file)->tensors()) {
    PD_ASSIGN_OR_RETURN(const TensorSite site, ParseTensorName(t.name, weights_path));
    auto tensor_error = [&](std::string_view what) {
      return absl::InvalidArgumentError(Str(weights_path, ": tensor '", t.name, "' ", what));
    };
    if (site.layer >= base.num_layers) {
      return tensor_error(Str("is for layer ", site.layer, "; the base model has ", base.num_layers));
    }
    if (!listed.empty() &&
        std::find(listed.begin(), listed.end(), LoraTargetName(site.target)) == listed.end()) {
      return tensor_error(Str("adapts ", LoraTargetName(site.target),
                              ", which target_modules does not list"));
    }
    if (!t.dtype || !(*t.dtype == DType::kF32 || *t.dtype == DType::kBF16 || *t.dtype == DType::kF16)) {
      return tensor_error(Str("has dtype ", t.dtype_name, "; F32, BF16 or F16 expected"));
    }
    const auto [out, in] = ProjectionShape(base, site.target);
    const std::vector<int64_t> want =
        site.is_b ? std::vector<int64_t>{out, a->rank_} : std::vector<int64_t>{a->rank_, in};
    if (t.shape != want) {
      return tensor_error(Str("has shape [", absl::StrJoin(t.shape, ", "), "]; this base model's ",
                              LoraTargetName(site.target), " at r=", a->rank_, " needs [",
                              absl::StrJoin(want, ", "), "] (an adapter of another model?)"));
    }
    uint8_t& bits = seen[static_cast<size_t>(site.layer)][static_cast<size_t>(site.target)];
    const uint8_t bit = site.is_b ? 2 : 1;
    if (bits & bit) return tensor_error("appears twice");
    bits |= bit;
    Matrices& m = a->layers_[static_cast<size_t>(site.layer)][static_cast<size_t>(site.target)];
    std::vector<float> values = ToF32(t);
    for (float v : values) {
      if (!std::isfinite(v)) return tensor_error("holds a value that is not finite");
    }
    if (site.is_b) {
      for (float& v : values) v = static_cast<float>(v * a->scale_);
      m.b = std::move(values);
    } else {
      m.a = std::move(values);
    }
  }
  for (int64_t l = 0; l < base.num_layers; ++l) {
    for (int i = 0; i < kNumLoraTargets; ++i) {
      const uint8_t bits = seen[static_cast<size_t>(l)][static_cast<size_t>(i)];
      if (bits == 0) continue;
      if (bits != 3) {
        return absl::InvalidArgumentError(
            Str(weights_path, ": layer ", l, "'s ", kTargetNames[static_cast<size_t>(i)], " has lora_",
                bits == 1 ? "A" : "B", " but not lora_", bits == 1 ? "B" : "A"));
      }
      Matrices& m = a->layers_[static_cast<size_t>(l)][static_cast<size_t>(i)];
      const auto [out, in] = ProjectionShape(base, static_cast<LoraTarget>(i));
      m.a_ref = {DType::kF32, m.a.data(), a->rank_, in};
      m.b_ref = {DType::kF32, m.b.data(), out, a->rank_};
      a->targeted_[static_cast<size_t>(i)] = true;
      a->bytes_ += (m.a.size() + m.b.size()) * sizeof(float);
    }
  }
  if (a->bytes_ == 0) {
    return absl::InvalidArgumentError(Str(weights_path, ": holds no LoRA matrices"));
  }
  a->kv_root_ = KvRoot(*a, base.num_layers);
  return std::shared_ptr<const LoraAdapter>(std::move(a));
}

}  // namespace pdserve
