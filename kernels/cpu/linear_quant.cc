#include "kernels/cpu/linear_quant.h"

#include <algorithm>

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

void LinearQuantColumns(const float* x, int64_t m, int64_t ldx, const QuantMatrixRef& w, float* y,
                        int64_t ldy, int64_t n_begin, int64_t n_end) {
#if PDSERVE_AVX2
  const int64_t qk = GgmlBlockElements(w.type), bytes = GgmlBlockBytes(w.type);
  const int64_t blocks = w.cols / qk;
  alignas(32) float buf[kMaxBlock];
  for (int64_t j = n_begin; j < n_end; ++j) {
    const uint8_t* row = w.row(j);
    for (int64_t t0 = 0; t0 < m; t0 += kRowGroup) {
      const int64_t rows = std::min(kRowGroup, m - t0);
      __m256 acc[kRowGroup];
      for (int64_t r = 0; r < kRowGroup; ++r) acc[r] = _mm256_setzero_ps();
      for (int64_t b = 0; b < blocks; ++b) {
        DequantizeBlock(w.type, row + b * bytes, buf);
        for (int64_t k = 0; k < qk; k += 8) {
          const __m256 wv = _mm256_load_ps(buf + k);
          for (int64_t r = 0; r < rows; ++r) {
            acc[r] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + (t0 + r) * ldx + b * qk + k), acc[r]);
          }
        }
      }
      for (int64_t r = 0; r < rows; ++r) y[(t0 + r) * ldy + j] = HorizontalSum(acc[r]);
    }
  }
#else
  LinearQuantColumnsScalar(x, m, ldx, w, y, ldy, n_begin, n_end);
#endif
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
