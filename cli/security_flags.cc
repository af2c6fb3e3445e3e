#include "cli/security_flags.h"

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include <cstdlib>

#include "common/base/status_macros.h"
#include "common/base/strings.h"

namespace pdserve::cli {

void SecurityFlags::RegisterTls(FlagSet& flags) {
  flags.String("tls-cert", &tls.cert, "PEM certificate chain of this process (turns on TLS)");
  flags.String("tls-key", &tls.key, "PEM private key for --tls-cert");
  flags.String("tls-ca", &tls.ca,
               "PEM CA of the tiers: mutual TLS between router, prefill and decode workers");
}

void SecurityFlags::RegisterPublic(FlagSet& flags) {
  flags.String("api-key-file", &api_key_file,
               "file of API keys, one per line; clients send 'authorization: Bearer <key>' "
               "(keys can also come from PDSERVE_API_KEYS, comma-separated)");
  flags.Int("max-request-bytes", &max_request_bytes,
            "largest request message the public API accepts (RESOURCE_EXHAUSTED beyond)");
}

absl::StatusOr<ServerOptions> SecurityFlags::InternalServer() const {
  PD_RETURN_IF_ERROR(ValidateTlsFiles(tls));
  ServerOptions o;
  PD_ASSIGN_OR_RETURN(o.credentials, MakeServerCredentials(tls, /*require_client_cert=*/true));
  return o;
}

absl::StatusOr<ServerOptions> SecurityFlags::PublicServer() const {
  PD_RETURN_IF_ERROR(ValidateTlsFiles(tls));
  if (max_request_bytes < 1024 || max_request_bytes > kMaxMessageBytes) {
    return absl::InvalidArgumentError(
        Str("--max-request-bytes: must be in [1024, ", kMaxMessageBytes, "]"));
  }
  ServerOptions o;
  PD_ASSIGN_OR_RETURN(o.credentials, MakeServerCredentials(tls, /*require_client_cert=*/false));
  o.max_receive_bytes = static_cast<int>(max_request_bytes);
  return o;
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> SecurityFlags::InternalChannel() const {
  return MakeInternalChannelCredentials(tls);
}

absl::StatusOr<ApiKeys> SecurityFlags::Keys() const {
  const char* env = std::getenv("PDSERVE_API_KEYS");
  return ApiKeys::Load(api_key_file, env ? env : "");
}

}  // namespace pdserve::cli
