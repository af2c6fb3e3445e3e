// The model's weights in an accelerator's memory, as DeviceModelRunner reads them: bf16 matrices
// (gate and up as one gate|up matrix), f32 norms and biases, the embedding table (bf16, or f32
// for checkpoints in other dtypes, as the CPU reads it). Either uploaded from a ModelWeights or
// made on the device from ModelWeights::Synthetic's seed (the fill kernel, no host copy).
//
// Immutable once made and shared: the runners of one process on one device (serve's prefill and
// decode workers) read one copy through SharedWeights::Device instead of holding the weights
// twice in device memory. Keeps a reference to the DeviceOps that allocated it, which frees the
// memory when the last runner lets go.
#ifndef PDSERVE_COMMON_ENGINE_DEVICE_WEIGHTS_H_
#define PDSERVE_COMMON_ENGINE_DEVICE_WEIGHTS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/engine/device_memory.h"
#include "common/model/model_config.h"
#include "kernels/cuda/device_ops.h"

namespace pdserve {

class ModelWeights;

class DeviceWeights {
 public:
  struct Layer {
    uint16_t *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr, *gate_up = nullptr,
             *down = nullptr;
    float *input_norm = nullptr, *post_norm = nullptr, *q_norm = nullptr, *k_norm = nullptr;
    float *q_bias = nullptr, *k_bias = nullptr, *v_bias = nullptr, *o_bias = nullptr;
    float *gate_bias = nullptr, *up_bias = nullptr, *down_bias = nullptr;
  };

  // The checkpoint's weights copied through `ops` (matrices rounded to bf16 once, as the CPU's
  // bf16 compute rounds them at load).
  static absl::StatusOr<std::shared_ptr<const DeviceWeights>> Upload(
      const ModelWeights& weights, std::shared_ptr<cuda::DeviceOps> ops);
  // ModelWeights::Synthetic(config, seed)'s values, stream for stream, made in device memory
  // (biases left out: zero). An 8B-shaped benchmark needs no 16 GB file.
  static absl::StatusOr<std::shared_ptr<const DeviceWeights>> Random(
      const ModelConfig& config, uint64_t seed, std::shared_ptr<cuda::DeviceOps> ops);
  DeviceWeights(const DeviceWeights&) = delete;
  DeviceWeights& operator=(const DeviceWeights&) = delete;

  const std::vector<Layer>& layers() const { return layers_; }
  const void* embed() const { return embed_; }
  cuda::ActType embed_type() const { return embed_type_; }
  const uint16_t* lm_head() const { return lm_head_; }
  const float* final_norm() const { return final_norm_; }
  size_t bytes() const { return memory_.bytes(); }  // Device memory held.

 private:
  explicit DeviceWeights(std::shared_ptr<cuda::DeviceOps> ops) : ops_(ops), memory_(ops) {}
  absl::StatusOr<void*> Fill(int64_t count, cuda::ActType type, float offset, float scale,
                             uint64_t seed);

  std::shared_ptr<cuda::DeviceOps> ops_;
  DeviceMemory memory_;
  std::vector<Layer> layers_;
  const void* embed_ = nullptr;
  cuda::ActType embed_type_ = cuda::ActType::kBF16;
  uint16_t* lm_head_ = nullptr;
  float* final_norm_ = nullptr;
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_ENGINE_DEVICE_WEIGHTS_H_
