#include "kernels/cpu/linear_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/base/dtype.h"
#include "kernels/cpu/linear_quant_panels.h"
#include "kernels/cpu/linear_quant_simd.h"
#include "kernels/cpu/linear_quant_vnni.h"
#include "kernels/cpu/quant_blocks.h"
#include "kernels/cpu/simd.h"

namespace pdserve::kernels {
namespace {

float F16At(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return F16ToF32(v);
}

bool IsKQuant(GgmlType type) {
  return type == GgmlType::kQ4_K || type == GgmlType::kQ5_K || type == GgmlType::kQ6_K;
}

void Resize(QuantizedActivations* out, int64_t m, int64_t k, int block) {
  out->m = m;
  out->k = k;
  out->block = block;
  out->q.resize(static_cast<size_t>(m * k));
  out->d.resize(static_cast<size_t>(m * (k / block)));
  out->sum16.resize(static_cast<size_t>(m * (k / 16)));
  out->sum32.resize(static_cast<size_t>(m * (k / 32)));
}

void CodeSums(QuantizedActivations* out) {
  const int64_t n16 = out->k / 16;
  for (int64_t i = 0; i < out->m * n16; ++i) {
    int s = 0;
    for (int l = 0; l < 16; ++l) s += out->q[static_cast<size_t>(i * 16 + l)];
    out->sum16[static_cast<size_t>(i)] = static_cast<int16_t>(s);
  }
  for (int64_t i = 0; i < out->m * (out->k / 32); ++i) {
    out->sum32[static_cast<size_t>(i)] =
        static_cast<int16_t>(out->sum16[static_cast<size_t>(2 * i)] + out->sum16[static_cast<size_t>(2 * i + 1)]);
  }
}

// The scale of a block of x and the factor its elements are multiplied by before rounding.
void BlockScale(float amax, float* d, float* id) {
  *d = amax / 127.0f;
  *id = amax > 0 ? 127.0f / amax : 0.0f;
}

// A K-quant block's decoded scales: Q4_K/Q5_K eight (scale, min) pairs, Q6_K sixteen scales.
struct KScales {
  float d = 0, dmin = 0;
  int16_t sc[16] = {};
  int16_t mn[8] = {};
};

KScales DecodeScales(GgmlType type, const uint8_t* b) {
  KScales s;
  if (type == GgmlType::kQ6_K) {
    for (int i = 0; i < 16; ++i) s.sc[i] = static_cast<int8_t>(b[192 + i]);
    s.d = F16At(b + 208);
    return s;
  }
  s.d = F16At(b);
  s.dmin = F16At(b + 2);
  for (int j = 0; j < 8; ++j) {
    int sc, mn;
    KQuantScaleMin(j, b + 4, &sc, &mn);
    s.sc[j] = static_cast<int16_t>(sc);
    s.mn[j] = static_cast<int16_t>(mn);
  }
  return s;
}

}  // namespace

int ActivationBlock(GgmlType type) { return IsKQuant(type) ? 256 : 32; }

void QuantizeActivationsScalar(const float* x, int64_t m, int64_t ldx, int64_t k, int block,
                               QuantizedActivations* out) {
  Resize(out, m, k, block);
  for (int64_t t = 0; t < m; ++t) {
    for (int64_t b = 0; b < k / block; ++b) {
      const float* xb = x + t * ldx + b * block;
      float amax = 0;
      for (int i = 0; i < block; ++i) amax = std::max(amax, std::fabs(xb[i]));
      float d, id;
      BlockScale(amax, &d, &id);
      out->d[static_cast<size_t>(t * (k / block) + b)] = d;
      int8_t* q = out->q.data() + t * k + b * block;
      for (int i = 0; i < block; ++i) {
        const float v = std::min(127.0f, std::max(-127.0f, xb[i] * id));
        q[i] = static_cast<int8_t>(std::nearbyint(v));
      }
    }
  }
  CodeSums(out);
}

void LinearQuantColumnsScalar(const QuantizedActivations& xq, const QuantMatrixRef& w, float* y,
                              int64_t ldy, int64_t n_begin, int64_t n_end) {
  const int64_t bytes = GgmlBlockBytes(w.type), k = w.cols;
  if (!IsKQuant(w.type)) {
    int8_t q[32];
    for (int64_t j = n_begin; j < n_end; ++j) {
      const uint8_t* row = w.row(j);
      for (int64_t t = 0; t < xq.m; ++t) {
        const int8_t* xc = xq.codes(t);
        float acc = 0;
        for (int64_t b = 0; b < k / 32; ++b) {
          BlockCodes32(w.type, row + b * bytes, q);
          const float s = F16At(row + b * bytes) * xq.scales(t)[b];
          int32_t itot = 0;
          for (int e = 0; e < 32; ++e) itot += q[e] * xc[32 * b + e];
          acc = std::fma(s, static_cast<float>(itot), acc);
        }
        y[t * ldy + j] = acc;
      }
    }
    return;
  }
  const bool six = w.type == GgmlType::kQ6_K;
  uint8_t q[256];
  for (int64_t j = n_begin; j < n_end; ++j) {
    const uint8_t* row = w.row(j);
    for (int64_t t = 0; t < xq.m; ++t) {
      const int8_t* xc = xq.codes(t);
      float acc = 0;
      for (int64_t s = 0; s < k / 256; ++s) {
        const KScales sc = DecodeScales(w.type, row + s * bytes);
        BlockCodesK(w.type, row + s * bytes, q);
        const int8_t* xs = xc + 256 * s;
        const float dx = xq.scales(t)[s];
        int32_t itot = 0, imin = 0;
        const int sub = six ? 16 : 32;
        for (int g = 0; g < 256 / sub; ++g) {
          int32_t dot = 0;
          for (int e = g * sub; e < (g + 1) * sub; ++e) dot += q[e] * xs[e];
          if (six) {
            dot -= 32 * xq.sum16[static_cast<size_t>(t * (k / 16) + 16 * s + g)];
          } else {
            imin += sc.mn[g] * xq.sum32[static_cast<size_t>(t * (k / 32) + 8 * s + g)];
          }
          itot += sc.sc[g] * dot;
        }
        if (six) {
          acc = std::fma(sc.d * dx, static_cast<float>(itot), acc);
        } else {  // d * itot - dmin * imin rounded once, then scaled by x's d (linear_quant.h).
          const float p = sc.dmin * static_cast<float>(imin);
          const float e = std::fma(sc.dmin, static_cast<float>(imin), -p);
          acc = std::fma(dx, std::fma(sc.d, static_cast<float>(itot), -p) - e, acc);
        }
      }
      y[t * ldy + j] = acc;
    }
  }
}

#if PDSERVE_AVX2
namespace {

using namespace quant_simd;  // NOLINT: the shared pieces of both paths.

// acc + v, kept in this order: integer adds reassociate freely, and GCC turns a kernel's chain of
// accumulations into a tree of temporaries that spill (a quarter of the R = 4 kernel's
// instructions were stack moves). The empty asm makes the sum opaque, so the chain stays a chain.
inline __m256i Accumulate(__m256i acc, __m256i v) {
  __m256i s = _mm256_add_epi32(acc, v);
  asm("" : "+x"(s));
  return s;
}

// Rows of x a kernel call walks together: each weight block is unpacked once for all of them.
// R rows of integer sums stay in registers.
constexpr int kRows32 = 4;
constexpr int kRowsK = 4;

// 32 signed codes as 8 lanes of sums of 4 products (|w| * sign-adjusted x: VPMADDUBSW takes an
// unsigned operand; x is in [-127, 127] and |w| <= 128, so no pair saturates).
__m256i DotSigned(__m256i abs_w, __m256i w, __m256i x) {
  const __m256i p = _mm256_maddubs_epi16(abs_w, _mm256_sign_epi8(x, w));
  return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

// Q8_0, Q4_0, Q5_0 for GroupK: per row of x the block's 32 products in 8 lanes.
template <typename Codes>
struct Kernel32 {
  static constexpr int kElements = 32, kDAt = 0, kDminAt = -1;
  template <int R>
  static void Dot(const uint8_t* b, const XRows<R>& x, __m256i* dot, __m128i*) {
    const __m256i wv = Codes::At(b), abs_w = _mm256_sign_epi8(wv, wv);
    for (int r = 0; r < R; ++r) dot[r] = DotSigned(abs_w, wv, Load32(x.q[r]));
  }
};

// Every int16 lane of the result = int16 lane `i` of a 128-bit lane of v (both lanes of v equal),
// or lane i in the low half and lane i2 in the high half.
template <int i, int i2 = i>
__m256i BroadcastLane16(__m256i v) {
  const __m256i ctrl = _mm256_setr_epi8(
      2 * i, 2 * i + 1, 2 * i, 2 * i + 1, 2 * i, 2 * i + 1, 2 * i, 2 * i + 1, 2 * i, 2 * i + 1,
      2 * i, 2 * i + 1, 2 * i, 2 * i + 1, 2 * i, 2 * i + 1, 2 * i2, 2 * i2 + 1, 2 * i2,
      2 * i2 + 1, 2 * i2, 2 * i2 + 1, 2 * i2, 2 * i2 + 1, 2 * i2, 2 * i2 + 1, 2 * i2, 2 * i2 + 1,
      2 * i2, 2 * i2 + 1, 2 * i2, 2 * i2 + 1);
  return _mm256_shuffle_epi8(v, ctrl);
}

// Codes times the sub-block scales into R rows' 8-lane sums, for pair p (sub-blocks 2p, 2p+1) of
// a Q4_K (kFifth false) or Q5_K block; sc: the eight scales as int16 in both 128-bit lanes.
template <bool kFifth, int p, int R>
inline void PairQ45K(const uint8_t* qs, __m256i qh, const XRows<R>& x, __m256i sc, __m256i* acc) {
  const __m256i bytes = Load32(qs + 32 * p);
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  __m256i lo = _mm256_and_si256(bytes, m4), hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), m4);
  if constexpr (kFifth) {
    lo = _mm256_or_si256(lo, BitTo4<2 * p>(qh));
    hi = _mm256_or_si256(hi, BitTo4<2 * p + 1>(qh));
  }
  const __m256i slo = BroadcastLane16<2 * p>(sc), shi = BroadcastLane16<2 * p + 1>(sc);
  for (int r = 0; r < R; ++r) {
    const __m256i plo = _mm256_maddubs_epi16(lo, Load32(x.q[r] + 64 * p));
    const __m256i phi = _mm256_maddubs_epi16(hi, Load32(x.q[r] + 64 * p + 32));
    acc[r] = Accumulate(acc[r], _mm256_madd_epi16(plo, slo));
    acc[r] = Accumulate(acc[r], _mm256_madd_epi16(phi, shi));
  }
}

// One Q4_K/Q5_K block against R rows: per row 8 lanes whose sum is the block's integer total
// (scale-weighted code products), and in mins[r] four partial sums of the mins' total.
template <bool kFifth>
struct KernelQ45K {
  static constexpr int kElements = 256, kDAt = 0, kDminAt = 2;
  template <int R>
  static void Dot(const uint8_t* b, const XRows<R>& x, __m256i* dot, __m128i* mins) {
    const __m256i sm = ScalesMins(b + 4);
    const __m256i sc = _mm256_permute2x128_si256(sm, sm, 0x00);
    const __m128i mn = _mm256_extracti128_si256(sm, 1);
    for (int r = 0; r < R; ++r) {
      mins[r] = _mm_madd_epi16(mn, _mm_loadu_si128(reinterpret_cast<const __m128i*>(x.sum32[r])));
      dot[r] = _mm256_setzero_si256();
    }
    const uint8_t* qs = kFifth ? b + 48 : b + 16;
    const __m256i qh = kFifth ? Load32(b + 16) : _mm256_setzero_si256();
    PairQ45K<kFifth, 0, R>(qs, qh, x, sc, dot);
    PairQ45K<kFifth, 1, R>(qs, qh, x, sc, dot);
    PairQ45K<kFifth, 2, R>(qs, qh, x, sc, dot);
    PairQ45K<kFifth, 3, R>(qs, qh, x, sc, dot);
  }
};

template <int h, int k, int R>
inline void QuarterQ6K(__m256i q, const XRows<R>& x, __m256i sc, __m256i* acc) {
  const __m256i scale = BroadcastLane16<2 * k, 2 * k + 1>(sc);
  for (int r = 0; r < R; ++r) {
    const __m256i p = _mm256_maddubs_epi16(q, Load32(x.q[r] + 128 * h + 32 * k));
    acc[r] = Accumulate(acc[r], _mm256_madd_epi16(p, scale));
  }
}

template <int h, int R>
inline void HalfQ6K(const uint8_t* b, const XRows<R>& x, __m256i sc, __m256i* acc) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
  const __m256i ql0 = Load32(b + 64 * h), ql1 = Load32(b + 64 * h + 32);
  const __m256i qh = Load32(b + 128 + 32 * h);
  // sc: this half's eight scales in both 128-bit lanes; register k's low 16 codes take scale 2k,
  // its high 16 scale 2k + 1.
  QuarterQ6K<h, 0, R>(
      _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30)),
      x, sc, acc);
  QuarterQ6K<h, 1, R>(
      _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30)),
      x, sc, acc);
  QuarterQ6K<h, 2, R>(
      _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), _mm256_and_si256(qh, m30)),
      x, sc, acc);
  QuarterQ6K<h, 3, R>(_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                                      _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30)),
                      x, sc, acc);
}

