#include "common/metrics/http_exporter.h"

#include "common/http/http_server.h"

namespace pdserve::metrics {

absl::StatusOr<std::unique_ptr<HttpExporter>> HttpExporter::Start(const std::string& listen,
                                                                  const Registry* registry,
                                                                  RenderOptions options) {
  http::HttpServerOptions o;
  o.listen = listen;
  o.flag = "--metrics-listen";
  o.max_connections = 128;
  o.handler_threads = 1;
  o.limits.max_body_bytes = 1 << 20;
  auto server = http::HttpServer::Start(
      o, [registry, options](http::HttpRequest req, std::shared_ptr<http::HttpResponder> res) {
        if (req.path != "/metrics") return res->Send(404, "text/plain", "not found: GET /metrics");
        if (req.method != "GET" && req.method != "HEAD") {
          return res->Send(405, "text/plain", "method not allowed: GET /metrics",
                           {{"Allow", "GET, HEAD"}});
        }
        res->Send(200, "text/plain; version=0.0.4; charset=utf-8", registry->Render(options));
      });
  if (!server.ok()) return server.status();
  std::unique_ptr<HttpExporter> e(new HttpExporter());
  e->server_ = std::move(*server);
  return e;
}

HttpExporter::~HttpExporter() = default;

const std::string& HttpExporter::address() const { return server_->address(); }

}  // namespace pdserve::metrics
