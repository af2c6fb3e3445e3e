#include "kernels/cpu/linear_quant.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <utility>

#include "common/base/dtype.h"

#include "common/base/thread_pool.h"
#include "kernels/cpu/quant_blocks.h"
#include "kernels/cpu/simd.h"

namespace pdserve::kernels {
namespace {

constexpr int64_t kRowGroup = 8;     // Rows of x per pass over a weight row.
constexpr int64_t kColumnGrain = 16;  // Columns per unit of work across threads.
constexpr int64_t kMaxBlock = 256;

// HorizontalSum's tree over 8 scalar lanes: ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)).
float SumLanes(const float* l) {
  return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

}  // namespace

void LinearQuantColumnsScalar(const float* x, int64_t m, int64_t ldx, const QuantMatrixRef& w,
                              float* y, int64_t ldy, int64_t n_begin, int64_t n_end) {
  const int64_t qk = GgmlBlockElements(w.type), bytes = GgmlBlockBytes(w.type);
  const int64_t blocks = w.cols / qk;
  float buf[kMaxBlock];
  for (int64_t j = n_begin; j < n_end; ++j) {
    const uint8_t* row = w.row(j);
    for (int64_t t0 = 0; t0 < m; t0 += kRowGroup) {
      const int64_t rows = std::min(kRowGroup, m - t0);
      float acc[kRowGroup][8] = {};
      for (int64_t b = 0; b < blocks; ++b) {
        DequantizeBlock(w.type, row + b * bytes, buf);
        for (int64_t r = 0; r < rows; ++r) {
          const float* xr = x + (t0 + r) * ldx + b * qk;
          for (int64_t k = 0; k < qk; k += 8) {
            for (int l = 0; l < 8; ++l) acc[r][l] = std::fma(buf[k + l], xr[k + l], acc[r][l]);
          }
        }
      }
      for (int64_t r = 0; r < rows; ++r) y[(t0 + r) * ldy + j] = SumLanes(acc[r]);
    }
  }
}

#if PDSERVE_AVX2
namespace {

// Each block type's weights, 8 at a time, as __m256 of exactly DequantizeBlock's bits: the same
// operations (a product, or the K-quants' one fused multiply-add) on the same operands. A
// Dequantizer is made per block (its scales decoded once) and called for groups g = 0, 1, ...

// An f16 scale as f32 by F16C (the conversion is exact: the same bits as F16ToF32).
float LoadF16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return _cvtsh_ss(v);
}

// 8 bytes as 8 int32 lanes.
__m256i Widen(__m128i bytes) { return _mm256_cvtepu8_epi32(bytes); }
__m128i Load8Bytes(const uint8_t* p) { return _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)); }

struct DeqQ8_0 {
  static constexpr int kGroups = 4;
  __m256 d;
  const int8_t* q;
  explicit DeqQ8_0(const uint8_t* b)
      : d(_mm256_set1_ps(LoadF16(b))), q(reinterpret_cast<const int8_t*>(b + 2)) {}
  template <int g>
  __m256 At() const {
    const __m256i v = _mm256_cvtepi8_epi32(Load8Bytes(reinterpret_cast<const uint8_t*>(q + 8 * g)));
    return _mm256_mul_ps(d, _mm256_cvtepi32_ps(v));
  }
};

struct DeqQ4_0 {
  static constexpr int kGroups = 4;
  __m256 d;
  const uint8_t* q;
  explicit DeqQ4_0(const uint8_t* b) : d(_mm256_set1_ps(LoadF16(b))), q(b + 2) {}
  template <int g>
  __m256 At() const {
    const __m128i bytes = Load8Bytes(q + 8 * (g & 1));
    const __m128i nib = g < 2 ? _mm_and_si128(bytes, _mm_set1_epi8(0x0F))
                              : _mm_and_si128(_mm_srli_epi16(bytes, 4), _mm_set1_epi8(0x0F));
    const __m256i v = _mm256_sub_epi32(Widen(nib), _mm256_set1_epi32(8));
    return _mm256_mul_ps(d, _mm256_cvtepi32_ps(v));
  }
};

