// Choosing a worker for a request. Pure functions over a snapshot of the tier, so they are unit
// tested without any RPC.
//
// kv_aware (default) scores each worker, lowest wins:
//   w_prefix * blocks_still_to_prefill + load
//   load = active_blocks + w_queue * waiting + w_recent * recent_blocks
// where blocks_still_to_prefill are the prompt's blocks past the longest prefix the worker holds,
// active_blocks the blocks its running sequences hold (plus those this router sent it since its
// last report), waiting its queue, and recent_blocks the prompt blocks this router sent it lately
// (decaying with a half-life; the work just sent is load the reports do not show yet, and at low
// concurrency it is the only thing that keeps a popular prefix from taking every request).
// Two guards keep a popular prefix from herding everyone onto one worker: when the tier is skewed
// ((max load + 1) / (min load + 1) above `imbalance_ratio`) the choice falls back to least_loaded;
// and with temperature > 0 the choice is sampled with probability proportional to
// exp(-score / (temperature * spread)), which spreads ties and keeps several routers from picking
// the same "best" worker. Exact ties go to the first candidate at or after the round-robin
// position, so equal workers take turns.
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
  double w_queue = 4.0;
  double w_recent = 1.0;
  double imbalance_ratio = 3.0;  // max/min load beyond this: least_loaded.
  double temperature = 0.0;      // > 0: softmax sampling.
};

// One worker as the router sees it at decision time.
struct WorkerCandidate {
  int64_t active_blocks = 0;
  int64_t waiting = 0;
  int64_t cached_prefix_blocks = 0;  // Leading prompt blocks the worker holds.
  double recent_blocks = 0;          // Decayed prompt blocks this router sent it lately.
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
