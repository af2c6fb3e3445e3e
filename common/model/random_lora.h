// Writes a random LoRA adapter in PEFT's layout (adapter_config.json, adapter_model.safetensors)
// for a model of `config`'s shape: the fixture of the LoRA tests.
#ifndef PDSERVE_COMMON_MODEL_RANDOM_LORA_H_
#define PDSERVE_COMMON_MODEL_RANDOM_LORA_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/base/dtype.h"
#include "common/model/lora_adapter.h"
#include "common/model/model_config.h"

namespace pdserve {

struct RandomLoraSpec {
  int64_t rank = 8;
  double alpha = 16;
  bool rslora = false;
  std::vector<LoraTarget> targets = {LoraTarget::kQ,    LoraTarget::kK,  LoraTarget::kV,
                                     LoraTarget::kO,    LoraTarget::kGate, LoraTarget::kUp,
                                     LoraTarget::kDown};
  DType dtype = DType::kF32;
  // B's values: PEFT starts B at zero; a trained one is not, and a test needs the term visible.
  double b_std = 0.05;
  uint64_t seed = 0;
};

absl::Status WriteRandomLora(const RandomLoraSpec& spec, const ModelConfig& config,
                             const std::string& dir);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_MODEL_RANDOM_LORA_H_
