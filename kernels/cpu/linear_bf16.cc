#include "kernels/cpu/linear_bf16.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/base/check.h"
#include "common/base/thread_pool.h"
#include "kernels/cpu/simd.h"

namespace pdserve::kernels {
namespace {

constexpr int64_t kChunk = 32;  // k per VDPBF16PS of one output (16 lanes x 2).

inline float FlushDenormal(float f) {
  return std::fpclassify(f) == FP_SUBNORMAL ? std::copysign(0.0f, f) : f;
}
// A bf16 input as VDPBF16PS reads it: denormals are zero.
inline float BF16In(const uint16_t* row, int64_t i, int64_t k) {
  return i < k ? FlushDenormal(Bf16ToF32(row[i])) : 0.0f;
}

// The fixed 16-lane tree: lane i + lane i+8, then simd.h's 8-lane tree.
inline float SumLanes(const float* lane) {
  float s[8];
  for (int i = 0; i < 8; ++i) s[i] = lane[i] + lane[i + 8];
  return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

#if PDSERVE_AVX2

// MXCSR's DAZ (bit 6) and FTZ (bit 15) for the duration of a scope: the AVX2 twin's FMAs then
// treat denormal inputs as zero and flush denormal results, as VDPBF16PS does.
class DazFtzScope {
 public:
  DazFtzScope() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8040u); }
  ~DazFtzScope() { _mm_setcsr(saved_); }

 private:
  unsigned saved_;
};

// 16 bf16 values as 8 pairs: the odd elements (high halves) and the even ones (low halves).
inline __m256 OddHalves(__m256i v) {
  return _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
}
inline __m256 EvenHalves(__m256i v) { return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)); }

// One chunk of 32 for T tokens x R rows; acc[t][r][0] holds lanes 0-7, [1] lanes 8-15.
template <int T, int R>
inline void TwinChunk(const uint16_t* const* x, const uint16_t* const* w, int64_t kk,
                      __m256 (&acc)[T][R][2]) {
  __m256 wo[R][2], we[R][2];
  for (int r = 0; r < R; ++r) {
    for (int h = 0; h < 2; ++h) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[r] + kk + 16 * h));
      wo[r][h] = OddHalves(v);
      we[r][h] = EvenHalves(v);
    }
  }
  for (int t = 0; t < T; ++t) {
    for (int h = 0; h < 2; ++h) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t] + kk + 16 * h));
      const __m256 xo = OddHalves(v), xe = EvenHalves(v);
      for (int r = 0; r < R; ++r) {
        acc[t][r][h] = _mm256_fmadd_ps(xo, wo[r][h], acc[t][r][h]);
        acc[t][r][h] = _mm256_fmadd_ps(xe, we[r][h], acc[t][r][h]);
      }
    }
  }
}

template <int T, int R>
void TwinTile(const uint16_t* x0, int64_t ldx, const uint16_t* w0, int64_t k, float* y,
              int64_t ldy) {
  __m256 acc[T][R][2];
  const uint16_t* x[T];
  const uint16_t* w[R];
  for (int t = 0; t < T; ++t) x[t] = x0 + t * ldx;
  for (int r = 0; r < R; ++r) w[r] = w0 + r * k;
  {
    DazFtzScope scope;
    for (int t = 0; t < T; ++t)
      for (int r = 0; r < R; ++r) acc[t][r][0] = acc[t][r][1] = _mm256_setzero_ps();
    const int64_t full = k / kChunk * kChunk;
    for (int64_t kk = 0; kk < full; kk += kChunk) TwinChunk<T, R>(x, w, kk, acc);
    if (full < k) {  // The last chunk, zero-padded.
      uint16_t xt[T][kChunk] = {}, wt[R][kChunk] = {};
      const uint16_t* xp[T];
      const uint16_t* wp[R];
      for (int t = 0; t < T; ++t) {
        std::memcpy(xt[t], x[t] + full, (k - full) * 2);
        xp[t] = xt[t];
      }
      for (int r = 0; r < R; ++r) {
        std::memcpy(wt[r], w[r] + full, (k - full) * 2);
        wp[r] = wt[r];
      }
      TwinChunk<T, R>(xp, wp, 0, acc);
    }
  }
  for (int t = 0; t < T; ++t) {
    for (int r = 0; r < R; ++r) {
      y[t * ldy + r] = HorizontalSum(_mm256_add_ps(acc[t][r][0], acc[t][r][1]));
    }
  }
}

template <int T>
void TwinTokens(const uint16_t* x, int64_t ldx, const uint16_t* w, int64_t k, float* y,
                int64_t ldy, int64_t rows) {
  int64_t r = 0;
  for (; r + 2 <= rows; r += 2) TwinTile<T, 2>(x, ldx, w + r * k, k, y + r, ldy);
  if (r < rows) TwinTile<T, 1>(x, ldx, w + r * k, k, y + r, ldy);
}

