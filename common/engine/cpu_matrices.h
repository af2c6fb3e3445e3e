// The matrices a CPU runner's linear layers read: the checkpoint's own, or copies in one arena (on
// transparent huge pages with --weight-huge-pages; always for bf16 compute, which reads them
// packed in panels, kernels/cpu/linear_bf16.h, and for quantized matrices the panel kernels
// read, repacked in panels, kernels/cpu/linear_quant_panels.h). Immutable once made, so the engines of one process
// can share one set (SharedWeights).
#ifndef PDSERVE_COMMON_ENGINE_CPU_MATRICES_H_
#define PDSERVE_COMMON_ENGINE_CPU_MATRICES_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/base/huge_page_arena.h"
#include "common/base/tensor_ref.h"
#include "common/engine/model_runner.h"

namespace pdserve {

class ModelWeights;

class CpuMatrices {
 public:
  struct Layer {
    MatrixRef q, k, v, o, gate, up, down;
  };

  // ResourceExhausted when the copies do not fit in memory. `weights` must outlive the result.
  // The copies are made on `threads` threads (<= 0: all cores).
  static absl::StatusOr<std::shared_ptr<const CpuMatrices>> Make(const ModelWeights& weights,
                                                                 ComputeDType compute_dtype,
                                                                 bool huge_pages, int threads);

  const Layer& layer(int64_t l) const { return layers_[static_cast<size_t>(l)]; }
  const MatrixRef& lm_head() const { return lm_head_; }
  // Each matrix's bytes where the linear layers read them, layer by layer, then the LM head.
  const std::vector<absl::Span<const std::byte>>& memory() const { return memory_; }

 private:
  CpuMatrices() = default;

  HugePageArena arena_;
  std::vector<Layer> layers_;
  MatrixRef lm_head_;
  std::vector<absl::Span<const std::byte>> memory_;
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_ENGINE_CPU_MATRICES_H_
