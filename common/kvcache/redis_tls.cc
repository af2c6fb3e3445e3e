#include "common/kvcache/redis_tls.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <future>
#include <string>
#include <thread>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509_vfy.h>

#include "common/base/strings.h"

namespace pdserve {
namespace {

using Clock = std::chrono::steady_clock;

std::string SslErrors() {
  std::string out;
  char buf[256];
  for (unsigned long e = ERR_get_error(); e != 0; e = ERR_get_error()) {
    ERR_error_string_n(e, buf, sizeof buf);
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? "the connection closed" : out;
}

bool SetNonBlocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  return flags >= 0 && ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0;
}

int MillisLeft(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, INT_MAX));
}

// A non-blocking TCP connection to host:port made before `deadline`; -1 with *why set.
int ConnectTcp(const std::string& host, int port, Clock::time_point deadline, std::string* why) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int g = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (g != 0) {
    *why = Str("cannot resolve: ", ::gai_strerror(g));
    return -1;
  }
  int fd = -1;
  *why = "no address";
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0 || !SetNonBlocking(fd)) {
      *why = std::strerror(errno);
    } else if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
      break;
    } else if (errno != EINPROGRESS) {
      *why = std::strerror(errno);
    } else {
      pollfd p{fd, POLLOUT, 0};
      int err = 0;
      socklen_t len = sizeof err;
      if (::poll(&p, 1, MillisLeft(deadline)) != 1) {
        *why = "connect timed out";
      } else if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
        *why = std::strerror(err != 0 ? err : errno);
      } else {
        break;
      }
    }
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  ::freeaddrinfo(found);
  if (fd >= 0) {
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  return fd;
}

// The handshake's outcome: OK, or why not.
absl::Status Handshake(SSL* ssl, int tcp, Clock::time_point deadline, const std::string& where) {
  ERR_clear_error();
  for (;;) {
    const int r = SSL_connect(ssl);
    if (r == 1) return absl::OkStatus();
    const int e = SSL_get_error(ssl, r);
    if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE) {
      const long verify = SSL_get_verify_result(ssl);
      const std::string reason = verify != X509_V_OK
                                     ? Str("the server's certificate: ", X509_verify_cert_error_string(verify))
                                     : SslErrors();
      return absl::FailedPreconditionError(Str(where, ": TLS handshake failed: ", reason));
    }
    pollfd p{tcp, static_cast<short>(e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT), 0};
    if (::poll(&p, 1, MillisLeft(deadline)) != 1) {
      return absl::UnavailableError(Str(where, ": TLS handshake timed out"));
    }
  }
}

// Carries bytes between hiredis's end (`local`) and the server's TLS connection until either
// closes. Everything here is non-blocking; poll waits for whichever side can move next.
void Pump(SSL* ssl, int tcp, int local) {
  constexpr size_t kMax = size_t{1} << 20;  // Buffered at most each way.
  std::string up, down;  // hiredis -> server, server -> hiredis (from down_at).
  size_t down_at = 0;
  char buf[1 << 16];
  bool server_closed = false;
  for (;;) {
    bool progress = false, ssl_wants_write = false;
    if (up.size() < kMax) {
      const ssize_t n = ::recv(local, buf, sizeof buf, 0);
      if (n > 0) {
        up.append(buf, static_cast<size_t>(n));
        progress = true;
      } else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        break;  // hiredis closed the connection (redisFree).
      }
    }
    if (!up.empty()) {
      const int n = SSL_write(ssl, up.data(), static_cast<int>(std::min<size_t>(up.size(), INT_MAX)));
      if (n > 0) {
        up.erase(0, static_cast<size_t>(n));
        progress = true;
      } else {
        const int e = SSL_get_error(ssl, n);
        if (e == SSL_ERROR_WANT_WRITE) {
          ssl_wants_write = true;
        } else if (e != SSL_ERROR_WANT_READ) {
          break;  // The server's side is gone: hiredis reads the end of its stream.
        }
      }
    }
    while (!server_closed && down.size() - down_at < kMax) {
      const int n = SSL_read(ssl, buf, sizeof buf);
      if (n > 0) {
        down.append(buf, static_cast<size_t>(n));
        progress = true;
        continue;
      }
      const int e = SSL_get_error(ssl, n);
      if (e == SSL_ERROR_WANT_WRITE) {
        ssl_wants_write = true;
      } else if (e != SSL_ERROR_WANT_READ) {
        server_closed = true;
      }
      break;
    }
    if (down_at < down.size()) {
      const ssize_t n = ::send(local, down.data() + down_at, down.size() - down_at, MSG_NOSIGNAL);
      if (n > 0) {
        down_at += static_cast<size_t>(n);
        progress = true;
        if (down_at == down.size()) {
          down.clear();
          down_at = 0;
        }
      } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        break;
      }
    }
    if (server_closed && down_at == down.size()) break;  // All the server sent is delivered.
    if (progress) continue;
    pollfd p[2] = {{local, 0, 0}, {tcp, 0, 0}};
    if (up.size() < kMax) p[0].events |= POLLIN;
    if (down_at < down.size()) p[0].events |= POLLOUT;
    if (!server_closed && down.size() - down_at < kMax) p[1].events |= POLLIN;
    if (ssl_wants_write) p[1].events |= POLLOUT;
    ::poll(p, 2, -1);
  }
  SSL_shutdown(ssl);  // Best effort (non-blocking): the server may have gone.
  SSL_free(ssl);
  ::close(tcp);
  ::close(local);
}

}  // namespace

