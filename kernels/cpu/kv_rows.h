// Reading K/V rows of a pool of any KvDType as f32 (internal to kernels/cpu), for simd.h's
// DotF32<KvRow<D>> and AxpyF32<KvRow<D>>: f32 and bf16 rows are values, int8 and int4 rows are
// codes whose row scale the attention kernels apply (kScaled).
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
struct KvRow<KvDType::kF32> : F32Row {
  static constexpr bool kScaled = false;
};

template <>
struct KvRow<KvDType::kBF16> : Bf16Row {
  static constexpr bool kScaled = false;
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

}  // namespace pdserve::kernels

#endif  // PDSERVE_KERNELS_CPU_KV_ROWS_H_
