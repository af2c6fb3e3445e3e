// VDPBF16PS path of the bf16 linear kernel (contract in linear_bf16.h). Every function that uses
// AVX-512 carries the target attribute instead of file-wide flags, as linear_avx512.cc.
// GCC 12 reports the "undefined" upper half that _mm512_inserti64x4 and friends start from as an
// uninitialised use (a false positive in its own headers); silenced for this file only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "kernels/cpu/linear_bf16.h"
#include "kernels/cpu/simd.h"

namespace pdserve::kernels {

#if PDSERVE_AVX2

#define PD_AVX512BF16 \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16")))

namespace {

bool CpuHasBf16Dot() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512bf16");
}

std::atomic<bool>& EnabledFlag() {
  static std::atomic<bool> enabled{[] {
    const char* isa = std::getenv("PDSERVE_KERNEL_ISA");
    return CpuHasBf16Dot() && !(isa != nullptr && std::strcmp(isa, "avx2") == 0);
  }()};
  return enabled;
}

constexpr int64_t kLanes = internal::kPanelRows;
constexpr int64_t kBlockBytes = 256 * 1024;  // Panels kept in L2 across token tiles.
constexpr int64_t kPrefetchBytes = 8192;    // Into L2, as linear.cc (bench/RESULTS.md).

// The output lanes of panel p that fall in [n_begin, n_end).
inline __mmask16 PanelMask(int64_t p, int64_t n_begin, int64_t n_end) {
  const int64_t lo = std::max<int64_t>(n_begin - p * kLanes, 0);
  const int64_t hi = std::min<int64_t>(n_end - p * kLanes, kLanes);
  return static_cast<__mmask16>(((1u << hi) - 1) & ~((1u << lo) - 1));
}

// T tokens x B panels (starting at panel p) over all of k; acc[t][b] holds 16 outputs.
template <int T, int B, bool Prefetch>
PD_AVX512BF16 inline void Tile(const uint16_t* x, int64_t ldx, const uint16_t* panels,
                               int64_t panel_elements, int64_t k, float* y, int64_t ldy, int64_t p,
                               int64_t n_begin, int64_t n_end, bool accumulate) {
  __m512 acc[T][B];
  if (accumulate) {
    for (int b = 0; b < B; ++b) {
      const __mmask16 mask = PanelMask(p + b, n_begin, n_end);
      for (int t = 0; t < T; ++t) acc[t][b] = _mm512_maskz_loadu_ps(mask, y + (p + b) * kLanes + t * ldy);
    }
  } else {
    for (int t = 0; t < T; ++t)
      for (int b = 0; b < B; ++b) acc[t][b] = _mm512_setzero_ps();
  }
  const uint16_t* w = panels + p * panel_elements;
  const int64_t full = k / 2;
  for (int64_t q = 0; q < full; ++q) {
    __m512i wv[B];
    for (int b = 0; b < B; ++b) {
      const uint16_t* src = w + b * panel_elements + q * 32;
      if constexpr (Prefetch) {
        _mm_prefetch(reinterpret_cast<const char*>(src) + kPrefetchBytes, _MM_HINT_T1);
      }
      if constexpr (T < 4) {
        // Streaming from memory (decode): two 32-byte loads per 64 bytes of weights stream
        // faster than one 64-byte load on this EPYC (bench/RESULTS.md). Same bits either way.
        const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
        const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 16));
        wv[b] = _mm512_inserti64x4(_mm512_zextsi256_si512(lo), hi, 1);
      } else {
        wv[b] = _mm512_loadu_si512(src);
      }
    }
    for (int t = 0; t < T; ++t) {
      uint32_t pair;
      std::memcpy(&pair, x + t * ldx + 2 * q, 4);
      const __m512i xv = _mm512_set1_epi32(static_cast<int>(pair));
      for (int b = 0; b < B; ++b) {
        acc[t][b] = _mm512_dpbf16_ps(acc[t][b], (__m512bh)xv, (__m512bh)wv[b]);
      }
    }
  }
  if (k % 2 != 0) {  // The last pair's odd element is zero, in x as in the packing.
    __m512i wv[B];
    for (int b = 0; b < B; ++b) wv[b] = _mm512_loadu_si512(w + b * panel_elements + full * 32);
    for (int t = 0; t < T; ++t) {
      const __m512i xv = _mm512_set1_epi32(x[t * ldx + k - 1]);
      for (int b = 0; b < B; ++b) {
        acc[t][b] = _mm512_dpbf16_ps(acc[t][b], (__m512bh)xv, (__m512bh)wv[b]);
      }
    }
  }
  for (int b = 0; b < B; ++b) {
    const __mmask16 mask = PanelMask(p + b, n_begin, n_end);
    float* yb = y + (p + b) * kLanes;
    for (int t = 0; t < T; ++t) _mm512_mask_storeu_ps(yb + t * ldy, mask, acc[t][b]);
  }
}

// Tokens [0, T) against panels [p_begin, p_end) in tiles of B (then a narrower last tile).
template <int T, int B, bool Prefetch>
PD_AVX512BF16 inline void PanelsForTokens(const uint16_t* x, int64_t ldx, const uint16_t* panels,
                                          int64_t panel_elements, int64_t k, float* y, int64_t ldy,
                                          int64_t p_begin, int64_t p_end, int64_t n_begin,
                                          int64_t n_end, bool accumulate) {
  int64_t p = p_begin;
  for (; p + B <= p_end; p += B) {
    Tile<T, B, Prefetch>(x, ldx, panels, panel_elements, k, y, ldy, p, n_begin, n_end, accumulate);
  }
  if constexpr (B > 1) {
    for (; p < p_end; ++p) {
      Tile<T, 1, Prefetch>(x, ldx, panels, panel_elements, k, y, ldy, p, n_begin, n_end, accumulate);
    }
  }
}

