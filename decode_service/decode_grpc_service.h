// The decode tier's gRPC service: a thin callback-API layer over DecodeWorker; and the same
// worker for a router in this process without gRPC (LocalDecodeService, `serve`).
#ifndef PDSERVE_DECODE_SERVICE_DECODE_GRPC_SERVICE_H_
#define PDSERVE_DECODE_SERVICE_DECODE_GRPC_SERVICE_H_

#include <string>

#include "decode_service/decode_worker.h"
#include "pdserve/internal/v1/worker.grpc.pb.h"
#include "common/rpc/local_decode.h"

namespace pdserve {

// The request as the worker takes it; `traceparent`/`tracestate`: the caller's trace context.
DecodeJob DecodeJobFromProto(const internal::v1::DecodeRequest& request, std::string traceparent,
                             std::string tracestate);
// One of the worker's outputs as a Generate stream's message.
internal::v1::DecodeResponse DecodeResponseFromOutput(const RequestOutput& output);

class LocalDecodeService : public LocalDecode {
 public:
  explicit LocalDecodeService(DecodeWorker* worker) : worker_(worker) {}
  void Start(const internal::v1::DecodeRequest& request, const std::string& traceparent,
             const std::string& tracestate, std::shared_ptr<LocalDecodeStream> stream) override;
  void Cancel(const std::string& request_id) override;

 private:
  DecodeWorker* worker_;  // Not owned.
};

class DecodeGrpcService : public internal::v1::DecodeWorker::CallbackService {
 public:
  explicit DecodeGrpcService(DecodeWorker* worker) : worker_(worker) {}

  grpc::ServerWriteReactor<internal::v1::DecodeResponse>* Generate(
      grpc::CallbackServerContext* context, const internal::v1::DecodeRequest* request) override;
  grpc::ServerUnaryReactor* GetWorkerInfo(grpc::CallbackServerContext* context,
                                          const internal::v1::GetWorkerInfoRequest* request,
                                          internal::v1::WorkerInfo* response) override;
  grpc::ServerWriteReactor<internal::v1::LoadReport>* WatchLoad(
      grpc::CallbackServerContext* context, const internal::v1::WatchLoadRequest* request) override;

 private:
  DecodeWorker* worker_;  // Not owned.
};

}  // namespace pdserve

#endif  // PDSERVE_DECODE_SERVICE_DECODE_GRPC_SERVICE_H_
