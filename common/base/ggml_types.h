// The tensor types of GGUF files that pdserve reads: llama.cpp's float types and the block
// formats `llama-quantize` writes for Q8_0, Q4_0, Q4_K_M and Q5_K_M files (Q5_0: Q4_K_M's
// fallback for rows that are not whole 256-element blocks). Each block format
// packs `BlockElements` consecutive elements of a row into `BlockBytes` bytes (the layouts are in
// kernels/cpu/quant_blocks.h). The numbers are GGUF's own type ids.
#ifndef PDSERVE_COMMON_BASE_GGML_TYPES_H_
#define PDSERVE_COMMON_BASE_GGML_TYPES_H_

#include <cstdint>
#include <optional>
#include <string_view>

namespace pdserve {

enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ5_0 = 6,
  kQ8_0 = 8,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kBF16 = 30,
};

// Null for a type id pdserve does not read (the caller names it in its error).
std::optional<GgmlType> GgmlTypeFromId(uint32_t id);
std::string_view GgmlTypeName(GgmlType type);  // "F32", "Q4_K", ...
// Elements per block (1 for the float types) and bytes per block.
int64_t GgmlBlockElements(GgmlType type);
int64_t GgmlBlockBytes(GgmlType type);
inline bool GgmlQuantized(GgmlType t) {
  return t != GgmlType::kF32 && t != GgmlType::kF16 && t != GgmlType::kBF16;
}
// Bytes of a row of `cols` elements (cols a multiple of the block elements).
inline int64_t GgmlRowBytes(GgmlType t, int64_t cols) {
  return cols / GgmlBlockElements(t) * GgmlBlockBytes(t);
}
// Bytes of one block of each of 16 rows in the panel layout the AVX512-VNNI kernels read
// (kernels/cpu/linear_quant_panels.h); 0 for a type without one.
inline int64_t GgmlPanelBlockBytes(GgmlType t) {
  switch (t) {
    case GgmlType::kQ8_0: return 544;
    case GgmlType::kQ4_0: return 288;
    case GgmlType::kQ5_0: return 352;
    case GgmlType::kQ4_K: return 2368;
    case GgmlType::kQ5_K: return 2880;
    case GgmlType::kQ6_K: return 3360;
    default: return 0;
  }
}

}  // namespace pdserve

#endif  // PDSERVE_COMMON_BASE_GGML_TYPES_H_