// Q4_K (kFifth false) and Q5_K.
template <bool kFifth>
struct DeqQ45K {
  static constexpr int kGroups = 32;
  float dsc[8], dm[8];  // Sub-block s: d * scale_s and dmin * min_s, as the scalar path has them.
  const uint8_t* qh;
  const uint8_t* qs;
  explicit DeqQ45K(const uint8_t* b) {
    const float d = LoadF16(b), dmin = LoadF16(b + 2);
    const uint8_t* sc = b + 4;
    for (int j = 0; j < 8; ++j) {
      int s, mn;
      KQuantScaleMin(j, sc, &s, &mn);
      dsc[j] = d * static_cast<float>(s);
      dm[j] = dmin * static_cast<float>(mn);
    }
    qh = kFifth ? b + 16 : nullptr;
    qs = kFifth ? b + 48 : b + 16;
  }
  template <int g>
  __m256 At() const {
    constexpr int pair = g / 8, high = (g / 4) & 1, part = g & 3;  // Elements 64p + 32h + 8part.
    const __m128i bytes = Load8Bytes(qs + 32 * pair + 8 * part);
    __m128i q = high ? _mm_and_si128(_mm_srli_epi16(bytes, 4), _mm_set1_epi8(0x0F))
                     : _mm_and_si128(bytes, _mm_set1_epi8(0x0F));
    __m256i v = Widen(q);
    if constexpr (kFifth) {
      constexpr int bit = 2 * pair + high;
      const __m256i h = Widen(Load8Bytes(qh + 8 * part));
      v = _mm256_or_si256(v, _mm256_slli_epi32(
                                 _mm256_and_si256(_mm256_srli_epi32(h, bit), _mm256_set1_epi32(1)), 4));
    }
    constexpr int sub = 2 * pair + high;
    return _mm256_fmadd_ps(_mm256_set1_ps(dsc[sub]), _mm256_cvtepi32_ps(v),
                           _mm256_set1_ps(-dm[sub]));
  }
};

struct DeqQ6K {
  static constexpr int kGroups = 32;
  const uint8_t* ql;
  const uint8_t* qh;
  const int8_t* sc;
  float d;
  explicit DeqQ6K(const uint8_t* b)
      : ql(b), qh(b + 128), sc(reinterpret_cast<const int8_t*>(b + 192)), d(LoadF16(b + 208)) {}
  template <int g>
  __m256 At() const {
    // Element e = 128 half + 32 quarter + l, l = 8 part + lane (DequantizeBlock's Q6K).
    constexpr int half = g / 16, quarter = (g / 4) & 3, part = g & 3;
    constexpr int l0 = 8 * part;
    const uint8_t* lo = ql + 64 * half + ((quarter & 1) ? 32 : 0) + l0;
    const __m256i low = Widen(Load8Bytes(lo));
    const __m256i nib = quarter < 2 ? _mm256_and_si256(low, _mm256_set1_epi32(0xF))
                                    : _mm256_srli_epi32(low, 4);
    const __m256i hb = _mm256_and_si256(
        _mm256_srli_epi32(Widen(Load8Bytes(qh + 32 * half + l0)), 2 * quarter), _mm256_set1_epi32(3));
    const __m256i q = _mm256_sub_epi32(_mm256_or_si256(nib, _mm256_slli_epi32(hb, 4)),
                                       _mm256_set1_epi32(32));
    const float dsc = d * static_cast<float>(sc[8 * half + l0 / 16 + 2 * quarter]);
    return _mm256_mul_ps(_mm256_set1_ps(dsc), _mm256_cvtepi32_ps(q));
  }
};

// y[t0 + r][j + c] for r < R, c < C: C weight rows, R rows of x, every block dequantized once per
// call. C > 1 gives a row of x C independent accumulators (an FMA's latency hidden behind the
// others'); each output still has one accumulator and one order, whatever C and R.
// One group of 8 weights of each of C rows into their R accumulators (g known at compile time, so
// every offset and shift is a constant).
template <int g, int C, int R, typename Deq>
inline void Group(const Deq* deq, const float* xb, int64_t ldx, __m256 (&acc)[C][R]) {
  for (int c = 0; c < C; ++c) {
    const __m256 wv = deq[c].template At<g>();
    for (int r = 0; r < R; ++r) {
      acc[c][r] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(xb + r * ldx + 8 * g), acc[c][r]);
    }
  }
}

template <int C, int R, typename Deq, int... G>
inline void Block(const Deq* deq, const float* xb, int64_t ldx, __m256 (&acc)[C][R],
                  std::integer_sequence<int, G...>) {
  (Group<G, C, R>(deq, xb, ldx, acc), ...);
}

