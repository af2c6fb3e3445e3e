// y = x W^T with W in one of llama.cpp's block formats (kernels/cpu/quant_blocks.h), read in
// place: the bytes a decode step streams are the quantized ones.
//
// Integer dot products, as llama.cpp's CPU backend does them: each row of x is quantized to int8
// (QuantizeActivations: per block of 32 elements for Q8_0/Q4_0/Q5_0, per 256 for the K-quants,
// scale max|x|/127, round to nearest even), the weight codes are multiplied by those int8 in exact
// integer arithmetic (AVX2 VPMADDUBSW/VPMADDWD), and only the per-block sums meet floats.
//
// Batch invariance, as the f32 and bf16 kernels keep it: y[t][j] is one fixed sequence of
// operations whatever m, the other rows, or the columns a thread was given. Integer sums are
// exact, so only the float steps need an order, and they have one per format:
//   Q8_0, Q4_0, Q5_0  per block b of 32 in order, with T the block's integer dot product:
//               acc = fma(d_w(b) * d_x(b), T, acc) (as the K-quants: one float step a block, so
//               the panel kernels sum a block's products in integers; |T| < 2^24, exact in float)
//   Q4_K, Q5_K  per block of 256 in order, with T = sum_s scale_s * dot_s and
//               M = sum_s min_s * xsum_s (xsum_s: the sum of x's codes in sub-block s):
//               p = dmin * M; e = fma(dmin, M, -p); acc = fma(d_x, fma(d, T, -p) - e, acc)
//               (the two parts nearly cancel where an output is small: their difference is
//               rounded once, as a dequantized weight is)
//   Q6_K        per block: acc = fma(d * d_x, sum_s scale_s * (dot_s - 32 * xsum_s), acc)
// The AVX2 path and the scalar twin give the same bits.
//
// Cost: 2*m*n*k integer multiply-adds; reads W once per call (n*k*bits/8 bytes) plus x's codes
// (m*k bytes) from cache.
#ifndef PDSERVE_KERNELS_CPU_LINEAR_QUANT_H_
#define PDSERVE_KERNELS_CPU_LINEAR_QUANT_H_

#include <cstdint>
#include <vector>

#include "common/base/ggml_types.h"

namespace pdserve::kernels {

// A [rows][cols] matrix of a quantized GgmlType, rows of GgmlRowBytes(type, cols) bytes.
struct QuantMatrixRef {
  GgmlType type = GgmlType::kQ8_0;
  const void* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;  // A multiple of the type's block elements.
  // Repacked in panels of 16 rows (linear_quant_panels.h) rather than row-major; row() is then
  // meaningless.
  bool panels = false;
  const uint8_t* row(int64_t r) const {
    return static_cast<const uint8_t*>(data) + r * GgmlRowBytes(type, cols);
  }
};

// m rows of x quantized for the integer kernels: per block of `block` elements a scale d and
// codes q = round(x * (127 / max|x|)) (nearest even) in [-127, 127], and the sums of the codes per
// 16 and per 32 elements (the K-quants' mins and Q6_K's offset use them).
struct QuantizedActivations {
  int64_t m = 0, k = 0;
  int block = 32;
  std::vector<int8_t> q;        // [m][k]
  std::vector<float> d;         // [m][k / block]
  std::vector<int16_t> sum16;   // [m][k / 16]
  std::vector<int16_t> sum32;   // [m][k / 32]
  const int8_t* codes(int64_t t) const { return q.data() + t * k; }
  const float* scales(int64_t t) const { return d.data() + t * (k / block); }
};

// The activation block a weight type's kernel reads: 256 for the K-quants, else 32.
int ActivationBlock(GgmlType type);

// x [m][k] (k a multiple of block) quantized into *out (AVX2 where built; the twin has the same
// bits). A NaN element becomes -127.
void QuantizeActivations(const float* x, int64_t m, int64_t ldx, int64_t k, int block,
                         QuantizedActivations* out);
void QuantizeActivationsScalar(const float* x, int64_t m, int64_t ldx, int64_t k, int block,
                               QuantizedActivations* out);

// Columns [n_begin, n_end) of y for all rows of xq (quantized with ActivationBlock(w.type)), on
// the calling thread (AVX2 where built).
void LinearQuantColumns(const QuantizedActivations& xq, const QuantMatrixRef& w, float* y,
                        int64_t ldy, int64_t n_begin, int64_t n_end);
// The scalar twin (same bits), for the tests and CPUs without AVX2.
void LinearQuantColumnsScalar(const QuantizedActivations& xq, const QuantMatrixRef& w, float* y,
                              int64_t ldy, int64_t n_begin, int64_t n_end);

// Double-precision reference for tests: the dequantized weights times the dequantized
// activations (d * q of QuantizeActivationsScalar), y [m][w.rows].
void LinearQuantReference(const float* x, int64_t m, int64_t ldx, const QuantMatrixRef& w,
                          double* y);

}  // namespace pdserve::kernels

#endif  // PDSERVE_KERNELS_CPU_LINEAR_QUANT_H_
