// The linear kernel's AVX-512 path (internal to kernels/cpu/linear.cc). Same contract and the
// same floating-point operations per output element as the AVX2 path: an output's 8-lane
// accumulator walks k in steps of 8, then the fixed horizontal sum, then the sequential tail.
// AVX-512 only packs two outputs' accumulators into one 512-bit register (two weight rows per
// FMA), so its results are bitwise equal to the AVX2 path's (tested), at up to twice the
// arithmetic per instruction.
#ifndef PDSERVE_KERNELS_CPU_LINEAR_AVX512_H_
#define PDSERVE_KERNELS_CPU_LINEAR_AVX512_H_

#include <cstdint>

#include "common/base/tensor_ref.h"

namespace pdserve::kernels {

// Whether this CPU runs the AVX-512 path (AVX-512 F, BW, DQ, VL) and it is not switched off
// (PDSERVE_KERNEL_ISA=avx2 in the environment, or SetAvx512Enabled(false) in tests).
bool Avx512Enabled();
void SetAvx512Enabled(bool enabled);  // Only takes effect where the CPU supports it.

// Columns [n_begin, n_end) of y = x W^T for all m rows. Call only when Avx512Enabled().
void LinearColumnsAvx512(const float* x, int64_t m, int64_t ldx, const MatrixRef& w, float* y,
                         int64_t ldy, int64_t n_begin, int64_t n_end);

}  // namespace pdserve::kernels

#endif  // PDSERVE_KERNELS_CPU_LINEAR_AVX512_H_
