// The prefill tier's gRPC service: a thin callback-API layer over PrefillWorker.
#ifndef PDSERVE_PREFILL_SERVICE_PREFILL_GRPC_SERVICE_H_
#define PDSERVE_PREFILL_SERVICE_PREFILL_GRPC_SERVICE_H_

#include "pdserve/internal/v1/worker.grpc.pb.h"
#include "prefill_service/prefill_worker.h"

namespace pdserve {

class PrefillGrpcService : public internal::v1::PrefillWorker::CallbackService {
 public:
  explicit PrefillGrpcService(PrefillWorker* worker) : worker_(worker) {}

  grpc::ServerUnaryReactor* Prefill(grpc::CallbackServerContext* context,
                                    const internal::v1::PrefillRequest* request,
                                    internal::v1::PrefillResponse* response) override;
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
  PrefillWorker* worker_;  // Not owned.
};

}  // namespace pdserve

#endif  // PDSERVE_PREFILL_SERVICE_PREFILL_GRPC_SERVICE_H_
