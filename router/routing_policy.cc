#include "router/routing_policy.h"

#include <algorithm>
#include <cmath>

#include "common/base/strings.h"

namespace pdserve {

absl::StatusOr<RoutingPolicy> ParseRoutingPolicy(std::string_view name) {
  if (name == "round_robin") return RoutingPolicy::kRoundRobin;
  if (name == "least_loaded") return RoutingPolicy::kLeastLoaded;
  if (name == "kv_aware") return RoutingPolicy::kKvAware;
  return absl::InvalidArgumentError(
      Str("--policy: '", name, "' is not round_robin, least_loaded or kv_aware"));
}

std::string_view RoutingPolicyName(RoutingPolicy policy) {
  switch (policy) {
    case RoutingPolicy::kRoundRobin: return "round_robin";
    case RoutingPolicy::kLeastLoaded: return "least_loaded";
    case RoutingPolicy::kKvAware: return "kv_aware";
  }
  return "?";
}

namespace {

double Load(const RoutingOptions& o, const WorkerCandidate& c) {
  return static_cast<double>(c.active_blocks) + o.w_queue * static_cast<double>(c.waiting);
}

// Lowest value wins; of exact ties, the first at or after `start` (cyclically).
size_t ArgMin(const std::vector<double>& v, uint64_t start) {
  const size_t n = v.size();
  size_t best = start % n;
  for (size_t k = 1; k < n; ++k) {
    const size_t i = (start + k) % n;
    if (v[i] < v[best]) best = i;
  }
  return best;
}

}  // namespace

RoutingDecision ChooseWorker(const RoutingOptions& o, const std::vector<WorkerCandidate>& c,
                             int64_t prompt_blocks, uint64_t round_robin_counter, double uniform) {
  RoutingDecision d;
  if (o.policy == RoutingPolicy::kRoundRobin) {
    d.index = round_robin_counter % c.size();
    return d;
  }
  std::vector<double> loads(c.size());
  double mean_recent = 0;
  for (size_t i = 0; i < c.size(); ++i) {
    loads[i] = Load(o, c[i]);
    mean_recent += c[i].recent_blocks / static_cast<double>(c.size());
  }
  std::vector<double> scores(c.size());
  for (size_t i = 0; i < c.size(); ++i) {
    const double share_excess =
        mean_recent > 0 ? c[i].recent_blocks / mean_recent - 1.0 : 0.0;
    scores[i] = loads[i] + o.w_recent * static_cast<double>(prompt_blocks) * share_excess;
  }
  if (o.policy == RoutingPolicy::kKvAware) {
    const double lo = *std::min_element(loads.begin(), loads.end());
    const double hi = *std::max_element(loads.begin(), loads.end());
    if (hi - lo > o.imbalance_min_blocks && (hi + 1) / (lo + 1) > o.imbalance_ratio) {
      d.fell_back = true;
    } else {
      for (size_t i = 0; i < c.size(); ++i) {
        const int64_t tier = std::max<int64_t>(0, std::min(c[i].tier_prefix_blocks,
                                                           prompt_blocks - c[i].cached_prefix_blocks));
        const int64_t to_prefill = std::max<int64_t>(0, prompt_blocks - c[i].cached_prefix_blocks - tier);
        scores[i] += o.w_prefix * (static_cast<double>(to_prefill) + o.w_tier * static_cast<double>(tier));
        scores[i] += o.w_lora * static_cast<double>(c[i].lora_load);
      }
    }
  }
  d.index = ArgMin(scores, round_robin_counter);
  if (o.temperature > 0 && c.size() > 1) {
    // Softmax over scores, scaled by their spread so the temperature is unit-free.
    const double best = scores[d.index];
    const double worst = *std::max_element(scores.begin(), scores.end());
    const double scale = o.temperature * std::max(1.0, worst - best);
    std::vector<double> weights(c.size());
    double total = 0;
    for (size_t i = 0; i < c.size(); ++i) total += weights[i] = std::exp(-(scores[i] - best) / scale);
    double target = uniform * total;
    for (size_t i = 0; i < c.size(); ++i) {
      target -= weights[i];
      if (target < 0) {
        d.index = i;
        break;
      }
    }
  }
  d.score = scores[d.index];
  return d;
}

}  // namespace pdserve
