#include "kernels/cpu/linear.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/base/check.h"
#include "common/base/thread_pool.h"
#include "kernels/cpu/linear_avx512.h"
#include "kernels/cpu/linear_quant.h"
#include "kernels/cpu/quant_blocks.h"
#include "kernels/cpu/simd.h"

namespace pdserve::kernels {
namespace {

// Weight rows per cache block: sized so a block of W stays in L2 while every token tile of x
// passes over it (x tiles stay in L1).
constexpr int64_t kBlockBytes = 96 * 1024;
// How far ahead the kernel prefetches weights on their first pass from memory. A forward pass
// streams ~200 matrices of 0.2-3.5 MB each; without this, every one of them starts by waiting on
// the hardware prefetcher to learn a new stream. Measured on the SmolLM-135M shape, bf16, batch 1
// (bench/RESULTS.md): no prefetch 43-49 tok/s; 2 KiB 51-56; 4 KiB 64-84; 8 KiB 76-91; 16 KiB 74-82.
// Into L2 (prefetcht1), not L1: on the AMD EPYC of issue 19, prefetcht0 held batch-1 decode at
// 0.55-0.59 of the read bandwidth (71-74 tok/s, f32 compute), prefetcht1 reaches 0.84-0.93
// (105-116 tok/s), alternating in one run; the L1 lines then come from L2 by the L1 prefetcher.
constexpr int64_t kPrefetchBytes = 8192;

#if PDSERVE_AVX2


struct F32Rows {
  static __m256 Load(const void* row, int64_t k) {
    return _mm256_loadu_ps(static_cast<const float*>(row) + k);
  }
  static float At(const void* row, int64_t k) { return static_cast<const float*>(row)[k]; }
  static constexpr size_t kSize = 4;
};
struct Bf16Rows {
  static __m256 Load(const void* row, int64_t k) {
    return Load8Bf16(static_cast<const uint16_t*>(row) + k);
  }
  static float At(const void* row, int64_t k) {
    return Bf16ToF32(static_cast<const uint16_t*>(row)[k]);
  }
  static constexpr size_t kSize = 2;
};
struct F16Rows {
  static __m256 Load(const void* row, int64_t k) {
    return Load8F16(static_cast<const uint16_t*>(row) + k);
  }
  static float At(const void* row, int64_t k) {
    return F16ToF32(static_cast<const uint16_t*>(row)[k]);
  }
  static constexpr size_t kSize = 2;
};

// T tokens x R weight rows. acc[t][r] accumulates x[t][k..k+8) * w[r][k..k+8) for k = 0, 8, ...
// Prefetch: this tile is the first to touch these weight rows (they come from memory).
template <typename W, int T, int R, bool Prefetch>
inline void MicroKernel(const float* x, int64_t ldx, const uint8_t* w, size_t w_stride, int64_t k,
                        float* y, int64_t ldy) {
  __m256 acc[T][R];
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < R; ++r) acc[t][r] = _mm256_setzero_ps();
  const int64_t k8 = k & ~int64_t{7};
  for (int64_t kk = 0; kk < k8; kk += 8) {
    __m256 wv[R];
    if constexpr (Prefetch) {
      for (int r = 0; r < R; ++r) {
        _mm_prefetch(reinterpret_cast<const char*>(w + r * w_stride + kk * W::kSize) +
                         kPrefetchBytes, _MM_HINT_T1);
      }
    }
    for (int r = 0; r < R; ++r) wv[r] = W::Load(w + r * w_stride, kk);
    for (int t = 0; t < T; ++t) {
      const __m256 xv = _mm256_loadu_ps(x + t * ldx + kk);
      for (int r = 0; r < R; ++r) acc[t][r] = _mm256_fmadd_ps(xv, wv[r], acc[t][r]);
    }
  }
  for (int t = 0; t < T; ++t) {
    for (int r = 0; r < R; ++r) {
      float s = HorizontalSum(acc[t][r]);
      for (int64_t kk = k8; kk < k; ++kk) s = std::fma(x[t * ldx + kk], W::At(w + r * w_stride, kk), s);
      y[t * ldy + r] = s;
    }
  }
}

template <typename W, int T, bool Prefetch>
inline void RowsForTokens(const float* x, int64_t ldx, const uint8_t* w0, size_t w_stride,
                          int64_t k, float* y, int64_t ldy, int64_t rows) {
  constexpr int R = T <= 2 ? 4 : 3;
  int64_t r = 0;
  for (; r + R <= rows; r += R) {
    MicroKernel<W, T, R, Prefetch>(x, ldx, w0 + r * w_stride, w_stride, k, y + r, ldy);
  }
  for (; r < rows; ++r) {
    MicroKernel<W, T, 1, Prefetch>(x, ldx, w0 + r * w_stride, w_stride, k, y + r, ldy);
  }
}

// Rows [t, t + T) of x against a block of weight rows.
template <typename W, int T>
inline void TokenTile(bool first, const float* x, int64_t ldx, const uint8_t* wb, size_t w_stride,
                      int64_t k, float* y, int64_t ldy, int64_t rows) {
  if (first) {
    RowsForTokens<W, T, true>(x, ldx, wb, w_stride, k, y, ldy, rows);
  } else {
    RowsForTokens<W, T, false>(x, ldx, wb, w_stride, k, y, ldy, rows);
  }
}

template <typename W>
void Columns(const float* x, int64_t m, int64_t ldx, const MatrixRef& w, float* y, int64_t ldy,
             int64_t n_begin, int64_t n_end) {
  const int64_t k = w.cols;
  const size_t w_stride = static_cast<size_t>(k) * W::kSize;
  const int64_t block = std::max<int64_t>(4, kBlockBytes / static_cast<int64_t>(w_stride));
  const uint8_t* base = static_cast<const uint8_t*>(w.data);
  for (int64_t nb = n_begin; nb < n_end; nb += block) {
    const int64_t rows = std::min(block, n_end - nb);
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

#else  // Portable scalar twin: the same 8-lane accumulation order, one lane at a time.

float WeightAt(const MatrixRef& w, int64_t row, int64_t k) {
  switch (w.dtype) {
    case DType::kF32: return static_cast<const float*>(w.data)[row * w.cols + k];
    case DType::kBF16: return Bf16ToF32(static_cast<const uint16_t*>(w.data)[row * w.cols + k]);
    case DType::kF16: return F16ToF32(static_cast<const uint16_t*>(w.data)[row * w.cols + k]);
  }
  return 0;
}

void ColumnsScalar(const float* x, int64_t m, int64_t ldx, const MatrixRef& w, float* y,
                   int64_t ldy, int64_t n_begin, int64_t n_end) {
  const int64_t k = w.cols;
  const int64_t k8 = k & ~int64_t{7};
  for (int64_t t = 0; t < m; ++t) {
    for (int64_t j = n_begin; j < n_end; ++j) {
      float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int64_t kk = 0; kk < k8; kk += 8) {
        for (int l = 0; l < 8; ++l) lane[l] = std::fma(x[t * ldx + kk + l], WeightAt(w, j, kk + l), lane[l]);
      }
      float s = ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
      for (int64_t kk = k8; kk < k; ++kk) s = std::fma(x[t * ldx + kk], WeightAt(w, j, kk), s);
      y[t * ldy + j] = s;
    }
  }
}

#endif  // PDSERVE_AVX2

// Rows of x from which the AVX-512 path is used. Measured (decode tok/s, bf16 SmolLM shape,
// 2 threads, AVX2 vs AVX-512 in one session): batch 4 113-154 vs 74-145; batch 8 122-132 vs
// 140-178; batch 16 143 vs 192-221; 128-token prefill 202-242 vs 308-313 tok/s.
constexpr int64_t kAvx512MinRows = 8;

QuantMatrixRef AsQuant(const MatrixRef& w) {
  return QuantMatrixRef{w.quant_type, w.data, w.rows, w.cols,
                        w.layout == MatrixLayout::kQuantPanels};
}

// Column ranges handed to threads are multiples of this (keeps micro-tiles whole).
constexpr int64_t kColumnGrain = 16;

}  // namespace

void LinearColumns(const float* x, int64_t m, int64_t ldx, const MatrixRef& w, float* y,
                   int64_t ldy, int64_t n_begin, int64_t n_end) {
  if (m <= 0 || n_begin >= n_end) return;
  if (w.quantized()) {  // x quantized here; LinearMulti quantizes once for all threads.
    thread_local QuantizedActivations xq;
    QuantizeActivations(x, m, ldx, w.cols, ActivationBlock(w.quant_type), &xq);
    LinearQuantColumns(xq, AsQuant(w), y, ldy, n_begin, n_end);
    return;
  }
#if PDSERVE_AVX2
  // AVX-512 from 8 rows of x up: below that the kernel streams weights and the AVX2 path's
  // fewer, wider-per-row loads are faster (bench/RESULTS.md). Both give the same bits.
  if (m >= kAvx512MinRows && Avx512Enabled()) {
    LinearColumnsAvx512(x, m, ldx, w, y, ldy, n_begin, n_end);
    return;
  }
  switch (w.dtype) {
    case DType::kF32: Columns<F32Rows>(x, m, ldx, w, y, ldy, n_begin, n_end); break;
    case DType::kBF16: Columns<Bf16Rows>(x, m, ldx, w, y, ldy, n_begin, n_end); break;
    case DType::kF16: Columns<F16Rows>(x, m, ldx, w, y, ldy, n_begin, n_end); break;
  }
#else
  ColumnsScalar(x, m, ldx, w, y, ldy, n_begin, n_end);
#endif
}

void Linear(const float* x, int64_t m, int64_t ldx, const MatrixRef& w, float* y, int64_t ldy,
            ThreadPool* pool) {
  LinearOutput out{&w, y, ldy};
  LinearMulti(x, m, ldx, &out, 1, pool);
}

namespace {

void OutputColumns(const LinearOutput* outputs, int num_outputs, ThreadPool* pool,
                   const absl::FunctionRef<void()>* first,
                   absl::FunctionRef<void(const LinearOutput&, int64_t, int64_t)> columns,
                   int64_t grain) {
  if (grain <= 0) grain = kColumnGrain;
  // Units of `grain` columns counted per output, so every range starts on a multiple of the
  // grain within its own output whatever the sizes of the outputs before it.
  int64_t units = 0;
  for (int i = 0; i < num_outputs; ++i) units += (outputs[i].w->rows + grain - 1) / grain;
  // Chunks from a shared counter, not a static split: the static one left one thread waiting at
  // the barrier (perf put Run + WorkerLoop at 9.8% of a bf16 batch-1 step, 5.7% with chunks).
  const auto chunk = [&](int64_t begin, int64_t end) {
    int64_t offset = 0;
    for (int i = 0; i < num_outputs; ++i) {
      const LinearOutput& o = outputs[i];
      const int64_t own = (o.w->rows + grain - 1) / grain;
      const int64_t lo = std::max(begin, offset), hi = std::min(end, offset + own);
      if (lo < hi) {
        const int64_t c0 = (lo - offset) * grain, c1 = std::min(o.w->rows, (hi - offset) * grain);
        columns(o, c0, c1);
        if (o.after != nullptr) (*o.after)(c0, c1);
      }
      offset += own;
    }
  };
  if (first != nullptr) {
    pool->ParallelForDynamic(units, 1, *first, chunk);
  } else {
    pool->ParallelForDynamic(units, 1, chunk);
  }
}

}  // namespace

void ForEachOutputColumns(const LinearOutput* outputs, int num_outputs, ThreadPool* pool,
                          absl::FunctionRef<void(const LinearOutput&, int64_t, int64_t)> columns,
                          int64_t grain) {
  OutputColumns(outputs, num_outputs, pool, nullptr, columns, grain);
}

void ForEachOutputColumns(const LinearOutput* outputs, int num_outputs, ThreadPool* pool,
                          absl::FunctionRef<void()> first,
                          absl::FunctionRef<void(const LinearOutput&, int64_t, int64_t)> columns) {
  OutputColumns(outputs, num_outputs, pool, &first, columns, 0);
}

void LinearMulti(const float* x, int64_t m, int64_t ldx, const LinearOutput* outputs,
                 int num_outputs, ThreadPool* pool) {
  // Quantized weights read x's int8 codes: made once here (per activation block size the
  // outputs need), not once per thread's chunk of columns.
  // (References: a lambda naming a thread_local would read the pool thread's own copy.)
  thread_local QuantizedActivations own32, own256;
  QuantizedActivations& xq32 = own32;
  QuantizedActivations& xq256 = own256;
  bool need32 = false, need256 = false;
  for (int i = 0; i < num_outputs; ++i) {
    if (!outputs[i].w->quantized()) continue;
    (ActivationBlock(outputs[i].w->quant_type) == 32 ? need32 : need256) = true;
  }
  const int64_t k = num_outputs > 0 ? outputs[0].w->cols : 0;
  const auto columns = [&](const LinearOutput& o, int64_t lo, int64_t hi) {
    if (o.w->quantized()) {
      const QuantizedActivations& xq = ActivationBlock(o.w->quant_type) == 32 ? xq32 : xq256;
      LinearQuantColumns(xq, AsQuant(*o.w), o.y, o.ldy, lo, hi);
      return;
    }
    LinearColumns(x, m, ldx, *o.w, o.y, o.ldy, lo, hi);
  };
  if (!need32 && !need256) {
    ForEachOutputColumns(outputs, num_outputs, pool, columns);
    return;
  }
  // Quantized while the pool's other threads wake: at batch 1 each took about a microsecond a
  // call, one after the other (bench/RESULTS.md).
  const auto quantize = [&] {
    if (need32) QuantizeActivations(x, m, ldx, k, 32, &xq32);
    if (need256) QuantizeActivations(x, m, ldx, k, 256, &xq256);
  };
  ForEachOutputColumns(outputs, num_outputs, pool, quantize, columns);
}

void LinearReference(const float* x, int64_t m, int64_t ldx, const MatrixRef& w, double* y) {
  if (w.quantized()) {  // With x's activation codes, as the kernel reads them.
    LinearQuantReference(x, m, ldx, AsQuant(w), y);
    return;
  }
  for (int64_t t = 0; t < m; ++t) {
    for (int64_t j = 0; j < w.rows; ++j) {
      double s = 0;
      for (int64_t kk = 0; kk < w.cols; ++kk) {
        double wv = 0;
        switch (w.dtype) {
          case DType::kF32: wv = static_cast<const float*>(w.data)[j * w.cols + kk]; break;
          case DType::kBF16: wv = Bf16ToF32(static_cast<const uint16_t*>(w.data)[j * w.cols + kk]); break;
          case DType::kF16: wv = F16ToF32(static_cast<const uint16_t*>(w.data)[j * w.cols + kk]); break;
        }
        s += static_cast<double>(x[t * ldx + kk]) * wv;
      }
      y[t * w.rows + j] = s;
    }
  }
}

}  // namespace pdserve::kernels
