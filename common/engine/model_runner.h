// The model forward pass behind one small interface, one implementation per backend ("cpu" now,
// "cuda" later), chosen by name through CreateModelRunner. This header names no backend.
#ifndef PDSERVE_COMMON_ENGINE_MODEL_RUNNER_H_
#define PDSERVE_COMMON_ENGINE_MODEL_RUNNER_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <optional>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/base/dtype.h"
#include "common/engine/forward_batch.h"

namespace pdserve {

class KvPool;
class ModelWeights;
class SharedWeights;
struct ModelConfig;

enum class PrefillGemm {
  kInvariant,  // Our kernel for every row: results bitwise independent of batching and chunking.
  kOpenBlas,   // OpenBLAS sgemm for prefill chunks of >= 32 tokens: faster prefill, not invariant.
};

// The arithmetic of the linear layers (projections and lm_head) and, on the cpu backend, of
// attention's Q.K^T and P.V. Norms, softmax and activations stay f32 in both.
enum class ComputeDType {
  kAuto,  // Options only: bf16 when the weights are bf16 and the backend computes bf16 natively
          // (the CPU has AVX512-BF16), f32 otherwise; ResolveComputeDType decides.
  kF32,   // Activations f32, weights widened exactly: the reference path, pinned by the parity tests.
  kBF16,  // Activations rounded to bf16, weights in bf16 (converted once at load if the checkpoint
          // is not), f32 accumulation (kernels/cpu/linear_bf16.h). Still batch-invariant.
};
std::string_view ComputeDTypeName(ComputeDType d);  // "auto", "f32", "bf16"
absl::StatusOr<ComputeDType> ParseComputeDType(std::string_view name);

// The parallel regions of a forward pass, in the order a layer runs them, for a breakdown of
// where its wall time goes (bench-engine). A region's time includes its threads' wait at its end.
enum class ForwardPhase : int {
  kEmbedding,     // token embeddings and RoPE's cos/sin per row
  kInputNorm,     // RMSNorm before attention
  kQkv,           // q/k/v projections (bf16 compute: rounding the rows included)
  kRopeKvStore,   // biases, q/k norms, RoPE, K/V into the pool
  kLayerCallback, // SetLayerCallback's function (a prefill worker queueing the layer's pages)
  kAttention,
  kOProjection,
  kResidualNorm,  // residual add and RMSNorm after attention
  kGateUp,
  kActivation,    // biases and SiLU(gate) x up
  kDown,
  kResidual,      // residual add after the MLP
  kLogits,        // final RMSNorm and lm_head of the sampled rows
};
inline constexpr int kNumForwardPhases = 13;
std::string_view ForwardPhaseName(ForwardPhase phase);  // "qkv", "attention", ...
// Seconds per phase, indexed by ForwardPhase.
using ForwardPhaseSeconds = std::array<double, kNumForwardPhases>;

struct ModelRunnerOptions {
  int threads = 0;                      // <= 0: all cores.
  int64_t max_batch_tokens = 2048;      // Scratch is sized for this many tokens per step.
  int64_t max_logit_rows = 256;         // Sequences sampled per step.
  int64_t max_model_len = 4096;         // Longest context attention must handle.
  PrefillGemm prefill_gemm = PrefillGemm::kInvariant;
  ComputeDType compute_dtype = ComputeDType::kF32;  // Resolved: never kAuto.
  // The cpu backend computing in bf16: attention's Q.K^T and P.V in bf16 too (attention_bf16.h).
  // false keeps attention in f32, the arithmetic of the cuda backend's kernels, which its host
  // tests compare bit for bit.
  bool bf16_attention = true;
  // Copy the linear layers' matrices into anonymous memory with transparent huge pages (decode
  // streams them every step; 2 MiB pages spare the TLB misses of a 4 KiB file mapping). Costs a
  // copy of those matrices in RAM and the time to make it.
  bool weight_huge_pages = true;
  // Device backends: run decode-only steps (every sequence one token) as CUDA graphs, one per
  // batch size, captured the first time that size runs.
  bool device_graphs = true;
  // Device backends: make ModelWeights::Synthetic's values for this seed in device memory instead
  // of uploading the weights (which may then be Synthetic(..., materialize=false): shapes only).
  // An 8B-shaped benchmark then needs no 16 GB file (bench-engine --random-weights).
  std::optional<uint64_t> synthetic_weights_seed;
  // The engines of one process (serve): the cpu backend takes its matrix copies from here, made
  // once for all of them. Null: its own. Must outlive the runner.
  SharedWeights* shared_weights = nullptr;
};

// Not thread-safe: driven by one scheduler thread. Forward writes the KV of the batch's tokens
// into the pool at their block-table slots, so the caller must own those blocks.
class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  // logits: [batch.num_logit_rows()][vocab], the rows of each sequence's last
  // num_logits tokens, in batch order.
  // InvalidArgument if the batch exceeds the sizes the runner was built for.
  virtual absl::Status Forward(const ForwardBatch& batch, float* logits) = 0;
  virtual std::string_view backend() const = 0;
  // Called during Forward, on the calling thread, as soon as layer `layer`'s K and V of every
  // token in the batch are in the pool (so those pages can be sent while later layers compute).
  using LayerCallback = std::function<void(int64_t layer)>;
  virtual void SetLayerCallback(LayerCallback callback) = 0;
  // Where the KV pages really are when not in the KvPool's own (host) memory: a GPU runner's
  // device copy of the pool, same layout. Null: the KvPool's memory.
  virtual uint8_t* kv_memory() { return nullptr; }
  // Wall time of each phase over all Forward calls so far; zeros where a backend does not time
  // its phases (a device backend's kernels run asynchronously).
  virtual ForwardPhaseSeconds phase_seconds() const { return {}; }
  // The memory a decode step streams its weight matrices from, where this runner reads them (its
  // packed copies, or the checkpoint's mapping): bench-engine reads it between steps as the rate
  // of the weights' own memory. Empty where the host does not read the weights (a device backend).
  virtual std::vector<absl::Span<const std::byte>> DecodeWeightMemory() const { return {}; }
};

