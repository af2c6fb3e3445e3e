// The flags `pdserve simulate` and `pdserve plan` share: the profile, each worker's engine
// settings, the router's prefill rules, and the workload (pdserve bench's generators or a trace).
#ifndef PDSERVE_CLI_SIM_FLAGS_H_
#define PDSERVE_CLI_SIM_FLAGS_H_

#include <string>

#include "absl/status/statusor.h"
#include "loadgen/workload.h"
#include "cli/flags.h"
#include "planner/plan.h"
#include "planner/simulator.h"

namespace pdserve::cli {

struct SimFlags {
  std::string profile_path, trace, rate_text = "inf", model;
  int64_t kv_blocks = 0, seed = 1;
  double kv_memory_gib = 4, transport_gbps = 0, transport_latency_us = -1, kv_dtype_bytes = 2;
  // KV cache tiers: each worker's disk and the shared store, GiB (0: none), and their reads.
  double host_gib = 0, disk_gib = 0, store_gib = 0;
  double host_gbps = 16, host_latency_us = 10;
  double disk_gbps = 2, disk_latency_us = 100, store_gbps = 1.25, store_latency_us = 500;
  std::string tier_load = "always";
  ClusterOptions cluster;
  WorkloadOptions workload;
  TraceOptions trace_options;

  // with_rate: --request-rate (simulate; plan searches the rate itself).
  void Register(FlagSet& flags, bool with_rate);
};

// --trace, --trace-length-scale, --trace-time-scale, --trace-max-requests: a Mooncake-format
// trace's flags (simulate, plan, and bench replaying a trace against real processes).
void RegisterTraceFlags(FlagSet& flags, std::string* path, TraceOptions* options);

// What the flags resolve to. InvalidArgument naming the flag.
struct SimSetup {
  SimProfile profile;
  ClusterOptions cluster;  // Without the split and policy (the caller's).
  double rate = 0;         // --request-rate (generated workloads); NaN for a trace.
  // The workload at any rate: generated (same seed, same requests) or the trace with its arrival
  // times scaled to the rate; and at the rate asked for.
  WorkloadAtRate at_rate;
  double native_rate = 0;  // A trace's own mean rate (requests / its span), after its flags.
  double mean_input_tokens = 0, mean_output_tokens = 0;
};
absl::StatusOr<SimSetup> ResolveSimFlags(const SimFlags& f);

}  // namespace pdserve::cli

#endif  // PDSERVE_CLI_SIM_FLAGS_H_
