#include "kernels/cpu/linear_avx512.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/cpu/simd.h"

namespace pdserve::kernels {

#if PDSERVE_AVX2

// Every function that uses AVX-512 carries this attribute (no file-wide -mavx512 flags: inline
// functions of shared headers compiled here must stay AVX2, or the linker could pick this copy).
#define PD_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl")))

namespace {

std::atomic<bool>& EnabledFlag() {
  static std::atomic<bool> enabled{[] {
    __builtin_cpu_init();
    const bool cpu = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                     __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
    const char* isa = std::getenv("PDSERVE_KERNEL_ISA");
    return cpu && !(isa != nullptr && std::strcmp(isa, "avx2") == 0);
  }()};
  return enabled;
}

constexpr int64_t kBlockBytes = 96 * 1024;  // As the AVX2 path (linear.cc).
constexpr int64_t kPrefetchBytes = 8192;  // Into L2, as linear.cc.

// Two weight rows' [k, k + 8) side by side: lanes 0-7 row a, lanes 8-15 row b.
struct F32Pair {
  PD_AVX512 static __m512 Load(const uint8_t* a, const uint8_t* b, int64_t k) {
    const __m256 lo = _mm256_loadu_ps(reinterpret_cast<const float*>(a) + k);
    const __m256 hi = _mm256_loadu_ps(reinterpret_cast<const float*>(b) + k);
    return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
  }
  static float At(const uint8_t* row, int64_t k) { return reinterpret_cast<const float*>(row)[k]; }
  static constexpr size_t kSize = 4;
};
struct Bf16Pair {
  PD_AVX512 static __m512 Load(const uint8_t* a, const uint8_t* b, int64_t k) {
    const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(reinterpret_cast<const uint16_t*>(a) + k));
    const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(reinterpret_cast<const uint16_t*>(b) + k));
    const __m256i h = _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static float At(const uint8_t* row, int64_t k) {
    return Bf16ToF32(reinterpret_cast<const uint16_t*>(row)[k]);
  }
  static constexpr size_t kSize = 2;
};
struct F16Pair {
  PD_AVX512 static __m512 Load(const uint8_t* a, const uint8_t* b, int64_t k) {
    const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(reinterpret_cast<const uint16_t*>(a) + k));
    const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(reinterpret_cast<const uint16_t*>(b) + k));
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1));
  }
  static float At(const uint8_t* row, int64_t k) {
    return F16ToF32(reinterpret_cast<const uint16_t*>(row)[k]);
  }
  static constexpr size_t kSize = 2;
};

