// Row-wise operations of the transformer block. Each works on one row at a time with a fixed
// operation order, so results do not depend on batch composition (see linear.h). All functions
// are thread-safe on disjoint outputs.
#ifndef PDSERVE_KERNELS_CPU_OPS_H_
#define PDSERVE_KERNELS_CPU_OPS_H_

#include <cstdint>

#include "common/base/tensor_ref.h"

namespace pdserve::kernels {

// out[i] = x[i] / sqrt(mean(x^2) + eps) * weight[i], for one row of n. out may alias x.
void RmsNorm(const float* x, const float* weight, int64_t n, float eps, float* out);

// Rotary embedding in Hugging Face's rotate-half form, in place on one head of `head_dim`:
// (x1, x2) -> (x1*cos - x2*sin, x2*cos + x1*sin) with x1 = x[0:d/2], x2 = x[d/2:d].
// cos_sin holds cos[0:d/2] then sin[0:d/2] for this token's position.
void ApplyRope(float* x, int64_t head_dim, const float* cos_sin);

// Inverse frequencies of the rotary embedding, with rope scaling applied (see model_config.h).
struct RopeParams {
  double theta = 10000.0;
  int type = 0;  // 0 none, 1 linear, 2 llama3
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  double original_max_position = 8192.0;
  // type 3: each frequency divided by its factor (GGUF's rope_freqs tensor, [head_dim / 2]).
  const float* freq_factors = nullptr;
};
// Writes cos[0:d/2] and sin[0:d/2] for `position` into out[0:d].
void RopeCosSin(const RopeParams& params, int64_t head_dim, int64_t position, float* out);

// out[i] = silu(gate[i]) * up[i] = gate / (1 + exp(-gate)) * up.
void SiluMul(const float* gate, const float* up, int64_t n, float* out);

// x[i] += y[i].
void AddInPlace(float* x, const float* y, int64_t n);
// x[i] += bias[i].
inline void AddBias(float* x, const float* bias, int64_t n) { AddInPlace(x, bias, n); }

// Copies row `id` of an embedding matrix into out as f32.
void EmbeddingRow(const MatrixRef& table, int64_t id, float* out);

// Dot product with the 8-lane order of linear.h.
float Dot(const float* a, const float* b, int64_t n);

// log(sum(exp(x[i]))) over n > 0 values: the maximum, then exp(x - max) (Exp8, < 2 ulp) summed in
// double. Within ~1e-7 of the exact value; the sampler's logprob normaliser.
double LogSumExp(const float* x, int64_t n);

}  // namespace pdserve::kernels

#endif  // PDSERVE_KERNELS_CPU_OPS_H_
