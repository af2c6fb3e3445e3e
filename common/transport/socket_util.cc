#include "common/transport/socket_util.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>

#include "common/base/host_port.h"
#include "common/base/log.h"
#include "common/base/status_macros.h"
#include "common/base/strings.h"

namespace pdserve {
namespace {

absl::Status SplitHostPort(std::string_view address, std::string* host, std::string* port) {
  const size_t colon = address.rfind(':');
  if (colon == std::string_view::npos || colon + 1 == address.size()) {
    return absl::InvalidArgumentError(Str("'", address, "' is not host:port"));
  }
  *host = std::string(address.substr(0, colon));
  *port = std::string(address.substr(colon + 1));
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);
  }
  return absl::OkStatus();
}

}  // namespace

std::string EndpointHost(std::string_view endpoint) {
  if (const size_t scheme = endpoint.find("://"); scheme != std::string_view::npos) {
    endpoint.remove_prefix(scheme + 3);
  }
  std::string host(endpoint.substr(0, endpoint.rfind(':')));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return host;
}

absl::StatusOr<int> ConnectTcp(std::string_view endpoint, int64_t timeout_ms) {
  std::string_view address = endpoint;
  if (const size_t scheme = address.find("://"); scheme != std::string_view::npos) {
    address.remove_prefix(scheme + 3);
  }
  std::string host, port;
  if (absl::Status s = SplitHostPort(address, &host, &port); !s.ok()) return s;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &res); rc != 0) {
    return absl::UnavailableError(Str("KV transport: cannot resolve ", endpoint, ": ",
                                      gai_strerror(rc)));
  }
  int fd = -1;
  int err = 0;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) break;
    err = errno;
    ::close(fd);
    fd = -1;
  }
  ::freeaddrinfo(res);
  if (fd < 0) {
    return absl::UnavailableError(Str("KV transport: cannot connect to ", endpoint, ": ",
                                      std::strerror(err)));
  }
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  // This side only writes pages (and reads the handshake's answer): a peer that takes nothing
  // for `timeout_ms` fails the write, and the connection with its transfers.
  if (timeout_ms > 0) {
    timeval tv{static_cast<time_t>(timeout_ms / 1000), static_cast<suseconds_t>((timeout_ms % 1000) * 1000)};
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  }
  return fd;
}

absl::StatusOr<ListeningSocket> ListenTcp(const std::string& address,
                                          const std::string& advertise_host,
                                          std::string_view scheme) {
  // The rules of every address flag (common/base/host_port.h).
  PD_ASSIGN_OR_RETURN(const HostPort parsed,
                      ParseHostPort(address, "--transport-listen", PortUse::kListen));
  const std::string& host = parsed.host;
  const std::string port = std::to_string(parsed.port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
      rc != 0) {
    return absl::InvalidArgumentError(Str("KV transport listen address '", address,
                                          "': ", gai_strerror(rc)));
  }
  int listen_fd = -1;
  int err = 0;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 64) == 0) {
      listen_fd = fd;
      break;
    }
    err = errno;
    ::close(fd);
  }
  ::freeaddrinfo(res);
  if (listen_fd < 0) {
    return absl::UnavailableError(Str("KV transport cannot listen on ", address, ": ",
                                      std::strerror(err)));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  ::getsockname(listen_fd, reinterpret_cast<sockaddr*>(&bound), &len);
  const int bound_port = bound.ss_family == AF_INET6
                             ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                             : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  std::string advertised = advertise_host.empty() ? host : advertise_host;
  if (advertised == "0.0.0.0" || advertised == "::") {
    char name[256] = {0};
    ::gethostname(name, sizeof(name) - 1);
    advertised = name;
  }
  return ListeningSocket{listen_fd, Str(scheme, HostPort{advertised, bound_port}.ToString())};
}

ConnectionServer::ConnectionServer(int listen_fd, std::function<void(int, uint64_t)> handler,
                                   Limits limits)
    : listen_fd_(listen_fd), handler_(std::move(handler)), limits_(limits) {
  acceptor_ = std::thread([this] { AcceptLoop(); });
}

ConnectionServer::~ConnectionServer() {
  stopping_.store(true);
  ::shutdown(listen_fd_, SHUT_RDWR);
  if (acceptor_.joinable()) acceptor_.join();
  ::close(listen_fd_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (Connection& c : connections_) ::shutdown(c.fd, SHUT_RDWR);
  }
  for (Connection& c : connections_) {
    if (c.thread.joinable()) c.thread.join();
    ::close(c.fd);
  }
}

namespace {

void SetReceiveTimeout(int fd, std::chrono::milliseconds timeout) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>(timeout.count() % 1000 * 1000);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
}

}  // namespace

void ConnectionServer::EndHandshake(int fd) { SetReceiveTimeout(fd, std::chrono::milliseconds(0)); }

void ConnectionServer::Refuse(int fd, const char* why) {
  const int64_t n = refused_.fetch_add(1) + 1;
  if ((n & (n - 1)) == 0) {  // The 1st, 2nd, 4th, ... refusal: a flood does not flood the log.
    PD_LOG(Warning) << "KV transport: refused a connection (" << why << "; " << n << " so far)";
  }
  ::close(fd);
}

void ConnectionServer::AcceptLoop() {
  while (!stopping_.load()) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // Out of descriptors or memory: wait for some to be freed rather than stop accepting.
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        continue;
      }
      return;  // Shut down.
    }
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = connections_.begin(); it != connections_.end();) {  // Connections that ended.
      if (it->done->load()) {
        it->thread.join();
        ::close(it->fd);
        it = connections_.erase(it);
      } else {
        ++it;
      }
    }
    if (static_cast<int>(connections_.size()) >= limits_.max_connections) {
      Refuse(fd, "too many connections");
      continue;
    }
    if (limits_.handshake_timeout.count() > 0) SetReceiveTimeout(fd, limits_.handshake_timeout);
    const uint64_t source = next_source_++;
    auto done = std::make_shared<std::atomic<bool>>(false);
    std::thread thread;
    try {
      thread = std::thread([this, fd, source, done] {
        handler_(fd, source);
        // Let the peer see the end (a refused handshake included); the fd is closed when reaped.
        ::shutdown(fd, SHUT_RDWR);
        done->store(true);
      });
    } catch (const std::system_error&) {
      Refuse(fd, "no thread for it");
      continue;
    }
    connections_.push_back(Connection{fd, std::move(thread), std::move(done)});
  }
}

}  // namespace pdserve
