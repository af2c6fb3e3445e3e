// --tls-cert / --tls-key / --tls-ca, --api-key-file (+ PDSERVE_API_KEYS) and the public message
// size limit, turned into gRPC credentials for the tier commands.
#ifndef PDSERVE_CLI_SECURITY_FLAGS_H_
#define PDSERVE_CLI_SECURITY_FLAGS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "cli/flags.h"
#include "common/rpc/api_keys.h"
#include "common/rpc/server_builder.h"
#include "common/rpc/tls.h"

namespace pdserve::cli {

struct SecurityFlags {
  TlsFiles tls;
  std::string api_key_file;
  int64_t max_request_bytes = 16 << 20;

  void RegisterTls(FlagSet& flags);
  // The public API's (router, serve): API keys, request size.
  void RegisterPublic(FlagSet& flags);
  // Options for a worker's internal server: mutual TLS when --tls-ca is set.
  absl::StatusOr<ServerOptions> InternalServer() const;
  // Options for the public server: TLS when --tls-cert is set; the request size limit.
  absl::StatusOr<ServerOptions> PublicServer() const;
  // Credentials for calls to other tiers (mutual TLS with --tls-ca; else insecure).
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> InternalChannel() const;
  // --api-key-file and the PDSERVE_API_KEYS environment variable (comma-separated).
  absl::StatusOr<ApiKeys> Keys() const;
};

}  // namespace pdserve::cli

#endif  // PDSERVE_CLI_SECURITY_FLAGS_H_
