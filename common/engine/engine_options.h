// Configuration of one engine (a worker's model, KV cache and scheduler). Filled by the CLI from
// flags (and environment variables for Kubernetes); defaults follow vLLM where it has one.
#ifndef PDSERVE_COMMON_ENGINE_ENGINE_OPTIONS_H_
#define PDSERVE_COMMON_ENGINE_ENGINE_OPTIONS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

#include "common/base/dtype.h"
#include "common/base/ggml_types.h"
#include "common/engine/model_runner.h"
#include "common/engine/speculative.h"
#include "common/model/weight_format.h"

namespace pdserve {

class KvPool;
class ModelWeights;
class SharedWeights;
class KvTier;
class LoraRegistry;
class PoolDevice;

enum class KvTierLoad { kAuto, kAlways, kFaster };

struct EngineOptions {
  std::string backend = "cpu";
  int threads = 0;                     // <= 0: all cores.
  int64_t block_size = 16;
  KvDType kv_dtype = KvDType::kF32;    // f32, bf16, int8 or int4.
  double kv_cache_gib = 4.0;           // KV pool size (vLLM CPU's default KV space is 4 GiB);
                                       // <= 0 with backend cuda: sized by gpu_memory_utilization.
  double gpu_memory_utilization = 0.9;  // Backend cuda: the share of the GPU's memory to use.
  // Backend cuda: engines of this process on the GPU reading one copy of the weights through
  // shared_weights (serve: its prefill and decode workers, 2); each sizes its KV cache to its
  // share of what gpu_memory_utilization leaves.
  int engines_per_device = 1;
  int64_t num_kv_blocks = 0;           // > 0 overrides kv_cache_gib (tests).
  int64_t max_num_seqs = 64;           // Running sequences per step.
  int64_t max_num_batched_tokens = 2048;  // Token budget per step (prefill chunks + decodes).
  int64_t max_model_len = 0;           // 0: the model's max_position_embeddings, capped to what
                                       // the KV pool holds.
  bool enable_prefix_caching = true;
  bool enable_kv_events = false;       // Log prefix-cache changes for routers (workers drain them).
  // The stored events also carry each block's tokens (KV events in vLLM's format need them;
  // pdserve's routers do not: off, no copy per stored block).
  bool kv_event_tokens = false;
  SpeculativeOptions speculative;      // Drafts verified per decode step (off by default).
  // Structured outputs need each token's bytes: the tokenizer (a directory or tokenizer.json, or
  // a GGUF file), loaded at the first constrained request. Empty: the model's.
  std::string tokenizer;
  // Structured outputs: compute the masks a step will need on a second thread while its forward
  // pass runs (those not computed before). Worth it where the forward pass leaves a core idle
  // (a GPU's); on a CPU whose cores all compute the forward pass it only contends. -1: on for
  // backend cuda, off for cpu; 0 off; 1 on.
  int overlap_masks = -1;
  PrefillGemm prefill_gemm = PrefillGemm::kInvariant;
  ComputeDType compute_dtype = ComputeDType::kAuto;  // Resolved in LLMEngine::Create.
  bool weight_huge_pages = true;  // ModelRunnerOptions::weight_huge_pages.
  // A format to quantize the model's float matrices to on load (--weight-dtype q4_k_m).
  WeightFormat weight_dtype = WeightFormat::kAsStored;
  // KV cache tiers (kv_tier.h): the process's tiers (the engines of one process share them),
  // local ones first, or none. Published prefix blocks are offered to each, and a request's next
  // prefix blocks loaded from the first that has each; `kv_offload_buffers` blocks may wait for a
  // store at once (more are dropped and counted: a store never slows a step).
  std::vector<std::shared_ptr<KvTier>> kv_tiers;
  int64_t kv_offload_buffers = 64;
  // A backend whose pool is in device memory reaches it for the tiers through PoolDevices this
  // makes (two: one for the scheduler thread's copies, one for the I/O thread's): --device cuda's
  // is CreateCudaPoolDevice; tests give a host stand-in. Unset: such a backend refuses tiers.
  std::function<absl::StatusOr<std::unique_ptr<PoolDevice>>()> kv_tier_device;
  // Whether a request's prefix found in the tiers is loaded: always, or only when loading it is
  // expected to be done sooner than computing it (the tiers' measured seconds a block, the
  // loads already queued included, against the engine's measured prefill seconds a token);
  // auto: the latter on a device backend (a GPU computes a prefix faster than a slow tier reads
  // it), always on cpu (every tier measured here reads faster than the CPU computes).
  KvTierLoad kv_tier_load = KvTierLoad::kAuto;
  // Engines of one process (serve's prefill and decode workers) given one object load the model
  // and make the cpu runner's matrix copies once between them (shared_weights.h). Null: their own.
  std::shared_ptr<SharedWeights> shared_weights;
  // The LoRA adapters requests may name (SamplingParams::lora_name); shared by the process's
  // engines. Null: none (a request naming one is refused). The cpu backend only.
  std::shared_ptr<LoraRegistry> lora;
  // LoRA adapters among a step's running requests at most (--max-loras; 0: no bound).
  int64_t max_loras = 0;
  // Tests only: makes the runner instead of CreateModelRunner(backend), e.g. the cuda backend's
  // runner over the host execution layer (its compute dtype still resolved for `backend`).
  std::function<absl::StatusOr<std::unique_ptr<ModelRunner>>(const ModelRunnerOptions&,
                                                             const ModelWeights*, KvPool*)>
      runner_factory;
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_ENGINE_ENGINE_OPTIONS_H_
