// The decode tier's gRPC service: a thin callback-API layer over DecodeWorker.
#ifndef PDSERVE_DECODE_SERVICE_DECODE_GRPC_SERVICE_H_
#define PDSERVE_DECODE_SERVICE_DECODE_GRPC_SERVICE_H_

#include "decode_service/decode_stream.h"
#include "decode_service/decode_worker.h"
#include "pdserve/internal/v1/worker.grpc.pb.h"

namespace pdserve {

class DecodeGrpcService : public internal::v1::DecodeWorker::CallbackService {
 public:
  explicit DecodeGrpcService(DecodeWorker* worker) : worker_(worker), streams_(worker) {}

  // After the worker's drain, before the server's Shutdown: ends the routers' GenerateMany calls
  // once what they carry is written (DecodeStreams::Close).
  void CloseStreams() { streams_.Close(); }

  grpc::ServerWriteReactor<internal::v1::DecodeResponse>* Generate(
      grpc::CallbackServerContext* context, const internal::v1::DecodeRequest* request) override;
  grpc::ServerBidiReactor<internal::v1::DecodeStreamRequest, internal::v1::DecodeStreamResponse>*
  GenerateMany(grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* GetWorkerInfo(grpc::CallbackServerContext* context,
                                          const internal::v1::GetWorkerInfoRequest* request,
                                          internal::v1::WorkerInfo* response) override;
  grpc::ServerWriteReactor<internal::v1::LoadReport>* WatchLoad(
      grpc::CallbackServerContext* context, const internal::v1::WatchLoadRequest* request) override;
  grpc::ServerUnaryReactor* LoadLoraAdapter(grpc::CallbackServerContext* context,
                                            const internal::v1::LoadLoraAdapterRequest* request,
                                            internal::v1::LoraAdapterChange* response) override;
  grpc::ServerUnaryReactor* UnloadLoraAdapter(grpc::CallbackServerContext* context,
                                              const internal::v1::UnloadLoraAdapterRequest* request,
                                              internal::v1::LoraAdapterChange* response) override;

 private:
  DecodeWorker* worker_;  // Not owned.
  DecodeStreams streams_;
};

}  // namespace pdserve

#endif  // PDSERVE_DECODE_SERVICE_DECODE_GRPC_SERVICE_H_
