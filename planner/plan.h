// The offline capacity planner (issue 40): for K workers, which prefill/decode split (and routing
// policy, and local-prefill threshold) serves the most traffic within the latency targets, found
// by running the simulator (simulator.h), not by a formula.
//
// Goodput of a configuration: the highest request rate at which at least `attainment` (0.9) of
// the requests meet both targets (TTFT and TPOT), found by doubling the rate until it fails, then
// bisecting in log space. The planner also says what the throughput formula of NVIDIA Dynamo's
// SLA planner would choose (prefill workers = rate x ISL / one worker's prefill tokens/s; decode
// workers = rate x OSL / one worker's tokens/s at the largest batch whose step meets the TPOT
// target at the mean context), scaled to K workers, so the two can be compared on the simulator.
#ifndef PDSERVE_PLANNER_PLAN_H_
#define PDSERVE_PLANNER_PLAN_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/simulator.h"

namespace pdserve {

// Makes the workload at a given rate (requests per second): the same requests, arriving faster
// or slower.
using WorkloadAtRate = std::function<absl::StatusOr<std::unique_ptr<RequestSource>>(double rate)>;

// Bounds on a plan's inputs: K workers are simulated in K splits, each with K workers.
inline constexpr int64_t kMaxPlanWorkers = 256;
inline constexpr double kMaxPlanRate = 1e6;  // Requests/s: the rate search starts below it.

struct PlanOptions {
  int64_t workers = 4;          // K: every split p + d = K with d >= 1 is tried (p = 0: colocated).
  double slo_ttft_ms = 0, slo_tpot_ms = 0;
  double attainment = 0.9;
  std::vector<RoutingPolicy> policies = {RoutingPolicy::kKvAware};
  std::vector<int64_t> local_prefill_tokens = {32};
  double start_rate = 1;        // The search's first rate.
  int bisect_steps = 10;        // After the bracket is found: each halves its width in log space.
  double mean_input_tokens = 0, mean_output_tokens = 0;  // For the formula.
};

struct SplitGoodput {
  int64_t prefill = 0, decode = 0;
  RoutingPolicy policy = RoutingPolicy::kKvAware;
  int64_t local_prefill_tokens = 0;
  double goodput_rate = 0;   // Requests per second; 0 when even the lowest rate tried fails.
  double attainment = 0;     // At that rate.
  // The search reached its ceiling (start_rate x 2^20) still meeting the targets: the workload
  // has too few requests to load this split, and goodput_rate is only a lower bound.
  bool unbounded = false;
  int64_t simulations = 0;
};

struct FormulaChoice {
  double prefill_tokens_per_second = 0;  // One prefill worker.
  int64_t decode_batch = 0;              // The largest batch whose step meets the TPOT target.
  double decode_tokens_per_second = 0;   // One decode worker at that batch.
  int64_t prefill = 0, decode = 0;       // Its split of the K workers.
};

struct PlanResult {
  std::vector<SplitGoodput> splits;  // Every configuration tried.
  size_t best = 0;                   // Index of the highest goodput (the first of equals).
  FormulaChoice formula;
  size_t formula_index = 0;          // Where the formula's split (with the first policy) is.
};

// InvalidArgument for impossible targets (not > 0), K < 1, or attainment outside (0, 1].
absl::StatusOr<PlanResult> Plan(const SimProfile& profile, const ClusterOptions& base,
                                const PlanOptions& options, const WorkloadAtRate& workload);

// The formula alone (also used by Plan).
FormulaChoice DynamoFormula(const SimProfile& profile, const SimWorker::Options& worker, int64_t workers,
                            double slo_tpot_ms, double mean_input_tokens, double mean_output_tokens);

}  // namespace pdserve

#endif  // PDSERVE_PLANNER_PLAN_H_
