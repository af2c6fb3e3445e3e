// Serves a Registry's exposition on GET /metrics (on common/http's event-driven server, so slow
// or many scrapers cannot hold the port: the same bounds as the OpenAI API's).
#ifndef PDSERVE_COMMON_METRICS_HTTP_EXPORTER_H_
#define PDSERVE_COMMON_METRICS_HTTP_EXPORTER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/metrics/metrics.h"

namespace pdserve::http {
class HttpServer;
}

namespace pdserve::metrics {

class HttpExporter {
 public:
  // `listen` is host:port (port 0 picks one). Unavailable when it cannot be bound.
  static absl::StatusOr<std::unique_ptr<HttpExporter>> Start(const std::string& listen,
                                                             const Registry* registry,
                                                             RenderOptions options);
  ~HttpExporter();
  const std::string& address() const;  // host:port actually bound.

 private:
  HttpExporter() = default;
  std::unique_ptr<http::HttpServer> server_;
};

}  // namespace pdserve::metrics

#endif  // PDSERVE_COMMON_METRICS_HTTP_EXPORTER_H_
