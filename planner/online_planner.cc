#include "planner/online_planner.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "common/base/log.h"
#include "common/base/status_macros.h"
#include "common/base/rng.h"
#include "common/base/strings.h"

namespace pdserve {
namespace {

// A sample of the observed traffic: lengths uniform within +-50% of the means, Poisson arrivals.
std::vector<SimRequest> Sample(const OnlinePlannerOptions& o, const Observation& obs) {
  SplitMix64 rng(12345);
  const double rate = std::max(obs.rate * o.headroom, 1e-9);
  const int64_t vocab = std::max<int64_t>(o.profile.vocab_size, 2);
  const int64_t max_prompt = std::max<int64_t>(1, o.cluster.worker.max_model_len - 2);
  std::vector<SimRequest> out;
  double t = 0;
  for (int64_t i = 0; i < o.sample_requests; ++i) {
    t += -std::log(1 - rng.Uniform()) / rate;
    const auto around = [&](double mean) {
      return std::max<int64_t>(1, std::llround(mean * (0.5 + rng.Uniform())));
    };
    const int64_t in = std::min(around(obs.mean_input_tokens), max_prompt);
    const int64_t outlen = std::min(around(obs.mean_output_tokens), o.cluster.worker.max_model_len - in - 1);
    std::vector<int32_t> prompt(static_cast<size_t>(in));
    for (int32_t& x : prompt) x = static_cast<int32_t>(rng.Next() % static_cast<uint64_t>(vocab));
    out.push_back({t, std::move(prompt), std::max<int64_t>(1, outlen)});
  }
  return out;
}

constexpr char kDesiredHelp[] = "Workers the online planner wants in each tier (after the scale-down delay).";
constexpr char kPlannedHelp[] = "Workers the last plan asked for in each tier (before the scale-down delay).";

metrics::Gauge& RouterGauge(metrics::Registry* r, const char* name, const char* help, const std::string& model) {
  return r->AddGauge(name, help, {"model_name", "role"}).With({model, "router"});
}
metrics::Gauge& TierGauge(metrics::Registry* r, const char* name, const char* help, const std::string& model,
                          const char* tier) {
  return r->AddGauge(name, help, {"model_name", "role", "tier"}).With({model, "router", tier});
}

}  // namespace

absl::Status CheckOnlinePlannerOptions(const OnlinePlannerOptions& o) {
  if (!(o.slo_ttft_ms > 0) || !(o.slo_tpot_ms > 0)) {
    return absl::InvalidArgumentError("--planner-slo-ttft-ms and --planner-slo-tpot-ms: both must be > 0");
  }
  if (!(o.attainment > 0 && o.attainment <= 1)) {
    return absl::InvalidArgumentError("--planner-attainment: must be in (0, 1]");
  }
  if (o.min_prefill < 0 || o.min_decode < 1 || o.min_prefill + o.min_decode > o.max_workers) {
    return absl::InvalidArgumentError(
        "--planner-min-prefill >= 0, --planner-min-decode >= 1, and together at most --planner-max-workers");
  }
  if (!(o.headroom >= 1) || o.sample_requests < 1 || !(o.interval_seconds > 0) ||
      !(o.scale_down_delay_seconds >= 0)) {
    return absl::InvalidArgumentError(
        "--planner-headroom >= 1, --planner-interval-seconds > 0, --planner-scale-down-delay-seconds >= 0");
  }
  return absl::OkStatus();
}

absl::StatusOr<Sizing> SizeDeployment(const OnlinePlannerOptions& o, const Observation& obs) {
  PD_RETURN_IF_ERROR(CheckOnlinePlannerOptions(o));
  Sizing none;
  none.prefill = o.min_prefill;
  none.decode = o.min_decode;
  none.attainment = 1;
  if (!(obs.rate > 0) || !(obs.mean_input_tokens > 0)) return none;  // No traffic: the minimum.
  Sizing best_at_max;
  best_at_max.attainment = -1;
  int64_t simulations = 0;
  const std::vector<SimRequest> sample = Sample(o, obs);  // The same requests for every split.
  for (int64_t k = o.min_prefill + o.min_decode; k <= o.max_workers; ++k) {
    Sizing best;
    best.attainment = -1;
    for (int64_t p = o.min_prefill; p <= k - o.min_decode; ++p) {
      ClusterOptions c = o.cluster;
      c.prefill_workers = p;
      c.decode_workers = k - p;
      c.slo.ttft_ms = o.slo_ttft_ms;
      c.slo.tpot_ms = o.slo_tpot_ms;
      c.slo.e2e_ms = 0;
      c.keep_requests = false;
      auto source = ListSource(sample);
      auto r = SimulateCluster(o.profile, c, *source);
      if (!r.ok()) return r.status();
      ++simulations;
      const int64_t n = r->summary.ok + r->summary.failed;
      const double att = n > 0 ? static_cast<double>(r->summary.good) / static_cast<double>(n) : 0;
      if (att > best.attainment) {
        best.prefill = p;
        best.decode = k - p;
        best.attainment = att;
      }
    }
    if (best.attainment >= o.attainment) {
      best.simulations = simulations;
      return best;
    }
    if (k == o.max_workers) best_at_max = best;
  }
  best_at_max.saturated = true;
  best_at_max.simulations = simulations;
  return best_at_max;
}

Sizing ScaleDownDelay::Update(double now, const Sizing& planned) {
  recent_.emplace_back(now, planned);
  while (!recent_.empty() && recent_.front().first < now - delay_) recent_.pop_front();
  Sizing out = planned;
  for (const auto& [t, s] : recent_) {
    out.prefill = std::max(out.prefill, s.prefill);
    out.decode = std::max(out.decode, s.decode);
  }
  return out;
}

PlannerLoop::PlannerLoop(OnlinePlannerOptions options, std::function<TrafficCounters()> sample,
                         metrics::Registry* registry, const std::string& model_name)
    : options_(std::move(options)),
      sample_(std::move(sample)),
      delay_(options_.scale_down_delay_seconds),
      start_(std::chrono::steady_clock::now()),
      desired_prefill_(TierGauge(registry, "pdserve_planner_desired_workers", kDesiredHelp, model_name, "prefill")),
      desired_decode_(TierGauge(registry, "pdserve_planner_desired_workers", kDesiredHelp, model_name, "decode")),
      planned_prefill_(TierGauge(registry, "pdserve_planner_planned_workers", kPlannedHelp, model_name, "prefill")),
      planned_decode_(TierGauge(registry, "pdserve_planner_planned_workers", kPlannedHelp, model_name, "decode")),
      rate_(RouterGauge(registry, "pdserve_planner_observed_request_rate",
                        "Requests per second over the planner's last interval.", model_name)),
      mean_in_(RouterGauge(registry, "pdserve_planner_observed_mean_input_tokens",
                           "Mean prompt tokens over the planner's last interval.", model_name)),
      mean_out_(RouterGauge(registry, "pdserve_planner_observed_mean_output_tokens",
                            "Mean tokens generated per request over the planner's last interval.", model_name)),
      attainment_(RouterGauge(registry, "pdserve_planner_attainment",
                              "Share of the simulated sample meeting both targets at the planned split.",
                              model_name)),
      saturated_(RouterGauge(registry, "pdserve_planner_saturated",
                             "1 when even --planner-max-workers did not meet the targets in simulation.",
                             model_name)),
      plan_seconds_(RouterGauge(registry, "pdserve_planner_plan_seconds", "Wall time of the last plan.", model_name)),
      plans_(registry->AddCounter("pdserve_planner_plans_total", "Plans made.", {"model_name", "role"})
                 .With({model_name, "router"})),
      thread_([this] { Run(); }) {
  desired_prefill_.Set(static_cast<double>(options_.min_prefill));
  desired_decode_.Set(static_cast<double>(options_.min_decode));
}

PlannerLoop::~PlannerLoop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void PlannerLoop::PlanOnce(double now, const TrafficCounters& c) {
  const double dt = now - last_at_;
  Observation obs;
  const double arrived = c.requests - last_.requests, started = c.first_tokens - last_.first_tokens;
  obs.rate = dt > 0 ? arrived / dt : 0;
  if (started > 0) {
    obs.mean_input_tokens = (c.prompt_tokens - last_.prompt_tokens) / started;
    obs.mean_output_tokens = std::max(1.0, (c.generation_tokens - last_.generation_tokens) / started);
  }
  last_ = c;
  last_at_ = now;
  const auto t0 = std::chrono::steady_clock::now();
  auto planned = SizeDeployment(options_, obs);
  if (!planned.ok()) {
    PD_LOG(Warning) << "planner: " << planned.status();
    return;
  }
  const Sizing desired = delay_.Update(now, *planned);
  plan_seconds_.Set(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  rate_.Set(obs.rate);
  mean_in_.Set(obs.mean_input_tokens);
  mean_out_.Set(obs.mean_output_tokens);
  attainment_.Set(planned->attainment);
  saturated_.Set(planned->saturated ? 1 : 0);
  planned_prefill_.Set(static_cast<double>(planned->prefill));
  planned_decode_.Set(static_cast<double>(planned->decode));
  desired_prefill_.Set(static_cast<double>(desired.prefill));
  desired_decode_.Set(static_cast<double>(desired.decode));
  plans_.Inc();
}

void PlannerLoop::Run() {
  const auto interval = std::chrono::duration<double>(options_.interval_seconds);
  std::unique_lock<std::mutex> lock(mu_);
  last_ = sample_();
  for (;;) {
    if (cv_.wait_for(lock, interval, [this] { return stop_; })) return;
    const double now = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    lock.unlock();
    PlanOnce(now, sample_());
    lock.lock();
  }
}

}  // namespace pdserve
