#include "common/base/ggml_types.h"

namespace pdserve {

std::optional<GgmlType> GgmlTypeFromId(uint32_t id) {
  switch (id) {
    case 0: return GgmlType::kF32;
    case 1: return GgmlType::kF16;
    case 2: return GgmlType::kQ4_0;
    case 6: return GgmlType::kQ5_0;
    case 8: return GgmlType::kQ8_0;
    case 12: return GgmlType::kQ4_K;
    case 13: return GgmlType::kQ5_K;
    case 14: return GgmlType::kQ6_K;
    case 30: return GgmlType::kBF16;
    default: return std::nullopt;
  }
}

std::string_view GgmlTypeName(GgmlType type) {
  switch (type) {
    case GgmlType::kF32: return "F32";
    case GgmlType::kF16: return "F16";
    case GgmlType::kQ4_0: return "Q4_0";
    case GgmlType::kQ5_0: return "Q5_0";
    case GgmlType::kQ8_0: return "Q8_0";
    case GgmlType::kQ4_K: return "Q4_K";
    case GgmlType::kQ5_K: return "Q5_K";
    case GgmlType::kQ6_K: return "Q6_K";
    case GgmlType::kBF16: return "BF16";
  }
  return "?";
}

int64_t GgmlBlockElements(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0:
    case GgmlType::kQ5_0:
    case GgmlType::kQ8_0: return 32;
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K: return 256;
    default: return 1;
  }
}

int64_t GgmlBlockBytes(GgmlType type) {
  switch (type) {
    case GgmlType::kF32: return 4;
    case GgmlType::kF16:
    case GgmlType::kBF16: return 2;
    case GgmlType::kQ4_0: return 18;   // f16 d, 16 bytes of nibbles.
    case GgmlType::kQ5_0: return 22;   // f16 d, 4 bytes of fifth bits, 16 bytes of nibbles.
    case GgmlType::kQ8_0: return 34;   // f16 d, 32 int8.
    case GgmlType::kQ4_K: return 144;  // f16 d, dmin; 12 bytes of 6-bit scales/mins; 128 nibbles.
    case GgmlType::kQ5_K: return 176;  // Q4_K's and 32 bytes of fifth bits.
    case GgmlType::kQ6_K: return 210;  // 128 low nibbles, 64 of high pairs, 16 int8 scales, f16 d.
  }
  return 1;
}

}  // namespace pdserve
