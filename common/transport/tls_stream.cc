#include "common/transport/tls_stream.h"

#include <arpa/inet.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>

#include <cerrno>

#include "common/base/strings.h"

namespace pdserve {
namespace {

std::string OpenSslError() {
  const unsigned long e = ERR_get_error();
  if (e == 0) return "unknown TLS error";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof(buf));
  ERR_clear_error();
  return buf;
}

absl::StatusOr<SSL_CTX*> MakeContext(bool server, const std::string& cert, const std::string& key,
                                     const std::string& ca) {
  SSL_CTX* ctx = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
  if (ctx == nullptr) return absl::InternalError(Str("TLS: ", OpenSslError()));
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  if (SSL_CTX_use_certificate_chain_file(ctx, cert.c_str()) != 1) {
    SSL_CTX_free(ctx);
    return absl::InvalidArgumentError(Str("--tls-cert: '", cert, "': ", OpenSslError()));
  }
  if (SSL_CTX_use_PrivateKey_file(ctx, key.c_str(), SSL_FILETYPE_PEM) != 1 ||
      SSL_CTX_check_private_key(ctx) != 1) {
    SSL_CTX_free(ctx);
    return absl::InvalidArgumentError(Str("--tls-key: '", key, "': ", OpenSslError()));
  }
  if (SSL_CTX_load_verify_locations(ctx, ca.c_str(), nullptr) != 1) {
    SSL_CTX_free(ctx);
    return absl::InvalidArgumentError(Str("--tls-ca: '", ca, "': ", OpenSslError()));
  }
  // Both ends must present a certificate from the CA.
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  return ctx;
}

// SSL_write sends with write(2), which raises SIGPIPE when the peer has gone, and SIGPIPE's
// default action ends the process: a peer that hangs up mid-transfer would kill the worker. This
// blocks SIGPIPE on the calling thread for the guard's life and discards one raised meanwhile.
class SigpipeGuard {
 public:
  SigpipeGuard() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~SigpipeGuard() {
    if (!was_pending_) {
      sigset_t pending;
      sigpending(&pending);
      if (sigismember(&pending, SIGPIPE) == 1) {
        const timespec zero{0, 0};
        while (sigtimedwait(&pipe_, nullptr, &zero) < 0 && errno == EINTR) {
        }
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SigpipeGuard(const SigpipeGuard&) = delete;
  SigpipeGuard& operator=(const SigpipeGuard&) = delete;

 private:
  sigset_t pipe_, old_;
  bool was_pending_ = false;
};

}  // namespace

Stream::~Stream() {
  if (ssl_ != nullptr) SSL_free(ssl_);
}

bool Stream::Read(void* buf, size_t len) {
  auto* p = static_cast<uint8_t*>(buf);
  while (len > 0) {
    if (ssl_ != nullptr) {
      const SigpipeGuard no_sigpipe;  // SSL_read may send (alerts).
      const int n = SSL_read(ssl_, p, static_cast<int>(std::min<size_t>(len, 1 << 30)));
      if (n <= 0) return false;
      p += n;
      len -= static_cast<size_t>(n);
      continue;
    }
    const ssize_t n = ::recv(fd_, p, len, 0);
    if (n == 0) return false;
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += n;
    len -= static_cast<size_t>(n);
  }
  return true;
}

ssize_t Stream::ReadSome(struct iovec* iov, int count) {
  if (ssl_ != nullptr) {  // TLS: one record's worth into the first buffer.
    const SigpipeGuard no_sigpipe;
    for (int i = 0; i < count; ++i) {
      if (iov[i].iov_len == 0) continue;
      return SSL_read(ssl_, iov[i].iov_base, static_cast<int>(std::min<size_t>(iov[i].iov_len, 1 << 30)));
    }
    return 0;
  }
  for (;;) {
    const ssize_t n = ::readv(fd_, iov, count);
    if (n < 0 && errno == EINTR) continue;
    return n;
  }
}

bool Stream::Write(struct iovec* iov, int count) {
  if (ssl_ != nullptr) {
    const SigpipeGuard no_sigpipe;
    for (int i = 0; i < count; ++i) {
      const auto* p = static_cast<const uint8_t*>(iov[i].iov_base);
      size_t len = iov[i].iov_len;
      while (len > 0) {
        const int n = SSL_write(ssl_, p, static_cast<int>(std::min<size_t>(len, 1 << 30)));
        if (n <= 0) return false;
        p += n;
        len -= static_cast<size_t>(n);
      }
    }
    return true;
  }
  while (count > 0) {
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(count);
    const ssize_t n = ::sendmsg(fd_, &msg, MSG_NOSIGNAL);  // A gone peer: EPIPE, no signal.
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    size_t left = static_cast<size_t>(n);
    while (count > 0 && left >= iov->iov_len) {
      left -= iov->iov_len;
      ++iov;
      --count;
    }
    if (count > 0) {
      iov->iov_base = static_cast<uint8_t*>(iov->iov_base) + left;
      iov->iov_len -= left;
    }
  }
  return true;
}

absl::StatusOr<std::unique_ptr<KvTls>> KvTls::Create(const std::string& cert,
                                                     const std::string& key,
                                                     const std::string& ca) {
  std::unique_ptr<KvTls> t(new KvTls());
  auto server = MakeContext(true, cert, key, ca);
  if (!server.ok()) return server.status();
  t->server_ = *server;
  auto client = MakeContext(false, cert, key, ca);
  if (!client.ok()) return client.status();
  t->client_ = *client;
  return t;
}

KvTls::~KvTls() {
  if (server_ != nullptr) SSL_CTX_free(server_);
  if (client_ != nullptr) SSL_CTX_free(client_);
}

absl::StatusOr<std::unique_ptr<Stream>> KvTls::Accept(int fd) const {
  SSL* ssl = SSL_new(server_);
  const SigpipeGuard no_sigpipe;
  if (ssl == nullptr || SSL_set_fd(ssl, fd) != 1 || SSL_accept(ssl) != 1) {
    const std::string why = OpenSslError();
    if (ssl != nullptr) SSL_free(ssl);
    return absl::UnauthenticatedError(Str("KV transport TLS handshake refused: ", why));
  }
  return std::make_unique<Stream>(fd, ssl);
}

absl::StatusOr<std::unique_ptr<Stream>> KvTls::Connect(int fd, const std::string& host) const {
  SSL* ssl = SSL_new(client_);
  if (ssl == nullptr) return absl::InternalError(Str("TLS: ", OpenSslError()));
  X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
  in6_addr probe;
  const bool is_ip = inet_pton(AF_INET, host.c_str(), &probe) == 1 ||
                     inet_pton(AF_INET6, host.c_str(), &probe) == 1;
  if (is_ip) {
    X509_VERIFY_PARAM_set1_ip_asc(param, host.c_str());
  } else {
    X509_VERIFY_PARAM_set1_host(param, host.c_str(), 0);
    SSL_set_tlsext_host_name(ssl, host.c_str());
  }
  const SigpipeGuard no_sigpipe;
  if (SSL_set_fd(ssl, fd) != 1 || SSL_connect(ssl) != 1) {
    const std::string why = OpenSslError();
    SSL_free(ssl);
    return absl::UnauthenticatedError(Str("KV transport TLS handshake with ", host, " failed: ", why));
  }
  return std::make_unique<Stream>(fd, ssl);
}

absl::StatusOr<std::unique_ptr<Stream>> AcceptStream(const KvTls* tls, int fd) {
  if (tls != nullptr) return tls->Accept(fd);
  return std::make_unique<Stream>(fd, nullptr);
}

absl::StatusOr<std::unique_ptr<Stream>> ConnectStream(const KvTls* tls, int fd,
                                                      const std::string& host) {
  if (tls != nullptr) return tls->Connect(fd, host);
  return std::make_unique<Stream>(fd, nullptr);
}

}  // namespace pdserve
