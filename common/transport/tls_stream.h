// The tcp KV transport's byte stream: a socket in the clear, or mutual TLS (OpenSSL) when the
// worker has --tls-cert/--tls-key/--tls-ca: both ends present a certificate signed by the CA
// and verify the other's, so only the tiers' own processes can open a KV connection or receive
// pages, and the pages travel encrypted.
#ifndef PDSERVE_COMMON_TRANSPORT_TLS_STREAM_H_
#define PDSERVE_COMMON_TRANSPORT_TLS_STREAM_H_

#include <sys/uio.h>

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

typedef struct ssl_ctx_st SSL_CTX;
typedef struct ssl_st SSL;

namespace pdserve {

// One connection. Read fills exactly `len` bytes; Write sends every byte of `iov`. One thread
// reads and one thread writes at a time (the transport's connections are one-directional after
// the handshake).
class Stream {
 public:
  Stream(int fd, SSL* ssl) : fd_(fd), ssl_(ssl) {}
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  bool Read(void* buf, size_t len);
  // Reads what is available (at least one byte, blocking until then) into `iov` in order; the
  // byte count, or <= 0 at the end or on an error. Lets a reader take a page and the frames
  // behind it in one call.
  ssize_t ReadSome(struct iovec* iov, int count);
  bool Write(struct iovec* iov, int count);
  int fd() const { return fd_; }

 private:
  const int fd_;  // Not owned.
  SSL* const ssl_;  // Owned; null: in the clear.
};

class KvTls {
 public:
  // PEM files; all three are needed (mutual TLS). InvalidArgument naming the file otherwise.
  static absl::StatusOr<std::unique_ptr<KvTls>> Create(const std::string& cert,
                                                       const std::string& key,
                                                       const std::string& ca);
  ~KvTls();
  // The TLS handshake on an accepted / connected socket (the peer's certificate checked against
  // the CA; when connecting, also against `host`, an IP address or a DNS name).
  absl::StatusOr<std::unique_ptr<Stream>> Accept(int fd) const;
  absl::StatusOr<std::unique_ptr<Stream>> Connect(int fd, const std::string& host) const;

 private:
  KvTls() = default;
  SSL_CTX* server_ = nullptr;
  SSL_CTX* client_ = nullptr;
};

// A connection's stream: mutual TLS when `tls` is set (the handshake as server, or as client
// checking `host`), else in the clear. On a refused handshake the fd stays open (the caller's).
absl::StatusOr<std::unique_ptr<Stream>> AcceptStream(const KvTls* tls, int fd);
absl::StatusOr<std::unique_ptr<Stream>> ConnectStream(const KvTls* tls, int fd,
                                                      const std::string& host);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_TRANSPORT_TLS_STREAM_H_
