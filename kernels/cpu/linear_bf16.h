// The bf16 compute path of the linear layers (--compute-dtype bf16): y = x W^T with x rounded to
// bf16 (round to nearest even, as F32ToBf16) and W in bf16, products exact in f32, sums in f32.
//
// Every output element y[t][j] is one fixed sequence of operations, the one AVX512-BF16's
// VDPBF16PS performs: a 16-lane f32 accumulator walks k in chunks of 32 (a zero-padded last
// chunk); lane l of chunk c adds x[32c+2l+1]*w[32c+2l+1] and then x[32c+2l]*w[32c+2l], each an
// f32 FMA that treats denormal inputs as zero and flushes a denormal result to zero; then the
// lanes are summed by a fixed tree (lane i + lane i+8, then simd.h's 8-lane tree). Nothing
// depends on m, on the other rows or on the columns a thread took, so results are bitwise
// batch-, chunk- and thread-invariant, as on the f32 path.
//
// Three implementations of that one sequence, bitwise equal (tested): VDPBF16PS where the CPU
// has AVX512-BF16, an AVX2 twin that performs the same FMAs with MXCSR's DAZ and FTZ set (so a
// CPU without bf16 instructions computes the same bits, slower), and a scalar reference.
// (AMX-BF16 is not used: its tiles sum each output's k in one sequential accumulator, another
// order, so it could not be mixed with this path; see bench/RESULTS.md.)
#ifndef PDSERVE_KERNELS_CPU_LINEAR_BF16_H_
#define PDSERVE_KERNELS_CPU_LINEAR_BF16_H_

#include <cstdint>

#include "common/base/tensor_ref.h"
#include "kernels/cpu/linear.h"

namespace pdserve {
class ThreadPool;
}

namespace pdserve::kernels {

// Whether this CPU has the bf16 dot-product instruction (AVX512-BF16 with AVX-512 F/BW/DQ/VL)
// and it is not switched off: PDSERVE_KERNEL_ISA=avx2 in the environment, or
// SetBf16DotEnabled(false) in tests. When off, the AVX2 twin computes the same bits.
bool Bf16DotSupported();  // The CPU alone (what --compute-dtype auto asks).
bool Bf16DotEnabled();
void SetBf16DotEnabled(bool enabled);  // Only takes effect where the CPU supports it.

// out[i] = F32ToBf16(x[i]) for rows [0, m) of x (leading dimensions ldx and ldout).
void RoundRowsToBf16(const float* x, int64_t m, int64_t k, int64_t ldx, uint16_t* out,
                     int64_t ldout);

// Columns [n_begin, n_end) of y for all m rows of the bf16 activations `xb`; W must be bf16.
void LinearBf16Columns(const uint16_t* xb, int64_t m, int64_t ldx, const MatrixRef& w, float* y,
                       int64_t ldy, int64_t n_begin, int64_t n_end);

// Several matrices that read the same xb, in one parallel region (as LinearMulti).
void LinearBf16Multi(const uint16_t* xb, int64_t m, int64_t ldx, const LinearOutput* outputs,
                     int num_outputs, ThreadPool* pool);

// The sequence above in plain scalar code: the portable build's path and the tests' reference.
void LinearBf16Reference(const uint16_t* xb, int64_t m, int64_t ldx, const MatrixRef& w, float* y,
                         int64_t ldy, int64_t n_begin, int64_t n_end);

namespace internal {
// The two vector paths, for the tests (call the first only when Bf16DotEnabled()).
void LinearBf16ColumnsAvx512(const uint16_t* xb, int64_t m, int64_t ldx, const MatrixRef& w,
                             float* y, int64_t ldy, int64_t n_begin, int64_t n_end);
void LinearBf16ColumnsAvx2(const uint16_t* xb, int64_t m, int64_t ldx, const MatrixRef& w,
                           float* y, int64_t ldy, int64_t n_begin, int64_t n_end);
}  // namespace internal

}  // namespace pdserve::kernels

#endif  // PDSERVE_KERNELS_CPU_LINEAR_BF16_H_
