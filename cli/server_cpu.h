// `pdserve bench --cpu-metrics`: the server processes' CPU time over a run, from their
// Prometheus endpoints (process_cpu_seconds_total), so a run reports CPU per output token per
// process (issue 62) wherever the processes run; and a worker's engine step time
// (pdserve_engine_step_seconds_total), what of it the engine's steps took.
#ifndef PDSERVE_CLI_SERVER_CPU_H_
#define PDSERVE_CLI_SERVER_CPU_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/base/host_port.h"

namespace pdserve::cli {

struct CpuEndpoint {
  std::string name;  // As reported ("router", "decode"; the address when not named).
  HostPort address;  // Of its /metrics.
};

// `name=host:port` or `host:port` entries, comma-separated; InvalidArgument naming the entry.
absl::StatusOr<std::vector<CpuEndpoint>> ParseCpuEndpoints(absl::string_view text);

// The sum of the series of `name` in a Prometheus exposition; NotFound when it has none.
absl::StatusOr<double> SumOfSeries(absl::string_view exposition, absl::string_view name);

struct ProcessTimes {
  double cpu_seconds = 0;          // process_cpu_seconds_total.
  double engine_step_seconds = -1;  // pdserve_engine_step_seconds_total (its roles'); -1: none.
};

// Each endpoint's figures now (GET /metrics); Unavailable naming the one that does not answer.
absl::StatusOr<std::map<std::string, ProcessTimes>> ScrapeProcessTimes(const std::vector<CpuEndpoint>& endpoints);

}  // namespace pdserve::cli

#endif  // PDSERVE_CLI_SERVER_CPU_H_
