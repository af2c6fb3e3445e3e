// Reading K/V rows of a pool of any KvDType as f32 (internal to kernels/cpu): f32 and bf16 rows
// are values, int8 and int4 rows are codes whose row scale the attention kernels apply (kScaled).
// Dot and Axpy keep simd.h's DotF32/AxpyF32 order exactly (bitwise equal for f32 and bf16).
#ifndef PDSERVE_KERNELS_CPU_KV_ROWS_H_
#define PDSERVE_KERNELS_CPU_KV_ROWS_H_

#include <cstdint>
#include <cstring>

#include "common/base/dtype.h"
#include "kernels/cpu/kv_quant.h"
#include "kernels/cpu/simd.h"

namespace pdserve::kernels {

template <KvDType D>
struct KvRow;

template <>
struct KvRow<KvDType::kF32> {
  static constexpr bool kScaled = false;
  static float Get(const uint8_t* r, int64_t i) { return reinterpret_cast<const float*>(r)[i]; }
#if PDSERVE_AVX2
  static __m256 Load8(const uint8_t* r, int64_t i) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(r) + i);
  }
#endif
};

template <>
struct KvRow<KvDType::kBF16> {
  static constexpr bool kScaled = false;
  static float Get(const uint8_t* r, int64_t i) {
    return Bf16ToF32(reinterpret_cast<const uint16_t*>(r)[i]);
  }
#if PDSERVE_AVX2
  static __m256 Load8(const uint8_t* r, int64_t i) {
    return Load8Bf16(reinterpret_cast<const uint16_t*>(r) + i);
  }
#endif
};

template <>
struct KvRow<KvDType::kInt8> {
  static constexpr bool kScaled = true;
  static float Get(const uint8_t* r, int64_t i) { return static_cast<float>(static_cast<int8_t>(r[i])); }
#if PDSERVE_AVX2
  static __m256 Load8(const uint8_t* r, int64_t i) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(r + i));
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
  }
#endif
};

template <>
struct KvRow<KvDType::kInt4> {
  static constexpr bool kScaled = true;
  static float Get(const uint8_t* r, int64_t i) { return static_cast<float>(Int4Code(r, i)); }
#if PDSERVE_AVX2
  // i is a multiple of 8: four bytes, nibble l of the little-endian word is element i + l.
  static __m256 Load8(const uint8_t* r, int64_t i) {
    int32_t word;
    std::memcpy(&word, r + i / 2, sizeof(word));
    const __m256i shifts = _mm256_setr_epi32(28, 24, 20, 16, 12, 8, 4, 0);
    const __m256i w = _mm256_sllv_epi32(_mm256_set1_epi32(word), shifts);
    return _mm256_cvtepi32_ps(_mm256_srai_epi32(w, 28));
  }
#endif
};

// sum(a[i] * row[i]) in DotF32's order.
template <KvDType D>
inline float DotRow(const float* a, const uint8_t* row, int64_t n) {
  const int64_t n8 = n & ~int64_t{7};
#if PDSERVE_AVX2
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n8; i += 8) {
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), KvRow<D>::Load8(row, i), acc);
  }
  float s = HorizontalSum(acc);
#else
  float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t i = 0; i < n8; i += 8)
    for (int l = 0; l < 8; ++l) lane[l] = std::fma(a[i + l], KvRow<D>::Get(row, i + l), lane[l]);
  float s = ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
#endif
  for (int64_t i = n8; i < n; ++i) s = std::fma(a[i], KvRow<D>::Get(row, i), s);
  return s;
}

// out[i] = fma(p, row[from + i], out[i]) for i in [0, n), from a multiple of 8.
template <KvDType D>
inline void AxpyRow(float p, const uint8_t* row, int64_t from, int64_t n, float* out) {
  int64_t i = 0;
#if PDSERVE_AVX2
  const __m256 pv = _mm256_set1_ps(p);
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(out + i,
                     _mm256_fmadd_ps(pv, KvRow<D>::Load8(row, from + i), _mm256_loadu_ps(out + i)));
  }
#endif
  for (; i < n; ++i) out[i] = std::fma(p, KvRow<D>::Get(row, from + i), out[i]);
}

}  // namespace pdserve::kernels

#endif  // PDSERVE_KERNELS_CPU_KV_ROWS_H_
