// TCP plumbing of the transports that talk over sockets (tcp; cuda_ipc's control connection):
// listening with an advertised endpoint, connecting with send/receive timeouts.
#ifndef PDSERVE_COMMON_TRANSPORT_SOCKET_UTIL_H_
#define PDSERVE_COMMON_TRANSPORT_SOCKET_UTIL_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include "absl/status/statusor.h"

namespace pdserve {

struct ListeningSocket {
  int fd = -1;
  std::string endpoint;  // scheme + advertised host:port
};

// Binds and listens on `address` (host:port, port 0 picks one; the rules of every address
// flag). The endpoint's host is `advertise_host`, else the listen host, or this machine's
// hostname when it listens on every interface.
absl::StatusOr<ListeningSocket> ListenTcp(const std::string& address,
                                          const std::string& advertise_host,
                                          std::string_view scheme);

// "scheme://host:port" -> host (brackets of an IPv6 literal removed).
std::string EndpointHost(std::string_view endpoint);

// Connects to "scheme://host:port" (or host:port). With timeout_ms > 0, a peer that accepts or
// sends nothing for that long fails the write or read (SO_SNDTIMEO / SO_RCVTIMEO).
absl::StatusOr<int> ConnectTcp(std::string_view endpoint, int64_t timeout_ms);

// Accepts connections on a listening socket and serves each on a thread of its own:
// handler(fd, source) with `source` a number unique to the connection; when it returns the
// connection is shut down (the peer sees the end) and closed when reaped at a later accept.
// The destructor stops accepting, shuts every connection down (so blocked reads return) and
// joins the threads. Owns the listening socket.
class ConnectionServer {
 public:
  ConnectionServer(int listen_fd, std::function<void(int fd, uint64_t source)> handler);
  ~ConnectionServer();
  ConnectionServer(const ConnectionServer&) = delete;
  ConnectionServer& operator=(const ConnectionServer&) = delete;

 private:
  struct Connection {
    int fd;
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done = std::make_shared<std::atomic<bool>>(false);
  };
  void AcceptLoop();

  const int listen_fd_;
  const std::function<void(int, uint64_t)> handler_;
  std::atomic<bool> stopping_{false};
  std::mutex mu_;
  std::list<Connection> connections_;  // Finished ones are reaped at the next accept.
  uint64_t next_source_ = 1;
  std::thread acceptor_;
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_TRANSPORT_SOCKET_UTIL_H_
