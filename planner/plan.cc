#include "planner/plan.h"

#include <algorithm>
#include <cmath>

#include "common/base/status_macros.h"
#include "common/base/strings.h"

namespace pdserve {
namespace {

// The share of requests meeting both targets at `rate`, by simulation.
absl::StatusOr<double> Attainment(const SimProfile& profile, const ClusterOptions& cluster,
                                  const WorkloadAtRate& workload, double rate) {
  auto source = workload(rate);
  if (!source.ok()) return source.status();
  auto r = SimulateCluster(profile, cluster, **source);
  if (!r.ok()) return r.status();
  const int64_t n = r->summary.ok + r->summary.failed;
  return n > 0 ? static_cast<double>(r->summary.good) / static_cast<double>(n) : 0.0;
}

// The highest rate meeting the attainment: a bracket by doubling or halving from the start
// rate, then bisection in log space.
absl::Status Search(const SimProfile& profile, const ClusterOptions& cluster, const PlanOptions& o,
                    const WorkloadAtRate& workload, SplitGoodput* out) {
  auto eval = [&](double rate) -> absl::StatusOr<double> {
    ++out->simulations;
    return Attainment(profile, cluster, workload, rate);
  };
  constexpr int kMaxDoublings = 20;
  double lo = 0, hi = 0, lo_att = 0;
  PD_ASSIGN_OR_RETURN(double a, eval(o.start_rate));
  if (a >= o.attainment) {
    lo = o.start_rate;
    lo_att = a;
    bool failed = false;
    for (int i = 0; i < kMaxDoublings && !failed; ++i) {
      PD_ASSIGN_OR_RETURN(double up, eval(lo * 2));
      failed = up < o.attainment;
      if (!failed) {
        lo *= 2;
        lo_att = up;
      }
    }
    if (!failed) {
      out->goodput_rate = lo;
      out->attainment = lo_att;
      out->unbounded = true;
      return absl::OkStatus();
    }
    hi = lo * 2;
  } else {
    hi = o.start_rate;
    for (int i = 0; i < kMaxDoublings && lo == 0; ++i) {
      PD_ASSIGN_OR_RETURN(double down, eval(hi / 2));
      if (down >= o.attainment) {
        lo = hi / 2;
        lo_att = down;
      } else {
        hi /= 2;
      }
    }
    if (lo == 0) {  // Not even at start_rate / 2^20.
      out->goodput_rate = 0;
      out->attainment = 0;
      return absl::OkStatus();
    }
  }
  for (int i = 0; i < o.bisect_steps; ++i) {
    const double mid = std::sqrt(lo * hi);
    PD_ASSIGN_OR_RETURN(double m, eval(mid));
    if (m >= o.attainment) {
      lo = mid;
      lo_att = m;
    } else {
      hi = mid;
    }
  }
  out->goodput_rate = lo;
  out->attainment = lo_att;
  return absl::OkStatus();
}

}  // namespace

FormulaChoice DynamoFormula(const SimProfile& profile, const SimWorker::Options& worker, int64_t workers,
                            double slo_tpot_ms, double mean_input_tokens, double mean_output_tokens) {
  FormulaChoice f;
  const StepTimeModel& m = profile.step;
  const double isl = std::max(1.0, mean_input_tokens), osl = std::max(1.0, mean_output_tokens);
  const int64_t budget = worker.max_num_batched_tokens;
  // One prefill worker's tokens per second: whole prompts packed into a step's token budget, or
  // one prompt in chunks of the budget.
  if (isl <= static_cast<double>(budget)) {
    const int64_t k = std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(budget) / isl));
    StepShape s;
    for (int64_t i = 0; i < k; ++i) s.AddChunk(static_cast<int64_t>(isl), 0);
    f.prefill_tokens_per_second = static_cast<double>(s.tokens) / m.Predict(s);
  } else {
    double seconds = 0;
    for (int64_t done = 0; done < static_cast<int64_t>(isl); done += budget) {
      StepShape s;
      s.AddChunk(std::min<int64_t>(budget, static_cast<int64_t>(isl) - done), done);
      seconds += m.Predict(s);
    }
    f.prefill_tokens_per_second = isl / seconds;
  }
  // One decode worker: the largest batch whose step meets the TPOT target at the mean context
  // (and whose KV fits), its tokens per second.
  const int64_t context = static_cast<int64_t>(isl + osl / 2);
  const int64_t fits = worker.num_blocks * worker.block_size / static_cast<int64_t>(isl + osl);
  for (int64_t b = 1; b <= std::min(worker.max_num_seqs, std::max<int64_t>(fits, 1)); ++b) {
    StepShape s;
    for (int64_t i = 0; i < b; ++i) s.AddChunk(1, context);
    if (m.Predict(s) * 1e3 <= slo_tpot_ms || b == 1) {
      f.decode_batch = b;
      f.decode_tokens_per_second = static_cast<double>(b) / m.Predict(s);
    }
  }
  // Workers needed per request per second, each tier; K split in that ratio, one each at least.
  const double per_prefill = isl / f.prefill_tokens_per_second;
  const double per_decode = osl / f.decode_tokens_per_second;
  if (workers < 2) {
    f.prefill = 0;
    f.decode = workers;
    return f;
  }
  f.prefill = std::clamp<int64_t>(std::llround(static_cast<double>(workers) * per_prefill / (per_prefill + per_decode)),
                                  1, workers - 1);
  f.decode = workers - f.prefill;
  return f;
}

