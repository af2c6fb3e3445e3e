// The weights of one model, as views into the memory-mapped checkpoint. Matrices stay in the
// checkpoint's dtype (f32, bf16 or f16) and are read by the kernels in place; small vectors (norms,
// biases) are converted to f32 and owned here.
#ifndef PDSERVE_COMMON_MODEL_MODEL_WEIGHTS_H_
#define PDSERVE_COMMON_MODEL_MODEL_WEIGHTS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/tensor_ref.h"
#include "common/model/checkpoint.h"
#include "common/model/gguf.h"
#include "common/model/model_config.h"
#include "common/model/weight_format.h"

namespace pdserve {

struct LayerWeights {
  std::vector<float> input_norm;           // [hidden]
  std::vector<float> post_attention_norm;  // [hidden]
  MatrixRef q_proj, k_proj, v_proj, o_proj;  // [q_size|kv_size|hidden][...]
  std::vector<float> q_bias, k_bias, v_bias, o_bias;  // Empty when the family has none.
  std::vector<float> q_norm, k_norm;                  // [head_dim], Qwen3 only.
  MatrixRef gate_proj, up_proj, down_proj;
  std::vector<float> gate_bias, up_bias, down_bias;   // Llama with mlp_bias only.
};

// Immutable after Load; thread-safe to read.
class ModelWeights {
 public:
  // Checks that every tensor the config implies is present with the right shape and a supported
  // dtype; errors name the tensor and its file.
  // `dir`: a Hugging Face checkpoint directory, or a GGUF file (LoadGguf). `quantize_to`
  // (--weight-dtype) converts the matrices on load into memory the weights own: q8_0, q4_k,
  // q4_k_m quantize every float matrix to its MatrixType in that format (Q8_0 gives
  // llama-quantize's bytes; a matrix whose type falls back to a float one stays as it is);
  // f32, f16, bf16 convert every matrix in another type, block formats included.
  static absl::StatusOr<std::unique_ptr<ModelWeights>> Load(const ModelConfig& config,
                                                            const std::string& dir,
                                                            WeightFormat quantize_to = WeightFormat::kAsStored);
  // Weights made instead of read, for benchmarks of a model's shape without its files
  // (bench-engine --random-weights). Every matrix is bf16 and never tied: matrix k (in the order
  // q, k, v, o, gate|up as one, down per layer, then lm_head, then the embedding) holds
  // scale * SymmetricUniform24(seed * 1000003 + k + 1, i) at element i, scale sqrt(3 / fan-in)
  // (1 for the embedding); norm weights are 1 and biases 0. With `materialize` false no memory is
  // made: every matrix keeps its shape and a null data pointer, for a device runner that makes
  // the same values in its own memory (ModelRunnerOptions::synthetic_weights_seed).
  // `path` may also be a GGUF file (gguf_model.h): then this reads its tensors by llama.cpp's names.
  static absl::StatusOr<std::unique_ptr<ModelWeights>> LoadGguf(const ModelConfig& config,
                                                                const std::string& path);
  static std::unique_ptr<ModelWeights> Synthetic(const ModelConfig& config, uint64_t seed,
                                                 bool materialize);

  const ModelConfig& config() const { return config_; }
  const MatrixRef& embed_tokens() const { return embed_tokens_; }  // [vocab][hidden]
  const MatrixRef& lm_head() const { return lm_head_; }            // [vocab][hidden]
  const std::vector<float>& final_norm() const { return final_norm_; }
  const LayerWeights& layer(int64_t i) const { return layers_[i]; }
  // Bytes of all matrices a decode step streams (every layer's projections plus lm_head).
  size_t DecodeWeightBytes() const;
  // The dtype most matrices use (for display; f32 for quantized weights, whose activations are).
  DType dtype() const { return quantized_ ? DType::kF32 : lm_head_.dtype; }
  // Some matrix is in a GGUF block format (MatrixRef::quant_type).
  bool quantized() const { return quantized_; }
  // Drops the pages of a matrix read from a file mapping from the resident set once it has been
  // copied elsewhere (cpu_matrices' huge-page copies): they are read from the file again if
  // touched. Matrices in memory the weights own are left alone.
  void ReleaseMappedPages(const MatrixRef& m) const;
  // "bf16", "f32", or the block formats of the matrices ("Q4_K+Q6_K"), for WorkerInfo and logs.
  std::string weight_format() const;

 private:
  ModelWeights() = default;
  void ConvertMatrices(WeightFormat format);
  ModelConfig config_;
  std::unique_ptr<Checkpoint> checkpoint_;  // Owns the mappings the MatrixRefs point into.
  std::unique_ptr<GgufFile> gguf_;          // Or: a GGUF file's.
  std::vector<std::unique_ptr<uint8_t[]>> owned_;  // Rows reordered from the file (llama q/k).
  bool quantized_ = false;
  std::vector<std::unique_ptr<uint16_t[]>> synthetic_;  // Or: Synthetic's matrices.
  MatrixRef embed_tokens_, lm_head_;
  std::vector<float> final_norm_;
  std::vector<LayerWeights> layers_;
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_MODEL_MODEL_WEIGHTS_H_
