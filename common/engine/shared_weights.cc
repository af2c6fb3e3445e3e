#include "common/engine/shared_weights.h"

#include "common/base/status_macros.h"
#include "common/base/strings.h"
#include "common/model/model_weights.h"

namespace pdserve {

absl::StatusOr<std::shared_ptr<const ModelWeights>> SharedWeights::Load(
    const ModelConfig& config, const std::string& model_dir, WeightFormat quantize_to) {
  std::lock_guard<std::mutex> lock(mu_);
  if (weights_ != nullptr) {
    if (model_dir != model_dir_) {
      return absl::InvalidArgumentError(Str("model: the engines of one process share one model ('",
                                            model_dir_, "'), not also '", model_dir, "'"));
    }
    return weights_;
  }
  PD_ASSIGN_OR_RETURN(std::unique_ptr<ModelWeights> loaded,
                      ModelWeights::Load(config, model_dir, quantize_to));
  weights_ = std::move(loaded);
  model_dir_ = model_dir;
  return weights_;
}

absl::StatusOr<std::shared_ptr<const CpuMatrices>> SharedWeights::Matrices(
    const ModelWeights& weights, ComputeDType compute_dtype, bool huge_pages, int threads) {
  std::lock_guard<std::mutex> lock(mu_);
  if (&weights != weights_.get()) {
    return absl::InvalidArgumentError("shared matrices of weights the process did not share");
  }
  auto& slot = matrices_[{compute_dtype, huge_pages}];
  if (slot == nullptr) {
    PD_ASSIGN_OR_RETURN(slot, CpuMatrices::Make(weights, compute_dtype, huge_pages, threads));
    ++matrices_made_;
  }
  return slot;
}

absl::StatusOr<std::shared_ptr<const DeviceWeights>> SharedWeights::Device(
    const ModelWeights& weights, std::shared_ptr<cuda::DeviceOps> ops) {
  std::lock_guard<std::mutex> lock(mu_);
  if (&weights != weights_.get()) {
    return absl::InvalidArgumentError("shared device weights of weights the process did not share");
  }
  if (device_ == nullptr) {
    PD_ASSIGN_OR_RETURN(device_, DeviceWeights::Upload(weights, std::move(ops)));
    ++device_uploads_;
  }
  return device_;
}

int SharedWeights::device_uploads() const {
  std::lock_guard<std::mutex> lock(mu_);
  return device_uploads_;
}

int SharedWeights::matrices_made() const {
  std::lock_guard<std::mutex> lock(mu_);
  return matrices_made_;
}

}  // namespace pdserve
