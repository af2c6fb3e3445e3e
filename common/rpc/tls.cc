#include "common/rpc/tls.h"

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include "common/base/file_util.h"
#include "common/base/status_macros.h"
#include "common/base/strings.h"

namespace pdserve {
namespace {

// `kind`: what the PEM block must hold ("CERTIFICATE", or "PRIVATE KEY" which also matches
// "EC PRIVATE KEY" and "RSA PRIVATE KEY").
absl::StatusOr<std::string> ReadPem(const std::string& flag, const std::string& path,
                                    const std::string& kind) {
  auto text = ReadFileToString(path);
  if (!text.ok()) {
    return absl::InvalidArgumentError(Str(flag, ": cannot read '", path, "': ", text.status().message()));
  }
  const bool found = kind == "CERTIFICATE" ? text->find("-----BEGIN CERTIFICATE-----") != std::string::npos
                                           : text->find(Str(kind, "-----")) != std::string::npos;
  if (!found) {
    return absl::InvalidArgumentError(Str(flag, ": '", path, "' holds no PEM ", kind));
  }
  return text;
}

}  // namespace

absl::Status ValidateTlsFiles(const TlsFiles& f) {
  if (f.cert.empty() != f.key.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key: give both or neither");
  }
  if (f.mutual() && f.cert.empty()) {
    return absl::InvalidArgumentError("--tls-ca: mutual TLS needs this process's --tls-cert and --tls-key");
  }
  if (!f.cert.empty()) {
    PD_RETURN_IF_ERROR(ReadPem("--tls-cert", f.cert, "CERTIFICATE").status());
    PD_RETURN_IF_ERROR(ReadPem("--tls-key", f.key, "PRIVATE KEY").status());
  }
  if (f.mutual()) PD_RETURN_IF_ERROR(ReadPem("--tls-ca", f.ca, "CERTIFICATE").status());
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsFiles& f, bool require_client_cert) {
  if (!f.server_tls()) return grpc::InsecureServerCredentials();
  PD_RETURN_IF_ERROR(ValidateTlsFiles(f));
  grpc::SslServerCredentialsOptions o;
  PD_ASSIGN_OR_RETURN(std::string cert, ReadPem("--tls-cert", f.cert, "CERTIFICATE"));
  PD_ASSIGN_OR_RETURN(std::string key, ReadPem("--tls-key", f.key, "PRIVATE KEY"));
  o.pem_key_cert_pairs.push_back({std::move(key), std::move(cert)});
  if (require_client_cert && f.mutual()) {
    PD_ASSIGN_OR_RETURN(o.pem_root_certs, ReadPem("--tls-ca", f.ca, "CERTIFICATE"));
    o.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(o);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeInternalChannelCredentials(
    const TlsFiles& f) {
  if (!f.mutual()) return grpc::InsecureChannelCredentials();
  PD_RETURN_IF_ERROR(ValidateTlsFiles(f));
  grpc::SslCredentialsOptions o;
  PD_ASSIGN_OR_RETURN(o.pem_root_certs, ReadPem("--tls-ca", f.ca, "CERTIFICATE"));
  PD_ASSIGN_OR_RETURN(o.pem_cert_chain, ReadPem("--tls-cert", f.cert, "CERTIFICATE"));
  PD_ASSIGN_OR_RETURN(o.pem_private_key, ReadPem("--tls-key", f.key, "PRIVATE KEY"));
  return grpc::SslCredentials(o);
}

}  // namespace pdserve
