#include "common/rpc/grpc_workarounds.h"

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/byte_buffer.h>

#include <chrono>
#include <memory>

#include <google/protobuf/stubs/logging.h>

#include "common/base/log.h"

namespace pdserve {

namespace {

// A channel takes its reference on the shared callback queue with its first callback-API call
// and keeps it until destroyed: one call on a channel that is never destroyed. (It goes nowhere
// and fails at once; nothing is sent.)
struct Pin {
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateChannel("127.0.0.1:1", grpc::InsecureChannelCredentials());
  grpc::GenericStub stub{channel};
  grpc::ClientContext context;
  grpc::ByteBuffer request, response;
};

}  // namespace

void PinGrpcCallbackQueue() {
  // Never destroyed, and reachable from here (so leak checkers do not count it).
  static Pin* const pin = [] {
    auto* p = new Pin();
    grpc::Slice empty("");
    p->request = grpc::ByteBuffer(&empty, 1);  // A default ByteBuffer is not a valid message.
    p->context.set_deadline(std::chrono::system_clock::now());
    p->stub.UnaryCall(&p->context, "/pdserve.Pin/Pin", grpc::StubOptions(), &p->request,
                      &p->response, [](grpc::Status) {});
    return p;
  }();
  (void)pin;
}

void RouteProtobufLogs() {
  static const bool routed = [] {
    google::protobuf::SetLogHandler([](google::protobuf::LogLevel level, const char* file, int line,
                                       const std::string& message) {
      if (level >= google::protobuf::LOGLEVEL_FATAL) {
        PD_LOG(Error) << "protobuf " << file << ":" << line << ": " << message;
      } else {
        PD_LOG(Debug) << "protobuf " << file << ":" << line << ": " << message;
      }
    });
    return true;
  }();
  (void)routed;
}

}  // namespace pdserve
