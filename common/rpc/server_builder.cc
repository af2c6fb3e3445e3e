#include "common/rpc/server_builder.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>
#include <grpcpp/support/channel_arguments.h>

#include "common/base/host_port.h"
#include "common/base/status_macros.h"
#include "common/base/strings.h"
#include "common/rpc/grpc_workarounds.h"

namespace pdserve {

absl::StatusOr<StartedServer> StartGrpcServer(const std::string& listen,
                                              const std::vector<grpc::Service*>& services,
                                              const ServerOptions& options) {
  static const bool once = [] {
    PinGrpcCallbackQueue();
    RouteProtobufLogs();
    grpc::EnableDefaultHealthCheckService(true);
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
    return true;
  }();
  (void)once;
  PD_ASSIGN_OR_RETURN(const HostPort address, ParseHostPort(listen, options.flag, PortUse::kListen));
  // Refused here with one line; gRPC's own failure to bind prints a core error dump first.
  PD_RETURN_IF_ERROR(CheckListenAddressFree(address, options.flag));
  grpc::ServerBuilder builder;
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  int port = 0;
  builder.AddListeningPort(address.ToString(),
                           options.credentials ? options.credentials
                                               : grpc::InsecureServerCredentials(),
                           &port);
  builder.SetMaxReceiveMessageSize(options.max_receive_bytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  for (grpc::Service* s : services) builder.RegisterService(s);
  StartedServer out;
  out.server = builder.BuildAndStart();
  if (!out.server || port == 0) {
    // Taken between the check and the bind (no SO_REUSEPORT: two servers never share a port).
    return absl::UnavailableError(Str("address ", address.ToString(), " is already in use or "
                                      "cannot be bound (", options.flag, ")"));
  }
  out.address = HostPort{address.host, port}.ToString();
  return out;
}

std::shared_ptr<grpc::Channel> InProcessChannel(grpc::Server& server) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  return server.InProcessChannel(args);
}

}  // namespace pdserve
