// Choosing a worker for a request. Pure functions over a snapshot of the tier, so they are unit
// tested without any RPC.
//
// kv_aware (default) scores each worker, lowest wins:
//   w_prefix * (blocks_still_to_prefill + w_tier * blocks_in_its_tiers) + load + share_excess
//   load         = active_blocks + w_queue * waiting
//   share_excess = w_recent * prompt_blocks * (recent_blocks / mean recent_blocks - 1)
// where blocks_in_its_tiers are the prompt's blocks after the longest prefix the worker's pool
// holds that its KV cache tiers hold (its disk, or the shared store: loaded, not computed),
// blocks_still_to_prefill the prompt's blocks past both,
// active_blocks the blocks its running sequences hold (plus those this router sent it since its
// last report), waiting its queue, and recent_blocks the prompt blocks this router sent it lately
// (decaying with a half-life). share_excess is how far over (or under) its share of the recent
// traffic a worker is, in units of this prompt: it keeps a popular prefix from taking every
// request at low concurrency, where load is ~0 everywhere, and it stays bounded whatever the
// request rate, so a cached prefix keeps its weight. (A first version added w_recent *
// recent_blocks itself: that grows with the rate, and at 25 requests/s its noise between workers
// outweighed a 4-block prefix, so kv_aware routed nearly round robin.)
// Two guards keep a popular prefix from herding everyone onto one worker when it is loaded: when
// the tier is skewed (max load - min load above `imbalance_min_blocks` and (max load + 1) /
// (min load + 1) above `imbalance_ratio`) the choice falls back to least_loaded; and with
// temperature > 0 the choice is sampled with probability proportional to
// exp(-score / (temperature * spread)), which spreads ties and keeps several routers from picking
// the same "best" worker. Exact ties go to the first candidate at or after the round-robin
// position, so equal workers take turns.
// A request of a LoRA adapter adds w_lora * lora_load to kv_aware's score (inside the guard, as the
// prefix term): 0 where the worker has the adapter in memory (its report, or this router sent it
// one lately), 1 where it must read it from disk into free room, 2 where that also drops another
// adapter (--max-cpu-loras full: a later request of that one pays again). So an adapter's
// requests gather on the workers that hold it (llm-d's LoRA affinity) while loads stay even.
// least_loaded scores load + share_excess.
#ifndef PDSERVE_ROUTER_ROUTING_POLICY_H_
#define PDSERVE_ROUTER_ROUTING_POLICY_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace pdserve {

enum class RoutingPolicy { kRoundRobin, kLeastLoaded, kKvAware };
absl::StatusOr<RoutingPolicy> ParseRoutingPolicy(std::string_view name);
std::string_view RoutingPolicyName(RoutingPolicy policy);

struct RoutingOptions {
  RoutingPolicy policy = RoutingPolicy::kKvAware;
  double w_prefix = 1.0;
  // What a block loaded from a KV cache tier costs against computing it (1): loading it from the
  // shared store took 0.06-0.11 of computing it in bench/kv_tier_bench.py (RESULTS "KV cache tiers").
  double w_tier = 0.1;
  double w_queue = 4.0;
  double w_recent = 1.0;
  // Both beyond: least_loaded. Small absolute differences (a request or two on an idle tier)
  // are not skew: the score itself weighs them against the prefix.
  double imbalance_ratio = 3.0;     // (max load + 1) / (min load + 1).
  double imbalance_min_blocks = 64;  // max load - min load.
  double temperature = 0.0;      // > 0: softmax sampling.
  // What reading a LoRA adapter from disk costs, in prompt blocks to prefill (kv_aware).
  double w_lora = 32.0;
};

// One worker as the router sees it at decision time.
struct WorkerCandidate {
  int64_t active_blocks = 0;
  int64_t waiting = 0;
  int64_t cached_prefix_blocks = 0;  // Leading prompt blocks the worker holds.
  double recent_blocks = 0;          // Decayed prompt blocks this router sent it lately.
  int64_t tier_prefix_blocks = 0;    // The blocks after its cached prefix that its KV cache tiers hold.
  int lora_load = 0;  // The request's adapter: 0 in memory (or none), 1 to load, 2 to load over another.
};

struct RoutingDecision {
  size_t index = 0;
  bool fell_back = false;  // The imbalance guard chose least_loaded.
  double score = 0;
};

// `candidates` is non-empty. `round_robin_counter` drives round_robin and breaks exact ties;
// `uniform` in [0,1) drives the softmax draw.
RoutingDecision ChooseWorker(const RoutingOptions& options,
                             const std::vector<WorkerCandidate>& candidates, int64_t prompt_blocks,
                             uint64_t round_robin_counter, double uniform);

}  // namespace pdserve

#endif  // PDSERVE_ROUTER_ROUTING_POLICY_H_
