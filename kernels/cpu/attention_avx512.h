// AVX-512 pieces of the grouped attention (internal to kernels/cpu/attention.cc): the query heads
// that share one KV head read each key and value once for the whole group. Every score and
// output element sees the per-head path's operations in its order (pairs of 8-lane accumulators
// per register, the same transposed reduction), so results are bitwise equal (tested).
#ifndef PDSERVE_KERNELS_CPU_ATTENTION_AVX512_H_
#define PDSERVE_KERNELS_CPU_ATTENTION_AVX512_H_

#include <cstdint>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/simd.h"  // PDSERVE_AVX2, __m256

namespace pdserve::kernels {

// The most query heads per KV head the grouped path takes at once.
inline constexpr int kMaxGroupAvx512 = 4;

// The first 16k elements of attention.cc's ExpAndSum: s[i] = exp(s[i] - max) by simd.h's Exp8
// on 16 lanes (the same bits), each 8 added to *acc in order. Returns how many it did. Call only
// when Avx512Enabled().
#if PDSERVE_AVX2
int64_t ExpAndSumAvx512(float* s, int64_t n, float max, __m256* acc);
#endif

// out[g][j] = dot(q[g], K[start + j]) * scale for j in [0, n8), n8 a multiple of 8, head_dim a
// multiple of 8, 1 <= group <= kMaxGroupAvx512. Call only when Avx512Enabled().
void ScoresGroupAvx512(const KvPagesView& view, const int32_t* table, int64_t kvh, int64_t start,
                       int64_t n8, const float* const* q, int group, float scale,
                       float* const* out);

// out[g][0:head_dim) = sum_j p[g][j] * V[start + j], head_dim a multiple of 64.
void WeightedValuesGroupAvx512(const KvPagesView& view, const int32_t* table, int64_t kvh,
                               int64_t start, int64_t n, const float* const* p, int group,
                               float* const* out);

}  // namespace pdserve::kernels

#endif  // PDSERVE_KERNELS_CPU_ATTENTION_AVX512_H_
