// pdserve bench: load against a router (--server), or the same workload against a fresh local
// cluster per routing policy (--compare-policies), in the spirit of `vllm bench serve`: TTFT,
// TPOT, ITL and end-to-end latency (mean, p50, p90, p99), request and token throughput, goodput
// under SLOs, the prefix-cache hit rate, and how evenly the router spread the requests (max/mean
// of per-worker decisions, from RouterAdmin). --sweep runs several request rates; --csv feeds
// bench/plot.sh. --workload trace replays a Mooncake-format trace (the simulator's reader): its
// arrival times, lengths and shared prefixes, so `pdserve simulate` and the real processes run
// the same requests.
#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "loadgen/load_client.h"
#include "loadgen/local_cluster.h"
#include "loadgen/workload.h"
#include "cli/address_flags.h"
#include "cli/bench_report.h"
#include "cli/server_cpu.h"
#include "cli/cli_util.h"
#include "cli/client_channel.h"
#include "cli/commands.h"
#include "cli/sim_flags.h"
#include "common/base/status_macros.h"
#include "common/base/strings.h"
#include "common/rpc/grpc_status.h"
#include "nlohmann/json.hpp"
#include "pdserve/internal/v1/worker.grpc.pb.h"
#include "pdserve/v1/generation.grpc.pb.h"
#include "planner/simulator.h"
#include "router/routing_policy.h"

