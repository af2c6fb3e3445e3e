// TLS to the shared store (`--kv-store rediss://...`) for Debian 12's hiredis (0.14), which has
// none: a connection is a socketpair whose one end hiredis reads and writes in the clear
// (redisConnectFd) and whose other end a thread of ours carries through an OpenSSL connection to
// the server. hiredis still speaks the whole protocol; the bridge only moves bytes.
//
// The server's certificate is verified against `ca_file` (or the system's CAs) and must name the
// host the URL names (a DNS name or an IP address). With `cert_file` and `key_file` the client
// presents a certificate (a server with `tls-auth-clients yes`). A bridge's thread ends when
// either side closes: hiredis's redisFree, or the server going away (hiredis then reads the end
// of the stream and the tier reconnects as after any lost connection).
#ifndef PDSERVE_COMMON_KVCACHE_REDIS_TLS_H_
#define PDSERVE_COMMON_KVCACHE_REDIS_TLS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"

typedef struct ssl_ctx_st SSL_CTX;

namespace pdserve {

struct RedisTlsOptions {
  std::string ca_file;    // PEM; empty: the system's CAs.
  std::string cert_file;  // PEM, with key_file: a client certificate; both or neither.
  std::string key_file;
};

class RedisTls {
 public:
  // InvalidArgument naming the flag (--kv-store-tls-ca, -cert, -key) for a file that cannot be
  // read or a key that does not match its certificate.
  static absl::StatusOr<std::unique_ptr<RedisTls>> Create(const RedisTlsOptions& options);
  ~RedisTls();
  RedisTls(const RedisTls&) = delete;
  RedisTls& operator=(const RedisTls&) = delete;

  // Connects to host:port and completes the TLS handshake within `timeout_ms`; returns the clear
  // end of the bridge for redisConnectFd (the caller's to close). Unavailable when the server is
  // out of reach or the handshake times out; FailedPrecondition when the handshake fails (a
  // certificate that does not verify, a server that is not TLS), naming why.
  absl::StatusOr<int> Connect(const std::string& host, int port, int timeout_ms) const;

 private:
  RedisTls() = default;
  SSL_CTX* ctx_ = nullptr;
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_KVCACHE_REDIS_TLS_H_