#endif  // PDSERVE_AVX2

}  // namespace

void RoundRowsToBf16(const float* x, int64_t m, int64_t k, int64_t ldx, uint16_t* out,
                     int64_t ldout) {
  for (int64_t t = 0; t < m; ++t) {
    const float* src = x + t * ldx;
    uint16_t* dst = out + t * ldout;
    int64_t i = 0;
#if PDSERVE_AVX2
    // F32ToBf16 on 8 lanes: round to nearest even; NaN kept quiet.
    const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
    const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff);
    const __m256i quiet = _mm256_set1_epi32(0x40);
    for (; i + 8 <= k; i += 8) {
      const __m256i u = _mm256_castps_si256(_mm256_loadu_ps(src + i));
      const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf);
      const __m256i hi = _mm256_srli_epi32(u, 16);
      const __m256i rounded =
          _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(bias, _mm256_and_si256(hi, one))), 16);
      const __m256i r = _mm256_blendv_epi8(rounded, _mm256_or_si256(hi, quiet), nan);
      const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm256_castsi256_si128(packed));
    }
#endif
    for (; i < k; ++i) dst[i] = F32ToBf16(src[i]);
  }
}

void LinearBf16Reference(const uint16_t* xb, int64_t m, int64_t ldx, const MatrixRef& w, float* y,
                         int64_t ldy, int64_t n_begin, int64_t n_end) {
  PD_CHECK(w.dtype == DType::kBF16);
  const int64_t k = w.cols;
  for (int64_t t = 0; t < m; ++t) {
    const uint16_t* x = xb + t * ldx;
    for (int64_t j = n_begin; j < n_end; ++j) {
      const uint16_t* wr = static_cast<const uint16_t*>(w.row(j));
      float lane[16] = {};
      for (int64_t c = 0; c < k; c += kChunk) {
        for (int l = 0; l < 16; ++l) {
          const int64_t i0 = c + 2 * l, i1 = i0 + 1;
          lane[l] = FlushDenormal(std::fma(BF16In(x, i1, k), BF16In(wr, i1, k), lane[l]));
          lane[l] = FlushDenormal(std::fma(BF16In(x, i0, k), BF16In(wr, i0, k), lane[l]));
        }
      }
      y[t * ldy + j] = SumLanes(lane);
    }
  }
}

namespace internal {

void LinearBf16ColumnsAvx2(const uint16_t* xb, int64_t m, int64_t ldx, const MatrixRef& w,
                           float* y, int64_t ldy, int64_t n_begin, int64_t n_end) {
#if PDSERVE_AVX2
  PD_CHECK(w.dtype == DType::kBF16);
  const int64_t k = w.cols;
  const uint16_t* base = static_cast<const uint16_t*>(w.data) + n_begin * k;
  const int64_t rows = n_end - n_begin;
  float* yb = y + n_begin;
  int64_t t = 0;
  for (; t + 4 <= m; t += 4) TwinTokens<4>(xb + t * ldx, ldx, base, k, yb + t * ldy, ldy, rows);
  switch (m - t) {
    case 3: TwinTokens<3>(xb + t * ldx, ldx, base, k, yb + t * ldy, ldy, rows); break;
    case 2: TwinTokens<2>(xb + t * ldx, ldx, base, k, yb + t * ldy, ldy, rows); break;
    case 1: TwinTokens<1>(xb + t * ldx, ldx, base, k, yb + t * ldy, ldy, rows); break;
    default: break;
  }
#else
  LinearBf16Reference(xb, m, ldx, w, y, ldy, n_begin, n_end);
#endif
}

}  // namespace internal

void LinearBf16Columns(const uint16_t* xb, int64_t m, int64_t ldx, const MatrixRef& w, float* y,
                       int64_t ldy, int64_t n_begin, int64_t n_end) {
  if (m <= 0 || n_begin >= n_end) return;
  if (Bf16DotEnabled()) {
    internal::LinearBf16ColumnsAvx512(xb, m, ldx, w, y, ldy, n_begin, n_end);
  } else {
    internal::LinearBf16ColumnsAvx2(xb, m, ldx, w, y, ldy, n_begin, n_end);
  }
}

void LinearBf16Multi(const uint16_t* xb, int64_t m, int64_t ldx, const LinearOutput* outputs,
                     int num_outputs, ThreadPool* pool) {
  ForEachOutputColumns(outputs, num_outputs, pool, [&](const LinearOutput& o, int64_t lo, int64_t hi) {
    LinearBf16Columns(xb, m, ldx, *o.w, o.y, o.ldy, lo, hi);
  });
}

}  // namespace pdserve::kernels
