#include "common/rpc/server_builder.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>

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
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(
      listen, options.credentials ? options.credentials : grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(options.max_receive_bytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  for (grpc::Service* s : services) builder.RegisterService(s);
  StartedServer out;
  out.server = builder.BuildAndStart();
  if (!out.server || port == 0) {
    return absl::UnavailableError(Str("cannot listen on ", listen, " (address in use or invalid)"));
  }
  const size_t colon = listen.rfind(':');
  out.address = Str(listen.substr(0, colon), ":", port);
  return out;
}

}  // namespace pdserve
