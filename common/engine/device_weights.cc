#include "common/engine/device_weights.h"

#include <cmath>

#include "common/base/dtype.h"
#include "common/base/status_macros.h"
#include "common/model/model_weights.h"
#include "kernels/cpu/ops.h"

namespace pdserve {
namespace {

// A matrix as bf16, rounded once as the CPU runner's bf16 compute mode does at load.
std::vector<uint16_t> ToBf16(const MatrixRef& m) {
  const size_t n = static_cast<size_t>(m.rows * m.cols);
  std::vector<uint16_t> out(n);
  for (size_t i = 0; i < n; ++i) {
    switch (m.dtype) {
      case DType::kBF16: out[i] = static_cast<const uint16_t*>(m.data)[i]; break;
      case DType::kF32: out[i] = F32ToBf16(static_cast<const float*>(m.data)[i]); break;
      case DType::kF16: out[i] = F32ToBf16(F16ToF32(static_cast<const uint16_t*>(m.data)[i])); break;
    }
  }
  return out;
}

// Rows of `a` then rows of `b` (same columns): the gate|up matrix of one GEMM.
std::vector<uint16_t> Concat(std::vector<uint16_t> a, const std::vector<uint16_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace

absl::StatusOr<void*> DeviceWeights::Fill(int64_t count, cuda::ActType type, float offset,
                                          float scale, uint64_t seed) {
  PD_ASSIGN_OR_RETURN(void* p, memory_.Alloc(static_cast<size_t>(count) *
                                             (type == cuda::ActType::kBF16 ? 2 : 4)));
  cuda::FillParams f;
  f.out = p;
  f.count = count;
  f.type = type;
  f.offset = offset;
  f.scale = scale;
  f.seed = seed;
  PD_RETURN_IF_ERROR(ops_->Fill(f));
  return p;
}

absl::StatusOr<std::shared_ptr<const DeviceWeights>> DeviceWeights::Upload(
    const ModelWeights& weights, std::shared_ptr<cuda::DeviceOps> ops) {
  std::shared_ptr<DeviceWeights> d(new DeviceWeights(std::move(ops)));
  const ModelConfig& c = weights.config();
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const LayerWeights& w = weights.layer(l);
    Layer b;
    PD_ASSIGN_OR_RETURN(b.q, d->memory_.Copy(ToBf16(w.q_proj)));
    PD_ASSIGN_OR_RETURN(b.k, d->memory_.Copy(ToBf16(w.k_proj)));
    PD_ASSIGN_OR_RETURN(b.v, d->memory_.Copy(ToBf16(w.v_proj)));
    PD_ASSIGN_OR_RETURN(b.o, d->memory_.Copy(ToBf16(w.o_proj)));
    PD_ASSIGN_OR_RETURN(b.gate_up, d->memory_.Copy(Concat(ToBf16(w.gate_proj), ToBf16(w.up_proj))));
    PD_ASSIGN_OR_RETURN(b.down, d->memory_.Copy(ToBf16(w.down_proj)));
    PD_ASSIGN_OR_RETURN(b.input_norm, d->memory_.Copy(w.input_norm));
    PD_ASSIGN_OR_RETURN(b.post_norm, d->memory_.Copy(w.post_attention_norm));
    PD_ASSIGN_OR_RETURN(b.q_norm, d->memory_.Copy(w.q_norm));
    PD_ASSIGN_OR_RETURN(b.k_norm, d->memory_.Copy(w.k_norm));
    PD_ASSIGN_OR_RETURN(b.q_bias, d->memory_.Copy(w.q_bias));
    PD_ASSIGN_OR_RETURN(b.k_bias, d->memory_.Copy(w.k_bias));
    PD_ASSIGN_OR_RETURN(b.v_bias, d->memory_.Copy(w.v_bias));
    PD_ASSIGN_OR_RETURN(b.o_bias, d->memory_.Copy(w.o_bias));
    PD_ASSIGN_OR_RETURN(b.gate_bias, d->memory_.Copy(w.gate_bias));
    PD_ASSIGN_OR_RETURN(b.up_bias, d->memory_.Copy(w.up_bias));
    PD_ASSIGN_OR_RETURN(b.down_bias, d->memory_.Copy(w.down_bias));
    d->layers_.push_back(b);
  }
  PD_ASSIGN_OR_RETURN(d->lm_head_, d->memory_.Copy(ToBf16(weights.lm_head())));
  PD_ASSIGN_OR_RETURN(d->final_norm_, d->memory_.Copy(weights.final_norm()));
  // The embedding is read exactly as the CPU reads it: bf16 stays bf16, f32 and f16 become f32.
  const MatrixRef& embed = weights.embed_tokens();
  if (embed.dtype == DType::kBF16) {
    std::vector<uint16_t> table(static_cast<const uint16_t*>(embed.data),
                                static_cast<const uint16_t*>(embed.data) + embed.rows * embed.cols);
    PD_ASSIGN_OR_RETURN(uint16_t * p, d->memory_.Copy(table));
    d->embed_ = p;
    d->embed_type_ = cuda::ActType::kBF16;
  } else {
    std::vector<float> table(static_cast<size_t>(embed.rows * embed.cols));
    for (int64_t r = 0; r < embed.rows; ++r) kernels::EmbeddingRow(embed, r, &table[r * embed.cols]);
    PD_ASSIGN_OR_RETURN(float* p, d->memory_.Copy(table));
    d->embed_ = p;
    d->embed_type_ = cuda::ActType::kF32;
  }
  return std::shared_ptr<const DeviceWeights>(std::move(d));
}

absl::StatusOr<std::shared_ptr<const DeviceWeights>> DeviceWeights::Random(
    const ModelConfig& c, uint64_t seed, std::shared_ptr<cuda::DeviceOps> ops) {
  std::shared_ptr<DeviceWeights> d(new DeviceWeights(std::move(ops)));
  const int64_t hidden = c.hidden_size, qs = c.q_size(), kvs = c.kv_size(), inter = c.intermediate_size;
  uint64_t stream = seed * 1000003;
  auto matrix = [&](int64_t rows, int64_t cols) -> absl::StatusOr<uint16_t*> {
    PD_ASSIGN_OR_RETURN(void* p, d->Fill(rows * cols, cuda::ActType::kBF16, 0.0f,
                                         static_cast<float>(std::sqrt(3.0 / cols)), ++stream));
    return static_cast<uint16_t*>(p);
  };
  auto ones = [&](int64_t n) -> absl::StatusOr<float*> {
    PD_ASSIGN_OR_RETURN(void* p, d->Fill(n, cuda::ActType::kF32, 1.0f, 0.0f, 0));
    return static_cast<float*>(p);
  };
  for (int64_t l = 0; l < c.num_layers; ++l) {
    Layer b;
    PD_ASSIGN_OR_RETURN(b.q, matrix(qs, hidden));
    PD_ASSIGN_OR_RETURN(b.k, matrix(kvs, hidden));
    PD_ASSIGN_OR_RETURN(b.v, matrix(kvs, hidden));
    PD_ASSIGN_OR_RETURN(b.o, matrix(hidden, qs));
    PD_ASSIGN_OR_RETURN(b.gate_up, matrix(2 * inter, hidden));
    PD_ASSIGN_OR_RETURN(b.down, matrix(hidden, inter));
    PD_ASSIGN_OR_RETURN(b.input_norm, ones(hidden));
    PD_ASSIGN_OR_RETURN(b.post_norm, ones(hidden));
    if (c.qk_norm) {
      PD_ASSIGN_OR_RETURN(b.q_norm, ones(c.head_dim));
      PD_ASSIGN_OR_RETURN(b.k_norm, ones(c.head_dim));
    }
    d->layers_.push_back(b);
  }
  PD_ASSIGN_OR_RETURN(d->lm_head_, matrix(c.vocab_size, hidden));
  PD_ASSIGN_OR_RETURN(d->final_norm_, ones(hidden));
  PD_ASSIGN_OR_RETURN(void* embed, d->Fill(c.vocab_size * hidden, cuda::ActType::kBF16, 0.0f, 1.0f, ++stream));
  d->embed_ = embed;
  d->embed_type_ = cuda::ActType::kBF16;
  PD_RETURN_IF_ERROR(d->ops_->Synchronize());
  return std::shared_ptr<const DeviceWeights>(std::move(d));
}

}  // namespace pdserve
