#include "common/model/random_lora.h"

#include <cmath>
#include <filesystem>
#include <fstream>

#include "common/base/rng.h"
#include "common/base/strings.h"
#include "common/model/safetensors_writer.h"
#include "nlohmann/json.hpp"

namespace pdserve {

absl::Status WriteRandomLora(const RandomLoraSpec& spec, const ModelConfig& c,
                             const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(Str("cannot create ", dir, ": ", ec.message()));
  SplitMix64 rng(spec.seed * 0x9e3779b97f4a7c15ull + 777);
  SafetensorsWriter writer;
  nlohmann::json targets = nlohmann::json::array();
  for (LoraTarget t : spec.targets) targets.push_back(std::string(LoraTargetName(t)));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    for (LoraTarget t : spec.targets) {
      const bool attn = static_cast<int>(t) <= static_cast<int>(LoraTarget::kO);
      int64_t out = 0, in = 0;
      switch (t) {
        case LoraTarget::kQ: out = c.q_size(); in = c.hidden_size; break;
        case LoraTarget::kK:
        case LoraTarget::kV: out = c.kv_size(); in = c.hidden_size; break;
        case LoraTarget::kO: out = c.hidden_size; in = c.q_size(); break;
        case LoraTarget::kGate:
        case LoraTarget::kUp: out = c.intermediate_size; in = c.hidden_size; break;
        case LoraTarget::kDown: out = c.hidden_size; in = c.intermediate_size; break;
      }
      const std::string p = Str("base_model.model.model.layers.", l, attn ? ".self_attn." : ".mlp.",
                                LoraTargetName(t), ".");
      // A as PEFT initializes it (Kaiming-uniform's scale, here normal), B non-zero.
      std::vector<float> a(static_cast<size_t>(spec.rank * in)), b(static_cast<size_t>(out * spec.rank));
      const double a_std = 1.0 / std::sqrt(static_cast<double>(in));
      for (float& v : a) v = static_cast<float>(a_std * rng.Normal());
      for (float& v : b) v = static_cast<float>(spec.b_std * rng.Normal());
      writer.Add(p + "lora_A.weight", spec.dtype, {spec.rank, in}, a);
      writer.Add(p + "lora_B.weight", spec.dtype, {out, spec.rank}, b);
    }
  }
  nlohmann::json config = {{"peft_type", "LORA"},
                           {"base_model_name_or_path", "random"},
                           {"r", spec.rank},
                           {"lora_alpha", spec.alpha},
                           {"use_rslora", spec.rslora},
                           {"target_modules", targets},
                           {"bias", "none"},
                           {"lora_dropout", 0.0},
                           {"use_dora", false},
                           {"fan_in_fan_out", false},
                           {"modules_to_save", nullptr},
                           {"task_type", "CAUSAL_LM"}};
  std::ofstream f(dir + "/adapter_config.json");
  f << config.dump(2) << "\n";
  if (!f) return absl::InternalError(Str("cannot write ", dir, "/adapter_config.json"));
  return writer.WriteFile(dir + "/adapter_model.safetensors");
}

}  // namespace pdserve
