// TCP plumbing of the transports that talk over sockets (tcp; cuda_ipc's control connection):
// listening with an advertised endpoint, connecting with send/receive timeouts.
#ifndef PDSERVE_COMMON_TRANSPORT_SOCKET_UTIL_H_
#define PDSERVE_COMMON_TRANSPORT_SOCKET_UTIL_H_

#include <atomic>
#include <chrono>
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
//
// Against peers that are not the tiers' workers: beyond `max_connections` live connections a new
// one is closed at once (logged), as is one whose thread cannot be made, so a flood costs
// connections, never the process; and a connection's reads time out after `handshake_timeout`
// until the handler calls EndHandshake(fd) once the peer has introduced itself, so a peer that
// connects and says nothing holds its thread only that long (after the handshake a connection
// may idle between transfers as long as it likes).
class ConnectionServer {
 public:
  struct Limits {
    int max_connections = 1024;
    std::chrono::milliseconds handshake_timeout{10000};
  };
  ConnectionServer(int listen_fd, std::function<void(int fd, uint64_t source)> handler,
                   Limits limits);
  ConnectionServer(int listen_fd, std::function<void(int fd, uint64_t source)> handler)
      : ConnectionServer(listen_fd, std::move(handler), Limits{}) {}
  ~ConnectionServer();
  ConnectionServer(const ConnectionServer&) = delete;
  ConnectionServer& operator=(const ConnectionServer&) = delete;

  // Lifts the handshake's read timeout from a connection's socket.
  static void EndHandshake(int fd);
  // Connections refused since the start (over the limit, or no thread for them).
  int64_t refused() const { return refused_.load(); }

 private:
  struct Connection {
    int fd;
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done = std::make_shared<std::atomic<bool>>(false);
  };
  void AcceptLoop();
  void Refuse(int fd, const char* why);

  const int listen_fd_;
  const std::function<void(int, uint64_t)> handler_;
  const Limits limits_;
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> refused_{0};
  std::mutex mu_;
  std::list<Connection> connections_;  // Finished ones are reaped at the next accept.
  uint64_t next_source_ = 1;
  std::thread acceptor_;
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_TRANSPORT_SOCKET_UTIL_H_
