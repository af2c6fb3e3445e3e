#include "kernels/cpu/linear_bf16.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/base/check.h"
#include "common/base/thread_pool.h"
#include "kernels/cpu/linear_avx512.h"
#include "kernels/cpu/simd.h"

namespace pdserve::kernels {
namespace {

constexpr int64_t kLanes = internal::kPanelRows;
using internal::PanelElements;

inline float FlushDenormal(float f) {
  return std::fpclassify(f) == FP_SUBNORMAL ? std::copysign(0.0f, f) : f;
}
// A bf16 value as VDPBF16PS reads it: denormals are zero.
inline float Bf16In(uint16_t v) { return FlushDenormal(Bf16ToF32(v)); }

// x's pair q as VDPBF16PS's broadcast operand: x[2q] in the low half, x[2q+1] (zero past k) high.
inline uint32_t XPair(const uint16_t* x, int64_t q, int64_t k) {
  if (2 * q + 1 < k) {
    uint32_t u;
    std::memcpy(&u, x + 2 * q, 4);
    return u;
  }
  return x[2 * q];
}

#if PDSERVE_AVX2

// 8 lanes' pairs: the odd elements (high halves) and the even ones (low halves), as f32.
inline __m256 OddHalves(__m256i v) {
  return _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
}
inline __m256 EvenHalves(__m256i v) { return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)); }

// T tokens against one panel; columns [lo, hi) of the panel's 16 stored to y (panel-relative).
template <int T>
void TwinTile(const uint16_t* x, int64_t ldx, const uint16_t* panel, int64_t k, float* y,
              int64_t ldy, int lo, int hi, bool accumulate) {
  __m256 acc[T][2];
  {
    DazFtzScope scope;
    for (int t = 0; t < T; ++t) {
      alignas(32) float init[kLanes] = {};
      if (accumulate) {
        for (int l = lo; l < hi; ++l) init[l] = y[t * ldy + l];
      }
      acc[t][0] = _mm256_load_ps(init);
      acc[t][1] = _mm256_load_ps(init + 8);
    }
    const int64_t pairs = (k + 1) / 2;
    for (int64_t q = 0; q < pairs; ++q) {
      __m256 wo[2], we[2];
      for (int h = 0; h < 2; ++h) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel + q * 32 + 16 * h));
        wo[h] = OddHalves(v);
        we[h] = EvenHalves(v);
      }
      for (int t = 0; t < T; ++t) {
        const __m256i u = _mm256_set1_epi32(static_cast<int>(XPair(x + t * ldx, q, k)));
        const __m256 xo = OddHalves(u), xe = EvenHalves(u);
        for (int h = 0; h < 2; ++h) {
          acc[t][h] = _mm256_fmadd_ps(xo, wo[h], acc[t][h]);
          acc[t][h] = _mm256_fmadd_ps(xe, we[h], acc[t][h]);
        }
      }
    }
  }
  for (int t = 0; t < T; ++t) {
    alignas(32) float out[kLanes];
    _mm256_store_ps(out, acc[t][0]);
    _mm256_store_ps(out + 8, acc[t][1]);
    for (int l = lo; l < hi; ++l) y[t * ldy + l] = out[l];
  }
}

template <int T>
void TwinTokens(const uint16_t* x, int64_t ldx, const MatrixRef& w, float* y, int64_t ldy,
                int64_t n_begin, int64_t n_end, bool accumulate) {
  const uint16_t* data = static_cast<const uint16_t*>(w.data);
  for (int64_t p = n_begin / kLanes; p * kLanes < n_end; ++p) {
    const int64_t first = p * kLanes;
    const int lo = static_cast<int>(std::max(n_begin, first) - first);
    const int hi = static_cast<int>(std::min(n_end, first + kLanes) - first);
    TwinTile<T>(x, ldx, data + p * internal::PanelStride(w), w.cols, y + first, ldy, lo, hi,
                accumulate);
  }
}

#endif  // PDSERVE_AVX2

}  // namespace

