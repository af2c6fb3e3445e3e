// An event-driven HTTP/1.1 server (epoll, non-blocking sockets, optional TLS through OpenSSL):
// the front end of the OpenAI API and of /metrics. One loop thread owns every connection;
// handlers run on a few handler threads and answer through an HttpResponder, from any thread,
// whenever they like, so a response that streams for minutes holds no thread, and thousands of
// clients can stream at once.
//
// Bounded against hostile clients: at most `max_connections` are open (the next is answered 503
// and closed); a request's head and body (Content-Length or chunked) must arrive within
// `request_timeout` of its first byte (of the connection's accept for the first request, TLS
// handshake included), else 408 and close, so clients trickling bytes cannot hold slots; an idle
// keep-alive connection closes after `idle_timeout`; a response the client does not read (no
// progress for `write_timeout`, or more than `max_queued_bytes` waiting) closes the connection.
// A connection that closes before its response ends cancels it (HttpResponder::OnCancel).
#ifndef PDSERVE_COMMON_HTTP_HTTP_SERVER_H_
#define PDSERVE_COMMON_HTTP_HTTP_SERVER_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/http/http_request.h"

namespace pdserve::http {

using Headers = std::vector<std::pair<std::string, std::string>>;

namespace internal {
class Loop;
}

// The answer to one request. Thread-safe; every call after the response has ended (or the
// connection has gone) is ignored. Either Send once, or StartStream, Write..., End.
class HttpResponder {
 public:
  HttpResponder(std::shared_ptr<internal::Loop> loop, uint64_t connection, bool keep_alive,
                int minor_version);
  ~HttpResponder();

  // The whole response (Content-Length).
  void Send(int status, std::string_view content_type, std::string body, const Headers& extra = {});
  // A streamed response: chunked transfer coding (HTTP/1.0: until the connection closes).
  void StartStream(int status, std::string_view content_type, const Headers& extra = {});
  void Write(std::string_view data);
  void End();

  // `f` runs once (on the server's thread, or at once here when already gone) if the connection
  // closes before the response ends, or the server stops. It must not block.
  void OnCancel(std::function<void()> f);
  bool gone() const;

 private:
  friend class internal::Loop;
  void Cancel();  // The loop: the connection went away.
  std::string Head(int status, std::string_view content_type, const Headers& extra,
                   const std::string* length);

  const std::shared_ptr<internal::Loop> loop_;
  const uint64_t connection_;
  const bool keep_alive_;
  const int minor_version_;
  mutable std::mutex mu_;
  bool started_ = false, ended_ = false, gone_ = false;
  bool head_only_ = false;  // A HEAD request: headers only.
  std::function<void()> on_cancel_;
};

// Called on a handler thread with the whole request. Must answer through `res` (now or later).
using HttpHandler = std::function<void(HttpRequest req, std::shared_ptr<HttpResponder> res)>;

// The name of the thread that does every connection's I/O (it blocks SIGPIPE: a write to a
// connection the client closed fails instead of ending the process).
inline constexpr char kLoopThreadName[] = "pdserve-http";

struct HttpServerOptions {
  std::string listen;                  // host:port (port 0: any).
  std::string flag = "--http-listen";  // Named in errors.
  size_t max_connections = 1024;
  HeadLimits limits;
  std::chrono::milliseconds request_timeout{30000};
  // An idle keep-alive connection closes after this (sent as `Keep-Alive: timeout=`): longer
  // than the idle timeout of the load balancers in front (often 60 s), so they close first.
  std::chrono::milliseconds idle_timeout{75000};
  std::chrono::milliseconds write_timeout{60000};
  size_t max_queued_bytes = 64 << 20;
  int handler_threads = 4;
  std::string tls_cert, tls_key;  // PEM files: HTTPS (empty: plain HTTP).
  // The body and content type of the server's own refusals (400, 408, 411, 413, 431, 503, ...);
  // default: the message as text/plain.
  std::function<std::pair<std::string, std::string>(int status, std::string_view message)>
      error_body;
  // Called on the loop thread when a request's head has arrived, before its body is read. A
  // status refuses the request (message, then the connection closes): an API key is checked
  // before a byte of the body is buffered or parsed. Must be cheap and must not block.
  std::function<std::optional<std::pair<int, std::string>>(const HttpRequest& head)> check_head;
  // Request bodies held at once, over all connections (being received or in a handler): a
  // request whose body would pass it is answered 503 (Retry-After) instead of being read. At
  // least max_body_bytes, so that one body of the largest size always fits.
  size_t max_buffered_body_bytes = 256 << 20;
};

// What a server has done, for metrics.
struct HttpStats {
  size_t connections = 0;  // Open now.
  uint64_t accepted = 0;   // Connections accepted (those refused at the limit included).
  std::vector<std::pair<int, uint64_t>> responses;  // Responses begun, by status (those seen).
};

class HttpServer {
 public:
  // Binds and starts serving; an error names `flag` (address taken, certificate unreadable).
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const HttpServerOptions& options,
                                                           HttpHandler handler);
  // Stops: closes every connection (cancelling responses in flight) and joins the threads.
  ~HttpServer();
  const std::string& address() const { return address_; }
  // Connections open now.
  size_t connections() const;
  HttpStats stats() const;
  // Begins a drain: idle keep-alive connections close, and each connection closes once its
  // response in flight ends. New connections are still served (the handler may refuse them).
  void BeginDrain();
  // Waits until no response is in flight and every queued byte is written, or `deadline`;
  // false at the deadline. Calls BeginDrain first.
  bool WaitDrained(std::chrono::steady_clock::time_point deadline);

 private:
  HttpServer() = default;
  std::shared_ptr<internal::Loop> loop_;
  std::string address_;
};

}  // namespace pdserve::http

#endif  // PDSERVE_COMMON_HTTP_HTTP_SERVER_H_