// Register tiles of kTilePanels panels (linear_bf16.h): 8 tokens x 3 panels is 24 accumulators
// + 3 weights + 1 token; fewer tokens for a batch's last rows and the GEMV of decode.
template <int T>
PD_AVX512BF16 inline void TokenTile(bool first, const uint16_t* x, int64_t ldx,
                                    const uint16_t* panels, int64_t panel_elements, int64_t k,
                                    float* y, int64_t ldy, int64_t p_begin, int64_t p_end,
                                    int64_t n_begin, int64_t n_end, bool accumulate) {
  constexpr int B = internal::kTilePanels;
  if (first) {
    PanelsForTokens<T, B, true>(x, ldx, panels, panel_elements, k, y, ldy, p_begin, p_end, n_begin,
                                n_end, accumulate);
  } else {
    PanelsForTokens<T, B, false>(x, ldx, panels, panel_elements, k, y, ldy, p_begin, p_end,
                                 n_begin, n_end, accumulate);
  }
}

}  // namespace

bool Bf16DotSupported() {
  static const bool cpu = CpuHasBf16Dot();
  return cpu;
}
bool Bf16DotEnabled() { return EnabledFlag().load(std::memory_order_relaxed); }
void SetBf16DotEnabled(bool enabled) { EnabledFlag().store(enabled && CpuHasBf16Dot()); }

namespace internal {

// F32ToBf16 on 16 lanes (round to nearest even by integer arithmetic, NaN kept quiet): the same
// bits as the scalar function (VCVTNEPS2BF16 flushes denormal inputs, which this must not).
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl"))) int64_t RoundToBf16Avx512(const float* x, int64_t n, uint16_t* out) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
  const __m512i one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff);
  const __m512i quiet = _mm512_set1_epi32(0x40);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i u = _mm512_castps_si512(_mm512_loadu_ps(x + i));
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs_mask), inf);
    const __m512i hi = _mm512_srli_epi32(u, 16);
    const __m512i rounded = _mm512_srli_epi32(
        _mm512_add_epi32(u, _mm512_add_epi32(bias, _mm512_and_si512(hi, one))), 16);
    const __m512i r = _mm512_mask_blend_epi32(nan, rounded, _mm512_or_si512(hi, quiet));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm512_cvtepi32_epi16(r));
  }
  return i;
}

// VCVTNE2PS2BF16: F32ToBf16 of x with denormal inputs flushed to a signed zero, 32 at a time.
PD_AVX512BF16 int64_t RoundToBf16FtzAvx512(const float* x, int64_t n, uint16_t* out) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(x + i));
    _mm512_storeu_si512(out + i, (__m512i)b);
  }
  if (i + 16 <= n) {
    const __m256bh b = _mm512_cvtneps_pbh(_mm512_loadu_ps(x + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), (__m256i)b);
    i += 16;
  }
  return i;
}

PD_AVX512BF16 void LinearBf16ColumnsAvx512(const uint16_t* xb, int64_t m, int64_t ldx,
                                           const MatrixRef& w, float* y, int64_t ldy,
                                           int64_t n_begin, int64_t n_end, bool accumulate) {
  const int64_t k = w.cols;
  const int64_t panel_elements = internal::PanelStride(w);
  // A multiple of the tile's panels, so that only a matrix's last tile is narrower.
  const int64_t block =
      std::max<int64_t>(1, kBlockBytes / (internal::PanelElements(k) * 2) / internal::kTilePanels) *
      internal::kTilePanels;
  const uint16_t* panels = static_cast<const uint16_t*>(w.data);
  const int64_t p_last = (n_end + kLanes - 1) / kLanes;
  for (int64_t pb = n_begin / kLanes; pb < p_last; pb += block) {
    const int64_t pe = std::min(pb + block, p_last);
    int64_t t = 0;
    for (; t + 8 <= m; t += 8) {
      TokenTile<8>(t == 0, xb + t * ldx, ldx, panels, panel_elements, k, y + t * ldy, ldy, pb, pe,
                   n_begin, n_end, accumulate);
    }
    const bool first = t == 0;
    const uint16_t* xt = xb + t * ldx;
    float* yt = y + t * ldy;
#define PD_TOKENS(T) \
  case T:           \
    TokenTile<T>(first, xt, ldx, panels, panel_elements, k, yt, ldy, pb, pe, n_begin, n_end, accumulate); \
    break
    switch (m - t) {
      PD_TOKENS(7);
      PD_TOKENS(6);
      PD_TOKENS(5);
      PD_TOKENS(4);
      PD_TOKENS(3);
      PD_TOKENS(2);
      PD_TOKENS(1);
      default: break;
    }
#undef PD_TOKENS
  }
}

}  // namespace internal

#else  // No AVX2 build: no bf16 instructions either; the scalar reference computes the same bits.

bool Bf16DotSupported() { return false; }
bool Bf16DotEnabled() { return false; }
void SetBf16DotEnabled(bool) {}
namespace internal {
int64_t RoundToBf16Avx512(const float*, int64_t, uint16_t*) { return 0; }
int64_t RoundToBf16FtzAvx512(const float*, int64_t, uint16_t*) { return 0; }
void LinearBf16ColumnsAvx512(const uint16_t* xb, int64_t m, int64_t ldx, const MatrixRef& w,
                             float* y, int64_t ldy, int64_t n_begin, int64_t n_end, bool accumulate) {
  LinearBf16Reference(xb, m, ldx, w, y, ldy, n_begin, n_end, accumulate);
}
}  // namespace internal

#endif  // PDSERVE_AVX2

}  // namespace pdserve::kernels
