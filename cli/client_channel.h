// The channel a client command (generate, bench) opens to a router's public port: plaintext, or
// TLS verified against --server-ca; an API key travels as "authorization: Bearer KEY" metadata.
#ifndef PDSERVE_CLI_CLIENT_CHANNEL_H_
#define PDSERVE_CLI_CLIENT_CHANNEL_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace grpc {
class Channel;
class ClientContext;
}  // namespace grpc

namespace pdserve::cli {

// InvalidArgument naming --server-ca when the CA file cannot be read.
absl::StatusOr<std::shared_ptr<grpc::Channel>> PublicChannel(const std::string& server,
                                                             const std::string& server_ca);

// Adds the key to a call (nothing when empty).
void AddApiKey(grpc::ClientContext* ctx, const std::string& api_key);

}  // namespace pdserve::cli

#endif  // PDSERVE_CLI_CLIENT_CHANNEL_H_
