// Element types of weights and KV pools, and exact scalar conversions between them.
// Conversions are header-inline because they sit in hot loops of the scalar kernel twins.
#ifndef PDSERVE_COMMON_BASE_DTYPE_H_
#define PDSERVE_COMMON_BASE_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "absl/status/statusor.h"

namespace pdserve {

enum class DType { kF32, kBF16, kF16 };

inline size_t DTypeSize(DType dtype) { return dtype == DType::kF32 ? 4 : 2; }
// "f32", "bf16", "f16" (the spelling our flags use).
std::string_view DTypeName(DType dtype);
// Accepts our spellings and safetensors' ("F32", "BF16", "F16") and torch's ("float32",
// "bfloat16", "float16").
absl::StatusOr<DType> ParseDType(std::string_view name);

// Element types of a KV pool. kInt8 and kInt4 are symmetric codes with one f32 scale per
// (K|V, kv_head, slot) row, stored in the page after the codes (kernels/cpu/kv_quant.h).
enum class KvDType { kF32, kBF16, kInt8, kInt4 };

// Bits per element of a K or V row (scales not counted).
constexpr int KvDTypeBits(KvDType dtype) {
  switch (dtype) {
    case KvDType::kF32: return 32;
    case KvDType::kBF16: return 16;
    case KvDType::kInt8: return 8;
    case KvDType::kInt4: return 4;
  }
  return 32;
}
constexpr bool KvDTypeQuantized(KvDType dtype) {
  return dtype == KvDType::kInt8 || dtype == KvDType::kInt4;
}
// "f32", "bf16", "int8", "int4" (the spelling of --kv-dtype and of the KV layout).
std::string_view KvDTypeName(KvDType dtype);
// InvalidArgument naming the accepted spellings.
absl::StatusOr<KvDType> ParseKvDType(std::string_view name);

inline float Bf16ToF32(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// Round to nearest even, as torch does; NaN stays a (quiet) NaN.
inline uint16_t F32ToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

inline float F16ToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // Subnormal half: normalise.
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ffu;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// Round to nearest even with overflow to infinity, matching vcvtps2ph with imm 0.
uint16_t F32ToF16(float f);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_BASE_DTYPE_H_
