// --otlp-traces-endpoint / --trace-sample-ratio for every tier command, with OpenTelemetry's
// environment variables as the SDKs read them when a flag is not given.
#ifndef PDSERVE_CLI_TRACING_FLAGS_H_
#define PDSERVE_CLI_TRACING_FLAGS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "cli/flags.h"
#include "common/metrics/metrics.h"
#include "common/tracing/tracer.h"

namespace pdserve::cli {

struct TracingFlags {
  std::string endpoint;
  double sample_ratio = -1;  // < 0: not given.

  void Register(FlagSet& flags);
  // The options after the environment: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, else
  // OTEL_EXPORTER_OTLP_ENDPOINT + /v1/traces; OTEL_TRACES_SAMPLER_ARG for the traceidratio
  // samplers (OTEL_TRACES_SAMPLER); OTEL_SERVICE_NAME (default "pdserve") and
  // OTEL_RESOURCE_ATTRIBUTES (k=v,...) for the resource, with pdserve.role = `role`.
  absl::StatusOr<TracingOptions> Options(const std::string& role) const;
  absl::Status Check() const { return Options("").status(); }
};

// A started tracer (null when tracing is off) and its counters in `registry`
// (pdserve_trace_spans_exported_total, pdserve_trace_spans_dropped_total).
struct StartedTracer {
  std::unique_ptr<Tracer> tracer;
  metrics::CollectorHandle counters;
};
// `role` labels the process's spans (pdserve.role) and, with `model_name`, the counters.
absl::StatusOr<StartedTracer> StartTracer(const TracingFlags& flags, const std::string& role,
                                          const std::string& model_name,
                                          metrics::Registry* registry);

}  // namespace pdserve::cli

#endif  // PDSERVE_CLI_TRACING_FLAGS_H_