void RoundRowsToBf16(const float* x, int64_t m, int64_t k, int64_t ldx, uint16_t* out,
                     int64_t ldout) {
  const bool avx512 = Avx512Enabled();
  for (int64_t t = 0; t < m; ++t) {
    const float* src = x + t * ldx;
    uint16_t* dst = out + t * ldout;
    int64_t i = avx512 ? internal::RoundToBf16Avx512(src, k, dst) : 0;
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

void RoundToBf16Ftz(const float* x, int64_t n, uint16_t* out) {
  int64_t i = Bf16DotEnabled() ? internal::RoundToBf16FtzAvx512(x, n, out) : 0;
  for (; i < n; ++i) out[i] = F32ToBf16(FlushDenormal(x[i]));
}

size_t Bf16PanelsBytes(int64_t rows, int64_t cols) {
  return static_cast<size_t>((rows + kLanes - 1) / kLanes * PanelElements(cols)) * 2;
}

MatrixLayout Bf16PanelLayout() {
  return AmxEnabled() ? MatrixLayout::kBf16PanelsAmx : MatrixLayout::kBf16Panels;
}

namespace {

// W[j][i] as bf16, for each checkpoint dtype.
template <DType D>
inline uint16_t WeightAsBf16(const void* row, int64_t i) {
  if constexpr (D == DType::kBF16) return static_cast<const uint16_t*>(row)[i];
  if constexpr (D == DType::kF32) return F32ToBf16(static_cast<const float*>(row)[i]);
  return F32ToBf16(F16ToF32(static_cast<const uint16_t*>(row)[i]));
}

// Panel by panel, pair by pair: each 64-byte output line written once, in order, from 16 rows
// read sequentially (2x faster than scattering row by row, which rewrote each line 16 times).
template <DType D>
void PackPanels(const MatrixRef& w, uint16_t* out) {
  const int64_t n = w.rows, k = w.cols, pairs = (k + 1) / 2;
  for (int64_t p = 0; p * kLanes < n; ++p) {
    const void* rows[kLanes];
    for (int64_t l = 0; l < kLanes; ++l) rows[l] = p * kLanes + l < n ? w.row(p * kLanes + l) : nullptr;
    uint16_t* panel = out + p * PanelElements(k);
    for (int64_t q = 0; q < pairs; ++q) {
      uint16_t* line = panel + q * 2 * kLanes;
      for (int64_t l = 0; l < kLanes; ++l) {
        uint16_t even = 0, odd = 0;
        if (rows[l] != nullptr) {
          even = WeightAsBf16<D>(rows[l], 2 * q);
          if (2 * q + 1 < k) odd = WeightAsBf16<D>(rows[l], 2 * q + 1);
        }
        line[2 * l] = even;
        line[2 * l + 1] = odd;
      }
    }
  }
}

}  // namespace

MatrixRef PackBf16Panels(const MatrixRef& w, void* dst, MatrixLayout layout) {
  PD_CHECK(w.layout == MatrixLayout::kRowMajor && layout != MatrixLayout::kRowMajor);
  uint16_t* out = static_cast<uint16_t*>(dst);
  switch (w.dtype) {
    case DType::kBF16: PackPanels<DType::kBF16>(w, out); break;
    case DType::kF32: PackPanels<DType::kF32>(w, out); break;
    case DType::kF16: PackPanels<DType::kF16>(w, out); break;
  }
  return MatrixRef{DType::kBF16, dst, w.rows, w.cols, layout};
}

uint16_t Bf16PanelsAt(const MatrixRef& packed, int64_t row, int64_t col) {
  PD_CHECK(packed.layout != MatrixLayout::kRowMajor);
  const uint16_t* data = static_cast<const uint16_t*>(packed.data);
  return data[(row / kLanes) * internal::PanelStride(packed) + (col / 2) * 2 * kLanes +
              (row % kLanes) * 2 + col % 2];
}

void LinearBf16Reference(const uint16_t* xb, int64_t m, int64_t ldx, const MatrixRef& w, float* y,
                         int64_t ldy, int64_t n_begin, int64_t n_end, bool accumulate) {
  PD_CHECK(w.layout != MatrixLayout::kRowMajor);
  const bool amx = w.layout == MatrixLayout::kBf16PanelsAmx;
  const int64_t k = w.cols, pairs = (k + 1) / 2;
  for (int64_t t = 0; t < m; ++t) {
    const uint16_t* x = xb + t * ldx;
    for (int64_t j = n_begin; j < n_end; ++j) {
      float acc = accumulate ? y[t * ldy + j] : 0.0f;
      if (amx) {  // Per k tile: the even and the odd elements' chains from zero, then one add each.
        for (int64_t q0 = 0; q0 < pairs; q0 += internal::kAmxTilePairs) {
          float even = 0.0f, odd = 0.0f;
          for (int64_t q = q0; q < std::min(pairs, q0 + internal::kAmxTilePairs); ++q) {
            const int64_t i0 = 2 * q, i1 = i0 + 1;
            even = internal::Bf16DotStep(even, x[i0], Bf16PanelsAt(w, j, i0));
            odd = internal::Bf16DotStep(odd, i1 < k ? x[i1] : 0, Bf16PanelsAt(w, j, i1));
          }
          acc = internal::AmxTileSum(acc, even, odd);
        }
      } else {
        for (int64_t q = 0; q < pairs; ++q) {
          const int64_t i0 = 2 * q, i1 = i0 + 1;
          acc = internal::Bf16DotStep(acc, i1 < k ? x[i1] : 0, Bf16PanelsAt(w, j, i1));
          acc = internal::Bf16DotStep(acc, x[i0], Bf16PanelsAt(w, j, i0));
        }
      }
      y[t * ldy + j] = acc;
    }
  }
}

namespace internal {

float Bf16DotStep(float acc, uint16_t a, uint16_t b) {
  return FlushDenormal(std::fma(Bf16In(a), Bf16In(b), acc));
}

float AmxTileSum(float acc, float even, float odd) {
  return FlushDenormal(acc + FlushDenormal(even + odd));
}

void LinearBf16ColumnsAvx2(const uint16_t* xb, int64_t m, int64_t ldx, const MatrixRef& w,
                           float* y, int64_t ldy, int64_t n_begin, int64_t n_end, bool accumulate) {
  PD_CHECK(w.layout == MatrixLayout::kBf16Panels);
#if PDSERVE_AVX2
  int64_t t = 0;
  for (; t + 4 <= m; t += 4) {
    TwinTokens<4>(xb + t * ldx, ldx, w, y + t * ldy, ldy, n_begin, n_end, accumulate);
  }
  const uint16_t* xt = xb + t * ldx;
  float* yt = y + t * ldy;
  switch (m - t) {
    case 3: TwinTokens<3>(xt, ldx, w, yt, ldy, n_begin, n_end, accumulate); break;
    case 2: TwinTokens<2>(xt, ldx, w, yt, ldy, n_begin, n_end, accumulate); break;
    case 1: TwinTokens<1>(xt, ldx, w, yt, ldy, n_begin, n_end, accumulate); break;
    default: break;
  }
#else
  LinearBf16Reference(xb, m, ldx, w, y, ldy, n_begin, n_end, accumulate);
#endif
}

}  // namespace internal

void LinearBf16Columns(const uint16_t* xb, int64_t m, int64_t ldx, const MatrixRef& w, float* y,
                       int64_t ldy, int64_t n_begin, int64_t n_end, bool accumulate) {
  PD_CHECK(w.layout != MatrixLayout::kRowMajor);
  if (m <= 0 || n_begin >= n_end) return;
  if (w.cols == 0) {  // No pairs: the sums are their starting values.
    if (!accumulate) {
      for (int64_t t = 0; t < m; ++t) std::fill(y + t * ldy + n_begin, y + t * ldy + n_end, 0.0f);
    }
    return;
  }
  if (w.layout == MatrixLayout::kBf16PanelsAmx) {
    if (AmxEnabled()) {
      internal::LinearBf16ColumnsAmx(xb, m, ldx, w, y, ldy, n_begin, n_end, accumulate);
    } else {  // Packed for AMX on a CPU without it (tests): the reference's AMX order.
      LinearBf16Reference(xb, m, ldx, w, y, ldy, n_begin, n_end, accumulate);
    }
    return;
  }
  if (Bf16DotEnabled()) {
    internal::LinearBf16ColumnsAvx512(xb, m, ldx, w, y, ldy, n_begin, n_end, accumulate);
  } else {
    internal::LinearBf16ColumnsAvx2(xb, m, ldx, w, y, ldy, n_begin, n_end, accumulate);
  }
}

void LinearBf16Multi(const uint16_t* xb, int64_t m, int64_t ldx, const LinearOutput* outputs,
                     int num_outputs, ThreadPool* pool) {
  ForEachOutputColumns(outputs, num_outputs, pool, [&](const LinearOutput& o, int64_t lo, int64_t hi) {
    LinearBf16Columns(xb, m, ldx, *o.w, o.y, o.ldy, lo, hi);
  }, num_outputs > 0 && outputs[0].w->layout == MatrixLayout::kBf16PanelsAmx
         ? internal::kAmxColumnGrain
         : internal::kColumnGrain);
}

}  // namespace pdserve::kernels