// Q6_K: per row, the sum over the 16 sub-blocks of scale * (codes . x - 32 * sum of x's codes).
struct KernelQ6K {
  static constexpr int kElements = 256, kDAt = 208, kDminAt = -1;
  template <int R>
  static void Dot(const uint8_t* b, const XRows<R>& x, __m256i* dot, __m128i*) {
    const __m256i sc16 =
        _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192)));
    for (int r = 0; r < R; ++r) dot[r] = _mm256_setzero_si256();
    HalfQ6K<0, R>(b, x, _mm256_permute2x128_si256(sc16, sc16, 0x00), dot);
    HalfQ6K<1, R>(b, x, _mm256_permute2x128_si256(sc16, sc16, 0x11), dot);
    for (int r = 0; r < R; ++r) {
      const __m256i off = _mm256_madd_epi16(sc16, Load32(x.sum16[r]));
      dot[r] = _mm256_sub_epi32(dot[r], _mm256_slli_epi32(off, 5));
    }
  }
};

#define PD_QUANT_TARGET
#include "kernels/cpu/linear_quant_group.inc"
#undef PD_QUANT_TARGET

template <typename Codes>
constexpr ColumnsFn kTiles32 = Tiles<kRows32, GroupK<Kernel32<Codes>, kRows32>, GroupK<Kernel32<Codes>, 1>>;
template <typename Kernel>
constexpr ColumnsFn kTilesK = Tiles<kRowsK, GroupK<Kernel, kRowsK>, GroupK<Kernel, 1>>;

