#include "common/engine/cpu_matrices.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "common/base/log.h"
#include "common/base/status_macros.h"
#include "common/base/strings.h"
#include "common/base/thread_pool.h"
#include "common/model/model_weights.h"
#include "kernels/cpu/linear_bf16.h"
#include "kernels/cpu/linear_quant_panels.h"

namespace pdserve {

absl::StatusOr<std::shared_ptr<const CpuMatrices>> CpuMatrices::Make(const ModelWeights& weights,
                                                                     ComputeDType compute_dtype,
                                                                     bool huge_pages, int threads) {
  std::shared_ptr<CpuMatrices> m(new CpuMatrices());
  const bool bf16 = compute_dtype == ComputeDType::kBF16;
  const ModelConfig& c = weights.config();
  m->layers_.resize(static_cast<size_t>(c.num_layers));
  // Every matrix with the slot its copy goes to (or that reads it in place).
  std::vector<std::pair<const MatrixRef*, MatrixRef*>> all;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const LayerWeights& w = weights.layer(l);
    Layer& out = m->layers_[static_cast<size_t>(l)];
    all.insert(all.end(), {{&w.q_proj, &out.q}, {&w.k_proj, &out.k}, {&w.v_proj, &out.v},
                           {&w.o_proj, &out.o}, {&w.gate_proj, &out.gate}, {&w.up_proj, &out.up},
                           {&w.down_proj, &out.down}});
  }
  all.emplace_back(&weights.lm_head(), &m->lm_head_);
  // Quantized matrices are repacked in panels where the CPU has kernels for them
  // (linear_quant_panels.h: every format with AVX512-VNNI, the K-quants with AVX2); the others
  // are read as they are.
  auto quant_panels = [](const MatrixRef& x) {
    return x.quantized() && kernels::QuantPanelsSupported(x.quant_type);
  };
  auto copy_bytes = [&](const MatrixRef& x) -> size_t {
    if (quant_panels(x)) return static_cast<size_t>(kernels::QuantPanelsBytes(x.quant_type, x.rows, x.cols));
    return bf16 && !x.quantized() ? kernels::Bf16PanelsBytes(x.rows, x.cols) : x.bytes();
  };
  // Copied (and the mapping's pages released) for huge pages, or to pack any matrix.
  bool copied = huge_pages || bf16;
  for (auto& [src, dst] : all) copied = copied || quant_panels(*src);
  auto memory = [](const void* data, size_t bytes) {
    return absl::Span<const std::byte>(static_cast<const std::byte*>(data), bytes);
  };
  if (!copied) {
    for (auto& [src, dst] : all) {
      *dst = *src;
      m->memory_.push_back(memory(src->data, src->bytes()));
    }
    return std::shared_ptr<const CpuMatrices>(std::move(m));
  }
  size_t bytes = 0;
  for (auto& [src, dst] : all) bytes += HugePageArena::Aligned(copy_bytes(*src));
  if (absl::Status s = m->arena_.Reserve(bytes, huge_pages); !s.ok()) {
    return absl::ResourceExhaustedError(Str("copies of the weight matrices (--weight-huge-pages, "
                                            "or the packed copies of bf16 compute): ", s.message()));
  }
  std::vector<void*> places;
  places.reserve(all.size());
  for (auto& [src, dst] : all) {
    places.push_back(m->arena_.Take(copy_bytes(*src)));
    m->memory_.push_back(memory(places.back(), copy_bytes(*src)));
  }
  // bf16 compute: packed in panels, and a checkpoint in f32 or f16 rounded to bf16 once here, as
  // vLLM's --dtype bfloat16 converts at load (the mapping is then no longer read).
  ThreadPool pool(threads);
  pool.ParallelForDynamic(static_cast<int64_t>(all.size()), 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const MatrixRef& src = *all[i].first;
      if (bf16 && !src.quantized()) {
        *all[i].second = kernels::PackBf16Panels(src, places[i]);
      } else if (quant_panels(src)) {
        kernels::PackQuantPanels({src.quant_type, src.data, src.rows, src.cols}, places[i]);
        *all[i].second = src;
        all[i].second->data = places[i];
        all[i].second->layout = MatrixLayout::kQuantPanels;
      } else {
        std::memcpy(places[i], src.data, src.bytes());
        *all[i].second = src;
        all[i].second->data = places[i];
      }
      // The copy is what the runner reads: the mapping's pages need not stay resident too
      // (a Q4_K_M model's resident set is then its file, not twice it).
      weights.ReleaseMappedPages(src);
    }
  });
  PD_LOG(Info) << "weights: " << (bytes >> 20) << " MiB of matrices copied, "
               << (std::min(m->arena_.HugeBytes(), bytes) >> 20) << " MiB of it on huge pages";
  return std::shared_ptr<const CpuMatrices>(std::move(m));
}

}  // namespace pdserve
