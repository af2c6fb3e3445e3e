#include "kernels/cpu/blas_gemm.h"

#include <cblas.h>

#include "common/base/thread_pool.h"

namespace pdserve::kernels {

void SetBlasThreads(int threads) { openblas_set_num_threads(threads); }

void Sgemm(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, a, k, b, k, 0.0f, c, n);
}

void BlasLinear(const float* x, int64_t m, int64_t ldx, const MatrixRef& w, float* y, int64_t ldy,
                std::vector<float>* scratch, ThreadPool* pool) {
  const float* wf = static_cast<const float*>(w.data);
  if (w.dtype != DType::kF32) {
    const int64_t total = w.rows * w.cols;
    if (static_cast<int64_t>(scratch->size()) < total) scratch->resize(total);
    float* dst = scratch->data();
    const uint16_t* src = static_cast<const uint16_t*>(w.data);
    const bool bf16 = w.dtype == DType::kBF16;
    pool->ParallelFor(total, 4096, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) dst[i] = bf16 ? Bf16ToF32(src[i]) : F16ToF32(src[i]);
    });
    wf = dst;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, w.rows, w.cols, 1.0f, x, ldx, wf, w.cols,
              0.0f, y, ldy);
}

}  // namespace pdserve::kernels
