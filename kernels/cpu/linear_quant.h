// y = x W^T with W in one of llama.cpp's block formats (kernels/cpu/quant_blocks.h), read in
// place: the bytes a decode step streams are the quantized ones.
//
// Batch invariance, as the f32 and bf16 linear kernels keep it: y[t][j] is one fixed sequence of
// operations whatever m, the other rows, or the columns a thread was given. Each block of row j
// is dequantized (DequantizeBlock's bits) and walked in steps of 8 by one 8-lane FMA accumulator
// per row of x, then reduced by the kernels' fixed horizontal-sum tree. The AVX2 path and the
// scalar twin give the same bits.
//
// Cost: 2*m*n*k flops; reads W once per group of 8 rows of x (n*k*bits/8 bytes), dequantizing
// each block once per group.
#ifndef PDSERVE_KERNELS_CPU_LINEAR_QUANT_H_
#define PDSERVE_KERNELS_CPU_LINEAR_QUANT_H_

#include <cstdint>

#include "common/base/ggml_types.h"

namespace pdserve {
class ThreadPool;
}

namespace pdserve::kernels {

// A [rows][cols] matrix of a quantized GgmlType, rows of GgmlRowBytes(type, cols) bytes.
struct QuantMatrixRef {
  GgmlType type = GgmlType::kQ8_0;
  const void* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;  // A multiple of the type's block elements.
  const uint8_t* row(int64_t r) const {
    return static_cast<const uint8_t*>(data) + r * GgmlRowBytes(type, cols);
  }
};

// Columns [n_begin, n_end) of y for all m rows, on the calling thread (AVX2 where built).
void LinearQuantColumns(const float* x, int64_t m, int64_t ldx, const QuantMatrixRef& w, float* y,
                        int64_t ldy, int64_t n_begin, int64_t n_end);
// The scalar twin (same bits), for the tests and CPUs without AVX2.
void LinearQuantColumnsScalar(const float* x, int64_t m, int64_t ldx, const QuantMatrixRef& w,
                              float* y, int64_t ldy, int64_t n_begin, int64_t n_end);
// All columns across the pool's threads (thread-count invariant).
void LinearQuant(const float* x, int64_t m, int64_t ldx, const QuantMatrixRef& w, float* y,
                 int64_t ldy, ThreadPool* pool);

}  // namespace pdserve::kernels

#endif  // PDSERVE_KERNELS_CPU_LINEAR_QUANT_H_
