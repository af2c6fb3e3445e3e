// The process's own figures under the names every Prometheus client library exports
// (process_cpu_seconds_total, process_resident_memory_bytes, process_virtual_memory_bytes,
// process_open_fds, process_max_fds, process_start_time_seconds), read from /proc at each
// scrape. CPU per output token (issue 62) is rate(process_cpu_seconds_total) over the tokens'.
#ifndef PDSERVE_COMMON_METRICS_PROCESS_METRICS_H_
#define PDSERVE_COMMON_METRICS_PROCESS_METRICS_H_

#include "common/metrics/metrics.h"

namespace pdserve::metrics {

// Registers the families and a collector that lives as long as the registry. Once per registry.
void AddProcessMetrics(Registry* registry);

}  // namespace pdserve::metrics

#endif  // PDSERVE_COMMON_METRICS_PROCESS_METRICS_H_
