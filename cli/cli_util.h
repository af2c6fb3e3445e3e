// Shared helpers of the subcommands: error reporting, exit codes, engine flags.
#ifndef PDSERVE_CLI_CLI_UTIL_H_
#define PDSERVE_CLI_CLI_UTIL_H_

#include <string>

#include "absl/status/status.h"
#include "cli/flags.h"
#include "common/engine/engine_options.h"

namespace pdserve::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;
inline constexpr int kExitUsage = 2;

// Prints "pdserve <command>: error: <message>" to stderr; returns the exit code for `status`
// (usage errors for InvalidArgument raised by flag parsing, 1 otherwise).
int ReportError(const std::string& command, const absl::Status& status, int code = kExitError);

// Parses flags; on --help prints usage and returns 0 through *exit_code; on error reports it.
// Returns true when the command should go on.
bool ParseFlagsOrExit(FlagSet& flags, const std::string& command, int argc, char** argv,
                      int* exit_code);

// Engine flags shared by generate, bench-engine and (later) the services.
struct EngineFlags {
  int64_t threads = 0;
  int64_t block_size = 16;
  std::string kv_dtype = "f32";
  double kv_cache_gib = 0.0;  // 0: 4 GiB of RAM (cpu), or by gpu_memory_utilization (cuda).
  double gpu_memory_utilization = 0.9;
  int64_t kv_blocks = 0;
  int64_t max_model_len = 0;
  int64_t max_num_seqs = 64;
  int64_t max_num_batched_tokens = 2048;
  bool prefix_caching = true;
  std::string prefill_gemm = "invariant";
  std::string compute_dtype = "auto";
  std::string weight_dtype = "auto";
  bool weight_huge_pages = true;
  std::string device = "cpu";
  // Speculative decoding (decode-side engines: generate, decode, serve, bench-engine).
  std::string speculative = "none";
  int64_t num_speculative_tokens = 5;
  int64_t spec_ngram_min = 2;
  int64_t spec_ngram_max = 4;
  int64_t spec_suffix_depth = 24;
  double spec_suffix_min_prob = 0.1;
  bool spec_step_budget = true;
  std::string structured_mask_overlap = "auto";
  // KV cache tiers: a directory for evicted and published prefix blocks, and its byte budget.
  std::string kv_offload_disk;
  double kv_offload_disk_gib = 16;
  double kv_offload_host_gib = 0;  // The host tier's budget (0: none).
  std::string kv_tier_load = "auto";  // EngineOptions::kv_tier_load.
  std::string kv_store, kv_store_password_file, kv_store_key_file;  // The shared store (Redis).
  std::string kv_store_tls_ca, kv_store_tls_cert, kv_store_tls_key;  // rediss://.
  int64_t kv_store_timeout_ms = 1000;
  // LoRA adapters: NAME=PATH,... (vLLM's --lora-modules), the largest rank accepted, the most
  // adapters kept loaded (0: no bound).
  std::string lora_modules;
  int64_t max_lora_rank = 16;
  int64_t max_cpu_loras = 0;
  int64_t max_loras = 0;
  bool lora_runtime_updates = false;  // --enable-lora-runtime-updates.

  // `speculative`: also the speculative decoding flags (not for prefill workers).
  void Register(FlagSet& flags, bool speculative = true);
  absl::Status ToOptions(EngineOptions* options) const;
  // The LoRA flags for the model at `model` (a directory or GGUF file, whose shape adapters must
  // fit): options->lora holds every --lora-modules adapter, loaded and checked; null without any
  // and without --enable-lora-runtime-updates (then an empty registry that takes runtime loads).
  absl::Status LoraToOptions(const std::string& model, EngineOptions* options) const;
};

}  // namespace pdserve::cli

#endif  // PDSERVE_CLI_CLI_UTIL_H_