// The AVX2 path's reduction tree on each 256-bit half (simd.h HorizontalSum, restated here so
// that no AVX2-compiled inline function is pulled into AVX-512 code and vice versa).
PD_AVX512 inline float HalfSum(__m256 v) {
  const __m128 lo = _mm256_castps256_ps128(v);
  const __m128 hi = _mm256_extractf128_ps(v, 1);
  __m128 s = _mm_add_ps(lo, hi);
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

// Writes a tile's outputs: each 256-bit half of acc[t][p] is output (t, 2p + half), reduced by the
// fixed tree and finished with the sequential tail over k8..k (row(r) is weight row r's bytes).
template <typename W, int T, int P, typename RowFn>
PD_AVX512 inline void StoreOutputs(__m512 (&acc)[T][P], const float* x, int64_t ldx, int64_t k8,
                                   int64_t k, float* y, int64_t ldy, int outputs, RowFn row) {
  for (int t = 0; t < T; ++t) {
    for (int p = 0; p < P; ++p) {
      for (int half = 0; half < 2; ++half) {
        const int r = 2 * p + half;
        if (r >= outputs) break;
        float s = HalfSum(half == 0 ? _mm512_castps512_ps256(acc[t][p])
                                    : _mm512_extractf32x8_ps(acc[t][p], 1));
        const uint8_t* w = row(r);
        for (int64_t kk = k8; kk < k; ++kk) s = std::fma(x[t * ldx + kk], W::At(w, kk), s);
        y[t * ldy + r] = s;
      }
    }
  }
}

// T tokens x P row pairs (rows 2p and 2p + 1 of `rows`; the pointers may repeat a row for an odd
// count, whose duplicate result is not written). acc[t][p] holds two outputs' 8-lane sums.
template <typename W, int T, int P, bool Prefetch>
PD_AVX512 inline void MicroKernel(const float* x, int64_t ldx, const uint8_t* const* rows,
                                  int64_t k, float* y, int64_t ldy, int outputs) {
  __m512 acc[T][P];
  for (int t = 0; t < T; ++t)
    for (int p = 0; p < P; ++p) acc[t][p] = _mm512_setzero_ps();
  const int64_t k8 = k & ~int64_t{7};
  for (int64_t kk = 0; kk < k8; kk += 8) {
    __m512 wv[P];
    if constexpr (Prefetch) {
      for (int r = 0; r < 2 * P; ++r) {
        _mm_prefetch(reinterpret_cast<const char*>(rows[r] + kk * W::kSize) + kPrefetchBytes,
                     _MM_HINT_T1);
      }
    }
    for (int p = 0; p < P; ++p) wv[p] = W::Load(rows[2 * p], rows[2 * p + 1], kk);
    for (int t = 0; t < T; ++t) {
      const __m512 xv = _mm512_broadcast_f32x8(_mm256_loadu_ps(x + t * ldx + kk));
      for (int p = 0; p < P; ++p) acc[t][p] = _mm512_fmadd_ps(xv, wv[p], acc[t][p]);
    }
  }
  StoreOutputs<W>(acc, x, ldx, k8, k, y, ldy, outputs, [rows](int r) { return rows[r]; });
}

template <typename W, int T, bool Prefetch>
PD_AVX512 inline void RowsForTokens(const float* x, int64_t ldx, const uint8_t* w0,
                                    size_t w_stride, int64_t k, float* y, int64_t ldy,
                                    int64_t rows) {
  constexpr int P = 4;  // 8 rows per tile: T x 4 accumulators.
  const uint8_t* ptr[2 * P];
  int64_t r = 0;
  for (; r + 2 * P <= rows; r += 2 * P) {
    for (int i = 0; i < 2 * P; ++i) ptr[i] = w0 + (r + i) * w_stride;
    MicroKernel<W, T, P, Prefetch>(x, ldx, ptr, k, y + r, ldy, 2 * P);
  }
  for (; r < rows; r += 2) {  // Pairs; an odd last row is paired with itself.
    ptr[0] = w0 + r * w_stride;
    ptr[1] = r + 1 < rows ? ptr[0] + w_stride : ptr[0];
    MicroKernel<W, T, 1, Prefetch>(x, ldx, ptr, k, y + r, ldy, r + 1 < rows ? 2 : 1);
  }
}

template <typename W, int T>
PD_AVX512 inline void TokenTile(bool first, const float* x, int64_t ldx, const uint8_t* wb,
                                size_t w_stride, int64_t k, float* y, int64_t ldy, int64_t rows) {
  if (first) {
    RowsForTokens<W, T, true>(x, ldx, wb, w_stride, k, y, ldy, rows);
  } else {
    RowsForTokens<W, T, false>(x, ldx, wb, w_stride, k, y, ldy, rows);
  }
}

// Packed path for many rows of x (prefill): a block of weight rows is widened once into f32, two
// rows interleaved per 8-wide k chunk ([row 2p, k..k+8 | row 2p+1, k..k+8], one 512-bit load),
// and every 8-token tile then reuses it from L2 with no conversion in the inner loop. Widening
// bf16/f16 to f32 is exact, so the products, sums and their order are the unpacked path's.
constexpr int64_t kPackMinRows = 32;

// Pair p's chunk c: packed + (p * chunks + c) * 16.
template <typename W>
PD_AVX512 void PackBlock(const uint8_t* wb, size_t w_stride, int64_t rows, int64_t k,
                         float* packed) {
  const int64_t chunks = k / 8;
  for (int64_t p = 0; p * 2 < rows; ++p) {
    const uint8_t* a = wb + 2 * p * w_stride;
    const uint8_t* b = 2 * p + 1 < rows ? a + w_stride : a;  // Odd last row: itself again.
    float* out = packed + p * chunks * 16;
    for (int64_t c = 0; c < chunks; ++c) {
      _mm_prefetch(reinterpret_cast<const char*>(a + c * 8 * W::kSize) + kPrefetchBytes, _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char*>(b + c * 8 * W::kSize) + kPrefetchBytes, _MM_HINT_T1);
      _mm512_storeu_ps(out + c * 16, W::Load(a, b, c * 8));
    }
  }
}

// T tokens x P packed pairs; `outputs` of the 2P rows are written (the rest are padding).
template <typename W, int T, int P>
PD_AVX512 inline void PackedKernel(const float* x, int64_t ldx, const float* packed,
                                   int64_t chunks, const uint8_t* w0, size_t w_stride, int64_t k,
                                   float* y, int64_t ldy, int outputs) {
  __m512 acc[T][P];
  for (int t = 0; t < T; ++t)
    for (int p = 0; p < P; ++p) acc[t][p] = _mm512_setzero_ps();
  for (int64_t c = 0; c < chunks; ++c) {
    __m512 wv[P];
    for (int p = 0; p < P; ++p) wv[p] = _mm512_loadu_ps(packed + (p * chunks + c) * 16);
    for (int t = 0; t < T; ++t) {
      const __m512 xv = _mm512_broadcast_f32x8(_mm256_loadu_ps(x + t * ldx + c * 8));
      for (int p = 0; p < P; ++p) acc[t][p] = _mm512_fmadd_ps(xv, wv[p], acc[t][p]);
    }
  }
  StoreOutputs<W>(acc, x, ldx, chunks * 8, k, y, ldy, outputs,
                  [w0, w_stride](int r) { return w0 + r * w_stride; });
}

// Tokens [0, T) of x against every packed pair of a block (3 pairs = 6 rows per tile).
template <typename W, int T>
PD_AVX512 inline void PackedTokens(const float* x, int64_t ldx, const float* packed,
                                   int64_t chunks, const uint8_t* wb, size_t w_stride, int64_t k,
                                   float* y, int64_t ldy, int64_t rows) {
  constexpr int P = 3;
  int64_t r = 0;
  for (; r + 2 * P <= rows; r += 2 * P) {
    PackedKernel<W, T, P>(x, ldx, packed + (r / 2) * chunks * 16, chunks, wb + r * w_stride,
                          w_stride, k, y + r, ldy, 2 * P);
  }
  for (; r < rows; r += 2) {
    const int outputs = r + 1 < rows ? 2 : 1;
    PackedKernel<W, T, 1>(x, ldx, packed + (r / 2) * chunks * 16, chunks, wb + r * w_stride,
                          w_stride, k, y + r, ldy, outputs);
  }
}

template <typename W>
PD_AVX512 void PackedColumns(const float* x, int64_t m, int64_t ldx, const MatrixRef& w, float* y,
                             int64_t ldy, int64_t n_begin, int64_t n_end) {
  const int64_t k = w.cols;
  const int64_t chunks = k / 8;
  const size_t w_stride = static_cast<size_t>(k) * W::kSize;
  // Packed rows stay in L2 (~192 KiB of f32) while the token tiles pass over them.
  int64_t block = (kBlockBytes * 2) / (k * 4) & ~int64_t{1};
  if (block < 8) block = 8;
  thread_local std::vector<float> packed;
  const size_t need = static_cast<size_t>((block + 1) / 2 * chunks * 16);
  if (packed.size() < need) packed.resize(need);
  const uint8_t* base = static_cast<const uint8_t*>(w.data);
  for (int64_t nb = n_begin; nb < n_end; nb += block) {
    const int64_t rows = block < n_end - nb ? block : n_end - nb;
    const uint8_t* wb = base + nb * w_stride;
    PackBlock<W>(wb, w_stride, rows, k, packed.data());
    int64_t t = 0;
    for (; t + 8 <= m; t += 8) {
      PackedTokens<W, 8>(x + t * ldx, ldx, packed.data(), chunks, wb, w_stride, k,
                         y + t * ldy + nb, ldy, rows);
    }
    const float* xt = x + t * ldx;
    float* yt = y + t * ldy + nb;
    switch (m - t) {
      case 7: PackedTokens<W, 7>(xt, ldx, packed.data(), chunks, wb, w_stride, k, yt, ldy, rows); break;
      case 6: PackedTokens<W, 6>(xt, ldx, packed.data(), chunks, wb, w_stride, k, yt, ldy, rows); break;
      case 5: PackedTokens<W, 5>(xt, ldx, packed.data(), chunks, wb, w_stride, k, yt, ldy, rows); break;
      case 4: PackedTokens<W, 4>(xt, ldx, packed.data(), chunks, wb, w_stride, k, yt, ldy, rows); break;
      case 3: PackedTokens<W, 3>(xt, ldx, packed.data(), chunks, wb, w_stride, k, yt, ldy, rows); break;
      case 2: PackedTokens<W, 2>(xt, ldx, packed.data(), chunks, wb, w_stride, k, yt, ldy, rows); break;
      case 1: PackedTokens<W, 1>(xt, ldx, packed.data(), chunks, wb, w_stride, k, yt, ldy, rows); break;
      default: break;
    }
  }
}

template <typename W>
PD_AVX512 void Columns(const float* x, int64_t m, int64_t ldx, const MatrixRef& w, float* y,
                       int64_t ldy, int64_t n_begin, int64_t n_end) {
  if (m >= kPackMinRows && w.cols >= 8) {
    PackedColumns<W>(x, m, ldx, w, y, ldy, n_begin, n_end);
    return;
  }
  const int64_t k = w.cols;
  const size_t w_stride = static_cast<size_t>(k) * W::kSize;
  int64_t block = kBlockBytes / static_cast<int64_t>(w_stride);
  if (block < 8) block = 8;
  const uint8_t* base = static_cast<const uint8_t*>(w.data);
  for (int64_t nb = n_begin; nb < n_end; nb += block) {
    const int64_t rows = block < n_end - nb ? block : n_end - nb;
    const uint8_t* wb = base + nb * w_stride;
    int64_t t = 0;
    for (; t + 4 <= m; t += 4) {
      TokenTile<W, 4>(t == 0, x + t * ldx, ldx, wb, w_stride, k, y + t * ldy + nb, ldy, rows);
    }
    const bool first = t == 0;
    switch (m - t) {
      case 3: TokenTile<W, 3>(first, x + t * ldx, ldx, wb, w_stride, k, y + t * ldy + nb, ldy, rows); break;
      case 2: TokenTile<W, 2>(first, x + t * ldx, ldx, wb, w_stride, k, y + t * ldy + nb, ldy, rows); break;
      case 1: TokenTile<W, 1>(first, x + t * ldx, ldx, wb, w_stride, k, y + t * ldy + nb, ldy, rows); break;
      default: break;
    }
  }
}

}  // namespace

bool Avx512Enabled() { return EnabledFlag().load(std::memory_order_relaxed); }

void SetAvx512Enabled(bool enabled) {
  __builtin_cpu_init();
  const bool cpu = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                   __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  EnabledFlag().store(enabled && cpu);
}

PD_AVX512 void LinearColumnsAvx512(const float* x, int64_t m, int64_t ldx, const MatrixRef& w,
                                   float* y, int64_t ldy, int64_t n_begin, int64_t n_end) {
  switch (w.dtype) {
    case DType::kF32: Columns<F32Pair>(x, m, ldx, w, y, ldy, n_begin, n_end); break;
    case DType::kBF16: Columns<Bf16Pair>(x, m, ldx, w, y, ldy, n_begin, n_end); break;
    case DType::kF16: Columns<F16Pair>(x, m, ldx, w, y, ldy, n_begin, n_end); break;
  }
}

#else  // No AVX2 build: no AVX-512 path either.

bool Avx512Enabled() { return false; }
void SetAvx512Enabled(bool) {}
void LinearColumnsAvx512(const float*, int64_t, int64_t, const MatrixRef&, float*, int64_t,
                         int64_t, int64_t) {}

#endif  // PDSERVE_AVX2

}  // namespace pdserve::kernels
