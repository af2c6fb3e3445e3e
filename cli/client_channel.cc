#include "cli/client_channel.h"

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include "common/base/file_util.h"
#include "common/base/strings.h"
#include "common/rpc/server_builder.h"

namespace pdserve::cli {

absl::StatusOr<std::shared_ptr<grpc::Channel>> PublicChannel(const std::string& server,
                                                             const std::string& server_ca) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (!server_ca.empty()) {
    auto ca = ReadFileToString(server_ca);
    if (!ca.ok()) return absl::InvalidArgumentError(Str("--server-ca: cannot read '", server_ca, "'"));
    grpc::SslCredentialsOptions tls;
    tls.pem_root_certs = *ca;
    credentials = grpc::SslCredentials(tls);
  }
  return grpc::CreateCustomChannel(server, credentials, args);
}

void AddApiKey(grpc::ClientContext* ctx, const std::string& api_key) {
  if (!api_key.empty()) ctx->AddMetadata("authorization", "Bearer " + api_key);
}

}  // namespace pdserve::cli
