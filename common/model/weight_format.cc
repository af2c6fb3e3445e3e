#include "common/model/weight_format.h"

#include "common/base/strings.h"

namespace pdserve {
namespace {

struct Entry {
  const char* name;
  WeightFormat format;
  uint32_t file_type;  // LLAMA_FTYPE_*: ALL_F32 0, MOSTLY_F16 1, Q8_0 7, Q4_K_S 14, Q4_K_M 15, BF16 32.
};
constexpr Entry kEntries[] = {{"auto", WeightFormat::kAsStored, 0}, {"f32", WeightFormat::kF32, 0},
                              {"f16", WeightFormat::kF16, 1},       {"bf16", WeightFormat::kBF16, 32},
                              {"q8_0", WeightFormat::kQ8_0, 7},     {"q4_k", WeightFormat::kQ4_K, 14},
                              {"q4_k_m", WeightFormat::kQ4_K_M, 15}};

// llama-quantize's use_more_bits: the first and last eighth of the layers, and every third
// between.
bool UseMoreBits(int64_t layer, int64_t layers) {
  return layer < layers / 8 || layer >= 7 * layers / 8 || (layer - layers / 8) % 3 == 2;
}

}  // namespace

absl::StatusOr<WeightFormat> ParseWeightFormat(std::string_view name) {
  for (const Entry& e : kEntries) {
    if (name == e.name) return e.format;
  }
  return absl::InvalidArgumentError(
      Str("'", name, "' is not auto, f32, f16, bf16, q8_0, q4_k or q4_k_m"));
}

const char* WeightFormatName(WeightFormat format) {
  for (const Entry& e : kEntries) {
    if (e.format == format) return e.name;
  }
  return "?";
}

uint32_t WeightFormatFileType(WeightFormat format) {
  for (const Entry& e : kEntries) {
    if (e.format == format) return e.file_type;
  }
  return 0;
}

GgmlType MatrixType(WeightFormat format, MatrixRole role, int64_t layer, int64_t layers,
                    int64_t cols, bool tied) {
  GgmlType t = GgmlType::kF32;
  switch (format) {
    case WeightFormat::kAsStored:
    case WeightFormat::kF32: return GgmlType::kF32;
    case WeightFormat::kF16: return GgmlType::kF16;
    case WeightFormat::kBF16: return GgmlType::kBF16;
    case WeightFormat::kQ8_0: t = GgmlType::kQ8_0; break;
    case WeightFormat::kQ4_K: t = GgmlType::kQ4_K; break;
    case WeightFormat::kQ4_K_M: {
      if (role == MatrixRole::kEmbedding && tied) role = MatrixRole::kHead;
      const bool more = (role == MatrixRole::kAttnV || role == MatrixRole::kFfnDown) &&
                        UseMoreBits(layer, layers);
      t = role == MatrixRole::kHead || more ? GgmlType::kQ6_K : GgmlType::kQ4_K;
      break;
    }
  }
  if (cols % 256 != 0) {  // llama-quantize's tensor_type_fallback.
    if (t == GgmlType::kQ4_K) t = GgmlType::kQ5_0;
    if (t == GgmlType::kQ6_K) t = GgmlType::kQ8_0;
  }
  if ((t == GgmlType::kQ8_0 || t == GgmlType::kQ5_0) && cols % 32 != 0) t = GgmlType::kF16;
  return t;
}

}  // namespace pdserve
