// The model forward pass behind one small interface, one implementation per backend ("cpu" now,
// "cuda" later), chosen by name through CreateModelRunner. This header names no backend.
#ifndef PDSERVE_COMMON_ENGINE_MODEL_RUNNER_H_
#define PDSERVE_COMMON_ENGINE_MODEL_RUNNER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/engine/forward_batch.h"

namespace pdserve {

class KvPool;
class ModelWeights;

enum class PrefillGemm {
  kInvariant,  // Our kernel for every row: results bitwise independent of batching and chunking.
  kOpenBlas,   // OpenBLAS sgemm for prefill chunks of >= 32 tokens: faster prefill, not invariant.
};

struct ModelRunnerOptions {
  int threads = 0;                      // <= 0: all cores.
  int64_t max_batch_tokens = 2048;      // Scratch is sized for this many tokens per step.
  int64_t max_logit_rows = 256;         // Sequences sampled per step.
  int64_t max_model_len = 4096;         // Longest context attention must handle.
  PrefillGemm prefill_gemm = PrefillGemm::kInvariant;
};

// Not thread-safe: driven by one scheduler thread. Forward writes the KV of the batch's tokens
// into the pool at their block-table slots, so the caller must own those blocks.
class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  // logits: [batch.num_logit_rows()][vocab], in the order of sequences with need_logits.
  // InvalidArgument if the batch exceeds the sizes the runner was built for.
  virtual absl::Status Forward(const ForwardBatch& batch, float* logits) = 0;
  virtual std::string_view backend() const = 0;
  // Called during Forward, on the calling thread, as soon as layer `layer`'s K and V of every
  // token in the batch are in the pool (so those pages can be sent while later layers compute).
  using LayerCallback = std::function<void(int64_t layer)>;
  virtual void SetLayerCallback(LayerCallback callback) = 0;
};

// `backend`: "cpu". `weights` and `pool` must outlive the runner.
absl::StatusOr<std::unique_ptr<ModelRunner>> CreateModelRunner(std::string_view backend,
                                                               const ModelRunnerOptions& options,
                                                               const ModelWeights* weights,
                                                               KvPool* pool);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_ENGINE_MODEL_RUNNER_H_