namespace pdserve::cli {
namespace {

struct PolicyResult {
  std::string label;  // The policy, or the server's.
  double rate = 0;    // Requests per second asked for (infinity: all at once).
  LoadSummary summary;
  internal::v1::RouterStats stats;
  bool have_stats = false;
  double decode_max_mean = 0, prefill_max_mean = 0;
  std::vector<int64_t> decode_decisions;
  // Speculative decoding during the run (the decode tier's counters, after minus before).
  // spec_on: a decode worker speculates (it reports acceptance by position); a run may still
  // draft nothing (the step budget keeps only drafts that pay on this machine).
  bool spec_on = false;
  int64_t spec_drafts = 0, spec_draft_tokens = 0, spec_accepted = 0;
  std::vector<int64_t> spec_accepted_by_position;
  // --cpu-metrics: each server process's CPU over the run, in microseconds an output token, and
  // its engine's step time likewise (negative: it runs no engine).
  struct ProcessCost {
    std::string name;
    double cpu_us = 0, engine_step_us = -1;
  };
  std::vector<ProcessCost> cpu_us_per_token;
};

// The decode tier's speculative decoding totals, as the router last heard them.
struct SpecTotals {
  int64_t drafts = 0, draft_tokens = 0, accepted = 0;
  std::vector<int64_t> by_position;
  bool operator==(const SpecTotals& o) const {
    return drafts == o.drafts && draft_tokens == o.draft_tokens && accepted == o.accepted &&
           by_position == o.by_position;
  }
};

SpecTotals SumSpec(const internal::v1::RouterStats& stats) {
  SpecTotals t;
  for (const auto& w : stats.decode()) {
    const internal::v1::WorkerInfo& i = w.info();
    t.drafts += i.spec_drafts();
    t.draft_tokens += i.spec_draft_tokens();
    t.accepted += i.spec_accepted_tokens();
    if (t.by_position.size() < static_cast<size_t>(i.spec_accepted_by_position_size())) {
      t.by_position.resize(static_cast<size_t>(i.spec_accepted_by_position_size()));
    }
    for (int p = 0; p < i.spec_accepted_by_position_size(); ++p) {
      t.by_position[static_cast<size_t>(p)] += i.spec_accepted_by_position(p);
    }
  }
  return t;
}

bool GetStats(internal::v1::RouterAdmin::Stub* admin, const std::string& api_key,
              internal::v1::RouterStats* out) {
  grpc::ClientContext ctx;
  AddApiKey(&ctx, api_key);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  return admin->GetRouterStats(&ctx, {}, out).ok();
}

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

// "inf" or a positive number of requests per second.
absl::StatusOr<v1::ModelInfo> ModelInfo(const std::shared_ptr<grpc::Channel>& channel,
                                        const std::string& api_key) {
  auto stub = v1::Generation::NewStub(channel);
  grpc::ClientContext ctx;
  AddApiKey(&ctx, api_key);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::ModelInfo info;
  grpc::Status s = stub->GetModelInfo(&ctx, {}, &info);
  if (!s.ok()) return FromGrpcStatus(s);
  return info;
}

// --workload trace: the file and how to read it.
struct TraceSpec {
  std::string path;
  TraceOptions options;
};

// A trace's requests as the load client sends them (the simulator's reader, so the same tokens
// for the same vocabulary), arrivals from its first request's.
absl::StatusOr<std::vector<BenchRequest>> ReadTrace(const TraceSpec& trace, int64_t vocab_size) {
  TraceOptions t = trace.options;
  t.vocab_size = vocab_size;
  auto source = OpenTrace(trace.path, t);
  if (!source.ok()) return absl::InvalidArgumentError(Str("--trace: ", source.status().message()));
  std::vector<BenchRequest> out;
  SimRequest r;
  double first = 0;
  for (;;) {
    auto more = (*source)->Next(&r);
    if (!more.ok()) return absl::InvalidArgumentError(Str("--trace: ", more.status().message()));
    if (!*more) break;
    if (out.empty()) first = r.arrival_seconds;
    BenchRequest b;
    b.prompt = std::move(r.prompt);
    b.output_tokens = r.output_tokens;
    b.arrival_seconds = r.arrival_seconds - first;
    out.push_back(std::move(b));
  }
  if (out.empty()) return absl::InvalidArgumentError(Str("--trace: '", trace.path, "' has no requests"));
  return out;
}

// The workload for this server's model: its vocabulary, and prompts that fit its context.
absl::StatusOr<std::vector<BenchRequest>> WorkloadFor(const v1::ModelInfo& info, WorkloadOptions w,
                                                      const TraceSpec* trace) {
  w.vocab_size = info.vocab_size();
  const int64_t context = info.context_length();
  if (trace != nullptr) {
    PD_ASSIGN_OR_RETURN(std::vector<BenchRequest> requests, ReadTrace(*trace, w.vocab_size));
    for (size_t i = 0; i < requests.size(); ++i) {
      const BenchRequest& r = requests[i];
      if (static_cast<int64_t>(r.prompt.size()) + r.output_tokens > context) {
        return absl::InvalidArgumentError(
            Str("--trace: request ", i + 1, " (", r.prompt.size(), " prompt + ", r.output_tokens,
                " output tokens) exceeds the model's ", context,
                "-token context (lower --trace-length-scale or --trace-max-requests)"));
      }
    }
    return requests;
  }
  if (w.kind == "synthetic-chat") {
    const int64_t room = context - 8 * w.output_len;
    if (room < 4) {
      return absl::InvalidArgumentError(Str("--output-len: replies of up to 8 x ", w.output_len,
                                            " tokens leave no room for a prompt in the model's ",
                                            context, "-token context"));
    }
    w.max_prompt_len = w.max_prompt_len > 0 ? std::min(w.max_prompt_len, room) : std::min(16 * w.input_len, room);
  }
  PD_ASSIGN_OR_RETURN(std::vector<BenchRequest> requests, MakeWorkload(w));
  for (const BenchRequest& r : requests) {
    if (static_cast<int64_t>(r.prompt.size()) + r.output_tokens > context) {
      return absl::InvalidArgumentError(
          Str("--input-len/--output-len: a request of ", r.prompt.size(), " prompt + ",
              r.output_tokens, " output tokens exceeds the model's ", context, "-token context"));
    }
  }
  return requests;
}

absl::StatusOr<PolicyResult> Measure(const std::shared_ptr<grpc::Channel>& channel,
                                     const WorkloadOptions& workload, const TraceSpec* trace,
                                     const LoadOptions& load, const Slo& slo) {
  PD_ASSIGN_OR_RETURN(const v1::ModelInfo info, ModelInfo(channel, load.api_key));
  PD_ASSIGN_OR_RETURN(const std::vector<BenchRequest> requests, WorkloadFor(info, workload, trace));
  PolicyResult r;
  r.rate = workload.rate;
  auto admin = internal::v1::RouterAdmin::NewStub(channel);
  internal::v1::RouterStats before;
  const bool have_before = GetStats(admin.get(), load.api_key, &before);
  r.summary = Summarize(RunLoad(channel, requests, load), slo);
  if (GetStats(admin.get(), load.api_key, &r.stats)) {
    r.have_stats = true;
    // Workers report after each step: wait (at most 3 s) until two reports 100 ms apart agree,
    // so the last steps' speculation is counted.
    for (int i = 0; i < 30; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      internal::v1::RouterStats again;
      if (!GetStats(admin.get(), load.api_key, &again)) break;
      const bool settled = SumSpec(again) == SumSpec(r.stats);
      r.stats = std::move(again);
      if (settled) break;
    }
    if (have_before) {
      const SpecTotals b = SumSpec(before), a = SumSpec(r.stats);
      r.spec_on = !a.by_position.empty();
      r.spec_drafts = a.drafts - b.drafts;
      r.spec_draft_tokens = a.draft_tokens - b.draft_tokens;
      r.spec_accepted = a.accepted - b.accepted;
      r.spec_accepted_by_position = a.by_position;
      for (size_t p = 0; p < b.by_position.size() && p < a.by_position.size(); ++p) {
        r.spec_accepted_by_position[p] -= b.by_position[p];
      }
    }
    r.label = r.stats.policy();
    r.decode_max_mean = MaxOverMean(r.stats.decode());
    r.prefill_max_mean = MaxOverMean(r.stats.prefill());
    for (const auto& w : r.stats.decode()) r.decode_decisions.push_back(w.decisions());
  }
  return r;
}

// Every figure of a result, by name: the json keys and the csv columns.
std::vector<std::pair<std::string, nlohmann::json>> Figures(const PolicyResult& r) {
  return SummaryFigures(r.rate, r.summary);
}

nlohmann::json ToJson(const PolicyResult& r) {
  nlohmann::json j = {{"policy", r.label}};
  for (const auto& [name, value] : Figures(r)) j[name] = value;
  if (!r.summary.first_error.empty()) j["first_error"] = r.summary.first_error;
  if (!r.cpu_us_per_token.empty()) {
    nlohmann::json cpu = nlohmann::json::object(), step = nlohmann::json::object();
    for (const auto& c : r.cpu_us_per_token) {
      cpu[c.name] = c.cpu_us;
      if (c.engine_step_us >= 0) step[c.name] = c.engine_step_us;
    }
    j["cpu_us_per_output_token"] = cpu;
    j["engine_step_us_per_output_token"] = step;
  }
  if (r.have_stats) {
    j["decode_max_over_mean"] = r.decode_max_mean;
    j["prefill_max_over_mean"] = r.prefill_max_mean;
    j["decode_decisions"] = r.decode_decisions;
    j["local_prefills"] = r.stats.local_prefills();
    j["remote_prefills"] = r.stats.remote_prefills();
    j["guard_fallbacks"] = r.stats.guard_fallbacks();
    // KV page bytes the decode tier received, from the workers' latest load reports.
    int64_t transfer_bytes = 0;
    for (const auto& w : r.stats.decode()) transfer_bytes += w.info().transfer_bytes();
    j["kv_transfer_bytes"] = transfer_bytes;
    if (r.spec_on) {  // As vLLM's spec decoding log line: rates of the run's drafts.
      // A run without drafts: rate 0, mean acceptance length 1 (each step made one token).
      const double drafts = static_cast<double>(std::max<int64_t>(r.spec_drafts, 1));
      j["spec_drafts"] = r.spec_drafts;
      j["spec_draft_tokens"] = r.spec_draft_tokens;
      j["spec_accepted_tokens"] = r.spec_accepted;
      j["spec_acceptance_rate"] = static_cast<double>(r.spec_accepted) /
                                  static_cast<double>(std::max<int64_t>(r.spec_draft_tokens, 1));
      j["spec_mean_acceptance_length"] = 1.0 + static_cast<double>(r.spec_accepted) / drafts;
      std::vector<double> per_position;
      for (int64_t n : r.spec_accepted_by_position) per_position.push_back(static_cast<double>(n) / drafts);
      j["spec_acceptance_by_position"] = per_position;
    }
  }
  return j;
}

absl::Status WriteCsv(const std::string& path, const std::vector<PolicyResult>& results) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return absl::InvalidArgumentError(Str("--csv: cannot write '", path, "'"));
  std::fprintf(f, "policy");
  for (const auto& [name, value] : Figures(results.front())) std::fprintf(f, ",%s", name.c_str());
  std::fprintf(f, "\n");
  for (const PolicyResult& r : results) {
    std::fprintf(f, "%s", r.label.c_str());
    for (const auto& [name, value] : Figures(r)) {
      if (value.is_number_float()) {
        std::fprintf(f, ",%.6g", value.get<double>());
      } else {
        std::fprintf(f, ",%s", value.is_string() ? value.get<std::string>().c_str() : value.dump().c_str());
      }
    }
    std::fprintf(f, "\n");
  }
  return std::fclose(f) == 0 ? absl::OkStatus()
                             : absl::DataLossError(Str("--csv: writing '", path, "' failed"));
}

// One result the way `vllm bench serve` prints it.
void PrintBlock(const PolicyResult& r, const Slo& slo) {
  PrintSummaryFigures(r.label, r.rate, r.summary, slo);
  for (const auto& c : r.cpu_us_per_token) {
    std::printf("%-40s %.1f\n", Str("CPU per output token (us), ", c.name, ":").c_str(), c.cpu_us);
    if (c.engine_step_us >= 0) {
      std::printf("%-40s %.1f\n", Str("  of which engine steps (us), ", c.name, ":").c_str(), c.engine_step_us);
    }
  }
  if (r.have_stats) {
    std::printf("%-40s %.2f / %.2f\n", "Routing max/mean (decode / prefill):", r.decode_max_mean,
                r.prefill_max_mean);
    std::printf("%-40s %lld / %lld\n", "Local / remote prefills:",
                static_cast<long long>(r.stats.local_prefills()),
                static_cast<long long>(r.stats.remote_prefills()));
    if (r.spec_on) {
      std::printf("%-40s %.3f (%lld of %lld drafted)\n", "Speculative acceptance rate:",
                  static_cast<double>(r.spec_accepted) /
                      static_cast<double>(std::max<int64_t>(r.spec_draft_tokens, 1)),
                  static_cast<long long>(r.spec_accepted), static_cast<long long>(r.spec_draft_tokens));
      std::printf("%-40s %.2f\n", "Mean acceptance length:",
                  1.0 + static_cast<double>(r.spec_accepted) /
                            static_cast<double>(std::max<int64_t>(r.spec_drafts, 1)));
    }
  }
  PrintSummaryEnd(r.summary);
}

// Several results (policies, rates) side by side.
void PrintTable(const std::vector<PolicyResult>& results) {
  std::printf("| policy | rate | ok/failed | hit rate | TTFT p50/p99 ms | TPOT p50/p99 ms | ITL p99 ms "
              "| E2E p50 ms | req/s | out tok/s | goodput | decode max/mean |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (const PolicyResult& r : results) {
    const LoadSummary& s = r.summary;
    std::printf("| %s | %s | %lld/%lld | %.3f | %.1f / %.1f | %.1f / %.1f | %.1f | %.1f | %.2f | %.1f "
                "| %.2f | %s |\n",
                r.label.c_str(), RateText(r.rate).c_str(), static_cast<long long>(s.ok),
                static_cast<long long>(s.failed), s.hit_rate, s.ttft.p50 * 1e3, s.ttft.p99 * 1e3,
                s.tpot.p50 * 1e3, s.tpot.p99 * 1e3, s.itl.p99 * 1e3, s.e2e.p50 * 1e3,
                s.requests_per_second, s.output_tokens_per_second, s.goodput,
                r.have_stats ? Str(r.decode_max_mean).c_str() : "-");
  }
}

}  // namespace

