// Choosing a worker for a request. Pure functions over a snapshot of the tier, so they are unit
// tested without any RPC.
//
// kv_aware (default) scores each worker, lowest wins:
//   w_prefix * blocks_still_to_prefill + active_blocks + w_queue * waiting
// where blocks_still_to_prefill are the prompt's blocks past the longest prefix the worker holds,
// active_blocks the blocks its running sequences hold (plus those this router just sent it), and
// waiting its queue. Two guards keep a popular prefix from herding everyone onto one worker: when
// the tier is skewed (max load / min load above `imbalance_ratio`, load = active_blocks + w_queue
// * waiting + 1) the choice falls back to least_loaded; and with temperature > 0 the choice is
// sampled with probability proportional to exp(-score / (temperature * spread)), which spreads
// ties and keeps several routers from picking the same "best" worker.
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
  double imbalance_ratio = 3.0;  // max/min load beyond this: least_loaded.
  double temperature = 0.0;      // > 0: softmax sampling.
};

// One worker as the router sees it at decision time.
struct WorkerCandidate {
  int64_t active_blocks = 0;
  int64_t waiting = 0;
  int64_t cached_prefix_blocks = 0;  // Leading prompt blocks the worker holds.
};

struct RoutingDecision {
  size_t index = 0;
  bool fell_back = false;  // The imbalance guard chose least_loaded.
  double score = 0;
};

// `candidates` is non-empty. `round_robin_counter` is consumed by round_robin; `uniform` in [0,1)
// drives the softmax draw.
RoutingDecision ChooseWorker(const RoutingOptions& options,
                             const std::vector<WorkerCandidate>& candidates, int64_t prompt_blocks,
                             uint64_t round_robin_counter, double uniform);

}  // namespace pdserve

#endif  // PDSERVE_ROUTER_ROUTING_POLICY_H_
