// `pdserve bench --cpu-metrics`: the server processes' CPU time over a run, from their
// Prometheus endpoints (process_cpu_seconds_total), so a run reports CPU per output token per
// process (issue 62) wherever the processes run.
#ifndef PDSERVE_CLI_SERVER_CPU_H_
#define PDSERVE_CLI_SERVER_CPU_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pdserve::cli {

struct CpuEndpoint {
  std::string name;     // As reported ("router", "decode"; the address when not named).
  std::string address;  // host:port of its /metrics.
};

// `name=host:port` or `host:port` entries, comma-separated; InvalidArgument naming the entry.
absl::StatusOr<std::vector<CpuEndpoint>> ParseCpuEndpoints(absl::string_view text);

// process_cpu_seconds_total in a Prometheus exposition; NotFound when absent.
absl::StatusOr<double> CpuSecondsIn(absl::string_view exposition);

// Each endpoint's process_cpu_seconds_total now (GET /metrics); Unavailable naming the one that
// does not answer.
absl::StatusOr<std::map<std::string, double>> ScrapeCpuSeconds(const std::vector<CpuEndpoint>& endpoints);

}  // namespace pdserve::cli

#endif  // PDSERVE_CLI_SERVER_CPU_H_
