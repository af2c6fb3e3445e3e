// The pieces the quantized kernels' two paths share (internal to kernels/cpu: linear_quant.cc's
// AVX2 kernels and linear_quant_vnni.cc's AVX512-VNNI ones): the walk over tiles and groups, the
// K-quant scales, x's rows at a block, and the integer reductions. Compiled as AVX2 in both.
#ifndef PDSERVE_KERNELS_CPU_LINEAR_QUANT_SIMD_H_
#define PDSERVE_KERNELS_CPU_LINEAR_QUANT_SIMD_H_

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/linear_quant.h"
#include "kernels/cpu/simd.h"

#if PDSERVE_AVX2
namespace pdserve::kernels::quant_simd {

constexpr int kGroup = 4;             // Weight rows walked together (x's codes loaded once).
constexpr int64_t kRowTile = 16;      // Rows of x per pass over a group (they stay in L2).
// How far ahead the first row of a tile prefetches the weights, into L2: linear.cc's
// kPrefetchBytes, for the same reason (a step streams hundreds of matrices from memory).
constexpr int64_t kPrefetchBytes = 8192;

// The first rows of a tile stream the weights from memory: every cache line of the block
// kPrefetchBytes ahead (a line a block straddles into is the next block's first).
inline void Prefetch(const uint8_t* blk, int64_t bytes) {
  for (int64_t off = 0; off < bytes; off += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(blk + kPrefetchBytes + off), _MM_HINT_T1);
  }
}

inline __m256i Load32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// The signed codes of one block of a 32-element format.
struct CodesQ8_0 {
  static __m256i At(const uint8_t* b) { return Load32(b + 2); }
};
struct CodesQ4_0 {
  static __m256i At(const uint8_t* b) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2));
    const __m256i nib =
        _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(0x0F));
    return _mm256_sub_epi8(nib, _mm256_set1_epi8(8));
  }
};

// Q5_0: Q4_0's nibbles (at byte 6) with the fifth bits of qh: byte l of the broadcast word's
// byte l / 8 keeps bit l % 8, compared to that bit to give 0xFF where it is set.
struct CodesQ5_0 {
  static __m256i At(const uint8_t* b) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 6));
    const __m256i nib =
        _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(0x0F));
    uint32_t qh;
    std::memcpy(&qh, b + 2, 4);
    const __m256i byte_of = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,  //
                                             2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(qh)), byte_of);
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    const __m256i code = _mm256_or_si256(nib, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
    return _mm256_sub_epi8(code, _mm256_set1_epi8(16));
  }
};

// A Q4_K/Q5_K block's 12 packed bytes as 16 int16: the eight 6-bit scales, then the eight mins
// (KQuantScaleMin's values, four bytes at a time).
inline __m256i ScalesMins(const uint8_t* packed) {
  uint32_t w[3];
  std::memcpy(w, packed, 12);
  const uint32_t six = 0x3F3F3F3Fu, four = 0x0F0F0F0Fu, two = 0x03030303u;
  const uint32_t sc_lo = w[0] & six, mn_lo = w[1] & six;
  const uint32_t sc_hi = (w[2] & four) | (((w[0] >> 6) & two) << 4);
  const uint32_t mn_hi = ((w[2] >> 4) & four) | (((w[1] >> 6) & two) << 4);
  return _mm256_cvtepu8_epi16(_mm_set_epi32(static_cast<int>(mn_hi), static_cast<int>(mn_lo),
                                            static_cast<int>(sc_hi), static_cast<int>(sc_lo)));
}

// A byte's bit `bit` moved to bit 4 (the fifth bit of a Q5_K code), other bits cleared.
template <int bit>
__m256i BitTo4(__m256i v) {
  __m256i s;
  if constexpr (bit < 4) {
    s = _mm256_slli_epi16(v, 4 - bit);
  } else if constexpr (bit > 4) {
    s = _mm256_srli_epi16(v, bit - 4);
  } else {
    s = v;
  }
  return _mm256_and_si256(s, _mm256_set1_epi8(0x10));
}

// x's codes at one block for R rows, and their per-16 / per-32 sums there.
template <int R>
struct XRows {
  const int8_t* q[R];
  const int16_t* sum16[R];
  const int16_t* sum32[R];
};

// The f16 at rows[c] + offset for c = 0..3 (a group: kGroup rows), as four floats.
static_assert(kGroup == 4, "LoadF16x4 reads a group's d");
inline __m128 LoadF16x4(const uint8_t* const* rows, int64_t offset) {
  uint16_t h[4];
  for (int c = 0; c < 4; ++c) std::memcpy(&h[c], rows[c] + offset, 2);
  return _mm_cvtph_ps(_mm_setr_epi16(static_cast<int16_t>(h[0]), static_cast<int16_t>(h[1]),
                                     static_cast<int16_t>(h[2]), static_cast<int16_t>(h[3]), 0, 0, 0, 0));
}

// The integer sums of four 8-lane vectors, as [a, b, c, d].
inline __m128i Sum4(__m256i a, __m256i b, __m256i c, __m256i d) {
  const __m256i abcd = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));
  return _mm_add_epi32(_mm256_castsi256_si128(abcd), _mm256_extracti128_si256(abcd, 1));
}
inline __m128i Sum4(__m128i a, __m128i b, __m128i c, __m128i d) {
  return _mm_hadd_epi32(_mm_hadd_epi32(a, b), _mm_hadd_epi32(c, d));
}

// A kernel over rows t..t+R-1 of x against weight rows j..j+n-1 (n <= kGroup; the missing ones
// repeat the last and are not stored); `prefetch` on the first rows of a tile.
using GroupFn = void (*)(const QuantizedActivations&, const QuantMatrixRef&, int64_t j, int n,
                         int64_t t, bool prefetch, float* y, int64_t ldy);
using ColumnsFn = void (*)(const QuantizedActivations&, const QuantMatrixRef&, float*, int64_t,
                           int64_t, int64_t);

// Columns [n_begin, n_end) for every row of x: tiles of kRowTile rows (they stay in L2), in each
// a group of kGroup weight rows at a time (in L1) against R rows of x at a time. Every output's
// float steps are the same whatever R, so the bits are too.
template <int R, GroupFn kGroupR, GroupFn kGroup1>
void Tiles(const QuantizedActivations& xq, const QuantMatrixRef& w, float* y, int64_t ldy,
           int64_t n_begin, int64_t n_end) {
  for (int64_t t0 = 0; t0 < xq.m; t0 += kRowTile) {
    const int64_t t1 = std::min(xq.m, t0 + kRowTile);
    for (int64_t j = n_begin; j < n_end; j += kGroup) {
      const int n = static_cast<int>(std::min<int64_t>(kGroup, n_end - j));
      int64_t t = t0;
      for (; t + R <= t1; t += R) kGroupR(xq, w, j, n, t, t == t0, y, ldy);
      for (; t < t1; ++t) kGroup1(xq, w, j, n, t, t == t0, y, ldy);
    }
  }
}

}  // namespace pdserve::kernels::quant_simd
#endif  // PDSERVE_AVX2

#endif  // PDSERVE_KERNELS_CPU_LINEAR_QUANT_SIMD_H_
