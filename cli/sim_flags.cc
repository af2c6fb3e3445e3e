#include "cli/sim_flags.h"

#include <cmath>
#include <limits>

#include "cli/bench_report.h"
#include "common/base/file_util.h"
#include "common/base/strings.h"
#include "common/model/model_shapes.h"

namespace pdserve::cli {

void SimFlags::Register(FlagSet& flags, bool with_rate) {
  flags.String("profile", &profile_path, "a `pdserve profile` file (step costs, KV transfer)");
  flags.String("model", &model,
               "optional: the model (directory or config.json) the plan is for; a profile of another model is refused");
  flags.Int("local-prefill-tokens", &cluster.local_prefill_tokens,
            "prompts with at most this many uncached tokens are prefilled on the decode worker");
  flags.Int("prefill-max-waiting", &cluster.prefill_max_waiting,
            "a prefill tier whose every worker queues this many takes no more (prefill locally)");
  flags.Double("transport-gbps", &transport_gbps, "KV transfer bandwidth, GB/s (default: the profile's)");
  flags.Double("transport-latency-us", &transport_latency_us, "KV transfer latency, us (default: the profile's)");
  flags.Double("kv-dtype-bytes", &kv_dtype_bytes,
               "bytes per KV element, for profiles that do not record the pool's (roofline ones)");
  flags.Int("kv-blocks", &kv_blocks, "KV cache blocks per worker (overrides --kv-memory-gib)");
  flags.Double("kv-memory-gib", &kv_memory_gib, "KV cache memory per worker, GiB");
  flags.Int("block-size", &cluster.worker.block_size, "KV cache block size in tokens");
  flags.Int("max-num-seqs", &cluster.worker.max_num_seqs, "sequences per step");
  flags.Int("max-num-batched-tokens", &cluster.worker.max_num_batched_tokens, "token budget per step");
  cluster.worker.max_model_len = 0;
  flags.Int("max-model-len", &cluster.worker.max_model_len,
            "longest sequence (0: the profile's, else what a worker's KV cache holds)");
  flags.Bool("enable-prefix-caching", &cluster.worker.enable_prefix_caching, "reuse KV of shared prompt prefixes");
  flags.Double("kv-offload-host-gib", &host_gib,
               "KV cache tiers: each worker's host-memory tier, GiB (0: none), as the workers' flag");
  flags.Double("kv-offload-host-gbps", &host_gbps, "the host tier's read bandwidth into the pool, GB/s");
  flags.Double("kv-offload-host-latency-us", &host_latency_us, "the host tier's latency per load, us");
  flags.String("kv-tier-load", &tier_load,
               "always, or faster: load a run only when it ends sooner than computing it (as the workers' flag)");
  flags.Double("kv-offload-disk-gib", &disk_gib,
               "KV cache tiers: each worker's disk tier, GiB (0: none), as the workers' flag");
  flags.Double("kv-offload-disk-gbps", &disk_gbps, "the disk tier's read bandwidth, GB/s");
  flags.Double("kv-offload-disk-latency-us", &disk_latency_us, "the disk tier's latency per load, us");
  flags.Double("kv-store-gib", &store_gib, "KV cache tiers: the shared store's size (Redis maxmemory), GiB (0: none)");
  flags.Double("kv-store-gbps", &store_gbps, "the shared store's read bandwidth to a worker, GB/s");
  flags.Double("kv-store-latency-us", &store_latency_us, "the shared store's round trip per load, us");
  flags.String("workload", &workload.kind, "random, shared-prefix or synthetic-chat (as pdserve bench), or trace");
  RegisterTraceFlags(flags, &trace, &trace_options);
  RegisterWorkloadShapeFlags(flags, &workload);
  if (with_rate) flags.String("request-rate", &rate_text, "requests per second, or inf (all at once)");
  flags.Int("seed", &seed, "workload and routing seed");
}

void RegisterTraceFlags(FlagSet& flags, std::string* path, TraceOptions* options) {
  flags.String("trace", path, "--workload trace: a Mooncake-format JSONL trace (../shared/traces/README.md)");
  flags.Double("trace-length-scale", &options->length_scale,
               "multiply the trace's prompt lengths and its 512-token blocks by this (1/32: 16-token blocks)");
  flags.Double("trace-time-scale", &options->time_scale,
               "multiply the trace's arrival times by this (0.5: twice the rate)");
  flags.Int("trace-max-requests", &options->max_requests, "the trace's first N requests (0: all)");
}

namespace {

absl::Status ResolveTierFlags(const SimFlags& f, const SimProfile& profile, ClusterOptions* cluster) {
  const std::pair<double, const char*> checked[] = {
      {f.host_gib, "--kv-offload-host-gib"}, {f.host_gbps, "--kv-offload-host-gbps"},
      {f.host_latency_us, "--kv-offload-host-latency-us"},
      {f.disk_gib, "--kv-offload-disk-gib"}, {f.store_gib, "--kv-store-gib"},
      {f.disk_gbps, "--kv-offload-disk-gbps"}, {f.disk_latency_us, "--kv-offload-disk-latency-us"},
      {f.store_gbps, "--kv-store-gbps"}, {f.store_latency_us, "--kv-store-latency-us"}};
  for (const auto& [v, flag] : checked) {
    if (!(v >= 0) || !std::isfinite(v) || v > 1e9) return absl::InvalidArgumentError(Str(flag, ": must be in [0, 1e9]"));
  }
  for (const auto& [v, flag] : {std::pair{f.host_gbps, "--kv-offload-host-gbps"}, {f.disk_gbps, "--kv-offload-disk-gbps"},
                                {f.store_gbps, "--kv-store-gbps"}}) {
    if (!(v > 0)) return absl::InvalidArgumentError(Str(flag, ": must be > 0"));
  }
  const double block_bytes =
      static_cast<double>(profile.kv_bytes_per_token) * static_cast<double>(cluster->worker.block_size);
  const auto blocks = [&](double gib, const char* flag) -> absl::StatusOr<int64_t> {
    if (gib == 0) return 0;
    if (!(block_bytes > 0)) return absl::InvalidArgumentError(Str(flag, ": the profile has no KV bytes per token"));
    const double n = std::floor(gib * 1073741824.0 / block_bytes);
    if (n < 1) return absl::InvalidArgumentError(Str(flag, ": smaller than one block (", block_bytes, " bytes)"));
    if (n > static_cast<double>(kMaxSimBlocks)) {
      return absl::InvalidArgumentError(Str(flag, ": more than ", kMaxSimBlocks, " blocks to simulate"));
    }
    return static_cast<int64_t>(n);
  };
  if (f.tier_load != "always" && f.tier_load != "faster") {
    return absl::InvalidArgumentError(Str("--kv-tier-load: '", f.tier_load, "' is not always or faster"));
  }
  cluster->tiers.load_faster = f.tier_load == "faster";
  auto host = blocks(f.host_gib, "--kv-offload-host-gib");
  if (!host.ok()) return host.status();
  cluster->tiers.host_blocks = *host;
  cluster->tiers.host = SimTierCost{f.host_latency_us * 1e-6, f.host_gbps * 1e9};
  auto disk = blocks(f.disk_gib, "--kv-offload-disk-gib");
  if (!disk.ok()) return disk.status();
  auto store = blocks(f.store_gib, "--kv-store-gib");
  if (!store.ok()) return store.status();
  cluster->tiers.disk_blocks = *disk;
  cluster->tiers.store_blocks = *store;
  cluster->tiers.disk = SimTierCost{f.disk_latency_us * 1e-6, f.disk_gbps * 1e9};
  cluster->tiers.store = SimTierCost{f.store_latency_us * 1e-6, f.store_gbps * 1e9};
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SimSetup> ResolveSimFlags(const SimFlags& f) {
  if (f.profile_path.empty()) {
    return absl::InvalidArgumentError("--profile: required (write one with pdserve profile)");
  }
  auto text = ReadFileToString(f.profile_path);
  if (!text.ok()) return absl::InvalidArgumentError(Str("--profile: cannot read '", f.profile_path, "'"));
  if (!(f.kv_dtype_bytes > 0)) return absl::InvalidArgumentError("--kv-dtype-bytes: must be > 0");
  SimSetup s;
  auto profile = ParseSimProfile(*text, f.profile_path, f.kv_dtype_bytes);
  if (!profile.ok()) return profile.status();
  s.profile = *profile;
  if (!f.model.empty()) {
    auto config = ModelShape(f.model);
    if (!config.ok()) return absl::InvalidArgumentError(Str("--model: ", config.status().message()));
    if (absl::Status st = CheckProfileModel(s.profile, *config); !st.ok()) {
      return absl::InvalidArgumentError(Str("--profile: ", st.message()));
    }
  }
  if (f.transport_gbps < 0 || !std::isfinite(f.transport_gbps)) {
    return absl::InvalidArgumentError("--transport-gbps: must be >= 0");
  }
  if (f.transport_gbps > 0) s.profile.transfer_bytes_per_second = f.transport_gbps * 1e9;
  if (f.transport_latency_us >= 0) s.profile.transfer_latency_seconds = f.transport_latency_us * 1e-6;
  s.cluster = f.cluster;
  s.cluster.seed = static_cast<uint64_t>(f.seed);
  if (absl::Status st = SizeWorkerPool(s.profile, f.kv_blocks, f.kv_memory_gib, "--", &s.cluster.worker);
      !st.ok()) {
    return st;
  }
  if (absl::Status st = ResolveTierFlags(f, s.profile, &s.cluster); !st.ok()) return st;
  if (f.workload.kind == "trace") {
    if (f.trace.empty()) return absl::InvalidArgumentError("--workload trace needs --trace FILE");
    TraceOptions t = f.trace_options;
    t.vocab_size = s.profile.vocab_size;
    // One pass for the trace's own rate and mean lengths (and its errors, before any run).
    auto scan = OpenTrace(f.trace, t);
    if (!scan.ok()) return absl::InvalidArgumentError(scan.status().message());
    SimRequest r;
    int64_t n = 0;
    double first = 0, last = 0, in = 0, out = 0;
    for (;;) {
      auto more = (*scan)->Next(&r);
      if (!more.ok()) return more.status();
      if (!*more) break;
      if (n++ == 0) first = r.arrival_seconds;
      last = r.arrival_seconds;
      in += static_cast<double>(r.prompt.size());
      out += static_cast<double>(r.output_tokens);
    }
    if (n == 0) return absl::InvalidArgumentError(Str("--trace: '", f.trace, "' has no requests"));
    s.mean_input_tokens = in / static_cast<double>(n);
    s.mean_output_tokens = out / static_cast<double>(n);
    s.native_rate = last > first ? static_cast<double>(n - 1) / (last - first) : 1e9;
    s.rate = s.native_rate;
    const std::string path = f.trace;
    const double native = s.native_rate;
    s.at_rate = [path, t, native](double rate) -> absl::StatusOr<std::unique_ptr<RequestSource>> {
      TraceOptions at = t;
      at.time_scale = t.time_scale * native / rate;
      return OpenTrace(path, at);
    };
    return s;
  }
  if (!f.trace.empty()) return absl::InvalidArgumentError("--trace: only with --workload trace");
  auto rate = ParseRate(f.rate_text, "--request-rate");
  if (!rate.ok()) return rate.status();
  s.rate = *rate;
  WorkloadOptions w0 = f.workload;
  w0.seed = static_cast<uint64_t>(f.seed);
  w0.vocab_size = s.profile.vocab_size;
  w0.rate = std::numeric_limits<double>::infinity();
  auto made = MakeWorkload(w0);
  if (!made.ok()) return made.status();
  double in = 0, out = 0;
  for (const BenchRequest& b : *made) {
    in += static_cast<double>(b.prompt.size());
    out += static_cast<double>(b.output_tokens);
  }
  const double n = std::max<double>(1, static_cast<double>(made->size()));
  s.mean_input_tokens = in / n;
  s.mean_output_tokens = out / n;
  s.at_rate = [w0](double rate) -> absl::StatusOr<std::unique_ptr<RequestSource>> {
    WorkloadOptions at = w0;
    at.rate = rate;
    auto requests = MakeWorkload(at);
    if (!requests.ok()) return requests.status();
    std::vector<SimRequest> list;
    list.reserve(requests->size());
    for (BenchRequest& b : *requests) list.push_back({b.arrival_seconds, std::move(b.prompt), b.output_tokens});
    return ListSource(std::move(list));
  };
  return s;
}

}  // namespace pdserve::cli