ColumnsFn ColumnsFor(GgmlType type) {
  switch (type) {
    case GgmlType::kQ8_0: return kTiles32<CodesQ8_0>;
    case GgmlType::kQ4_0: return kTiles32<CodesQ4_0>;
    case GgmlType::kQ5_0: return kTiles32<CodesQ5_0>;
    case GgmlType::kQ4_K: return kTilesK<KernelQ45K<false>>;
    case GgmlType::kQ5_K: return kTilesK<KernelQ45K<true>>;
    case GgmlType::kQ6_K: return kTilesK<KernelQ6K>;
    default: return nullptr;
  }
}

}  // namespace
#endif

void QuantizeActivations(const float* x, int64_t m, int64_t ldx, int64_t k, int block,
                         QuantizedActivations* out) {
#if PDSERVE_AVX2
  Resize(out, m, k, block);
  const __m256 sign = _mm256_set1_ps(-0.0f), lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t t = 0; t < m; ++t) {
    for (int64_t b = 0; b < k / block; ++b) {
      const float* xb = x + t * ldx + b * block;
      __m256 mx = _mm256_setzero_ps();
      for (int i = 0; i < block; i += 8) mx = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(xb + i)), mx);
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, mx);
      float amax = 0;
      for (float v : lanes) amax = std::max(amax, v);
      float d, id;
      BlockScale(amax, &d, &id);
      out->d[static_cast<size_t>(t * (k / block) + b)] = d;
      const __m256 vid = _mm256_set1_ps(id);
      int8_t* q = out->q.data() + t * k + b * block;
      for (int i = 0; i < block; i += 32) {
        __m256i v[4];
        for (int u = 0; u < 4; ++u) {
          const __m256 s = _mm256_mul_ps(_mm256_loadu_ps(xb + i + 8 * u), vid);
          v[u] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(s, lo), hi));
        }
        const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]),
                                                  _mm256_packs_epi32(v[2], v[3]));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + i),
                            _mm256_permutevar8x32_epi32(packed, order));
      }
    }
  }
  CodeSums(out);
