// pdserve simulate: a prefill/decode deployment simulated on a virtual clock (planner/simulator.h)
// with a profile's step costs (`pdserve profile`), on a `pdserve bench` workload or a request
// trace; prints the figures `pdserve bench` prints, plus each worker's load.
#include <cmath>
#include <cstdio>
#include <limits>

#include "loadgen/load_client.h"
#include "cli/bench_report.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/sim_flags.h"
#include "common/base/strings.h"
#include "nlohmann/json.hpp"
#include "planner/simulator.h"
#include "router/routing_policy.h"

namespace pdserve::cli {

int SimulateCommand(int argc, char** argv) {
  const char* cmd = "simulate";
  std::string policy = "kv_aware", goodput, format = "text";
  int64_t prefill = 1, decode = 1;
  bool per_worker = false;
  SimFlags sf;
  FlagSet flags("simulate",
                "Simulates a prefill/decode deployment on a virtual clock: pdserve's own router "
                "policy, schedulers and block managers, with a profile's step costs in place of "
                "the forward pass.");
  flags.Int("prefill", &prefill, "prefill workers (0: every prompt prefilled on its decode worker)");
  flags.Int("decode", &decode, "decode workers");
  flags.String("policy", &policy, "routing policy: kv_aware, least_loaded or round_robin");
  sf.Register(flags, /*with_rate=*/true);
  flags.String("goodput", &goodput, "SLOs for goodput, e.g. 'ttft:500 tpot:50' (ms)");
  flags.Bool("per-worker", &per_worker, "text: also print each worker's steps, busy share and KV usage");
  flags.String("format", &format, "text or json");
  int code;
  if (!ParseFlagsOrExit(flags, cmd, argc, argv, &code)) return code;
  auto usage = [&](const std::string& m) { return ReportError(cmd, absl::InvalidArgumentError(m), kExitUsage); };
  if (format != "text" && format != "json") return usage("--format: must be text or json");
  auto setup = ResolveSimFlags(sf);
  if (!setup.ok()) return ReportError(cmd, setup.status(), kExitUsage);
  const SimProfile& profile = setup->profile;
  ClusterOptions o = setup->cluster;
  auto parsed_policy = ParseRoutingPolicy(policy);
  if (!parsed_policy.ok()) return ReportError(cmd, parsed_policy.status(), kExitUsage);
  o.routing.policy = *parsed_policy;
  o.prefill_workers = prefill;
  o.decode_workers = decode;
  Slo slo;
  if (absl::Status s = ParseSlo(goodput, &slo); !s.ok()) return ReportError(cmd, s, kExitUsage);
  o.slo = slo;
  const bool trace = sf.workload.kind == "trace";
  auto made = setup->at_rate(setup->rate);
  if (!made.ok()) return ReportError(cmd, made.status(), kExitUsage);
  std::unique_ptr<RequestSource> source = std::move(*made);
  const double label_rate = trace ? std::numeric_limits<double>::quiet_NaN() : setup->rate;
  auto result = SimulateCluster(profile, o, *source);
  if (!result.ok()) {
    const bool bad_input = result.status().code() == absl::StatusCode::kInvalidArgument;
    return ReportError(cmd, result.status(), bad_input ? kExitUsage : kExitError);
  }
  const LoadSummary& summary = result->summary;
  const double span = result->end_seconds - result->first_arrival_seconds;
  const double speedup = result->wall_seconds > 0 ? span / result->wall_seconds : 0;
  const double us_per_step = result->steps > 0 ? result->wall_seconds * 1e6 / result->steps : 0;
  const double mean_batch =
      result->steps > 0 ? static_cast<double>(result->step_sequences) / static_cast<double>(result->steps) : 0;
  const std::string label = Str("simulated ", prefill, "P", decode, "D ", RoutingPolicyName(o.routing.policy),
                                profile.modelled ? " (modelled)" : "");
  const double shown_rate =
      std::isnan(label_rate) ? (span > 0 ? static_cast<double>(summary.ok + summary.failed) / span : 0) : label_rate;
  if (format == "json") {
    nlohmann::ordered_json j = {{"policy", std::string(RoutingPolicyName(o.routing.policy))}, {"simulated", true},
              {"modelled", profile.modelled}, {"profile_model", profile.model}};
    for (const auto& [name, value] : SummaryFigures(shown_rate, summary)) j[name] = value;
    if (!summary.first_error.empty()) j["first_error"] = summary.first_error;
    j["prefill_workers"] = prefill;
    j["decode_workers"] = decode;
    j["kv_blocks_per_worker"] = o.worker.num_blocks;
    j["local_prefills"] = result->local_prefills;
    j["remote_prefills"] = result->remote_prefills;
    j["reserve_refusals"] = result->reserve_refusals;
    j["guard_fallbacks"] = result->guard_fallbacks;
    if (o.tiers.host_blocks > 0 || o.tiers.disk_blocks > 0 || o.tiers.store_blocks > 0) {
      j["kv_offload_host_blocks_per_worker"] = o.tiers.host_blocks;
      j["kv_offload_disk_blocks_per_worker"] = o.tiers.disk_blocks;
      j["kv_store_blocks"] = o.tiers.store_blocks;
      j["host_loaded_tokens"] = result->host_loaded_tokens;
      j["disk_loaded_tokens"] = result->disk_loaded_tokens;
      j["store_loaded_tokens"] = result->store_loaded_tokens;
      j["tier_loads"] = result->tier_loads;
      j["declined_loads"] = result->declined_loads;
      j["host_evictions"] = result->host_evictions;
      j["disk_evictions"] = result->disk_evictions;
      j["store_evictions"] = result->store_evictions;
    }
    j["peak_in_flight"] = result->peak_in_flight;
    j["steps"] = result->steps;
    j["mean_batch"] = mean_batch;
    j["sim_wall_seconds"] = result->wall_seconds;
    j["sim_us_per_step"] = us_per_step;
    j["sim_speedup"] = speedup;
    nlohmann::ordered_json workers = nlohmann::ordered_json::array();
    for (const SimWorkerStats& s : result->workers) {
      workers.push_back({{"tier", s.tier}, {"requests", s.requests}, {"steps", s.steps},
                         {"busy", span > 0 ? s.busy_seconds / span : 0}, {"kv_usage_mean", s.kv_usage_mean},
                         {"kv_usage_max", s.kv_usage_max}, {"preemptions", s.preemptions}});
    }
    j["workers"] = workers;
    std::printf("%s\n", j.dump(2).c_str());
    return kExitOk;
  }
  PrintSummaryFigures(label, shown_rate, summary, slo);
  std::printf("%-40s %lld / %lld (%lld reservations refused)\n", "Local / remote prefills:",
              static_cast<long long>(result->local_prefills), static_cast<long long>(result->remote_prefills),
              static_cast<long long>(result->reserve_refusals));
  if (o.tiers.host_blocks > 0 || o.tiers.disk_blocks > 0 || o.tiers.store_blocks > 0) {
    std::printf("%-40s %lld / %lld / %lld tokens in %lld loads (%lld declined)\n", "Loaded from host / disk / store:",
                static_cast<long long>(result->host_loaded_tokens), static_cast<long long>(result->disk_loaded_tokens),
                static_cast<long long>(result->store_loaded_tokens), static_cast<long long>(result->tier_loads),
                static_cast<long long>(result->declined_loads));
  }
  double busy_max = 0, busy_sum = 0;
  for (const SimWorkerStats& s : result->workers) {
    if (s.tier != "decode" || span <= 0) continue;
    busy_max = std::max(busy_max, s.busy_seconds / span);
    busy_sum += s.busy_seconds / span;
  }
  std::printf("%-40s %.2f / %.2f\n", "Decode busy max / mean:", busy_max, busy_sum / static_cast<double>(decode));
  std::printf("%-40s %.1f s in %.2f s (%.0fx), %.2f us per step (mean batch %.1f)\n",
              "Simulated time / wall time:", span, result->wall_seconds, speedup, us_per_step, mean_batch);
  std::printf("%-40s %lld\n", "Peak requests in flight:", static_cast<long long>(result->peak_in_flight));
  if (per_worker) {
    for (size_t i = 0; i < result->workers.size(); ++i) {
      const SimWorkerStats& s = result->workers[i];
      std::printf("  %-8s %2zu: %6lld requests %8lld steps  busy %.2f  KV mean %.2f max %.2f  %lld preemptions\n",
                  s.tier.c_str(), i, static_cast<long long>(s.requests), static_cast<long long>(s.steps),
                  span > 0 ? s.busy_seconds / span : 0, s.kv_usage_mean, s.kv_usage_max,
                  static_cast<long long>(s.preemptions));
    }
  }
  PrintSummaryEnd(summary);
  return kExitOk;
}

}  // namespace pdserve::cli
