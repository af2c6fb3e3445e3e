// What `--weight-dtype` and `gguf convert --type` make of a checkpoint's float matrices: each
// matrix's type chosen as llama-quantize chooses it for the file type of the same name.
#ifndef PDSERVE_COMMON_MODEL_WEIGHT_FORMAT_H_
#define PDSERVE_COMMON_MODEL_WEIGHT_FORMAT_H_

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/base/ggml_types.h"

namespace pdserve {

enum class WeightFormat {
  kAsStored,  // --weight-dtype auto
  kF32,
  kF16,
  kBF16,
  kQ8_0,    // every matrix Q8_0
  kQ4_K,    // every matrix Q4_K (output and embeddings too)
  kQ4_K_M,  // llama-quantize's Q4_K_M: Q4_K, with Q6_K for the output (or the tied embeddings)
            // and for attn_v and ffn_down in the layers use_more_bits picks
};

// "auto", "f32", "f16", "bf16", "q8_0", "q4_k", "q4_k_m"; anything else InvalidArgument.
absl::StatusOr<WeightFormat> ParseWeightFormat(std::string_view name);
const char* WeightFormatName(WeightFormat format);
// llama.cpp's general.file_type of a file in the format (LLAMA_FTYPE_*).
uint32_t WeightFormatFileType(WeightFormat format);

// The matrices of a llama-family layer stack, as llama-quantize tells them apart.
enum class MatrixRole { kEmbedding, kHead, kAttnQ, kAttnK, kAttnV, kAttnOutput, kFfnGate, kFfnUp, kFfnDown };

// The type of one matrix (in layer `layer` of `layers`; rows of `cols` elements) in `format`
// (not kAsStored); `tied`: the embeddings are also the head, and take the head's type. Rows that
// are not whole blocks fall back as llama-quantize's do: Q6_K to Q8_0, Q4_K to Q5_0, and a 32-element
// type whose rows are not whole blocks either to F16.
GgmlType MatrixType(WeightFormat format, MatrixRole role, int64_t layer, int64_t layers,
                    int64_t cols, bool tied = false);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_MODEL_WEIGHT_FORMAT_H_
