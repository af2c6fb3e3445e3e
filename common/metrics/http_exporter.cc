#include "common/metrics/http_exporter.h"

#include <httplib.h>

#include <sys/socket.h>

#include <chrono>
#include <thread>

#include "common/base/host_port.h"
#include "common/base/strings.h"

namespace pdserve::metrics {

absl::StatusOr<std::unique_ptr<HttpExporter>> HttpExporter::Start(const std::string& listen,
                                                                  const Registry* registry,
                                                                  RenderOptions options) {
  auto address = ParseHostPort(listen, "--metrics-listen", PortUse::kListen);
  if (!address.ok()) return address.status();
  const std::string& host = address->host;
  const int port = address->port;
  std::unique_ptr<HttpExporter> e(new HttpExporter());
  e->server_ = std::make_unique<httplib::Server>();
  // httplib's default adds SO_REUSEPORT, which lets a second process share a taken port silently.
  e->server_->set_socket_options([](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  e->server_->Get("/metrics", [registry, options](const httplib::Request&, httplib::Response& res) {
    res.set_content(registry->Render(options), "text/plain; version=0.0.4; charset=utf-8");
  });
  const int bound = port == 0 ? e->server_->bind_to_any_port(host)
                              : (e->server_->bind_to_port(host, port) ? port : -1);
  if (bound <= 0) {
    return absl::UnavailableError(Str("--metrics-listen: cannot listen on ", listen));
  }
  e->address_ = HostPort{host, bound}.ToString();
  httplib::Server* server = e->server_.get();
  e->thread_ = std::thread([server] { server->listen_after_bind(); });
  // stop() is a no-op until the accept loop runs; wait for it so that destruction cannot race.
  while (!server->is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return e;
}

HttpExporter::~HttpExporter() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace pdserve::metrics
