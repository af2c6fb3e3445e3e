#include "kernels/cpu/simd.h"

#include <algorithm>
#include <cmath>

namespace pdserve::kernels {

// Same operations, in the same order, as Exp8 (so a scalar tail matches the vector lanes bitwise).
float ExpScalar(float x) {
  x = std::min(std::max(x, -88.3762626647949f), 88.3762626647949f);
  const float n = std::nearbyint(x * 1.44269504088896341f);
  float r = std::fma(-n, 0.693359375f, x);
  r = std::fma(-n, -2.12194440e-4f, r);
  float p = 1.9875691500E-4f;
  p = std::fma(p, r, 1.3981999507E-3f);
  p = std::fma(p, r, 8.3334519073E-3f);
  p = std::fma(p, r, 4.1665795894E-2f);
  p = std::fma(p, r, 1.6666665459E-1f);
  p = std::fma(p, r, 5.0000001201E-1f);
  const float r2 = r * r;
  p = std::fma(p, r2, r + 1.0f);
  const int ni = static_cast<int>(n);
  const int half = ni >> 1;
  const int rest = ni - half;
  uint32_t b1 = static_cast<uint32_t>(half + 127) << 23;
  uint32_t b2 = static_cast<uint32_t>(rest + 127) << 23;
  float f1, f2;
  std::memcpy(&f1, &b1, 4);
  std::memcpy(&f2, &b2, 4);
  return (p * f1) * f2;
}

}  // namespace pdserve::kernels
