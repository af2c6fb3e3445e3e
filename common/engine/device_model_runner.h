// The forward pass on an accelerator (backend "cuda"), written against cuda::DeviceOps so the same
// code drives a GPU (CudaDeviceOps) and, in tests, the host execution layer (HostDeviceOps),
// where it is compared with the CPU runner.
//
// Numerics are the CPU runner's bf16 compute mode: weights in bf16, activations rounded to bf16
// at every GEMM input, f32 accumulation, the residual stream, norms, RoPE, softmax and the KV
// store in f32 (then the pool's dtype, the CPU's page bytes). GEMM sums run in the device's
// order, so results equal the CPU's within float rounding, not bitwise.
//
// Per step: one copy of the step's metadata (token ids, positions, block tables, logit rows,
// decode rows, prefill tiles) into device memory, then per layer: add + RMSNorm, the q/k/v GEMMs,
// bias/qk-norm/RoPE + KV store (a layer mark), attention (flash-decoding for one-token chunks,
// tiled prefill for longer ones), o GEMM, add + RMSNorm, the gate|up GEMM (one matrix), SiLU-mul,
// down GEMM; then the final norm of the rows sampled and lm_head; the logits come back to the
// host for the existing sampler. The layer callback runs on the calling thread as each layer's
// mark completes, while later layers still compute.
#ifndef PDSERVE_COMMON_ENGINE_DEVICE_MODEL_RUNNER_H_
#define PDSERVE_COMMON_ENGINE_DEVICE_MODEL_RUNNER_H_

#include <memory>
#include <vector>

#include "common/engine/device_memory.h"
#include "common/engine/device_weights.h"
#include "common/engine/model_runner.h"
#include "common/kvcache/kv_pool.h"
#include "common/model/model_weights.h"
#include "kernels/cuda/device_ops.h"

namespace pdserve {

class DeviceModelRunner : public ModelRunner {
 public:
  // options.compute_dtype must be kBF16 (the only arithmetic this backend has) and
  // prefill_gemm kInvariant. With options.synthetic_weights_seed the weights are made in device
  // memory (only `weights`' config is read); with options.shared_weights the process's one
  // device copy is used (uploaded by the first runner that asks). The model's shapes are checked against the kernels' limits
  // (InvalidArgument naming them).
  static absl::StatusOr<std::unique_ptr<DeviceModelRunner>> Create(
      const ModelRunnerOptions& options, const ModelWeights* weights, KvPool* pool,
      std::unique_ptr<cuda::DeviceOps> ops);
  ~DeviceModelRunner() override;

  absl::Status Forward(const ForwardBatch& batch, float* logits) override;
  std::string_view backend() const override { return "cuda"; }
  void SetLayerCallback(LayerCallback callback) override { layer_callback_ = std::move(callback); }
  // The pool the kernels use (device memory on a GPU; the KvPool's own bytes on the host layer).
  uint8_t* kv_memory() override { return kv_memory_; }

 private:
  DeviceModelRunner(const ModelRunnerOptions& options, const ModelConfig& config, KvPool* pool,
                    std::shared_ptr<cuda::DeviceOps> ops);
  static absl::Status Check(const ModelRunnerOptions& options, const ModelConfig& config,
                            const KvPool& pool);
  absl::Status AllocateBuffers();
  absl::Status Layer(int64_t layer);
  // y[m][n] = x[m][k] w[n][k]^T, dense rows.
  absl::Status Gemm(const uint16_t* x, int64_t m, int64_t k, const uint16_t* w, int64_t n, float* y);
  // Embedding, every layer, final norm and lm_head of the step laid out in step_.
  absl::Status EnqueueStep();
  cuda::KvLayer KvLayerView(int64_t layer) const;

  ModelRunnerOptions options_;
  ModelConfig config_;
  KvPool* pool_;
  std::shared_ptr<cuda::DeviceOps> ops_;  // Shared with weights_ when it made them.
  // In device memory: this runner's own, or one copy for the process (options.shared_weights).
  std::shared_ptr<const DeviceWeights> weights_;
  LayerCallback layer_callback_;
  DeviceMemory memory_;  // The buffers below (not the weights).
  void* staging_ = nullptr;  // Host (pinned) metadata of one step.
  size_t staging_bytes_ = 0;

  // Device memory.
  uint8_t* kv_memory_ = nullptr;
  float* cos_sin_ = nullptr;
  float *x_ = nullptr, *q_ = nullptr, *k_ = nullptr, *v_ = nullptr, *tmp_ = nullptr,
        *gate_up_out_ = nullptr, *logits_ = nullptr, *partial_ = nullptr, *partial_ml_ = nullptr;
  uint16_t *h_ = nullptr, *attn_ = nullptr, *act_ = nullptr, *logit_in_ = nullptr;
  int32_t* meta_ = nullptr;  // Device copy of the staging area.
  int64_t max_partial_rows_splits_ = 0;
  int max_table_ = 0;
  bool graphs_failed_ = false;  // A capture failed: every step is enqueued op by op.  // Blocks per sequence at max_model_len: the graph steps' table stride.

  // This step's layout (host), valid during Forward.
  struct Step {
    int rows = 0, logit_rows = 0, decode_rows = 0, tiles = 0, table_stride = 0;
    int32_t *ids = nullptr, *positions = nullptr, *row_seq = nullptr, *tables = nullptr,
            *logit_index = nullptr, *decode_index = nullptr, *tile_first = nullptr,
            *tile_rows = nullptr;  // Device pointers into meta_.
    int split_tokens = 0, max_splits = 0;
  } step_;
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_ENGINE_DEVICE_MODEL_RUNNER_H_