absl::StatusOr<std::unique_ptr<RedisTls>> RedisTls::Create(const RedisTlsOptions& options) {
  if (options.cert_file.empty() != options.key_file.empty()) {
    return absl::InvalidArgumentError("--kv-store-tls-cert and --kv-store-tls-key go together");
  }
  auto tls = std::unique_ptr<RedisTls>(new RedisTls());
  tls->ctx_ = SSL_CTX_new(TLS_client_method());
  if (tls->ctx_ == nullptr) return absl::InternalError(Str("--kv-store: TLS: ", SslErrors()));
  SSL_CTX_set_min_proto_version(tls->ctx_, TLS1_2_VERSION);
  SSL_CTX_set_verify(tls->ctx_, SSL_VERIFY_PEER, nullptr);
  ERR_clear_error();
  if (!options.ca_file.empty()) {
    if (SSL_CTX_load_verify_locations(tls->ctx_, options.ca_file.c_str(), nullptr) != 1) {
      return absl::InvalidArgumentError(Str("--kv-store-tls-ca: cannot load '", options.ca_file, "': ", SslErrors()));
    }
  } else if (SSL_CTX_set_default_verify_paths(tls->ctx_) != 1) {
    return absl::InvalidArgumentError(Str("--kv-store: TLS: the system's CAs: ", SslErrors()));
  }
  if (!options.cert_file.empty()) {
    if (SSL_CTX_use_certificate_chain_file(tls->ctx_, options.cert_file.c_str()) != 1) {
      return absl::InvalidArgumentError(Str("--kv-store-tls-cert: cannot load '", options.cert_file, "': ", SslErrors()));
    }
    if (SSL_CTX_use_PrivateKey_file(tls->ctx_, options.key_file.c_str(), SSL_FILETYPE_PEM) != 1) {
      return absl::InvalidArgumentError(Str("--kv-store-tls-key: cannot load '", options.key_file, "': ", SslErrors()));
    }
    if (SSL_CTX_check_private_key(tls->ctx_) != 1) {
      return absl::InvalidArgumentError("--kv-store-tls-key: the key does not match --kv-store-tls-cert");
    }
  }
  return tls;
}

RedisTls::~RedisTls() {
  if (ctx_ != nullptr) SSL_CTX_free(ctx_);  // Bridges still running hold their own reference.
}

absl::StatusOr<int> RedisTls::Connect(const std::string& host, int port, int timeout_ms) const {
  const std::string where = Str("redis ", host, ":", port);
  const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  std::string why;
  const int tcp = ConnectTcp(host, port, deadline, &why);
  if (tcp < 0) return absl::UnavailableError(Str(where, ": ", why));
  SSL* ssl = SSL_new(ctx_);
  int pair[2] = {-1, -1};
  if (ssl == nullptr || ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0 || !SetNonBlocking(pair[1])) {
    if (ssl != nullptr) SSL_free(ssl);
    for (int fd : {tcp, pair[0], pair[1]}) {
      if (fd >= 0) ::close(fd);
    }
    return absl::ResourceExhaustedError(Str(where, ": cannot make a TLS connection"));
  }
  // Room for a block's reply in flight on each leg (fewer wake-ups of either side).
  const int kBuffer = 4 << 20;
  for (int fd : {pair[0], pair[1]}) {
    ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &kBuffer, sizeof kBuffer);
    ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &kBuffer, sizeof kBuffer);
  }
  SSL_set_fd(ssl, tcp);
  SSL_set_mode(ssl, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  // The certificate must name the host as the URL gives it: an IP address or a DNS name.
  in6_addr ip6;
  in_addr ip4;
  if (::inet_pton(AF_INET, host.c_str(), &ip4) == 1 || ::inet_pton(AF_INET6, host.c_str(), &ip6) == 1) {
    X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), host.c_str());
  } else {
    SSL_set_tlsext_host_name(ssl, host.c_str());
    SSL_set1_host(ssl, host.c_str());
  }
  // The handshake and then the bridge run on a thread of their own, which blocks SIGPIPE for its
  // life (OpenSSL writes with write(2): a server gone mid-write must not end the process).
  std::promise<absl::Status> handshake;
  std::future<absl::Status> done = handshake.get_future();
  const int local = pair[1];
  std::thread([ssl, tcp, local, deadline, where, handshake = std::move(handshake)]() mutable {
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
    absl::Status s = Handshake(ssl, tcp, deadline, where);
    const bool ok = s.ok();
    handshake.set_value(std::move(s));
    if (!ok) {
      SSL_free(ssl);
      ::close(tcp);
      ::close(local);
      return;
    }
    Pump(ssl, tcp, local);
  }).detach();
  absl::Status s = done.get();  // The thread honours the deadline.
  if (!s.ok()) {
    ::close(pair[0]);
    return s;
  }
  return pair[0];
}

}  // namespace pdserve
