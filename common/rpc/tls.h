// TLS for pdserve's gRPC servers and channels, from PEM files.
//
// Public port: TLS with the process's certificate (clients verify it). Internal (router ->
// workers, decode -> prefill): mutual TLS when a CA is given: servers require a client
// certificate signed by that CA, clients present theirs and verify the server against it.
#ifndef PDSERVE_COMMON_RPC_TLS_H_
#define PDSERVE_COMMON_RPC_TLS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace grpc {
class ChannelCredentials;
class ServerCredentials;
}  // namespace grpc

namespace pdserve {

struct TlsFiles {
  std::string cert;  // PEM certificate chain of this process.
  std::string key;   // PEM private key.
  std::string ca;    // PEM CA bundle for peers (mutual TLS between tiers); empty: none.

  bool server_tls() const { return !cert.empty(); }
  bool mutual() const { return !ca.empty(); }
};

// InvalidArgument naming the flag when a file is missing, unreadable or inconsistent (a
// certificate without a key, mTLS without a certificate).
absl::Status ValidateTlsFiles(const TlsFiles& files);

// Server credentials. `require_client_cert`: only callers presenting a certificate signed by
// files.ca get in (internal services with mTLS). Insecure when files.cert is empty.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsFiles& files, bool require_client_cert);

// Credentials for calls to another tier: mutual TLS (CA + this process's certificate) when
// files.ca is set, else insecure.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeInternalChannelCredentials(
    const TlsFiles& files);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_RPC_TLS_H_
