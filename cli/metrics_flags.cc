#include "cli/metrics_flags.h"

#include "common/base/strings.h"
#include "common/metrics/process_metrics.h"

#ifndef PDSERVE_VERSION
#define PDSERVE_VERSION "unknown"
#endif
#ifndef PDSERVE_COMMIT
#define PDSERVE_COMMIT "unknown"
#endif
#ifndef PDSERVE_CUDA
#define PDSERVE_CUDA "none"
#endif

namespace pdserve::cli {

void MetricsFlags::Register(FlagSet& flags) {
  flags.String("metrics-listen", &listen,
               "serve Prometheus metrics on http://host:port/metrics (port 0 picks one; empty: off)");
  flags.String("metrics-compat", &compat,
               "'vllm': also expose the vllm: names of the metrics vLLM has");
}

absl::StatusOr<std::unique_ptr<metrics::HttpExporter>> MetricsFlags::Start(
    metrics::Registry* registry) const {
  if (!compat.empty() && compat != "vllm") {
    return absl::InvalidArgumentError(
        Str("--metrics-compat: '", compat, "' is not supported (use vllm or leave it empty)"));
  }
  registry
      ->AddGauge("pdserve_build_info", "pdserve's version, git commit and CUDA toolkit (value 1).",
                 {"version", "commit", "cuda"})
      .With({PDSERVE_VERSION, PDSERVE_COMMIT, PDSERVE_CUDA})
      .Set(1);
  metrics::AddProcessMetrics(registry);
  if (listen.empty()) return std::unique_ptr<metrics::HttpExporter>();
  metrics::RenderOptions options;
  options.vllm_compat = compat == "vllm";
  return metrics::HttpExporter::Start(listen, registry, options);
}

std::string MetricsReadyField(const metrics::HttpExporter* exporter) {
  return exporter == nullptr ? "" : Str(" metrics=", exporter->address());
}

}  // namespace pdserve::cli
