// A decode worker in the router's own process (`serve`): the router hands it requests and takes
// its outputs directly, not through gRPC (the hop that costs a message a token a stream). The
// decode tier implements it (LocalDecodeService, decode_service/decode_grpc_service.h); the router only knows this.
#ifndef PDSERVE_COMMON_RPC_LOCAL_DECODE_H_
#define PDSERVE_COMMON_RPC_LOCAL_DECODE_H_

#include <memory>
#include <string>

#include <grpcpp/support/status.h>

#include "pdserve/internal/v1/worker.pb.h"

namespace pdserve {

// One request's outputs, as the decode worker's Generate stream would carry them.
class LocalDecodeStream {
 public:
  virtual ~LocalDecodeStream() = default;
  // On the worker's scheduler thread, in order; OnEnd exactly once, last (OK after the message
  // with the finish reason; CANCELLED after Cancel; the worker's error otherwise).
  virtual void OnResponse(const internal::v1::DecodeResponse& response) = 0;
  virtual void OnEnd(const grpc::Status& status) = 0;
};

class LocalDecode {
 public:
  virtual ~LocalDecode() = default;
  // `traceparent`/`tracestate`: the router's attempt span (W3C; empty: none). The stream may end
  // before Start returns (a worker that is shutting down).
  virtual void Start(const internal::v1::DecodeRequest& request, const std::string& traceparent,
                     const std::string& tracestate, std::shared_ptr<LocalDecodeStream> stream) = 0;
  // Stops the request; its stream ends CANCELLED unless it has already ended.
  virtual void Cancel(const std::string& request_id) = 0;
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_RPC_LOCAL_DECODE_H_
