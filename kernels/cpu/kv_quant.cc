#include "kernels/cpu/kv_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace pdserve::kernels {
namespace {

// Max |x|, or NaN when a value is not finite.
float RowMax(const float* x, int64_t n) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) return std::numeric_limits<float>::quiet_NaN();
    amax = std::max(amax, std::fabs(x[i]));
  }
  return amax;
}

// Codes in [-levels, levels] into code(i, c); returns the scale. The factor levels / amax is
// taken in double so a denormal amax cannot overflow it.
template <typename Put>
bool Quantize(const float* x, int64_t n, int levels, float* scale, Put put) {
  const float amax = RowMax(x, n);
  if (std::isnan(amax)) {
    for (int64_t i = 0; i < n; ++i) put(i, 0);
    *scale = std::numeric_limits<float>::quiet_NaN();
    return false;
  }
  if (amax == 0.0f) {
    for (int64_t i = 0; i < n; ++i) put(i, 0);
    *scale = 0.0f;
    return true;
  }
  const double inv = static_cast<double>(levels) / static_cast<double>(amax);
  for (int64_t i = 0; i < n; ++i) {
    const double c = std::nearbyint(static_cast<double>(x[i]) * inv);  // Ties to even.
    put(i, static_cast<int>(std::clamp(c, -static_cast<double>(levels), static_cast<double>(levels))));
  }
  *scale = static_cast<float>(static_cast<double>(amax) / levels);
  return true;
}

}  // namespace

bool QuantizeRowInt8(const float* x, int64_t n, int8_t* codes, float* scale) {
  return Quantize(x, n, kInt8Levels, scale,
                  [&](int64_t i, int c) { codes[i] = static_cast<int8_t>(c); });
}

bool QuantizeRowInt4(const float* x, int64_t n, uint8_t* packed, float* scale) {
  std::memset(packed, 0, static_cast<size_t>(n / 2));
  return Quantize(x, n, kInt4Levels, scale, [&](int64_t i, int c) {
    packed[i >> 1] |= static_cast<uint8_t>((c & 0xf) << ((i & 1) * 4));
  });
}

void DequantizeRowInt8(const int8_t* codes, int64_t n, float scale, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(codes[i]) * scale;
}

void DequantizeRowInt4(const uint8_t* packed, int64_t n, float scale, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(Int4Code(packed, i)) * scale;
}

double QuantErrorBound(float amax, int levels) {
  const double scale = static_cast<double>(amax) / levels;
  // Half a step; the scale's f32 rounding (relative 2^-24) times the largest code; the product's
  // rounding (relative 2^-24 of amax); and, for a denormal scale, its absolute spacing times the
  // largest code.
  const double denorm = static_cast<double>(std::numeric_limits<float>::denorm_min());
  return scale / 2 + 2 * amax * std::ldexp(1.0, -24) + levels * denorm;
}

}  // namespace pdserve::kernels
