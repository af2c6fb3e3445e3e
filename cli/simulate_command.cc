// pdserve simulate: a prefill/decode deployment simulated on a virtual clock (planner/simulator.h)
// with a profile's step costs (`pdserve profile`), on a `pdserve bench` workload or a request
// trace; prints the figures `pdserve bench` prints, plus each worker's load.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>

#include "bench/serving/load_client.h"
#include "bench/serving/workload.h"
#include "cli/bench_report.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "common/base/strings.h"
#include "nlohmann/json.hpp"
#include "planner/simulator.h"
#include "router/routing_policy.h"

namespace pdserve::cli {
namespace {

using Json = nlohmann::ordered_json;

}  // namespace

int SimulateCommand(int argc, char** argv) {
  const char* cmd = "simulate";
  std::string profile_path, policy = "kv_aware", trace, rate_text = "inf", goodput, format = "text";
  int64_t prefill = 1, decode = 1, kv_blocks = 0, seed = 1;
  double kv_memory_gib = 4, transport_gbps = 0, transport_latency_us = -1, kv_dtype_bytes = 2;
  ClusterOptions o;
  WorkloadOptions w;
  TraceOptions t;
  bool per_worker = false;
  FlagSet flags("simulate",
                "Simulates a prefill/decode deployment on a virtual clock: pdserve's own router "
                "policy, schedulers and block managers, with a profile's step costs in place of "
                "the forward pass.");
  flags.String("profile", &profile_path, "a `pdserve profile` file (step costs, KV transfer)");
  flags.Int("prefill", &prefill, "prefill workers (0: every prompt prefilled on its decode worker)");
  flags.Int("decode", &decode, "decode workers");
  flags.String("policy", &policy, "routing policy: kv_aware, least_loaded or round_robin");
  flags.Int("local-prefill-tokens", &o.local_prefill_tokens,
            "prompts with at most this many uncached tokens are prefilled on the decode worker");
  flags.Int("prefill-max-waiting", &o.prefill_max_waiting,
            "a prefill tier whose every worker queues this many takes no more (prefill locally)");
  flags.Double("transport-gbps", &transport_gbps, "KV transfer bandwidth, GB/s (default: the profile's)");
  flags.Double("transport-latency-us", &transport_latency_us, "KV transfer latency, us (default: the profile's)");
  flags.Double("kv-dtype-bytes", &kv_dtype_bytes,
               "bytes per KV element, for profiles that do not record the pool's (roofline ones)");
  flags.Int("kv-blocks", &kv_blocks, "KV cache blocks per worker (overrides --kv-memory-gib)");
  flags.Double("kv-memory-gib", &kv_memory_gib, "KV cache memory per worker, GiB");
  flags.Int("block-size", &o.worker.block_size, "KV cache block size in tokens");
  flags.Int("max-num-seqs", &o.worker.max_num_seqs, "sequences per step");
  flags.Int("max-num-batched-tokens", &o.worker.max_num_batched_tokens, "token budget per step");
  o.worker.max_model_len = 0;
  flags.Int("max-model-len", &o.worker.max_model_len,
            "longest sequence (0: the profile's, else what a worker's KV cache holds)");
  flags.Bool("enable-prefix-caching", &o.worker.enable_prefix_caching, "reuse KV of shared prompt prefixes");
  flags.String("workload", &w.kind, "random, shared-prefix or synthetic-chat (as pdserve bench), or trace");
  flags.String("trace", &trace, "--workload trace: a Mooncake-format JSONL trace (../shared/traces/README.md)");
  flags.Double("trace-length-scale", &t.length_scale,
               "multiply the trace's prompt lengths and its 512-token blocks by this (1/32: 16-token blocks)");
  flags.Double("trace-time-scale", &t.time_scale, "multiply the trace's arrival times by this (0.5: twice the rate)");
  flags.Int("trace-max-requests", &t.max_requests, "the trace's first N requests (0: all)");
  flags.Int("num-prompts", &w.num_prompts, "requests (generated workloads)");
  flags.Int("input-len", &w.input_len, "prompt tokens (as pdserve bench)");
  flags.Int("output-len", &w.output_len, "tokens generated per request");
  flags.Double("range-ratio", &w.range_ratio, "random, shared-prefix: lengths uniform in len x [1 - r, 1 + r]");
  flags.Int("groups", &w.groups, "shared-prefix: distinct system prompts");
  flags.Int("prefix-len", &w.prefix_len, "shared-prefix: system prompt tokens");
  flags.Int("max-prompt-len", &w.max_prompt_len, "synthetic-chat: longest prompt");
  flags.String("request-rate", &rate_text, "requests per second, or inf (all at once)");
  flags.Double("burstiness", &w.burstiness, "shape of the Gamma arrival gaps: 1 Poisson");
  flags.Int("seed", &seed, "workload and routing seed");
  flags.String("goodput", &goodput, "SLOs for goodput, e.g. 'ttft:500 tpot:50' (ms)");
  flags.Bool("per-worker", &per_worker, "text: also print each worker's steps, busy share and KV usage");
  flags.String("format", &format, "text or json");
  int code;
  if (!ParseFlagsOrExit(flags, cmd, argc, argv, &code)) return code;
  auto usage = [&](const std::string& m) { return ReportError(cmd, absl::InvalidArgumentError(m), kExitUsage); };
  if (profile_path.empty()) return usage("--profile: required (write one with pdserve profile)");
  if (format != "text" && format != "json") return usage("--format: must be text or json");
  std::ifstream pf(profile_path);
  if (!pf) return usage(Str("--profile: cannot read '", profile_path, "'"));
  std::stringstream text;
  text << pf.rdbuf();
  if (!(kv_dtype_bytes > 0)) return usage("--kv-dtype-bytes: must be > 0");
  auto profile = ParseSimProfile(text.str(), profile_path, kv_dtype_bytes);
  if (!profile.ok()) return ReportError(cmd, profile.status(), kExitUsage);
  if (transport_gbps < 0 || !std::isfinite(transport_gbps)) return usage("--transport-gbps: must be >= 0");
  if (transport_gbps > 0) profile->transfer_bytes_per_second = transport_gbps * 1e9;
  if (transport_latency_us >= 0) profile->transfer_latency_seconds = transport_latency_us * 1e-6;
  auto parsed_policy = ParseRoutingPolicy(policy);
  if (!parsed_policy.ok()) return ReportError(cmd, parsed_policy.status(), kExitUsage);
  o.routing.policy = *parsed_policy;
  o.prefill_workers = prefill;
  o.decode_workers = decode;
  o.seed = static_cast<uint64_t>(seed);
  if (o.worker.block_size < 1) return usage("--block-size: must be >= 1");
  if (kv_blocks <= 0) {
    if (!(kv_memory_gib > 0)) return usage("--kv-memory-gib: must be > 0");
    kv_blocks = static_cast<int64_t>(kv_memory_gib * (1ull << 30) /
                                     static_cast<double>(profile->kv_bytes_per_token * o.worker.block_size));
  }
  o.worker.num_blocks = kv_blocks;
  if (o.worker.max_model_len <= 0) {
    const int64_t holds = kv_blocks * o.worker.block_size;
    o.worker.max_model_len = profile->max_model_len > 0 ? std::min(profile->max_model_len, holds) : holds;
  }
  Slo slo;
  if (absl::Status s = ParseSlo(goodput, &slo); !s.ok()) return ReportError(cmd, s, kExitUsage);
  o.slo = slo;
  auto rate = ParseRate(rate_text, "--request-rate");
  if (!rate.ok()) return ReportError(cmd, rate.status(), kExitUsage);

  std::unique_ptr<RequestSource> source;
  double label_rate = *rate;
  if (w.kind == "trace") {
    if (trace.empty()) return usage("--workload trace needs --trace FILE");
    t.vocab_size = profile->vocab_size;
    auto opened = OpenTrace(trace, t);
    if (!opened.ok()) return ReportError(cmd, opened.status(), kExitUsage);
    source = std::move(*opened);
    label_rate = std::numeric_limits<double>::quiet_NaN();
  } else {
    if (!trace.empty()) return usage("--trace: only with --workload trace");
    w.rate = *rate;
    w.seed = static_cast<uint64_t>(seed);
    w.vocab_size = profile->vocab_size;
    auto made = MakeWorkload(w);
    if (!made.ok()) return ReportError(cmd, made.status(), kExitUsage);
    std::vector<SimRequest> list;
    list.reserve(made->size());
    for (BenchRequest& b : *made) list.push_back({b.arrival_seconds, std::move(b.prompt), b.output_tokens});
    source = ListSource(std::move(list));
  }
  auto result = SimulateCluster(*profile, o, *source);
  if (!result.ok()) {
    const bool bad_input = result.status().code() == absl::StatusCode::kInvalidArgument;
    return ReportError(cmd, result.status(), bad_input ? kExitUsage : kExitError);
  }
  const LoadSummary& summary = result->summary;
  const double span = result->end_seconds - result->first_arrival_seconds;
  const double speedup = result->wall_seconds > 0 ? span / result->wall_seconds : 0;
  const double us_per_step = result->steps > 0 ? result->wall_seconds * 1e6 / result->steps : 0;
  const std::string label = Str("simulated ", prefill, "P", decode, "D ", RoutingPolicyName(o.routing.policy),
                                profile->modelled ? " (modelled)" : "");
  const double shown_rate =
      std::isnan(label_rate) ? (span > 0 ? static_cast<double>(summary.ok + summary.failed) / span : 0) : label_rate;
  if (format == "json") {
    Json j = {{"policy", std::string(RoutingPolicyName(o.routing.policy))}, {"simulated", true},
              {"modelled", profile->modelled}, {"profile_model", profile->model}};
    for (const auto& [name, value] : SummaryFigures(shown_rate, summary)) j[name] = value;
    if (!summary.first_error.empty()) j["first_error"] = summary.first_error;
    j["prefill_workers"] = prefill;
    j["decode_workers"] = decode;
    j["kv_blocks_per_worker"] = kv_blocks;
    j["local_prefills"] = result->local_prefills;
    j["remote_prefills"] = result->remote_prefills;
    j["reserve_refusals"] = result->reserve_refusals;
    j["guard_fallbacks"] = result->guard_fallbacks;
    j["peak_in_flight"] = result->peak_in_flight;
    j["steps"] = result->steps;
    j["mean_batch"] = result->steps > 0 ? static_cast<double>(result->step_sequences) / result->steps : 0.0;
    j["sim_wall_seconds"] = result->wall_seconds;
    j["sim_us_per_step"] = us_per_step;
    j["sim_speedup"] = speedup;
    Json workers = Json::array();
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
  double busy_max = 0, busy_sum = 0;
  for (const SimWorkerStats& s : result->workers) {
    if (s.tier != "decode" || span <= 0) continue;
    busy_max = std::max(busy_max, s.busy_seconds / span);
    busy_sum += s.busy_seconds / span;
  }
  std::printf("%-40s %.2f / %.2f\n", "Decode busy max / mean:", busy_max, busy_sum / static_cast<double>(decode));
  std::printf("%-40s %.1f s in %.2f s (%.0fx), %.2f us per step (mean batch %.1f)\n",
              "Simulated time / wall time:", span, result->wall_seconds, speedup, us_per_step,
              result->steps > 0 ? static_cast<double>(result->step_sequences) / result->steps : 0.0);
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