// kAuto -> kF32 or kBF16 for this backend, these weights and this CPU; an error for a combination
// that does not exist (bf16 compute with OpenBLAS prefill).
absl::StatusOr<ComputeDType> ResolveComputeDType(std::string_view backend, ComputeDType requested,
                                                 DType weights_dtype, PrefillGemm prefill_gemm);

// The checks every backend makes before a step: token and logit row counts within the sizes the
// runner was built for, positions within max_model_len, block tables long enough and in range,
// token ids in the vocabulary. InvalidArgument naming the sequence and the value.
absl::Status ValidateForwardBatch(const ForwardBatch& batch, const ModelRunnerOptions& options,
                                  int64_t block_size, int64_t num_blocks, int64_t vocab_size);

// Bytes of KV cache a backend with its own memory leaves each of `engines` engines of one
// process (serve --device cuda: 2) that share one copy of the weights: `utilization` of the
// device's memory less the weights (bf16), split equally, less each engine's working buffers and
// 1 GiB for the CUDA context and cuBLASLt's workspace. "cpu": Unimplemented (the KV cache is
// --kv-memory-gib of RAM); no GPU: Unavailable; a device too small: ResourceExhausted naming
// the sizes.
absl::StatusOr<size_t> DeviceKvBudgetBytes(std::string_view backend, double utilization,
                                           const ModelConfig& config, int64_t max_batch_tokens,
                                           int engines = 1);
// Its arithmetic for a device of `total` bytes.
absl::StatusOr<size_t> KvBudgetFromDeviceMemory(size_t total, double utilization,
                                                const ModelConfig& config,
                                                int64_t max_batch_tokens, int engines);

// `backend`: "cpu". `weights` and `pool` must outlive the runner.
absl::StatusOr<std::unique_ptr<ModelRunner>> CreateModelRunner(std::string_view backend,
                                                               const ModelRunnerOptions& options,
                                                               const ModelWeights* weights,
                                                               KvPool* pool);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_ENGINE_MODEL_RUNNER_H_
