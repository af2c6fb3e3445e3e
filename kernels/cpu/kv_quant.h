// Symmetric quantization of KV rows (one token's K or V of one kv head) for int8 and int4 pools.
//
// A row x of n values gets one f32 scale s = max|x| / L (L = 127 for int8, 7 for int4) and codes
// c = round_to_nearest_even(x * L / max|x|) in [-L, L]; it reads back as c * s. Error bound per
// element: |x - c * s| <= s / 2 (plus the f32 rounding of s and of the product, and for rows
// whose max is denormal the spacing of denormals; QuantErrorBound says exactly). int4 packs
// element 2i in the low nibble and 2i + 1 in the high nibble of byte i (two's complement).
//
// One scalar implementation (it runs once per stored token, not per read): every path that
// stores a token writes the same bytes, which is what keeps chunked, batched and disaggregated
// runs bitwise equal on quantized pools.
#ifndef PDSERVE_KERNELS_CPU_KV_QUANT_H_
#define PDSERVE_KERNELS_CPU_KV_QUANT_H_

#include <cstdint>

namespace pdserve::kernels {

inline constexpr int kInt8Levels = 127;
inline constexpr int kInt4Levels = 7;

// Quantizes x[0, n). A row holding inf or NaN cannot be represented: it is refused (returns
// false) and written as zero codes with a NaN scale, so reading it gives NaN, not a silently
// clipped value. An all-zero row gets scale 0.
bool QuantizeRowInt8(const float* x, int64_t n, int8_t* codes, float* scale);
// n even; packed holds n / 2 bytes.
bool QuantizeRowInt4(const float* x, int64_t n, uint8_t* packed, float* scale);

// out[i] = code_i * scale.
void DequantizeRowInt8(const int8_t* codes, int64_t n, float scale, float* out);
void DequantizeRowInt4(const uint8_t* packed, int64_t n, float scale, float* out);

// Code i of a packed int4 row.
inline int Int4Code(const uint8_t* packed, int64_t i) {
  const int nibble = (packed[i >> 1] >> ((i & 1) * 4)) & 0xf;
  return nibble >= 8 ? nibble - 16 : nibble;
}

// The largest |x_i - dequantized_i| the format allows for a row whose max |x| is amax.
double QuantErrorBound(float amax, int levels);

}  // namespace pdserve::kernels

#endif  // PDSERVE_KERNELS_CPU_KV_QUANT_H_
