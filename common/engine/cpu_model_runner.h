// The CPU forward pass (backend "cpu"): the reference implementation and the small-deployment
// path. Linear layers in f32 over f32/bf16/f16 weights read in place, or (compute dtype bf16)
// bf16 activations x bf16 weights with f32 sums (VDPBF16PS); attention in f32, or (compute dtype
// bf16) Q.K^T and P.V in bf16 with an f32 softmax (attention_bf16.h); norms and activations in
// f32; KV pool in f32, bf16, int8 or int4.
//
// Cost per step for T tokens: 2 * T * (parameters in the projections) flops plus attention
// (4 * context * head_dim per query head per token); a decode step streams every weight once
// (ModelWeights::DecodeWeightBytes) plus each sequence's KV.
#ifndef PDSERVE_COMMON_ENGINE_CPU_MODEL_RUNNER_H_
#define PDSERVE_COMMON_ENGINE_CPU_MODEL_RUNNER_H_

#include <array>
#include <chrono>
#include <memory>
#include <vector>

#include "common/base/thread_pool.h"
#include "common/engine/cpu_matrices.h"
#include "common/engine/model_runner.h"
#include "common/kvcache/kv_pool.h"
#include "common/model/lora_adapter.h"
#include "common/model/model_weights.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/lora.h"
#include "kernels/cpu/ops.h"

namespace pdserve {

class CpuModelRunner : public ModelRunner {
 public:
  static absl::StatusOr<std::unique_ptr<CpuModelRunner>> Create(const ModelRunnerOptions& options,
                                                                const ModelWeights* weights,
                                                                KvPool* pool);
  absl::Status Forward(const ForwardBatch& batch, float* logits) override;
  std::string_view backend() const override { return "cpu"; }
  void SetLayerCallback(LayerCallback callback) override { layer_callback_ = std::move(callback); }
  int threads() const { return pool_threads_.num_threads(); }
  ForwardPhaseSeconds phase_seconds() const override { return phase_seconds_; }
  std::vector<absl::Span<const std::byte>> DecodeWeightMemory() const override {
    return matrices_->memory();
  }

 private:
  // Adds the time since the previous lap (or the start of Forward) to `phase`.
  void Lap(ForwardPhase phase) {
    const auto now = std::chrono::steady_clock::now();
    phase_seconds_[static_cast<int>(phase)] += std::chrono::duration<double>(now - lap_).count();
    lap_ = now;
  }
  CpuModelRunner(const ModelRunnerOptions& options, const ModelWeights* weights, KvPool* pool);
  absl::Status Validate(const ForwardBatch& batch) const;
  void Layer(int64_t layer, const ForwardBatch& batch, int64_t rows);
  // y = x W^T for `rows` rows (each of x's rows has the matrices' cols elements), choosing the
  // invariant f32 kernel, the bf16 kernel or OpenBLAS per the options; with `targets` (output
  // i is layer `layer`'s targets[i]), each row's LoRA term added (kernels/cpu/lora.h).
  void Project(const float* x, int64_t rows, int64_t ldx, const kernels::LinearOutput* outputs,
               int num_outputs, int64_t layer = -1, const LoraTarget* targets = nullptr);
  // The bf16 kernel over rows already rounded to bf16 (row length k); `lora`: PlanLoraDeltas
  // planned these outputs' terms.
  void ProjectBf16(const uint16_t* xb, int64_t rows, int64_t k, const kernels::LinearOutput* outputs,
                   int num_outputs, bool lora);
  bool ProjectsByBlas(int64_t rows) const;  // Project takes OpenBLAS for these rows.
  // The step's runs of consecutive rows with one LoRA adapter (empty: none in the batch).
  void PlanLora(const ForwardBatch& batch);
  // The LoRA terms of layer `layer` for these outputs (targets[i] -> outputs[i]) in lora_deltas_,
  // grouped by output (lora_first_), and the scratch sized; false when there are none.
  bool PlanLoraDeltas(int64_t layer, const LoraTarget* targets, int num_outputs,
                      const kernels::LinearOutput* outputs);
  // Calls `run` with the outputs, each with the expand of its deltas as its `after` (the shrink
  // done).
  void WithLoraEpilogues(const kernels::LinearOutput* outputs, int num_outputs, bool bf16,
                         absl::FunctionRef<void(const kernels::LinearOutput*)> run);
  struct Row {
    int32_t seq;       // Index into batch.sequences.
    int64_t position;
  };
  struct LoraRun {
    int64_t begin, end;  // Rows.
    const LoraAdapter* adapter;
  };
  // One call of the bf16 attention: a sequence's rows [row, row + count) (one chunk), query heads
  // [head_begin, head_end) of one KV head, tiles share, share + shares, ... of the chunk.
  struct AttentionItem {
    int32_t seq;
    int64_t row, count, share, shares;
    int64_t head_begin, head_end;
  };
  void AttentionF32(const ForwardBatch& batch, const kernels::KvPagesView& view, int64_t rows);
  void PlanAttentionBf16(const ForwardBatch& batch);  // Fills attn_items_, once per step.
  void AttentionBf16(const ForwardBatch& batch, const kernels::KvPagesView& view);

  const ModelRunnerOptions options_;
  LayerCallback layer_callback_;
  const ModelWeights* weights_;
  std::shared_ptr<const CpuMatrices> matrices_;  // What the linear layers read.
  const ModelConfig& config_;
  KvPool* kv_;
  ThreadPool pool_threads_;
  const bool bf16_attention_;  // attention_bf16.h (compute dtype bf16, options.bf16_attention).
  kernels::RopeParams rope_;
  float attn_scale_;
  ForwardPhaseSeconds phase_seconds_{};
  std::chrono::steady_clock::time_point lap_;

  // Scratch, sized at construction so a step allocates nothing.
  std::vector<Row> rows_;
  std::vector<float> x_, h_, q_, k_, v_, attn_, tmp_, gate_, up_, rope_cs_;
  std::vector<float> attn_scratch_;  // [threads][heads per KV head][max_model_len]
  size_t attn_scratch_per_thread_ = 0;
  std::vector<AttentionItem> attn_items_;  // Compute dtype bf16: this step's calls (per layer).
  std::unique_ptr<uint8_t[]> attn_bf16_scratch_;  // [threads][attn_bf16_scratch_bytes_]
  size_t attn_bf16_scratch_bytes_ = 0;
  std::vector<float> logit_in_;      // [max_logit_rows][hidden]
  std::vector<float> blas_scratch_;
  std::vector<uint16_t> x_bf16_;     // [max_batch_tokens][widest input] (compute dtype bf16)
  // LoRA: this step's runs, a layer's terms, and their A x rows (grown to the largest step's).
  std::vector<LoraRun> lora_runs_;
  std::vector<kernels::LoraDelta> lora_deltas_;
  std::array<int, 4> lora_first_{};
  std::vector<float> lora_scratch_;
  std::vector<uint16_t> lora_scratch_bf16_;
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_ENGINE_CPU_MODEL_RUNNER_H_
