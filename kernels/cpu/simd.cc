#include "kernels/cpu/simd.h"

#include <algorithm>
#include <cmath>

namespace pdserve::kernels {

// Same operations, in the same order, as Exp8 (so a scalar tail matches the vector lanes bitwise).
float ExpScalar(float x) {
  using C = ExpConst;
  // MAXPS then MINPS: a NaN becomes -kMaxX, as in Exp8 (std::max would keep it, and converting
  // it to int below is undefined).
  x = x > -C::kMaxX ? x : -C::kMaxX;
  x = x < C::kMaxX ? x : C::kMaxX;
  const float n = std::nearbyint(x * C::kLog2e);
  float r = std::fma(-n, C::kLn2Hi, x);
  r = std::fma(-n, C::kLn2Lo, r);
  float p = C::kP0;
  p = std::fma(p, r, C::kP1);
  p = std::fma(p, r, C::kP2);
  p = std::fma(p, r, C::kP3);
  p = std::fma(p, r, C::kP4);
  p = std::fma(p, r, C::kP5);
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