// y[t0 + r][j + c] for r < R, c < C: C weight rows, R rows of x, every block dequantized once per
// call. C > 1 gives a row of x C independent accumulators (an FMA's latency hidden behind the
// others'); each output still has one accumulator and one order, whatever C and R.
template <int C, int R, typename Deq>
void RowsDot(const QuantMatrixRef& w, int64_t j, const float* x, int64_t ldx, float* y,
             int64_t ldy) {
  constexpr int64_t qk = Deq::kGroups * 8;
  const int64_t bytes = GgmlBlockBytes(w.type), blocks = w.cols / qk;
  const uint8_t* rows[C];
  for (int c = 0; c < C; ++c) rows[c] = w.row(j + c);
  __m256 acc[C][R];
  for (int c = 0; c < C; ++c) {
    for (int r = 0; r < R; ++r) acc[c][r] = _mm256_setzero_ps();
  }
  for (int64_t b = 0; b < blocks; ++b) {
    alignas(64) unsigned char storage[C * sizeof(Deq)];
    Deq* deq = reinterpret_cast<Deq*>(storage);
    for (int c = 0; c < C; ++c) {
      // The rows stream from memory: ask for what comes 1 KiB ahead of each.
      _mm_prefetch(reinterpret_cast<const char*>(rows[c] + b * bytes + 1024), _MM_HINT_T0);
      new (&deq[c]) Deq(rows[c] + b * bytes);
    }
    Block<C, R>(deq, x + b * qk, ldx, acc, std::make_integer_sequence<int, Deq::kGroups>());
  }
  for (int c = 0; c < C; ++c) {
    for (int r = 0; r < R; ++r) y[r * ldy + j + c] = HorizontalSum(acc[c][r]);
  }
}

template <int R, typename Deq>
void ColumnsOfRows(const float* x, int64_t ldx, const QuantMatrixRef& w, float* y, int64_t ldy,
                   int64_t n_begin, int64_t n_end) {
  constexpr int C = R <= 2 ? 4 : 1;
  int64_t j = n_begin;
  for (; j + C <= n_end; j += C) RowsDot<C, R, Deq>(w, j, x, ldx, y, ldy);
  for (; j < n_end; ++j) RowsDot<1, R, Deq>(w, j, x, ldx, y, ldy);
}

template <typename Deq>
void Columns(const float* x, int64_t m, int64_t ldx, const QuantMatrixRef& w, float* y,
             int64_t ldy, int64_t n_begin, int64_t n_end) {
  for (int64_t t0 = 0; t0 < m; t0 += kRowGroup) {
    const float* xt = x + t0 * ldx;
    float* yt = y + t0 * ldy;
    switch (std::min(kRowGroup, m - t0)) {
      case 1: ColumnsOfRows<1, Deq>(xt, ldx, w, yt, ldy, n_begin, n_end); break;
      case 2: ColumnsOfRows<2, Deq>(xt, ldx, w, yt, ldy, n_begin, n_end); break;
      case 3: ColumnsOfRows<3, Deq>(xt, ldx, w, yt, ldy, n_begin, n_end); break;
      case 4: ColumnsOfRows<4, Deq>(xt, ldx, w, yt, ldy, n_begin, n_end); break;
      case 5: ColumnsOfRows<5, Deq>(xt, ldx, w, yt, ldy, n_begin, n_end); break;
      case 6: ColumnsOfRows<6, Deq>(xt, ldx, w, yt, ldy, n_begin, n_end); break;
      case 7: ColumnsOfRows<7, Deq>(xt, ldx, w, yt, ldy, n_begin, n_end); break;
      default: ColumnsOfRows<8, Deq>(xt, ldx, w, yt, ldy, n_begin, n_end); break;
    }
  }
}

}  // namespace
#endif

void LinearQuantColumns(const float* x, int64_t m, int64_t ldx, const QuantMatrixRef& w, float* y,
                        int64_t ldy, int64_t n_begin, int64_t n_end) {
#if PDSERVE_AVX2
  switch (w.type) {
    case GgmlType::kQ8_0: return Columns<DeqQ8_0>(x, m, ldx, w, y, ldy, n_begin, n_end);
    case GgmlType::kQ4_0: return Columns<DeqQ4_0>(x, m, ldx, w, y, ldy, n_begin, n_end);
    case GgmlType::kQ4_K: return Columns<DeqQ45K<false>>(x, m, ldx, w, y, ldy, n_begin, n_end);
    case GgmlType::kQ5_K: return Columns<DeqQ45K<true>>(x, m, ldx, w, y, ldy, n_begin, n_end);
    case GgmlType::kQ6_K: return Columns<DeqQ6K>(x, m, ldx, w, y, ldy, n_begin, n_end);
    default: break;
  }
#endif
  LinearQuantColumnsScalar(x, m, ldx, w, y, ldy, n_begin, n_end);
}

void LinearQuant(const float* x, int64_t m, int64_t ldx, const QuantMatrixRef& w, float* y,
                 int64_t ldy, ThreadPool* pool) {
  const int64_t units = (w.rows + kColumnGrain - 1) / kColumnGrain;
  pool->ParallelForDynamic(units, 1, [&](int64_t begin, int64_t end) {
    LinearQuantColumns(x, m, ldx, w, y, ldy, begin * kColumnGrain,
                       std::min(w.rows, end * kColumnGrain));
  });
}

}  // namespace pdserve::kernels
