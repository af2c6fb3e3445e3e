// pdserve bench: load against a router (--server), or the same workload against a fresh local
// cluster per routing policy (--compare-policies), with the figures a serving team compares:
// prefix-cache hit rate, TTFT and TPOT percentiles, requests per second, and how evenly the
// router spread the requests (max/mean of per-worker decisions, from RouterAdmin).
#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <cstdio>
#include <thread>

#include "absl/strings/str_split.h"
#include "bench/serving/load_client.h"
#include "bench/serving/local_cluster.h"
#include "bench/serving/workload.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "common/base/status_macros.h"
#include "common/base/strings.h"
#include "common/rpc/grpc_status.h"
#include "nlohmann/json.hpp"
#include "pdserve/internal/v1/worker.grpc.pb.h"
#include "pdserve/v1/generation.grpc.pb.h"
#include "router/routing_policy.h"

namespace pdserve::cli {
namespace {

struct PolicyResult {
  std::string label;  // The policy, or the server's.
  LoadSummary summary;
  internal::v1::RouterStats stats;
  bool have_stats = false;
  double decode_max_mean = 0, prefill_max_mean = 0;
  std::vector<int64_t> decode_decisions;
};

double MaxOverMean(const google::protobuf::RepeatedPtrField<internal::v1::RoutedWorker>& ws) {
  if (ws.empty()) return 0;
  int64_t max = 0, sum = 0;
  for (const auto& w : ws) {
    max = std::max(max, w.decisions());
    sum += w.decisions();
  }
  return sum == 0 ? 0 : static_cast<double>(max) * ws.size() / static_cast<double>(sum);
}

std::vector<std::string> Words(const std::string& s) {
  std::vector<std::string> out;
  for (absl::string_view w : absl::StrSplit(s, ' ', absl::SkipEmpty())) out.emplace_back(w);
  return out;
}

absl::StatusOr<v1::ModelInfo> ModelInfo(const std::string& server) {
  auto stub = v1::Generation::NewStub(grpc::CreateChannel(server, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::ModelInfo info;
  grpc::Status s = stub->GetModelInfo(&ctx, {}, &info);
  if (!s.ok()) return FromGrpcStatus(s);
  return info;
}

absl::StatusOr<PolicyResult> Measure(const std::string& server, WorkloadOptions workload,
                                     double timeout_seconds) {
  PD_ASSIGN_OR_RETURN(const v1::ModelInfo info, ModelInfo(server));
  workload.vocab_size = info.vocab_size();
  PD_ASSIGN_OR_RETURN(const std::vector<BenchRequest> requests, MakeWorkload(workload));
  PolicyResult r;
  r.summary = Summarize(RunLoad(server, requests, workload.output_tokens, timeout_seconds));
  auto admin = internal::v1::RouterAdmin::NewStub(
      grpc::CreateChannel(server, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (admin->GetRouterStats(&ctx, {}, &r.stats).ok()) {
    r.have_stats = true;
    r.label = r.stats.policy();
    r.decode_max_mean = MaxOverMean(r.stats.decode());
    r.prefill_max_mean = MaxOverMean(r.stats.prefill());
    for (const auto& w : r.stats.decode()) r.decode_decisions.push_back(w.decisions());
  }
  return r;
}

nlohmann::json ToJson(const PolicyResult& r) {
  const LoadSummary& s = r.summary;
  nlohmann::json j = {{"policy", r.label},
                      {"ok", s.ok},
                      {"failed", s.failed},
                      {"hit_rate", s.hit_rate},
                      {"ttft_p50_ms", s.ttft_p50 * 1e3},
                      {"ttft_p90_ms", s.ttft_p90 * 1e3},
                      {"tpot_p50_ms", s.tpot_p50 * 1e3},
                      {"tpot_p90_ms", s.tpot_p90 * 1e3},
                      {"requests_per_second", s.requests_per_second},
                      {"output_tokens_per_second", s.output_tokens_per_second}};
  if (!s.first_error.empty()) j["first_error"] = s.first_error;
  if (r.have_stats) {
    j["decode_max_over_mean"] = r.decode_max_mean;
    j["prefill_max_over_mean"] = r.prefill_max_mean;
    j["decode_decisions"] = r.decode_decisions;
    j["local_prefills"] = r.stats.local_prefills();
    j["remote_prefills"] = r.stats.remote_prefills();
    j["guard_fallbacks"] = r.stats.guard_fallbacks();
  }
  return j;
}

void PrintTable(const std::vector<PolicyResult>& results) {
  std::printf("| policy | ok/failed | hit rate | TTFT p50 ms | TTFT p90 ms | TPOT p50 ms | TPOT p90 ms "
              "| req/s | decode max/mean | prefill max/mean | local/remote prefills |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (const PolicyResult& r : results) {
    const LoadSummary& s = r.summary;
    std::printf("| %s | %lld/%lld | %.3f | %.1f | %.1f | %.1f | %.1f | %.2f | %s | %s | %s |\n",
                r.label.c_str(), static_cast<long long>(s.ok), static_cast<long long>(s.failed),
                s.hit_rate, s.ttft_p50 * 1e3, s.ttft_p90 * 1e3, s.tpot_p50 * 1e3, s.tpot_p90 * 1e3,
                s.requests_per_second,
                r.have_stats ? Str(r.decode_max_mean).c_str() : "-",
                r.have_stats ? Str(r.prefill_max_mean).c_str() : "-",
                r.have_stats ? Str(r.stats.local_prefills(), "/", r.stats.remote_prefills()).c_str()
                             : "-");
    if (!s.first_error.empty()) std::printf("  first error: %s\n", s.first_error.c_str());
  }
}

}  // namespace

int BenchCommand(int argc, char** argv) {
  const char* cmd = "bench";
  std::string server, compare, model, format = "text", worker_flags, router_flags;
  int64_t prefill = 2, decode = 3, local_prefill_tokens = 32, seed = 1;
  double timeout_seconds = 300;
  WorkloadOptions w;
  FlagSet flags("bench", "Serving benchmark: a workload against a router (--server), or against a "
                         "fresh local cluster per routing policy (--compare-policies).");
  flags.String("server", &server, "a running router, host:port");
  flags.String("compare-policies", &compare,
               "comma-separated policies to compare on local clusters (e.g. round_robin,kv_aware)");
  flags.String("model", &model, "--compare-policies: the model directory");
  flags.Int("prefill", &prefill, "--compare-policies: prefill workers");
  flags.Int("decode", &decode, "--compare-policies: decode workers");
  flags.String("worker-flags", &worker_flags,
               "--compare-policies: flags for every worker, space-separated (e.g. '--threads 1 "
               "--kv-blocks 96')");
  flags.String("router-flags", &router_flags, "--compare-policies: extra router flags");
  flags.Int("local-prefill-tokens", &local_prefill_tokens,
            "--compare-policies: router's and decode workers' --local-prefill-tokens");
  flags.String("workload", &w.kind, "shared-prefix or random");
  flags.Int("requests", &w.requests, "requests to send");
  flags.Double("rate", &w.rate, "Poisson arrival rate, requests per second (<= 0: all at once)");
  flags.Int("groups", &w.groups, "shared-prefix: distinct system prompts");
  flags.Int("system-tokens", &w.system_tokens, "shared-prefix: system prompt length");
  flags.Int("suffix-tokens", &w.suffix_tokens, "user part length (random: added to system-tokens)");
  flags.Int("output-tokens", &w.output_tokens, "tokens generated per request (EOS ignored)");
  flags.Int("seed", &seed, "workload seed");
  flags.Double("timeout-seconds", &timeout_seconds, "deadline of each request");
  flags.String("format", &format, "text (a markdown table) or json");
  int code;
  if (!ParseFlagsOrExit(flags, cmd, argc, argv, &code)) return code;
  w.seed = static_cast<uint64_t>(seed);
  if (server.empty() == compare.empty()) {
    return ReportError(cmd, absl::InvalidArgumentError(
                                "give either --server or --compare-policies (with --model)"),
                       kExitUsage);
  }
  if (format != "text" && format != "json") {
    return ReportError(cmd, absl::InvalidArgumentError("--format: must be text or json"), kExitUsage);
  }
  if (!(timeout_seconds > 0)) {
    return ReportError(cmd, absl::InvalidArgumentError("--timeout-seconds: must be > 0"), kExitUsage);
  }
  {
    WorkloadOptions check = w;
    check.vocab_size = 1 << 20;
    if (absl::Status s = MakeWorkload(check).status(); !s.ok()) return ReportError(cmd, s, kExitUsage);
  }
  std::vector<PolicyResult> results;
  if (!server.empty()) {
    auto r = Measure(server, w, timeout_seconds);
    if (!r.ok()) return ReportError(cmd, r.status());
    if (r->label.empty()) r->label = server;
    results.push_back(std::move(*r));
  } else {
    if (model.empty()) {
      return ReportError(cmd, absl::InvalidArgumentError("--compare-policies needs --model"), kExitUsage);
    }
    if (prefill < 0 || decode < 1) {
      return ReportError(cmd, absl::InvalidArgumentError("--prefill must be >= 0 and --decode >= 1"),
                         kExitUsage);
    }
    std::vector<std::string> policies;
    for (absl::string_view p : absl::StrSplit(compare, ',', absl::SkipEmpty())) {
      if (absl::Status s = ParseRoutingPolicy(std::string(p)).status(); !s.ok()) {
        return ReportError(cmd, absl::InvalidArgumentError(Str("--compare-policies: '", p,
                                                               "' is not a policy")), kExitUsage);
      }
      policies.emplace_back(p);
    }
    for (const std::string& policy : policies) {
      LocalClusterOptions o;
      o.binary = "/proc/self/exe";
      o.model = model;
      o.prefill = prefill;
      o.decode = decode;
      o.worker_args = Words(worker_flags);
      o.decode_args = {"--local-prefill-tokens", Str(local_prefill_tokens)};
      o.router_args = {"--policy", policy, "--local-prefill-tokens", Str(local_prefill_tokens)};
      for (const std::string& a : Words(router_flags)) o.router_args.push_back(a);
      std::fprintf(stderr, "bench: %s: starting %lld prefill + %lld decode workers and a router\n",
                   policy.c_str(), static_cast<long long>(prefill), static_cast<long long>(decode));
      auto cluster = LocalCluster::Start(o);
      if (!cluster.ok()) return ReportError(cmd, cluster.status());
      auto r = Measure((*cluster)->router(), w, timeout_seconds);
      const absl::Status stopped = (*cluster)->Stop();
      if (!r.ok()) return ReportError(cmd, r.status());
      if (!stopped.ok()) return ReportError(cmd, stopped);
      r->label = policy;
      results.push_back(std::move(*r));
    }
  }
  if (format == "json") {
    nlohmann::json out = nlohmann::json::array();
    for (const PolicyResult& r : results) out.push_back(ToJson(r));
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    PrintTable(results);
  }
  for (const PolicyResult& r : results) {
    if (r.summary.failed > 0) return kExitError;
  }
  return kExitOk;
}

}  // namespace pdserve::cli
