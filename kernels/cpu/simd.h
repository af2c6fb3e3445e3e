// Shared AVX2 helpers for the CPU kernels (internal to kernels/cpu). Each vector routine has a
// scalar twin with the same contract, used when the build targets a CPU without AVX2.
#ifndef PDSERVE_KERNELS_CPU_SIMD_H_
#define PDSERVE_KERNELS_CPU_SIMD_H_

#include <cstdint>
#include <cmath>
#include <cstring>

#include "common/base/dtype.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define PDSERVE_AVX2 1
#include <immintrin.h>
#endif

namespace pdserve::kernels {

// The constants of the exp, shared by its three copies (Exp8 below, ExpScalar, and the 16-lane
// Exp16 in attention_avx512.cc), which must stay bitwise equal.
struct ExpConst {
  static constexpr float kMaxX = 88.3762626647949f;  // |x| clamp.
  static constexpr float kLog2e = 1.44269504088896341f;
  static constexpr float kLn2Hi = 0.693359375f;      // ln 2 = kLn2Hi + kLn2Lo.
  static constexpr float kLn2Lo = -2.12194440e-4f;
  // The polynomial for exp(r), highest degree first.
  static constexpr float kP0 = 1.9875691500E-4f, kP1 = 1.3981999507E-3f, kP2 = 8.3334519073E-3f,
                         kP3 = 4.1665795894E-2f, kP4 = 1.6666665459E-1f, kP5 = 5.0000001201E-1f;
};

#if PDSERVE_AVX2
// MXCSR's DAZ (bit 6) and FTZ (bit 15) for the duration of a scope: FMAs then treat denormal
// inputs as zero and flush denormal results, as VDPBF16PS and TDPBF16PS do (the bf16 paths'
// twins made of FMAs).
class DazFtzScope {
 public:
  DazFtzScope() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8040u); }
  ~DazFtzScope() { _mm_setcsr(saved_); }
  DazFtzScope(const DazFtzScope&) = delete;
  DazFtzScope& operator=(const DazFtzScope&) = delete;

 private:
  unsigned saved_;
};

