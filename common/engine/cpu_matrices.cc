#include "common/engine/cpu_matrices.h"

#include <algorithm>
#include <cstring>

#include "common/base/log.h"
#include "common/base/status_macros.h"
#include "common/base/strings.h"
#include "common/model/model_weights.h"
#include "kernels/cpu/linear_bf16.h"

namespace pdserve {

absl::StatusOr<std::shared_ptr<const CpuMatrices>> CpuMatrices::Make(const ModelWeights& weights,
                                                                     ComputeDType compute_dtype,
                                                                     bool huge_pages) {
  std::shared_ptr<CpuMatrices> m(new CpuMatrices());
  m->compute_dtype_ = compute_dtype;
  m->copied_ = huge_pages || compute_dtype == ComputeDType::kBF16;
  const ModelConfig& c = weights.config();
  std::vector<const MatrixRef*> all;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const LayerWeights& w = weights.layer(l);
    for (const MatrixRef* x : {&w.q_proj, &w.k_proj, &w.v_proj, &w.o_proj, &w.gate_proj,
                               &w.up_proj, &w.down_proj}) {
      all.push_back(x);
    }
  }
  all.push_back(&weights.lm_head());
  if (m->copied_) {
    size_t bytes = 0;
    for (const MatrixRef* x : all) {
      bytes += HugePageArena::Aligned(compute_dtype == ComputeDType::kBF16
                                          ? kernels::Bf16PanelsBytes(x->rows, x->cols)
                                          : x->bytes());
    }
    if (absl::Status s = m->arena_.Reserve(bytes, huge_pages); !s.ok()) {
      return absl::ResourceExhaustedError(Str("copies of the weight matrices (--weight-huge-pages, "
                                              "or the packed copies of bf16 compute): ", s.message()));
    }
    m->copied_bytes_ = bytes;
  }
  m->layers_.reserve(static_cast<size_t>(c.num_layers));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const LayerWeights& w = weights.layer(l);
    m->layers_.push_back(Layer{m->Copy(w.q_proj), m->Copy(w.k_proj), m->Copy(w.v_proj),
                               m->Copy(w.o_proj), m->Copy(w.gate_proj), m->Copy(w.up_proj),
                               m->Copy(w.down_proj)});
  }
  m->lm_head_ = m->Copy(weights.lm_head());
  if (m->copied_bytes_ > 0) {
    PD_LOG(Info) << "weights: " << (m->copied_bytes_ >> 20) << " MiB of matrices copied, "
                 << (std::min(m->arena_.HugeBytes(), m->copied_bytes_) >> 20)
                 << " MiB of it on huge pages";
  }
  return std::shared_ptr<const CpuMatrices>(std::move(m));
}

MatrixRef CpuMatrices::Copy(const MatrixRef& w) {
  if (!copied_) return w;
  // bf16 compute: packed in panels, and a checkpoint in f32 or f16 rounded to bf16 once here, as
  // vLLM's --dtype bfloat16 converts at load (the mapping is then no longer read).
  if (compute_dtype_ == ComputeDType::kBF16) {
    return kernels::PackBf16Panels(w, arena_.Take(kernels::Bf16PanelsBytes(w.rows, w.cols)));
  }
  void* dst = arena_.Take(w.bytes());
  std::memcpy(dst, w.data, w.bytes());
  return MatrixRef{w.dtype, dst, w.rows, w.cols};
}

}  // namespace pdserve
