// VDPBF16PS path of the bf16 linear kernel (contract in linear_bf16.h). Every function that uses
// AVX-512 carries the target attribute instead of file-wide flags, as linear_avx512.cc.
// GCC 12 reports the "undefined" upper half that _mm512_inserti64x4 and friends start from as an
// uninitialised use (a false positive in its own headers); silenced for this file only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
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

constexpr int64_t kChunk = 32;
constexpr int64_t kBlockBytes = 96 * 1024;  // Weight rows per cache block, as linear.cc.
constexpr int64_t kPrefetchBytes = 8192;    // Into L2, as linear.cc (bench/RESULTS.md).

// The 16-lane tree of linear_bf16.h: lane i + lane i+8, then the 8-lane tree of simd.h.
PD_AVX512BF16 inline float Sum16(__m512 v) {
  const __m256 s8 = _mm256_add_ps(_mm512_extractf32x8_ps(v, 0), _mm512_extractf32x8_ps(v, 1));
  const __m128 lo = _mm256_castps256_ps128(s8);
  const __m128 hi = _mm256_extractf128_ps(s8, 1);
  __m128 s = _mm_add_ps(lo, hi);
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

// T tokens x R weight rows over all of k; acc[t][r] is output (t, r)'s 16 lanes.
template <int T, int R, bool Prefetch>
PD_AVX512BF16 inline void Tile(const uint16_t* x, int64_t ldx, const uint16_t* w, int64_t k,
                               float* y, int64_t ldy) {
  __m512 acc[T][R];
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < R; ++r) acc[t][r] = _mm512_setzero_ps();
  const int64_t full = k / kChunk * kChunk;
  for (int64_t kk = 0; kk < full; kk += kChunk) {
    __m512i wv[R];
    for (int r = 0; r < R; ++r) {
      if constexpr (Prefetch) {
        _mm_prefetch(reinterpret_cast<const char*>(w + r * k + kk) + kPrefetchBytes, _MM_HINT_T1);
      }
      if constexpr (T < 4) {
        // Streaming from memory (decode): two 32-byte loads per 64 bytes of weights stream
        // faster than one 64-byte load on this EPYC (BM_Bf16DecodeStepGemvs 33.5-34.3 vs
        // 27.7-32.1 GB/s; batch-1 decode +5-8%, bench/RESULTS.md). Same bits either way.
        const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + r * k + kk));
        const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + r * k + kk + 16));
        wv[r] = _mm512_inserti64x4(_mm512_zextsi256_si512(lo), hi, 1);
      } else {
        wv[r] = _mm512_loadu_si512(w + r * k + kk);
      }
    }
    for (int t = 0; t < T; ++t) {
      const __m512i xv = _mm512_loadu_si512(x + t * ldx + kk);
      for (int r = 0; r < R; ++r) {
        acc[t][r] = _mm512_dpbf16_ps(acc[t][r], (__m512bh)xv, (__m512bh)wv[r]);
      }
    }
  }
  if (full < k) {  // The last chunk, zero-padded by masked loads.
    const __mmask32 mask = (k - full) >= 32 ? ~__mmask32{0} : ((__mmask32{1} << (k - full)) - 1);
    __m512i wv[R];
    for (int r = 0; r < R; ++r) wv[r] = _mm512_maskz_loadu_epi16(mask, w + r * k + full);
    for (int t = 0; t < T; ++t) {
      const __m512i xv = _mm512_maskz_loadu_epi16(mask, x + t * ldx + full);
      for (int r = 0; r < R; ++r) {
        acc[t][r] = _mm512_dpbf16_ps(acc[t][r], (__m512bh)xv, (__m512bh)wv[r]);
      }
    }
  }
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < R; ++r) y[t * ldy + r] = Sum16(acc[t][r]);
}

// Tokens [0, T) against `rows` weight rows in tiles of R (then single rows).
template <int T, int R, bool Prefetch>
PD_AVX512BF16 inline void RowsForTokens(const uint16_t* x, int64_t ldx, const uint16_t* w,
                                        int64_t k, float* y, int64_t ldy, int64_t rows) {
  int64_t r = 0;
  for (; r + R <= rows; r += R) Tile<T, R, Prefetch>(x, ldx, w + r * k, k, y + r, ldy);
  for (; r < rows; ++r) Tile<T, 1, Prefetch>(x, ldx, w + r * k, k, y + r, ldy);
}

// Register tiles: 4 weight rows for 1-3 tokens (the GEMV of decode: 4 streams per thread, as the
// f32 path; 8 rows were 3-11% faster while the prefetch went to L1, not since it goes to L2,
// bench/RESULTS.md), 4 tokens x 6 rows from 4 tokens up (24 accumulators + 6 weights + 1 token).
template <int T>
PD_AVX512BF16 inline void TokenTile(bool first, const uint16_t* x, int64_t ldx, const uint16_t* w,
                                    int64_t k, float* y, int64_t ldy, int64_t rows) {
  constexpr int R = T >= 4 ? 6 : 4;
  if (first) {
    RowsForTokens<T, R, true>(x, ldx, w, k, y, ldy, rows);
  } else {
    RowsForTokens<T, R, false>(x, ldx, w, k, y, ldy, rows);
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

PD_AVX512BF16 void LinearBf16ColumnsAvx512(const uint16_t* xb, int64_t m, int64_t ldx,
                                           const MatrixRef& w, float* y, int64_t ldy,
                                           int64_t n_begin, int64_t n_end) {
  const int64_t k = w.cols;
  int64_t block = kBlockBytes / (k * 2);
  if (block < 8) block = 8;
  const uint16_t* base = static_cast<const uint16_t*>(w.data);
  for (int64_t nb = n_begin; nb < n_end; nb += block) {
    const int64_t rows = block < n_end - nb ? block : n_end - nb;
    const uint16_t* wb = base + nb * k;
    int64_t t = 0;
    for (; t + 4 <= m; t += 4) {
      TokenTile<4>(t == 0, xb + t * ldx, ldx, wb, k, y + t * ldy + nb, ldy, rows);
    }
    const bool first = t == 0;
    const uint16_t* xt = xb + t * ldx;
    float* yt = y + t * ldy + nb;
    switch (m - t) {
      case 3: TokenTile<3>(first, xt, ldx, wb, k, yt, ldy, rows); break;
      case 2: TokenTile<2>(first, xt, ldx, wb, k, yt, ldy, rows); break;
      case 1: TokenTile<1>(first, xt, ldx, wb, k, yt, ldy, rows); break;
      default: break;
    }
  }
}

}  // namespace internal

#else  // No AVX2 build: no bf16 instructions either; the scalar reference computes the same bits.

bool Bf16DotSupported() { return false; }
bool Bf16DotEnabled() { return false; }
void SetBf16DotEnabled(bool) {}
namespace internal {
void LinearBf16ColumnsAvx512(const uint16_t* xb, int64_t m, int64_t ldx, const MatrixRef& w,
                             float* y, int64_t ldy, int64_t n_begin, int64_t n_end) {
  LinearBf16Reference(xb, m, ldx, w, y, ldy, n_begin, n_end);
}
}  // namespace internal

#endif  // PDSERVE_AVX2

}  // namespace pdserve::kernels
