// The online planner (issue 40): `pdserve router --planner-profile P` re-plans the deployment
// every interval from what the router measures (request rate, mean prompt and output tokens) and
// exports how many prefill and decode workers it wants (pdserve_planner_desired_workers{tier}),
// for the Helm chart's autoscalers to follow.
//
// Sizing: the smallest number of workers K (from the minimums up to max_workers) for which some
// split p + d = K meets the latency targets for `attainment` of a simulated sample of the observed
// traffic (random prompts and outputs of the observed mean lengths, Poisson arrivals at the
// observed rate x headroom); among the splits of that K, the one with the highest attainment.
// The sample has no shared prefixes (the router does not know how much its traffic shares):
// with prefix hits the real deployment needs less, never more.
//
// Scaling down waits: what is published is, per tier, the highest count planned over the last
// scale_down_delay seconds, so a rise is followed at once and a fall only once it has lasted (as
// Kubernetes' HPA stabilization window; the workers drain on SIGTERM when a pod goes).
#ifndef PDSERVE_PLANNER_ONLINE_PLANNER_H_
#define PDSERVE_PLANNER_ONLINE_PLANNER_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "common/metrics/metrics.h"
#include "planner/simulator.h"

namespace pdserve {

struct OnlinePlannerOptions {
  SimProfile profile;
  ClusterOptions cluster;  // Each worker's engine settings and the routing policy.
  double slo_ttft_ms = 0, slo_tpot_ms = 0, attainment = 0.9;
  int64_t min_prefill = 0, min_decode = 1, max_workers = 16;
  double headroom = 1.0;           // Plan for the observed rate x this.
  int64_t sample_requests = 200;   // Requests per simulated sample.
  double interval_seconds = 30;
  double scale_down_delay_seconds = 300;
};

struct Observation {
  double rate = 0;  // Requests per second.
  double mean_input_tokens = 0, mean_output_tokens = 0;
};

struct Sizing {
  int64_t prefill = 0, decode = 1;
  double attainment = 0;  // Simulated, at this split.
  bool saturated = false;  // Even max_workers did not meet the targets: the best split at max.
  int64_t simulations = 0;
};

// InvalidArgument for options that cannot plan (targets not > 0, minimums above the maximum).
absl::Status CheckOnlinePlannerOptions(const OnlinePlannerOptions& options);
absl::StatusOr<Sizing> SizeDeployment(const OnlinePlannerOptions& options, const Observation& observed);

// The scale-down delay: per tier, the highest count planned within the last `delay_seconds`.
class ScaleDownDelay {
 public:
  explicit ScaleDownDelay(double delay_seconds) : delay_(delay_seconds) {}
  Sizing Update(double now_seconds, const Sizing& planned);

 private:
  const double delay_;
  std::deque<std::pair<double, Sizing>> recent_;
};

// Cumulative counters the planner differences over each interval.
struct TrafficCounters {
  double requests = 0;           // Arrived.
  double prompt_tokens = 0;      // Of requests that got their first token.
  double first_tokens = 0;       // Requests that got their first token.
  double generation_tokens = 0;  // All tokens generated.
};

// The loop: every interval, samples the counters, plans, publishes the gauges below in
// `registry` (labels model_name, role "router"; desired and planned also by tier):
//   pdserve_planner_desired_workers, pdserve_planner_planned_workers (before the delay),
//   pdserve_planner_observed_request_rate, pdserve_planner_observed_mean_input_tokens,
//   pdserve_planner_observed_mean_output_tokens, pdserve_planner_attainment,
//   pdserve_planner_saturated, pdserve_planner_plans_total, pdserve_planner_plan_seconds.
class PlannerLoop {
 public:
  PlannerLoop(OnlinePlannerOptions options, std::function<TrafficCounters()> sample,
              metrics::Registry* registry, const std::string& model_name);
  ~PlannerLoop();  // Stops the thread.
  PlannerLoop(const PlannerLoop&) = delete;
  PlannerLoop& operator=(const PlannerLoop&) = delete;

 private:
  void Run();
  void PlanOnce(double now, const TrafficCounters& c);

  const OnlinePlannerOptions options_;
  std::function<TrafficCounters()> sample_;
  ScaleDownDelay delay_;
  TrafficCounters last_{};
  double last_at_ = 0;
  std::chrono::steady_clock::time_point start_;
  metrics::Gauge &desired_prefill_, &desired_decode_, &planned_prefill_, &planned_decode_;
  metrics::Gauge &rate_, &mean_in_, &mean_out_, &attainment_, &saturated_, &plan_seconds_;
  metrics::Counter& plans_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;  // Last: starts after everything above.
};

}  // namespace pdserve

#endif  // PDSERVE_PLANNER_ONLINE_PLANNER_H_
