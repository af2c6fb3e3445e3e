// Serves a Registry's exposition on GET /metrics (cpp-httplib, its own thread).
#ifndef PDSERVE_COMMON_METRICS_HTTP_EXPORTER_H_
#define PDSERVE_COMMON_METRICS_HTTP_EXPORTER_H_

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "common/metrics/metrics.h"

namespace httplib {
class Server;
}

namespace pdserve::metrics {

class HttpExporter {
 public:
  // `listen` is host:port (port 0 picks one). Unavailable when it cannot be bound.
  static absl::StatusOr<std::unique_ptr<HttpExporter>> Start(const std::string& listen,
                                                             const Registry* registry,
                                                             RenderOptions options);
  ~HttpExporter();
  const std::string& address() const { return address_; }  // host:port actually bound.

 private:
  HttpExporter() = default;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  std::string address_;
};

}  // namespace pdserve::metrics

#endif  // PDSERVE_COMMON_METRICS_HTTP_EXPORTER_H_
