#include "cli/planner_flags.h"

#include "common/base/file_util.h"
#include "common/base/strings.h"

namespace pdserve::cli {

void PlannerFlags::Register(FlagSet& flags) {
  flags.String("planner-profile", &profile,
               "a `pdserve profile` of the workers: re-plan the deployment every interval and export "
               "pdserve_planner_desired_workers{tier} (off when empty)");
  flags.Double("planner-slo-ttft-ms", &options.slo_ttft_ms, "planner: time-to-first-token target, ms");
  flags.Double("planner-slo-tpot-ms", &options.slo_tpot_ms, "planner: time-per-output-token target, ms");
  flags.Double("planner-attainment", &options.attainment, "planner: share of requests that must meet both");
  flags.Int("planner-min-prefill", &options.min_prefill, "planner: fewest prefill workers");
  flags.Int("planner-min-decode", &options.min_decode, "planner: fewest decode workers");
  flags.Int("planner-max-workers", &options.max_workers, "planner: most workers of both tiers together");
  flags.Double("planner-headroom", &options.headroom, "planner: plan for the observed rate x this (>= 1)");
  flags.Int("planner-sample-requests", &options.sample_requests, "planner: requests per simulated sample");
  flags.Double("planner-interval-seconds", &options.interval_seconds, "planner: how often it re-plans");
  flags.Double("planner-scale-down-delay-seconds", &options.scale_down_delay_seconds,
               "planner: a lower count is published only once every plan for this long asked for it");
  flags.Double("planner-kv-memory-gib", &kv_memory_gib, "planner: each worker's KV cache, GiB (as the workers')");
  flags.Int("planner-kv-blocks", &kv_blocks, "planner: each worker's KV blocks (overrides --planner-kv-memory-gib)");
  flags.Int("planner-max-num-seqs", &options.cluster.worker.max_num_seqs, "planner: the workers' --max-num-seqs");
  flags.Int("planner-max-num-batched-tokens", &options.cluster.worker.max_num_batched_tokens,
            "planner: the workers' --max-num-batched-tokens");
}

absl::StatusOr<std::optional<OnlinePlannerOptions>> PlannerFlags::ToOptions(int64_t block_size,
                                                                            RoutingPolicy policy) const {
  if (profile.empty()) return std::optional<OnlinePlannerOptions>();
  auto text = ReadFileToString(profile);
  if (!text.ok()) return absl::InvalidArgumentError(Str("--planner-profile: cannot read '", profile, "'"));
  OnlinePlannerOptions o = options;
  auto p = ParseSimProfile(*text, profile);
  if (!p.ok()) return absl::InvalidArgumentError(Str("--planner-profile: ", p.status().message()));
  o.profile = *p;
  o.cluster.routing.policy = policy;
  SimWorker::Options& w = o.cluster.worker;
  w.block_size = block_size;
  if (w.max_num_seqs < 1 || w.max_num_batched_tokens < 1) {
    return absl::InvalidArgumentError("--planner-max-num-seqs, --planner-max-num-batched-tokens: must be >= 1");
  }
  w.max_model_len = 0;  // The profile's, within the pool.
  if (absl::Status s = SizeWorkerPool(o.profile, kv_blocks, kv_memory_gib, "--planner-", &w); !s.ok()) return s;
  if (absl::Status s = CheckOnlinePlannerOptions(o); !s.ok()) return s;
  return std::optional<OnlinePlannerOptions>(o);
}

}  // namespace pdserve::cli