#else
  QuantizeActivationsScalar(x, m, ldx, k, block, out);
#endif
}

void LinearQuantColumns(const QuantizedActivations& xq, const QuantMatrixRef& w, float* y,
                        int64_t ldy, int64_t n_begin, int64_t n_end) {
  if (w.panels) {  // Packed only where the CPU runs the panel kernels.
    LinearQuantPanelColumns(xq, w, y, ldy, n_begin, n_end);
    return;
  }
#if PDSERVE_AVX2
  if (QuantVnniEnabled()) {
    if (const ColumnsFn columns = QuantColumnsVnni(w.type)) {
      columns(xq, w, y, ldy, n_begin, n_end);
      return;
    }
  }
  if (const ColumnsFn columns = ColumnsFor(w.type)) {
    columns(xq, w, y, ldy, n_begin, n_end);
    return;
  }
#endif
  LinearQuantColumnsScalar(xq, w, y, ldy, n_begin, n_end);
}

void LinearQuantReference(const float* x, int64_t m, int64_t ldx, const QuantMatrixRef& w,
                          double* y) {
  QuantizedActivations xq;
  QuantizeActivationsScalar(x, m, ldx, w.cols, ActivationBlock(w.type), &xq);
  std::vector<float> wf(static_cast<size_t>(w.cols));
  for (int64_t j = 0; j < w.rows; ++j) {
    if (w.panels) {
      DequantizePanelRow(w.type, w.data, w.cols, j, wf.data());
    } else {
      DequantizeRow(w.type, w.row(j), wf.data(), w.cols);
    }
    for (int64_t t = 0; t < m; ++t) {
      double s = 0;
      for (int64_t i = 0; i < w.cols; ++i) {
        s += static_cast<double>(wf[static_cast<size_t>(i)]) * xq.scales(t)[i / xq.block] *
             xq.codes(t)[i];
      }
      y[t * w.rows + j] = s;
    }
  }
}

}  // namespace pdserve::kernels
