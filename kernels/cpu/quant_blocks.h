// llama.cpp's weight block formats (GGUF tensor types), read by pdserve's kernels:
//   Q8_0  32 elements: f16 d, int8 q[32];                         w = d * q
//   Q4_0  32 elements: f16 d, 16 bytes (low nibbles: 0..15, high: 16..31);  w = d * (q - 8)
//   Q5_0  32 elements: f16 d, 4 bytes qh (bit l: element l's fifth bit), 16 bytes of nibbles as
//         Q4_0's;  w = d * (q - 16), q in 0..31
//   Q4_K 256 elements: f16 d, f16 dmin, 12 bytes of eight 6-bit (scale, min) pairs, 128 bytes
//        of nibbles (each 64 elements: 32 low nibbles, then the same 32 bytes' high nibbles);
//        sub-block s of 32: w = (d * scale_s) * q - (dmin * min_s)
//   Q5_K as Q4_K plus 32 bytes of fifth bits (bit 2p of byte l for element l of pair p's first
//        sub-block, bit 2p+1 for its second): q in 0..31
//   Q6_K 256 elements: 128 bytes of low nibbles, 64 of high bit pairs, 16 int8 scales (one per
//        16 elements), f16 d; w = (d * scale) * (q - 32), q in 0..63
//
// The dequantized value of an element is one fixed function of its block (the K-quants' minus
// as one fused multiply-add): every kernel that reads a block, scalar or SIMD, computes these
// bits, so a row's result never depends on which path read it.
#ifndef PDSERVE_KERNELS_CPU_QUANT_BLOCKS_H_
#define PDSERVE_KERNELS_CPU_QUANT_BLOCKS_H_

#include <cstdint>

#include "common/base/ggml_types.h"

namespace pdserve::kernels {

// n elements (a multiple of the type's block elements) of a row in `type` to f32. The float
// types convert exactly.
void DequantizeRow(GgmlType type, const void* src, float* dst, int64_t n);

// Q4_K/Q5_K: the 6-bit scale and min of sub-block j (0..7) from a block's 12 packed bytes.
inline void KQuantScaleMin(int j, const uint8_t* q, int* scale, int* min) {
  if (j < 4) {
    *scale = q[j] & 63;
    *min = q[j + 4] & 63;
  } else {
    *scale = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *min = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// A block's integer codes in element order: Q8_0/Q4_0/Q5_0 signed (minus 8 / 16) into
// codes[32]; Q4_K/Q5_K/Q6_K unsigned (0..15, 0..31, 0..63) into codes[256]. Every reader of the
// layouts (the dequantizer below, the integer kernels' scalar twin) goes through these.
void BlockCodes32(GgmlType type, const uint8_t* block, int8_t* codes);
void BlockCodesK(GgmlType type, const uint8_t* block, uint8_t* codes);

// One block of a quantized type to its BlockElements floats.
void DequantizeBlock(GgmlType type, const uint8_t* block, float* out);

// f32 to Q8_0, the same bytes as llama.cpp's quantize_row_q8_0_ref: per block of 32,
// d = max|x| / 127 stored as f16 (round to nearest even), q = round(x / d) (halfway away from 0).
void QuantizeRowQ8_0(const float* src, void* dst, int64_t n);

// f32 to Q5_0, the same bytes as llama.cpp's quantize_row_q5_0_ref: per block of 32, d = (the
// element of largest magnitude) / -16 as f16, code = min(31, trunc(x * (1 / d) + 16.5)).
void QuantizeRowQ5_0(const float* src, void* dst, int64_t n);

// f32 to Q4_K by llama.cpp's reference search (quantize_row_q4_K_ref's: per sub-block of 32 a
// weighted least-squares fit of scale and min over 21 candidate grids, weights |x| + rms; the
// eight scales and mins then quantized to 6 bits against the block's largest). Ties round to
// even (nearbyint) where llama.cpp's float trick does the same.
void QuantizeRowQ4_K(const float* src, void* dst, int64_t n);

// f32 to Q6_K by llama.cpp's reference search (quantize_row_q6_K_ref's: per 16 elements a
// weighted (x^2) least-squares scale over 19 grids of codes in [-32, 31], the 16 scales then
// int8 against the block's largest, the codes re-rounded against the stored scales).
void QuantizeRowQ6_K(const float* src, void* dst, int64_t n);

// n floats as `type`: F32, F16, BF16 (round to nearest even), or blocks by the quantizers above
// (Q8_0, Q5_0, Q4_K, Q6_K); false for another type. The inverse of DequantizeRow.
bool EncodeRow(GgmlType type, const float* src, void* dst, int64_t n);

}  // namespace pdserve::kernels

#endif  // PDSERVE_KERNELS_CPU_QUANT_BLOCKS_H_
