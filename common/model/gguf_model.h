// A model given as one GGUF file instead of a Hugging Face directory: its architecture from the
// file's metadata (llama.cpp's keys for the llama, qwen2 and qwen3 architectures; Mistral files are
// llama), checked by the same rules as a config.json.
#ifndef PDSERVE_COMMON_MODEL_GGUF_MODEL_H_
#define PDSERVE_COMMON_MODEL_GGUF_MODEL_H_

#include <string>

#include "absl/status/statusor.h"
#include "common/model/gguf.h"
#include "common/model/model_config.h"

namespace pdserve {

// A path names a GGUF model when it is a regular file (not a .json one), or names none and ends
// in .gguf; a directory is a Hugging Face checkpoint.
bool IsGgufPath(const std::string& path);

// The config a GGUF file's metadata and tensors imply. Errors name the key. Llama 3.1's scaling
// comes from pdserve's own keys (pdserve.rope.scaling.*, exact) or llama.cpp's rope_freqs tensor.
absl::StatusOr<ModelConfig> ModelConfigFromGguf(const GgufFile& file);

// A model path: a directory's config.json, or a GGUF file's metadata.
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& path);

// llama.cpp's converter reorders the rows of a llama-architecture model's q and k projections
// (and their biases) for its rotary layout: GGUF row h*d + 2i + j is Hugging Face row
// h*d + j*d/2 + i within each head of d rows. pdserve keeps Hugging Face's order (the KV pages'
// layout is the same whatever file a worker loaded); qwen2 and qwen3 files are not reordered.
bool GgufPermutesQk(const GgufFile& file);
inline int64_t GgufRowToHf(int64_t row, int64_t head_dim) {
  const int64_t h = row / head_dim, r = row % head_dim;
  return h * head_dim + (r % 2) * (head_dim / 2) + r / 2;
}

}  // namespace pdserve

#endif  // PDSERVE_COMMON_MODEL_GGUF_MODEL_H_
