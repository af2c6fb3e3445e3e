#include "common/base/dtype.h"

#include "common/base/strings.h"

namespace pdserve {

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "f32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "f16";
  }
  return "?";
}

absl::StatusOr<DType> ParseDType(std::string_view name) {
  if (name == "f32" || name == "F32" || name == "float32" || name == "float") return DType::kF32;
  if (name == "bf16" || name == "BF16" || name == "bfloat16") return DType::kBF16;
  if (name == "f16" || name == "F16" || name == "float16" || name == "half") return DType::kF16;
  return absl::InvalidArgumentError(
      Str("unsupported dtype '", name, "' (supported: f32, bf16, f16)"));
}

std::string_view KvDTypeName(KvDType dtype) {
  switch (dtype) {
    case KvDType::kF32: return "f32";
    case KvDType::kBF16: return "bf16";
    case KvDType::kInt8: return "int8";
    case KvDType::kInt4: return "int4";
  }
  return "?";
}

absl::StatusOr<KvDType> ParseKvDType(std::string_view name) {
  if (name == "f32") return KvDType::kF32;
  if (name == "bf16") return KvDType::kBF16;
  if (name == "int8") return KvDType::kInt8;
  if (name == "int4") return KvDType::kInt4;
  return absl::InvalidArgumentError(
      Str("'", name, "' is not a KV cache dtype (f32, bf16, int8 or int4)"));
}

uint16_t F32ToF16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // Overflow -> inf.
  if (abs < 0x38800000u) {  // Result is subnormal or zero in half precision.
    if (abs < 0x33000000u) return sign;  // Below half the smallest subnormal: zero.
    const uint32_t exp = abs >> 23;
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    // value = mant * 2^(exp-150) and a half subnormal is k * 2^-24, so k = mant >> (126 - exp).
    const uint32_t shift = 126 - exp;
    const uint32_t half_mant = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1);
    uint32_t result = half_mant;
    if (rem > halfway || (rem == halfway && (half_mant & 1u))) ++result;
    return static_cast<uint16_t>(sign | result);
  }
  // Normal: rebias the exponent, round the mantissa to 10 bits (nearest even).
  uint32_t rebased = abs - ((127u - 15u) << 23);
  const uint32_t rounding = 0xfffu + ((rebased >> 13) & 1u);
  rebased += rounding;
  return static_cast<uint16_t>(sign | (rebased >> 13));
}

}  // namespace pdserve
