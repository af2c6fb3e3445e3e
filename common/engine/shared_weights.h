// What the engines of one process share instead of each holding its own: the checkpoint's
// weights, loaded once, and the CPU runner's matrix copies (CpuMatrices), made once per compute
// dtype and page kind. `pdserve serve` runs a prefill and a decode engine in one process: without
// this each loaded the model and each made its copies, twice the weights' RAM. Likewise the cuda
// backend's device copy (DeviceWeights): two engines on one GPU read one upload.
// Thread-safe: the workers' engines may be built on different threads.
#ifndef PDSERVE_COMMON_ENGINE_SHARED_WEIGHTS_H_
#define PDSERVE_COMMON_ENGINE_SHARED_WEIGHTS_H_

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "common/engine/cpu_matrices.h"
#include "common/engine/device_weights.h"
#include "common/model/model_config.h"
#include "common/model/weight_format.h"

namespace pdserve {

class ModelWeights;

class SharedWeights {
 public:
  // The weights in `model_dir` (whose config the caller parsed), loaded on the first call; the
  // same object for later calls with that directory. One model per process: another directory
  // is InvalidArgument.
  absl::StatusOr<std::shared_ptr<const ModelWeights>> Load(const ModelConfig& config,
                                                           const std::string& model_dir,
                                                           WeightFormat quantize_to = WeightFormat::kAsStored);

  // CpuMatrices::Make(weights, compute_dtype, huge_pages, threads) once per (compute_dtype,
  // huge_pages); `weights` must be the ones Load returned.
  absl::StatusOr<std::shared_ptr<const CpuMatrices>> Matrices(const ModelWeights& weights,
                                                              ComputeDType compute_dtype,
                                                              bool huge_pages, int threads);

  int matrices_made() const;  // Tests: how many sets Matrices made.

  // DeviceWeights::Upload(weights, ops) on the first call, the same copy afterwards (one device
  // per process: every engine of serve --device cuda uses GPU 0). `weights` must be the ones
  // Load returned.
  absl::StatusOr<std::shared_ptr<const DeviceWeights>> Device(const ModelWeights& weights,
                                                              std::shared_ptr<cuda::DeviceOps> ops);
  int device_uploads() const;  // Tests: how many times Device uploaded.

 private:
  mutable std::mutex mu_;
  std::string model_dir_;
  std::shared_ptr<const ModelWeights> weights_;
  std::map<std::pair<ComputeDType, bool>, std::shared_ptr<const CpuMatrices>> matrices_;
  int matrices_made_ = 0;
  std::shared_ptr<const DeviceWeights> device_;
  int device_uploads_ = 0;
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_ENGINE_SHARED_WEIGHTS_H_