absl::StatusOr<PlanResult> Plan(const SimProfile& profile, const ClusterOptions& base,
                                const PlanOptions& options, const WorkloadAtRate& workload) {
  // Every split of K workers is simulated at several rates with K workers each: K^2 workers'
  // state in turn, so K is bounded (plan a slice of a larger cluster: the best split scales).
  if (options.workers < 1 || options.workers > kMaxPlanWorkers) {
    return absl::InvalidArgumentError(Str("--workers: must be in [1, ", kMaxPlanWorkers, "]"));
  }
  if (!(options.slo_ttft_ms > 0) || !(options.slo_tpot_ms > 0) || !std::isfinite(options.slo_ttft_ms) ||
      !std::isfinite(options.slo_tpot_ms)) {
    return absl::InvalidArgumentError("--slo-ttft-ms and --slo-tpot-ms: both targets must be > 0");
  }
  if (!(options.attainment > 0 && options.attainment <= 1)) {
    return absl::InvalidArgumentError("--attainment: must be in (0, 1]");
  }
  if (!(options.start_rate > 0) || options.start_rate > kMaxPlanRate) {
    return absl::InvalidArgumentError(Str("--start-rate: must be in (0, ", kMaxPlanRate, "] requests/s"));
  }
  if (options.bisect_steps < 0 || options.policies.empty() ||
      options.local_prefill_tokens.empty()) {
    return absl::InvalidArgumentError("plan: a start rate > 0, bisection steps >= 0, a policy and a threshold");
  }
  PlanResult result;
  result.formula = DynamoFormula(profile, base.worker, options.workers, options.slo_tpot_ms,
                                 options.mean_input_tokens, options.mean_output_tokens);
  for (RoutingPolicy policy : options.policies) {
    for (int64_t lpt : options.local_prefill_tokens) {
      for (int64_t p = 0; p < options.workers; ++p) {
        ClusterOptions c = base;
        c.prefill_workers = p;
        c.decode_workers = options.workers - p;
        c.routing.policy = policy;
        c.local_prefill_tokens = lpt;
        c.slo.ttft_ms = options.slo_ttft_ms;
        c.slo.tpot_ms = options.slo_tpot_ms;
        c.slo.e2e_ms = 0;
        c.keep_requests = false;
        SplitGoodput g;
        g.prefill = p;
        g.decode = options.workers - p;
        g.policy = policy;
        g.local_prefill_tokens = lpt;
        PD_RETURN_IF_ERROR(Search(profile, c, options, workload, &g));
        if (policy == options.policies.front() && lpt == options.local_prefill_tokens.front() &&
            p == result.formula.prefill) {
          result.formula_index = result.splits.size();
        }
        result.splits.push_back(g);
      }
    }
  }
  for (size_t i = 1; i < result.splits.size(); ++i) {
    if (result.splits[i].goodput_rate > result.splits[result.best].goodput_rate) result.best = i;
  }
  return result;
}

}  // namespace pdserve
