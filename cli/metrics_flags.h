// --metrics-listen / --metrics-compat for the tier commands, and the build_info series.
#ifndef PDSERVE_CLI_METRICS_FLAGS_H_
#define PDSERVE_CLI_METRICS_FLAGS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "cli/flags.h"
#include "common/metrics/http_exporter.h"
#include "common/metrics/metrics.h"

namespace pdserve::cli {

struct MetricsFlags {
  std::string listen;  // Empty: no /metrics endpoint.
  std::string compat;  // "" or "vllm".

  void Register(FlagSet& flags);
  // Adds pdserve:build_info to `registry` and, when --metrics-listen is set, serves it. Returns
  // null when no endpoint was asked for; InvalidArgument for a bad flag, Unavailable when the
  // address cannot be bound.
  absl::StatusOr<std::unique_ptr<metrics::HttpExporter>> Start(metrics::Registry* registry) const;
};

// " metrics=host:port" for the ready line, or "" without an endpoint.
std::string MetricsReadyField(const metrics::HttpExporter* exporter);

}  // namespace pdserve::cli

#endif  // PDSERVE_CLI_METRICS_FLAGS_H_
