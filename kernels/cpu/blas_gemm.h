// y = x W^T through OpenBLAS sgemm: the fast prefill path when batch invariance is not required
// (ModelRunnerOptions::prefill_gemm = kOpenBlas). bf16/f16 weights are widened to f32 into
// `scratch` first (n*k floats), since OpenBLAS 0.3.21 has no fast bf16 GEMM for AVX2 machines.
//
// Results differ in the last bits from kernels::Linear and depend on m (OpenBLAS picks different
// micro-kernels for edge tiles), which is why it is not the default.
#ifndef PDSERVE_KERNELS_CPU_BLAS_GEMM_H_
#define PDSERVE_KERNELS_CPU_BLAS_GEMM_H_

#include <cstdint>
#include <vector>

#include "common/base/tensor_ref.h"

namespace pdserve {
class ThreadPool;
}

namespace pdserve::kernels {

// Sets OpenBLAS' own thread count (process-wide).
void SetBlasThreads(int threads);

// Cost: 2*m*n*k flops, plus n*k conversions for non-f32 weights (split across `pool`).
void BlasLinear(const float* x, int64_t m, int64_t ldx, const MatrixRef& w, float* y, int64_t ldy,
                std::vector<float>* scratch, ThreadPool* pool);

// sgemm C[m][n] = A[m][k] B[n][k]^T on f32 buffers (used by benchmarks to measure peak).
void Sgemm(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k);

}  // namespace pdserve::kernels

#endif  // PDSERVE_KERNELS_CPU_BLAS_GEMM_H_
