// Starting a gRPC server the same way everywhere: health checking (grpc.health.v1) and server
// reflection on, message size limits, the listening port reported back.
#ifndef PDSERVE_COMMON_RPC_SERVER_BUILDER_H_
#define PDSERVE_COMMON_RPC_SERVER_BUILDER_H_

#include <memory>
#include <string>
#include <vector>

#include <grpcpp/server.h>

#include "absl/status/statusor.h"

namespace grpc {
class Service;
class ServerCredentials;
}  // namespace grpc

namespace pdserve {

// Message size limit for requests and responses between tiers (a prompt of a million tokens fits).
inline constexpr int kMaxMessageBytes = 64 << 20;

struct ServerOptions {
  std::shared_ptr<grpc::ServerCredentials> credentials;  // Null: insecure.
  int max_receive_bytes = kMaxMessageBytes;  // Larger requests fail with RESOURCE_EXHAUSTED.
  std::string flag = "--listen";  // Named in errors about the address.
};

struct StartedServer {
  std::unique_ptr<grpc::Server> server;
  std::string address;  // host:port actually bound (port resolved when 0 was asked).
};

// `listen` is host:port (port 0 picks a free one; rules in common/base/host_port.h). Services are
// not owned and must outlive the server. InvalidArgument for a malformed address; Unavailable
// "address A is already in use (--listen)" when another process holds the port (gRPC's default
// SO_REUSEPORT, which would let both processes share it, is off), or when it cannot be bound.
absl::StatusOr<StartedServer> StartGrpcServer(const std::string& listen,
                                              const std::vector<grpc::Service*>& services,
                                              const ServerOptions& options = {});

// A channel to `server` from inside its own process (gRPC's in-process transport: no socket, no
// HTTP/2 framing), with the same message size limits as the channels between tiers.
std::shared_ptr<grpc::Channel> InProcessChannel(grpc::Server& server);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_RPC_SERVER_BUILDER_H_
