// pdserve plan: which prefill/decode split of K workers serves the most requests per second
// within a TTFT and a TPOT target, found on the simulator (planner/plan.h), beside the split
// NVIDIA Dynamo's throughput formula would choose; with several seeds, whether the choice holds.
#include <cstdio>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/sim_flags.h"
#include "common/base/strings.h"
#include "nlohmann/json.hpp"
#include "planner/plan.h"
#include "router/routing_policy.h"

namespace pdserve::cli {
namespace {

using Json = nlohmann::ordered_json;

std::string SplitName(const SplitGoodput& g) { return Str(g.prefill, "P", g.decode, "D"); }

}  // namespace

int PlanCommand(int argc, char** argv) {
  const char* cmd = "plan";
  std::string policies = "kv_aware", thresholds, seeds = "1", format = "text";
  SimFlags sf;
  PlanOptions po;
  FlagSet flags("plan",
                "Finds the prefill/decode split of --workers workers (and, if asked, the routing "
                "policy and local-prefill threshold) with the highest goodput: the most requests "
                "per second at which --attainment of them meet both latency targets, on the "
                "simulator.");
  flags.Int("workers", &po.workers, "K: the workers to split (every p + d = K, d >= 1; p = 0 is colocated)");
  flags.Double("slo-ttft-ms", &po.slo_ttft_ms, "time-to-first-token target, ms");
  flags.Double("slo-tpot-ms", &po.slo_tpot_ms, "time-per-output-token target, ms");
  flags.Double("attainment", &po.attainment, "share of requests that must meet both targets");
  flags.String("policies", &policies, "routing policies to try, comma-separated");
  flags.String("local-prefill-thresholds", &thresholds,
               "--local-prefill-tokens values to try, comma-separated (default: --local-prefill-tokens)");
  flags.String("seeds", &seeds, "workload seeds, comma-separated: the plan is made for each");
  flags.Double("start-rate", &po.start_rate, "the rate search's first rate, requests/s");
  int64_t bisect_steps = po.bisect_steps;
  flags.Int("bisect-steps", &bisect_steps, "bisection steps once the rate is bracketed within 2x");
  sf.Register(flags, /*with_rate=*/false);
  flags.String("format", &format, "text or json");
  int code;
  if (!ParseFlagsOrExit(flags, cmd, argc, argv, &code)) return code;
  auto usage = [&](const std::string& m) { return ReportError(cmd, absl::InvalidArgumentError(m), kExitUsage); };
  if (format != "text" && format != "json") return usage("--format: must be text or json");
  if (bisect_steps < 0 || bisect_steps > 60) return usage("--bisect-steps: must be in [0, 60]");
  po.bisect_steps = static_cast<int>(bisect_steps);
  po.policies.clear();
  for (absl::string_view name : absl::StrSplit(policies, ',', absl::SkipEmpty())) {
    auto p = ParseRoutingPolicy(std::string_view(name.data(), name.size()));
    if (!p.ok()) return ReportError(cmd, p.status(), kExitUsage);
    po.policies.push_back(*p);
  }
  if (po.policies.empty()) return usage("--policies: none given");
  po.local_prefill_tokens.clear();
  for (absl::string_view t : absl::StrSplit(thresholds, ',', absl::SkipEmpty())) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(t, &v) || v < 0) return usage(Str("--local-prefill-thresholds: '", t, "' is not a count"));
    po.local_prefill_tokens.push_back(v);
  }
  if (po.local_prefill_tokens.empty()) po.local_prefill_tokens.push_back(sf.cluster.local_prefill_tokens);
  std::vector<int64_t> seed_list;
  for (absl::string_view t : absl::StrSplit(seeds, ',', absl::SkipEmpty())) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(t, &v)) return usage(Str("--seeds: '", t, "' is not an integer"));
    seed_list.push_back(v);
  }
  if (seed_list.empty()) return usage("--seeds: none given");
  if (sf.workload.kind == "trace" && seed_list.size() > 1) {
    return usage("--seeds: a trace is one workload; several seeds are for generated workloads");
  }

  Json out = Json::array();
  for (int64_t seed : seed_list) {
    sf.seed = seed;
    auto setup = ResolveSimFlags(sf);
    if (!setup.ok()) return ReportError(cmd, setup.status(), kExitUsage);
    PlanOptions o = po;
    o.mean_input_tokens = setup->mean_input_tokens;
    o.mean_output_tokens = setup->mean_output_tokens;
    auto plan = Plan(setup->profile, setup->cluster, o, setup->at_rate);
    if (!plan.ok()) {
      const bool bad = plan.status().code() == absl::StatusCode::kInvalidArgument;
      return ReportError(cmd, plan.status(), bad ? kExitUsage : kExitError);
    }
    const SplitGoodput& best = plan->splits[plan->best];
    const SplitGoodput& formula = plan->splits[plan->formula_index];
    double worst = best.goodput_rate;
    for (const SplitGoodput& g : plan->splits) worst = std::min(worst, g.goodput_rate);
    if (format == "json") {
      Json j = {{"seed", seed}, {"workers", o.workers}, {"modelled", setup->profile.modelled},
                {"slo_ttft_ms", o.slo_ttft_ms}, {"slo_tpot_ms", o.slo_tpot_ms}, {"attainment", o.attainment},
                {"mean_input_tokens", o.mean_input_tokens}, {"mean_output_tokens", o.mean_output_tokens}};
      Json splits = Json::array();
      for (const SplitGoodput& g : plan->splits) {
        splits.push_back({{"prefill", g.prefill}, {"decode", g.decode},
                          {"policy", std::string(RoutingPolicyName(g.policy))},
                          {"local_prefill_tokens", g.local_prefill_tokens}, {"goodput", g.goodput_rate},
                          {"attainment", g.attainment}, {"unbounded", g.unbounded},
                          {"simulations", g.simulations}});
      }
      j["splits"] = splits;
      j["best"] = plan->best;
      j["formula"] = {{"prefill", plan->formula.prefill}, {"decode", plan->formula.decode},
                      {"prefill_tokens_per_second", plan->formula.prefill_tokens_per_second},
                      {"decode_batch", plan->formula.decode_batch},
                      {"decode_tokens_per_second", plan->formula.decode_tokens_per_second},
                      {"goodput", formula.goodput_rate}};
      out.push_back(j);
      continue;
    }
    std::printf("Plan for %lld workers, seed %lld: TTFT <= %g ms and TPOT <= %g ms for %.0f%% of requests%s\n",
                static_cast<long long>(o.workers), static_cast<long long>(seed), o.slo_ttft_ms, o.slo_tpot_ms,
                o.attainment * 100, setup->profile.modelled ? " (modelled profile)" : "");
    std::printf("mean prompt %.0f tokens, mean output %.0f tokens\n", o.mean_input_tokens, o.mean_output_tokens);
    std::printf("| split | policy | local prefill <= | goodput (req/s) | attainment | simulations |\n");
    std::printf("| --- | --- | --- | --- | --- | --- |\n");
    for (size_t i = 0; i < plan->splits.size(); ++i) {
      const SplitGoodput& g = plan->splits[i];
      std::printf("| %s%s | %s | %lld | %s%.3f | %.3f | %lld |\n", SplitName(g).c_str(),
                  i == plan->best ? " (best)" : i == plan->formula_index ? " (formula)" : "",
                  std::string(RoutingPolicyName(g.policy)).c_str(), static_cast<long long>(g.local_prefill_tokens),
                  g.unbounded ? ">= " : "", g.goodput_rate, g.attainment, static_cast<long long>(g.simulations));
    }
    std::printf("Best: %s (%s), %.3f req/s; worst split %.3f req/s.\n", SplitName(best).c_str(),
                std::string(RoutingPolicyName(best.policy)).c_str(), best.goodput_rate, worst);
    std::printf("Dynamo's throughput formula (one prefill worker %.0f tokens/s; one decode worker %.0f "
                "tokens/s at batch %lld): %s, %.3f req/s on the simulator%s.\n",
                plan->formula.prefill_tokens_per_second, plan->formula.decode_tokens_per_second,
                static_cast<long long>(plan->formula.decode_batch), SplitName(formula).c_str(),
                formula.goodput_rate,
                plan->best == plan->formula_index ? ": the same split" : "");
    for (const SplitGoodput& g : plan->splits) {
      if (g.unbounded) {
        std::printf("Note: %s met the targets at every rate tried: the workload is too small to load it "
                    "(more --num-prompts).\n", SplitName(g).c_str());
      }
    }
  }
  if (format == "json") std::printf("%s\n", out.dump(2).c_str());
  return kExitOk;
}

}  // namespace pdserve::cli