int BenchCommand(int argc, char** argv) {
  const char* cmd = "bench";
  std::string server, compare, model, format = "text", worker_flags, router_flags;
  std::string rate_text = "inf", sweep, goodput, csv, server_ca, cpu_metrics;
  int64_t prefill = 2, decode = 3, local_prefill_tokens = 32, seed = 1;
  WorkloadOptions w;
  TraceSpec trace;
  LoadOptions load;
  FlagSet flags("bench", "Serving benchmark: a workload against a router (--server), or against a "
                         "fresh local cluster per routing policy (--compare-policies).");
  flags.String("server", &server, "a running router, host:port");
  flags.String("server-ca", &server_ca, "with --server: PEM CA to verify the router's TLS certificate");
  flags.String("endpoint", &load.endpoint,
               "grpc, openai-completions or openai-chat (the OpenAI HTTP API at --http-server; "
               "TTFT to the first SSE chunk with content)");
  flags.String("http-server", &load.http_address,
               "with --server and an openai endpoint: the router's --http-listen address");
  flags.String("api-key", &load.api_key,
               "with --server: API key (better: PDSERVE_API_KEY in the environment)");
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
  flags.String("workload", &w.kind,
               "random, shared-prefix or synthetic-chat, or trace (--trace: its arrival times, lengths "
               "and shared prefixes)");
  RegisterWorkloadShapeFlags(flags, &w);
  RegisterTraceFlags(flags, &trace.path, &trace.options);
  flags.String("request-rate", &rate_text, "requests per second, or inf (all at once)");
  flags.Int("max-concurrency", &load.max_concurrency, "streams open at once (0: no limit)");
  flags.String("goodput", &goodput,
               "SLOs for goodput, e.g. 'ttft:500 tpot:50' (ms; keys ttft, tpot, e2el)");
  flags.String("sweep", &sweep, "comma-separated request rates to run in turn (overrides --request-rate)");
  flags.Int("seed", &seed, "workload seed");
  flags.Double("timeout-seconds", &load.timeout_seconds, "deadline of each request");
  flags.String("cpu-metrics", &cpu_metrics,
               "with --server: the server processes' /metrics (name=host:port, comma-separated): "
               "each one's CPU per output token over the run, from process_cpu_seconds_total");
  flags.String("format", &format, "text or json");
  flags.String("csv", &csv, "also write one csv row per result here (for bench/plot.sh)");
  int code;
  if (!ParseFlagsOrExit(flags, cmd, argc, argv, &code)) return code;
  w.seed = static_cast<uint64_t>(seed);
  auto usage = [&](absl::Status s) { return ReportError(cmd, s, kExitUsage); };
  if (server.empty() == compare.empty()) {
    return usage(absl::InvalidArgumentError("give either --server or --compare-policies (with --model)"));
  }
  if (format != "text" && format != "json") {
    return usage(absl::InvalidArgumentError("--format: must be text or json"));
  }
  if (!server.empty()) {
    if (absl::Status s = AddressFlags().Peer(server, "--server").Check(); !s.ok()) return usage(s);
  }
  if (load.endpoint != "grpc" && load.endpoint != "openai-completions" && load.endpoint != "openai-chat") {
    return usage(absl::InvalidArgumentError("--endpoint: must be grpc, openai-completions or openai-chat"));
  }
  if (load.endpoint != "grpc") {
    if (server.empty() || load.http_address.empty()) {
      return usage(absl::InvalidArgumentError(
          Str("--endpoint ", load.endpoint, " needs --server (model info, router stats) and --http-server")));
    }
    if (absl::Status s = AddressFlags().Peer(load.http_address, "--http-server").Check(); !s.ok()) return usage(s);
  }
  if (!(load.timeout_seconds > 0)) {
    return usage(absl::InvalidArgumentError("--timeout-seconds: must be > 0"));
  }
  // The load client holds a thread per open stream.
  constexpr int64_t kMaxStreams = 10000;
  if (load.max_concurrency < 0 || load.max_concurrency > kMaxStreams) {
    return usage(absl::InvalidArgumentError(Str("--max-concurrency: must be in [0, ", kMaxStreams, "]")));
  }
  const bool replay = w.kind == "trace";
  if (replay) {
    if (trace.path.empty()) return usage(absl::InvalidArgumentError("--workload trace needs --trace FILE"));
    if (!sweep.empty() || rate_text != "inf") {
      return usage(absl::InvalidArgumentError(
          "--request-rate, --sweep: a trace keeps its own arrival times (scale them with --trace-time-scale)"));
    }
    // Read once here for its errors and its size, before any cluster starts.
    auto scan = ReadTrace(trace, 1 << 20);
    if (!scan.ok()) return usage(scan.status());
    w.num_prompts = static_cast<int64_t>(scan->size());
  } else if (!trace.path.empty()) {
    return usage(absl::InvalidArgumentError("--trace: only with --workload trace"));
  }
  if (load.max_concurrency == 0 && w.num_prompts > kMaxStreams) {
    return usage(absl::InvalidArgumentError(
        Str(replay ? "--trace" : "--num-prompts", ": more than ", kMaxStreams,
            " requests need --max-concurrency (the load client holds a thread per open stream)")));
  }
  std::vector<CpuEndpoint> cpu_endpoints;
  if (!cpu_metrics.empty()) {
    if (server.empty()) return usage(absl::InvalidArgumentError("--cpu-metrics: only with --server"));
    auto parsed = ParseCpuEndpoints(cpu_metrics);
    if (!parsed.ok()) return usage(parsed.status());
    cpu_endpoints = std::move(*parsed);
  }
  Slo slo;
  if (absl::Status s = ParseSlo(goodput, &slo); !s.ok()) return usage(s);
  std::vector<double> rates;
  if (replay) {
    rates.push_back(std::numeric_limits<double>::quiet_NaN());  // The trace's own arrivals.
  } else if (sweep.empty()) {
    auto rate = ParseRate(rate_text, "--request-rate");
    if (!rate.ok()) return usage(rate.status());
    rates.push_back(*rate);
  } else {
    for (absl::string_view item : absl::StrSplit(sweep, ',', absl::SkipEmpty())) {
      auto rate = ParseRate(item, "--sweep");
      if (!rate.ok()) return usage(rate.status());
      rates.push_back(*rate);
    }
    if (rates.empty()) return usage(absl::InvalidArgumentError("--sweep: no rates"));
  }
  if (!replay) {
    WorkloadOptions check = w;
    check.vocab_size = 1 << 20;
    check.rate = rates.front();
    if (absl::Status s = MakeWorkload(check).status(); !s.ok()) return usage(s);
  }
  load.progress = isatty(STDERR_FILENO) != 0;
  if (!csv.empty()) {  // Before a long run, not after it.
    std::FILE* f = std::fopen(csv.c_str(), "w");
    if (f == nullptr) return usage(absl::InvalidArgumentError(Str("--csv: cannot write '", csv, "'")));
    std::fclose(f);
  }

  // Runs every rate against one server.
  std::vector<PolicyResult> results;
  auto run_rates = [&](const std::string& address, const std::string& label) -> absl::Status {
    for (size_t k = 0; k < rates.size(); ++k) {
      const double rate = rates[k];
      WorkloadOptions at = w;
      at.rate = rate;
      // Each rate of a sweep gets its own prompts: the server's prefix cache still holds the
      // previous rate's, which would turn later runs into cache hits.
      at.seed = w.seed + k;
      std::fprintf(stderr, "bench: %s: %lld requests at rate %s\n",
                   (label.empty() ? address : label).c_str(),
                   static_cast<long long>(w.num_prompts), RateText(rate).c_str());
      PD_ASSIGN_OR_RETURN(auto channel, PublicChannel(address, server_ca));
      std::map<std::string, ProcessTimes> cpu_before;
      if (!cpu_endpoints.empty()) {
        PD_ASSIGN_OR_RETURN(cpu_before, ScrapeProcessTimes(cpu_endpoints));
      }
      PD_ASSIGN_OR_RETURN(PolicyResult r, Measure(channel, at, replay ? &trace : nullptr, load, slo));
      if (!cpu_endpoints.empty()) {
        PD_ASSIGN_OR_RETURN(const auto cpu_after, ScrapeProcessTimes(cpu_endpoints));
        const double tokens = static_cast<double>(std::max<int64_t>(r.summary.completion_tokens, 1));
        for (const CpuEndpoint& e : cpu_endpoints) {
          const ProcessTimes& a = cpu_after.at(e.name);
          const ProcessTimes& b = cpu_before.at(e.name);
          PolicyResult::ProcessCost c;
          c.name = e.name;
          c.cpu_us = (a.cpu_seconds - b.cpu_seconds) / tokens * 1e6;
          if (a.engine_step_seconds >= 0 && b.engine_step_seconds >= 0) {
            c.engine_step_us = (a.engine_step_seconds - b.engine_step_seconds) / tokens * 1e6;
          }
          r.cpu_us_per_token.push_back(std::move(c));
        }
      }
      if (!label.empty()) r.label = label;
      if (r.label.empty()) r.label = address;
      results.push_back(std::move(r));
    }
    return absl::OkStatus();
  };
  if (!server.empty()) {
    if (absl::Status s = run_rates(server, ""); !s.ok()) {
      return ReportError(cmd, s, absl::IsInvalidArgument(s) ? kExitUsage : kExitError);
    }
  } else {
    if (model.empty()) return usage(absl::InvalidArgumentError("--compare-policies needs --model"));
    if (prefill < 0 || decode < 1) {
      return usage(absl::InvalidArgumentError("--prefill must be >= 0 and --decode >= 1"));
    }
    std::vector<std::string> policies;
    for (absl::string_view p : absl::StrSplit(compare, ',', absl::SkipEmpty())) {
      if (absl::Status s = ParseRoutingPolicy(std::string(p)).status(); !s.ok()) {
        return usage(absl::InvalidArgumentError(Str("--compare-policies: '", p, "' is not a policy")));
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
      const absl::Status measured = run_rates((*cluster)->router(), policy);
      const absl::Status stopped = (*cluster)->Stop();
      if (!measured.ok()) return ReportError(cmd, measured);
      if (!stopped.ok()) return ReportError(cmd, stopped);
    }
  }
  if (format == "json") {
    nlohmann::json out = nlohmann::json::array();
    for (const PolicyResult& r : results) out.push_back(ToJson(r));
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    for (const PolicyResult& r : results) PrintBlock(r, slo);
    if (results.size() > 1) PrintTable(results);
  }
  if (!csv.empty()) {
    if (absl::Status s = WriteCsv(csv, results); !s.ok()) return ReportError(cmd, s);
  }
  for (const PolicyResult& r : results) {
    if (r.summary.failed > 0) return kExitError;
  }
  return kExitOk;
}

}  // namespace pdserve::cli
