#include "common/engine/model_runner.h"

#include "common/base/strings.h"
#include "common/engine/cpu_model_runner.h"
#include "common/engine/device_model_runner.h"
#include "common/model/model_config.h"
#if PDSERVE_WITH_CUDA
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/cuda_device_ops.h"
#endif
#include "kernels/cpu/linear_bf16.h"

namespace pdserve {

std::string_view ComputeDTypeName(ComputeDType d) {
  switch (d) {
    case ComputeDType::kAuto: return "auto";
    case ComputeDType::kF32: return "f32";
    case ComputeDType::kBF16: return "bf16";
  }
  return "?";
}

std::string_view ForwardPhaseName(ForwardPhase phase) {
  switch (phase) {
    case ForwardPhase::kEmbedding: return "embedding";
    case ForwardPhase::kInputNorm: return "input_norm";
    case ForwardPhase::kQkv: return "qkv";
    case ForwardPhase::kRopeKvStore: return "rope_kv_store";
    case ForwardPhase::kLayerCallback: return "layer_callback";
    case ForwardPhase::kAttention: return "attention";
    case ForwardPhase::kOProjection: return "o_proj";
    case ForwardPhase::kResidualNorm: return "residual_norm";
    case ForwardPhase::kGateUp: return "gate_up";
    case ForwardPhase::kActivation: return "activation";
    case ForwardPhase::kDown: return "down";
    case ForwardPhase::kResidual: return "residual";
    case ForwardPhase::kLogits: return "logits";
  }
  return "?";
}

absl::StatusOr<ComputeDType> ParseComputeDType(std::string_view name) {
  if (name == "auto") return ComputeDType::kAuto;
  if (name == "f32") return ComputeDType::kF32;
  if (name == "bf16") return ComputeDType::kBF16;
  return absl::InvalidArgumentError(Str("'", name, "' is not f32, bf16 or auto"));
}

absl::StatusOr<ComputeDType> ResolveComputeDType(std::string_view backend, ComputeDType requested,
                                                 DType weights_dtype, PrefillGemm prefill_gemm) {
  if (requested == ComputeDType::kBF16 && prefill_gemm == PrefillGemm::kOpenBlas) {
    return absl::InvalidArgumentError(
        "compute dtype bf16 and the OpenBLAS prefill GEMM exclude each other (OpenBLAS computes "
        "in f32): choose --compute-dtype f32 or --prefill-gemm invariant");
  }
  if (backend == "cuda") {
    // The CUDA backend has one arithmetic: bf16 GEMMs with f32 accumulation (as vLLM and SGLang
    // serve bf16 checkpoints); an f32 checkpoint is rounded to bf16 at load.
    if (requested == ComputeDType::kF32) {
      return absl::InvalidArgumentError(
          "--device cuda computes in bf16: use --compute-dtype bf16 or auto");
    }
    return ComputeDType::kBF16;
  }
  if (requested != ComputeDType::kAuto) return requested;
  // As vLLM's CPU backend: compute in the checkpoint's dtype where the CPU does so natively.
  // (Where the bf16 instructions are switched off, PDSERVE_KERNEL_ISA=avx2, auto is f32: the
  // AVX2 twin computes the same bits as VDPBF16PS but is no faster than f32.)
  const bool native = backend == "cpu" && kernels::Bf16DotEnabled();
  return weights_dtype == DType::kBF16 && native && prefill_gemm == PrefillGemm::kInvariant
             ? ComputeDType::kBF16
             : ComputeDType::kF32;
}

absl::Status ValidateForwardBatch(const ForwardBatch& batch, const ModelRunnerOptions& options,
                                  int64_t block_size, int64_t num_blocks, int64_t vocab_size) {
  const int64_t tokens = batch.num_tokens();
  if (tokens < 1 || tokens > options.max_batch_tokens) {
    return absl::InvalidArgumentError(
        Str("batch has ", tokens, " tokens; this runner takes 1..", options.max_batch_tokens));
  }
  if (batch.num_logit_rows() > options.max_logit_rows) {
    return absl::InvalidArgumentError(Str("batch asks for ", batch.num_logit_rows(),
                                          " logit rows; at most ", options.max_logit_rows));
  }
  const int64_t bs = block_size;
  for (size_t i = 0; i < batch.sequences.size(); ++i) {
    const SequenceChunk& s = batch.sequences[i];
    const int64_t end = s.start_position + static_cast<int64_t>(s.tokens.size());
    if (s.tokens.empty() || s.start_position < 0 || end > options.max_model_len) {
      return absl::InvalidArgumentError(Str("sequence ", i, ": positions [", s.start_position,
                                            ", ", end, ") outside [0, ", options.max_model_len,
                                            "]"));
    }
    if (s.num_logits < 0 || s.num_logits > static_cast<int64_t>(s.tokens.size())) {
      return absl::InvalidArgumentError(Str("sequence ", i, ": asks for logits of ", s.num_logits,
                                            " of its ", s.tokens.size(), " tokens"));
    }
    if (static_cast<int64_t>(s.block_table.size()) * bs < end) {
      return absl::InvalidArgumentError(Str("sequence ", i, ": block table holds ",
                                            s.block_table.size() * bs, " tokens, needs ", end));
    }
    for (int32_t b : s.block_table) {
      if (b < 0 || b >= num_blocks) {
        return absl::InvalidArgumentError(Str("sequence ", i, ": block id ", b, " out of range"));
      }
    }
    for (int32_t t : s.tokens) {
      if (t < 0 || t >= vocab_size) {
        return absl::InvalidArgumentError(Str("sequence ", i, ": token id ", t,
                                              " outside the vocabulary of ", vocab_size));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<size_t> KvBudgetFromDeviceMemory(size_t total, double utilization,
                                                const ModelConfig& c, int64_t max_batch_tokens,
                                                int engines) {
  if (engines < 1) return absl::InvalidArgumentError("engines per device must be >= 1");
  // bf16 weights: every matrix, the embedding (f32 where the checkpoint is not bf16: at most 2x).
  const double weights = 2.0 * static_cast<double>(c.NumParameters()) +
                         2.0 * static_cast<double>(c.vocab_size * c.hidden_size);
  // Per batched token: residual, q, k, v, gate|up, tmp in f32; h, attention, activation in bf16.
  const double per_token = 4.0 * (2 * c.hidden_size + c.q_size() + 2 * c.kv_size() +
                                  2 * c.intermediate_size) +
                           2.0 * (c.hidden_size + c.q_size() + c.intermediate_size);
  const double buffers = per_token * static_cast<double>(max_batch_tokens) + (1ull << 30);
  // One copy of the weights for all the engines (SharedWeights::Device), then equal shares.
  const double budget = (utilization * static_cast<double>(total) - weights) / engines - buffers;
  if (budget <= 0) {
    return absl::ResourceExhaustedError(
        Str("--gpu-memory-utilization ", utilization, " of the GPU's ", total >> 20,
            " MiB does not hold the model's weights (", static_cast<int64_t>(weights) >> 20,
            " MiB) and ", engines, engines == 1 ? " engine's" : " engines'", " buffers (",
            static_cast<int64_t>(buffers) >> 20, " MiB each)"));
  }
  return static_cast<size_t>(budget);
}

absl::StatusOr<size_t> DeviceKvBudgetBytes(std::string_view backend, double utilization,
                                           const ModelConfig& c, int64_t max_batch_tokens,
                                           int engines) {
  if (backend != "cuda") return absl::UnimplementedError("only a device backend has its own memory");
  size_t total = 0;
#if PDSERVE_WITH_CUDA
  total = cuda::DeviceMemoryBytes();
#endif
  if (total == 0) return absl::UnavailableError("--device cuda: no GPU to size the KV cache from");
  return KvBudgetFromDeviceMemory(total, utilization, c, max_batch_tokens, engines);
}

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateModelRunner(std::string_view backend,
                                                               const ModelRunnerOptions& options,
                                                               const ModelWeights* weights,
                                                               KvPool* pool) {
  if (backend == "cpu") {
    auto runner = CpuModelRunner::Create(options, weights, pool);
    if (!runner.ok()) return runner.status();
    return std::unique_ptr<ModelRunner>(std::move(*runner));
  }
  if (backend == "cuda") {
#if PDSERVE_WITH_CUDA
    auto ops = cuda::CreateCudaDeviceOps();
    if (!ops.ok()) return ops.status();
    auto runner = DeviceModelRunner::Create(options, weights, pool, std::move(*ops));
    if (!runner.ok()) return runner.status();
    return std::unique_ptr<ModelRunner>(std::move(*runner));
#else
    return absl::UnavailableError("this pdserve was built without CUDA (PDSERVE_CUDA=OFF or no nvcc)");
#endif
  }
  return absl::InvalidArgumentError(Str("unknown model runner backend '", backend,
                                        "' (available: cpu, cuda)"));
}

}  // namespace pdserve
