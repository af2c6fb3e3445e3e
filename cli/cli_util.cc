#include "cli/cli_util.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "absl/strings/ascii.h"
#include "absl/strings/str_split.h"
#include "common/base/file_util.h"
#include "common/base/status_macros.h"
#include "common/base/strings.h"
#include "common/kvcache/disk_tier.h"
#include "common/kvcache/host_tier.h"
#include "common/transport/pool_device.h"
#include "common/kvcache/redis_tier.h"
#include "common/model/gguf_model.h"
#include "common/model/lora_registry.h"

namespace pdserve::cli {

int ReportError(const std::string& command, const absl::Status& status, int code) {
  std::fprintf(stderr, "pdserve %s: error: %s\n", command.c_str(),
               std::string(status.message()).c_str());
  return code;
}

bool ParseFlagsOrExit(FlagSet& flags, const std::string& command, int argc, char** argv,
                      int* exit_code) {
  const absl::Status s = flags.Parse(argc, argv);
  if (flags.help_requested()) {
    std::fputs(flags.Usage().c_str(), stdout);
    *exit_code = kExitOk;
    return false;
  }
  if (!s.ok()) {
    *exit_code = ReportError(command, s, kExitUsage);
    return false;
  }
  return true;
}

void EngineFlags::Register(FlagSet& flags, bool with_speculative) {
  if (with_speculative) {
    flags.String("speculative", &speculative,
                 "speculative decoding: none, ngram (drafts from the request's own prompt and "
                 "output by n-gram lookup) or suffix (suffix decoding: the most frequent "
                 "continuation in an index of the request's tokens and of this worker's recent "
                 "outputs); drafts are verified in the next step and the output is identical to "
                 "plain decoding, only faster where text repeats");
    flags.Int("num-speculative-tokens", &num_speculative_tokens,
              "the most drafted tokens per decode step (a request may ask for fewer)");
    flags.Int("spec-ngram-min", &spec_ngram_min, "ngram: the shortest context suffix matched");
    flags.Int("spec-ngram-max", &spec_ngram_max, "ngram: the longest context suffix matched (tried first)");
    flags.Int("spec-suffix-depth", &spec_suffix_depth,
              "suffix: the longest substring indexed, match and draft together (memory: up to this "
              "many index nodes per token of a request)");
    flags.Double("spec-suffix-min-prob", &spec_suffix_min_prob,
                 "suffix: draft a token while its share of the matched continuations is at least this");
    flags.Bool("spec-step-budget", &spec_step_budget,
               "keep only the drafted tokens that pay by the measured cost of this machine's "
               "steps, and pause drafting that costs more than it saves (false: every draft the "
               "per-request adaptation allows)");
  }
  flags.Int("threads", &threads, "compute threads (0: all cores)");
  flags.String("lora-modules", &lora_modules,
               "LoRA adapters to serve, NAME=PATH,... (PEFT directories: adapter_config.json and "
               "adapter_model.safetensors); a request names one as its model");
  flags.Int("max-lora-rank", &max_lora_rank, "the largest LoRA rank (r) an adapter may have");
  flags.Int("max-loras", &max_loras,
            "the most LoRA adapters among the requests running at once (0: no bound); a request "
            "of another adapter waits for one of them to end");
  flags.Int("max-cpu-loras", &max_cpu_loras,
            "the most LoRA adapters kept loaded (0: all); the least recently used one no request "
            "runs with is dropped and loaded again from its directory when asked for");
  flags.Bool("enable-lora-runtime-updates", &lora_runtime_updates,
             "let adapters be loaded and unloaded while serving (POST /v1/load_lora_adapter and "
             "/v1/unload_lora_adapter on the router, behind the API key; workers take them from "
             "the router)");
  flags.Int("block-size", &block_size, "KV cache block size in tokens");
  flags.String("kv-dtype", &kv_dtype, "KV cache dtype: f32, bf16, int8 or int4 (int8/int4: symmetric codes with an f32 scale per token and head, in the page)");
  flags.Double("kv-memory-gib", &kv_cache_gib,
               "KV cache memory in GiB (0: 4 GiB of RAM on --device cpu; on cuda what "
               "--gpu-memory-utilization leaves)");
  flags.Double("gpu-memory-utilization", &gpu_memory_utilization,
               "--device cuda: the share of the GPU's memory for weights, buffers and the KV "
               "cache, as vLLM's (two workers on one GPU: give each its share)");
  flags.Int("kv-blocks", &kv_blocks, "KV cache size in blocks (overrides --kv-memory-gib)");
  flags.Int("max-model-len", &max_model_len,
            "longest sequence (0: the model's, capped to what the KV cache holds)");
  flags.Int("max-num-seqs", &max_num_seqs, "sequences per step");
  flags.Int("max-num-batched-tokens", &max_num_batched_tokens, "token budget per step");
  flags.Bool("enable-prefix-caching", &prefix_caching, "reuse KV of shared prompt prefixes");
  flags.String("prefill-gemm", &prefill_gemm,
               "invariant (bitwise batch-invariant kernels) or openblas (faster prefill)");
  flags.Bool("weight-huge-pages", &weight_huge_pages,
             "copy the linear layers' weights into transparent huge pages (faster decode; one "
             "copy of them in RAM)");
  flags.String("device", &device,
               "cpu, or cuda (the forward pass on GPU 0: bf16 weights and GEMMs with f32 sums, "
               "the KV pool in device memory)");
  flags.String("weight-dtype", &weight_dtype,
               "auto (the weights as stored: a checkpoint's float dtype, a GGUF file's blocks), "
               "q8_0, q4_k or q4_k_m (float matrices quantized on load to llama.cpp's Q8_0, Q4_K, "
               "or Q4_K_M's mix of Q4_K and Q6_K; rows that are not whole blocks fall back to "
               "Q8_0 or stay as they are), f32, f16 or bf16 (every matrix converted on load, a "
               "GGUF file's blocks included)");
  flags.String("structured-mask-overlap", &structured_mask_overlap,
               "structured outputs: compute a step's new token masks on a second thread during "
               "its forward pass: auto (on for --device cuda), true or false");
  flags.String("kv-offload-disk", &kv_offload_disk,
               "KV cache tier on disk: a directory where published prefix blocks are kept beyond "
               "the pool (checked on load, LRU under --kv-offload-disk-gib, kept across restarts); "
               "a request whose next prefix blocks are there loads them instead of computing them");
  flags.Double("kv-offload-disk-gib", &kv_offload_disk_gib, "--kv-offload-disk: its byte budget, GiB");
  flags.Double("kv-offload-host-gib", &kv_offload_host_gib,
               "KV cache tier in host memory (pinned for --device cuda): GiB for published prefix "
               "blocks beyond the pool, LRU, asked before the disk and the store; the process's "
               "engines share it (0: none)");
  flags.String("kv-tier-load", &kv_tier_load,
               "when a prefix found in the KV tiers is loaded: always, faster (only when loading "
               "it is expected to end sooner than computing it, by the tiers' and the engine's "
               "measured speeds) or auto (faster on --device cuda, always on cpu)");
  flags.String("kv-store", &kv_store,
               "shared KV tier: redis://HOST:PORT[,HOST:PORT...] (blocks sharded by hash across the "
               "servers); published prefix blocks are written through to it and any worker loads "
               "the prefixes any worker computed (asked after the pool and --kv-offload-disk)");
  flags.String("kv-store-password-file", &kv_store_password_file,
               "--kv-store: a file holding PASSWORD or USER:PASSWORD for Redis AUTH (an ACL user)");
  flags.String("kv-store-key-file", &kv_store_key_file,
               "--kv-store: a file holding a secret; every block is signed with HMAC-SHA256 under it "
               "and a block whose signature fails is never used (a store others can write)");
  flags.Int("kv-store-timeout-ms", &kv_store_timeout_ms, "--kv-store: connect and command timeout");
  flags.String("kv-store-tls-ca", &kv_store_tls_ca,
               "--kv-store rediss://: the CA (PEM) the servers' certificates are verified against "
               "(default: the system's CAs); a certificate must name the host as the URL does");
  flags.String("kv-store-tls-cert", &kv_store_tls_cert,
               "--kv-store rediss://: a client certificate (PEM), for servers with tls-auth-clients");
  flags.String("kv-store-tls-key", &kv_store_tls_key, "--kv-store-tls-cert's private key (PEM)");
  flags.String("compute-dtype", &compute_dtype,
               "linear layers in f32, bf16 (bf16 activations x bf16 weights, f32 sums; "
               "batch-invariant too) or auto (bf16 when the weights are bf16 and the CPU has "
               "AVX512-BF16)");
}

absl::Status EngineFlags::ToOptions(EngineOptions* o) const {
  o->threads = static_cast<int>(threads);
  o->block_size = block_size;
  const absl::StatusOr<KvDType> kv = ParseKvDType(kv_dtype);
  if (!kv.ok()) return absl::InvalidArgumentError(Str("--kv-dtype: ", kv.status().message()));
  o->kv_dtype = *kv;
  if (!(kv_cache_gib >= 0)) return absl::InvalidArgumentError("--kv-memory-gib: must be >= 0");
  if (!(gpu_memory_utilization > 0 && gpu_memory_utilization <= 1)) {
    return absl::InvalidArgumentError("--gpu-memory-utilization: must be in (0, 1]");
  }
  o->gpu_memory_utilization = gpu_memory_utilization;
  if (kv_blocks < 0) return absl::InvalidArgumentError("--kv-blocks: must be >= 0");
  o->kv_cache_gib = kv_cache_gib;
  o->num_kv_blocks = kv_blocks;
  o->max_model_len = max_model_len;
  o->max_num_seqs = max_num_seqs;
  o->max_num_batched_tokens = max_num_batched_tokens;
  o->enable_prefix_caching = prefix_caching;
  if (prefill_gemm == "invariant") {
    o->prefill_gemm = PrefillGemm::kInvariant;
  } else if (prefill_gemm == "openblas") {
    o->prefill_gemm = PrefillGemm::kOpenBlas;
  } else {
    return absl::InvalidArgumentError(
        Str("--prefill-gemm: '", prefill_gemm, "' is not invariant or openblas"));
  }
  auto compute = ParseComputeDType(compute_dtype);
  if (!compute.ok()) return absl::InvalidArgumentError(Str("--compute-dtype: ", compute.status().message()));
  o->compute_dtype = *compute;
  o->weight_huge_pages = weight_huge_pages;
  auto format = ParseWeightFormat(weight_dtype);
  if (!format.ok()) return absl::InvalidArgumentError(Str("--weight-dtype: ", format.status().message()));
  o->weight_dtype = *format;
  if (device != "cpu" && device != "cuda") {
    return absl::InvalidArgumentError(Str("--device: '", device, "' is not cpu or cuda"));
  }
  o->backend = device;
  if (structured_mask_overlap == "auto") {
    o->overlap_masks = -1;
  } else if (structured_mask_overlap == "true" || structured_mask_overlap == "false") {
    o->overlap_masks = structured_mask_overlap == "true" ? 1 : 0;
  } else {
    return absl::InvalidArgumentError(Str("--structured-mask-overlap: '", structured_mask_overlap,
                                          "' is not auto, true or false"));
  }
  if (kv_cache_gib == 0 && device == "cpu") o->kv_cache_gib = 4.0;
  if (o->compute_dtype == ComputeDType::kBF16 && o->prefill_gemm == PrefillGemm::kOpenBlas) {
    return absl::InvalidArgumentError(
        "--compute-dtype bf16 and --prefill-gemm openblas exclude each other (OpenBLAS computes in "
        "f32)");
  }
  if (kv_tier_load == "auto" || kv_tier_load == "always" || kv_tier_load == "faster") {
    o->kv_tier_load = kv_tier_load == "always"   ? KvTierLoad::kAlways
                      : kv_tier_load == "faster" ? KvTierLoad::kFaster
                                                 : KvTierLoad::kAuto;
  } else {
    return absl::InvalidArgumentError(Str("--kv-tier-load: '", kv_tier_load, "' is not auto, always or faster"));
  }
  // 1 PiB at most: the byte count must fit an int64 (a larger value would overflow the cast).
  constexpr double kMaxGib = 1 << 20;
  if (!(kv_offload_host_gib >= 0) || !(kv_offload_host_gib <= kMaxGib)) {
    return absl::InvalidArgumentError("--kv-offload-host-gib: must be >= 0 and at most 1048576 (1 PiB)");
  }
  std::shared_ptr<PoolDevice> pinner;  // --device cuda: pins the host tier's memory.
  if (device == "cuda") {
    o->kv_tier_device = [] { return CreatePoolDevice("cuda"); };
    if (kv_offload_host_gib > 0) {
      auto d = CreatePoolDevice("cuda");
      if (!d.ok()) return absl::Status(d.status().code(), Str("--kv-offload-host-gib: ", d.status().message()));
      pinner = std::move(*d);
    }
  }
  if (kv_offload_host_gib > 0) {
    HostTierOptions ho;
    ho.budget_bytes = static_cast<int64_t>(kv_offload_host_gib * static_cast<double>(int64_t{1} << 30));
    if (device == "cpu") ho.event_medium = "HOST";  // The pool's own events are "CPU".
    if (pinner != nullptr) {
      ho.pin = [pinner](void* p, size_t n) { return pinner->PinHost(p, n); };
      ho.unpin = [pinner](void* p) { pinner->UnpinHost(p); };
    }
    auto tier = HostTier::Create(std::move(ho));
    if (!tier.ok()) return tier.status();
    o->kv_tiers.push_back(std::shared_ptr<KvTier>(std::move(*tier)));
  }
  if (!kv_offload_disk.empty()) {
    if (!(kv_offload_disk_gib > 0) || !(kv_offload_disk_gib <= kMaxGib)) {
      return absl::InvalidArgumentError("--kv-offload-disk-gib: must be > 0 and at most 1048576 (1 PiB)");
    }
    auto tier = DiskTier::Open(
        {kv_offload_disk, static_cast<int64_t>(kv_offload_disk_gib * static_cast<double>(int64_t{1} << 30))});
    if (!tier.ok()) return tier.status();
    o->kv_tiers.push_back(std::shared_ptr<KvTier>(std::move(*tier)));
  }
  if (kv_store.empty() && (!kv_store_password_file.empty() || !kv_store_key_file.empty() ||
                            !kv_store_tls_ca.empty() || !kv_store_tls_cert.empty() || !kv_store_tls_key.empty())) {
    return absl::InvalidArgumentError("--kv-store-password-file/-key-file/-tls-ca/-tls-cert/-tls-key: need --kv-store");
  }
  if (!kv_store.empty()) {
    RedisTierOptions ro;
    PD_RETURN_IF_ERROR(ParseRedisUrl(kv_store, &ro));
    if (!kv_store_password_file.empty()) PD_RETURN_IF_ERROR(ReadRedisPasswordFile(kv_store_password_file, &ro));
    ro.tls_options = {kv_store_tls_ca, kv_store_tls_cert, kv_store_tls_key};
    if (!kv_store_key_file.empty()) {
      auto key = ReadFileToString(kv_store_key_file);
      if (!key.ok()) return absl::InvalidArgumentError(Str("--kv-store-key-file: ", key.status().message()));
      if (key->size() < 16) {
        return absl::InvalidArgumentError("--kv-store-key-file: the key must be at least 16 bytes");
      }
      ro.hmac_key = std::move(*key);
    }
    if (kv_store_timeout_ms < 1 || kv_store_timeout_ms > 600000) {
      return absl::InvalidArgumentError("--kv-store-timeout-ms: must be in [1, 600000]");
    }
    ro.timeout_ms = static_cast<int>(kv_store_timeout_ms);
    auto tier = RedisTier::Open(ro);
    if (!tier.ok()) return tier.status();
    o->kv_tiers.push_back(std::shared_ptr<KvTier>(std::move(*tier)));
  }
  if (threads < 0) return absl::InvalidArgumentError("--threads: must be >= 0");
  if (block_size < 1) return absl::InvalidArgumentError("--block-size: must be positive");
  if (max_num_seqs < 1) return absl::InvalidArgumentError("--max-num-seqs: must be positive");
  if (max_num_batched_tokens < 1) {
    return absl::InvalidArgumentError("--max-num-batched-tokens: must be positive");
  }
  if (max_model_len < 0) return absl::InvalidArgumentError("--max-model-len: must be >= 0");
  PD_ASSIGN_OR_RETURN(o->speculative.method, ParseSpeculativeMethod(speculative));
  constexpr int64_t kLimit = 1 << 20;  // Validate names the real bounds; this keeps the casts exact.
  o->speculative.num_tokens = static_cast<int32_t>(std::clamp<int64_t>(num_speculative_tokens, -1, kLimit));
  o->speculative.ngram_min = static_cast<int32_t>(std::clamp<int64_t>(spec_ngram_min, -1, kLimit));
  o->speculative.ngram_max = static_cast<int32_t>(std::clamp<int64_t>(spec_ngram_max, -1, kLimit));
  o->speculative.suffix_depth = static_cast<int32_t>(std::clamp<int64_t>(spec_suffix_depth, -1, kLimit));
  o->speculative.suffix_min_prob = spec_suffix_min_prob;
  o->speculative.step_budget = spec_step_budget;
  return o->speculative.Validate();
}

absl::Status EngineFlags::LoraToOptions(const std::string& model, EngineOptions* o) const {
  if (max_lora_rank < 1 || max_lora_rank > kMaxLoraRankLimit) {
    return absl::InvalidArgumentError(Str("--max-lora-rank: must be in [1, ", kMaxLoraRankLimit, "]"));
  }
  if (max_cpu_loras < 0) return absl::InvalidArgumentError("--max-cpu-loras: must be >= 0");
  if (max_loras < 0) return absl::InvalidArgumentError("--max-loras: must be >= 0");
  if (max_cpu_loras > 0 && max_cpu_loras < max_loras) {
    return absl::InvalidArgumentError(Str("--max-cpu-loras: ", max_cpu_loras, " is fewer than --max-loras (",
                                          max_loras, "): the adapters running must all be loaded"));
  }
  o->max_loras = max_loras;
  if (lora_modules.empty() && !lora_runtime_updates) return absl::OkStatus();
  PD_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(model));
  auto registry = std::make_shared<LoraRegistry>(
      config, LoraRegistryOptions{.max_rank = max_lora_rank,
                                  .max_loaded = max_cpu_loras,
                                  .runtime_updates = lora_runtime_updates});
  for (absl::string_view item : absl::StrSplit(lora_modules, ',', absl::SkipWhitespace())) {
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos || eq == 0 || eq + 1 == item.size()) {
      return absl::InvalidArgumentError(
          Str("--lora-modules: '", item, "' is not NAME=PATH (e.g. psalms=models/pdserve-demo-lora)"));
    }
    const std::string name(absl::StripAsciiWhitespace(item.substr(0, eq)));
    const std::string path(absl::StripAsciiWhitespace(item.substr(eq + 1)));
    if (absl::Status s = registry->Add(name, path); !s.ok()) {
      return absl::Status(s.code() == absl::StatusCode::kNotFound ? absl::StatusCode::kInvalidArgument
                                                                  : s.code(),
                          Str("--lora-modules: ", s.message()));
    }
  }
  o->lora = std::move(registry);
  return absl::OkStatus();
}

}  // namespace pdserve::cli