// Loads 8 weights as f32.
inline __m256 Load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 Load8(const uint16_t* p, DType dtype) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  if (dtype == DType::kF16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline __m256 Load8Bf16(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline __m256 Load8F16(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// Fixed-order horizontal sum: ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)). Every reduction of an
// 8-lane accumulator in the kernels uses exactly this tree (HorizontalSum8x8 below too), which is
// what keeps results independent of how keys or rows are grouped.
inline float HorizontalSum(__m256 v) {
  const __m128 lo = _mm256_castps256_ps128(v);
  const __m128 hi = _mm256_extractf128_ps(v, 1);
  __m128 s = _mm_add_ps(lo, hi);            // (l0+l4, l1+l5, l2+l6, l3+l7)
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));   // (.. + l2+l6, .. + l3+l7)
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

// The 8 horizontal sums of v[0..7] in one vector, each bit-identical to HorizontalSum(v[i]).
// Cost: 8 permutes + 10 adds/shuffles instead of 8 separate reductions.
inline __m256 HorizontalSum8x8(const __m256* v) {
  auto halves = [](__m256 a, __m256 b) {  // [lo(a)+hi(a) | lo(b)+hi(b)]
    return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
  };
  const __m256 w01 = halves(v[0], v[1]), w23 = halves(v[2], v[3]);
  const __m256 w45 = halves(v[4], v[5]), w67 = halves(v[6], v[7]);
  // z: per 128-bit half, (a[0]+a[2], a[1]+a[3]) for two of the vectors.
  const __m256 z0 = _mm256_add_ps(_mm256_shuffle_ps(w01, w23, _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm256_shuffle_ps(w01, w23, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m256 z1 = _mm256_add_ps(_mm256_shuffle_ps(w45, w67, _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm256_shuffle_ps(w45, w67, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m256 r = _mm256_add_ps(_mm256_shuffle_ps(z0, z1, _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm256_shuffle_ps(z0, z1, _MM_SHUFFLE(3, 1, 3, 1)));
  // r = [s0 s2 s4 s6 | s1 s3 s5 s7]
  return _mm256_permutevar8x32_ps(r, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

inline float HorizontalMax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

// exp(x) for 8 lanes, relative error < 2 ulp over the float range; x < -87.3 gives 0-ish, large x
// saturates at ~2^127. Cephes-style range reduction: exp(x) = 2^n * exp(r), |r| <= ln2/2.
inline __m256 Exp8(__m256 x) {
  using C = ExpConst;
  const __m256 max_x = _mm256_set1_ps(C::kMaxX);
  const __m256 min_x = _mm256_set1_ps(-C::kMaxX);
  x = _mm256_min_ps(_mm256_max_ps(x, min_x), max_x);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(C::kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(C::kLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(C::kLn2Lo), r);
  __m256 p = _mm256_set1_ps(C::kP0);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(C::kP1));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(C::kP2));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(C::kP3));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(C::kP4));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(C::kP5));
  const __m256 r2 = _mm256_mul_ps(r, r);
  p = _mm256_fmadd_ps(p, r2, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  // 2^n: n in [-127, 128]; split in two factors so n = 128 and n = -127 stay representable.
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i half = _mm256_srai_epi32(ni, 1);
  const __m256i rest = _mm256_sub_epi32(ni, half);
  const __m256 f1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, _mm256_set1_epi32(127)), 23));
  const __m256 f2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(rest, _mm256_set1_epi32(127)), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, f1), f2);
}
#endif  // PDSERVE_AVX2

// Scalar exp with the same polynomial (used for tails and in portable builds).
float ExpScalar(float x);

// Readers of a row of elements as f32, for DotF32 and AxpyF32: Get(row, i) is element i;
// Load8(row, i) elements [i, i + 8), i a multiple of 8. kv_rows.h adds int8 and int4 codes.
struct F32Row {
  static float Get(const uint8_t* r, int64_t i) { return reinterpret_cast<const float*>(r)[i]; }
#if PDSERVE_AVX2
  static __m256 Load8(const uint8_t* r, int64_t i) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(r) + i);
  }
#endif
};

struct Bf16Row {
  static float Get(const uint8_t* r, int64_t i) {
    return Bf16ToF32(reinterpret_cast<const uint16_t*>(r)[i]);
  }
#if PDSERVE_AVX2
  static __m256 Load8(const uint8_t* r, int64_t i) {
    return Load8Bf16(reinterpret_cast<const uint16_t*>(r) + i);
  }
#endif
};

// sum(a[i] * row[i]) in the 8-lane order every kernel uses: one FMA accumulator over i = l mod 8,
// HorizontalSum's tree, then the tail in order.
template <typename Row>
inline float DotF32(const float* a, const uint8_t* row, int64_t n) {
  const int64_t n8 = n & ~int64_t{7};
#if PDSERVE_AVX2
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n8; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), Row::Load8(row, i), acc);
  float s = HorizontalSum(acc);
#else
  float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t i = 0; i < n8; i += 8)
    for (int l = 0; l < 8; ++l) lane[l] = std::fma(a[i + l], Row::Get(row, i + l), lane[l]);
  float s = ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
#endif
  for (int64_t i = n8; i < n; ++i) s = std::fma(a[i], Row::Get(row, i), s);
  return s;
}

// out[i] = fma(p, row[from + i], out[i]) for i in [0, n), from a multiple of 8.
template <typename Row>
inline void AxpyF32(float p, const uint8_t* row, int64_t from, int64_t n, float* out) {
  int64_t i = 0;
#if PDSERVE_AVX2
  const __m256 pv = _mm256_set1_ps(p);
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(out + i, _mm256_fmadd_ps(pv, Row::Load8(row, from + i), _mm256_loadu_ps(out + i)));
  }
#endif
  for (; i < n; ++i) out[i] = std::fma(p, Row::Get(row, from + i), out[i]);
}

}  // namespace pdserve::kernels

#endif  // PDSERVE_KERNELS_CPU_SIMD_H_
