#include "prefill_service/prefill_grpc_service.h"

#include "common/rpc/grpc_status.h"

namespace pdserve {

grpc::ServerUnaryReactor* PrefillGrpcService::Prefill(grpc::CallbackServerContext* context,
                                                      const internal::v1::PrefillRequest* request,
                                                      internal::v1::PrefillResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  // The reactor and response stay valid until Finish; the worker calls `done` exactly once.
  worker_->Submit(*request, [reactor, response](absl::StatusOr<internal::v1::PrefillResponse> r) {
    if (!r.ok()) {
      reactor->Finish(ToGrpcStatus(r.status()));
      return;
    }
    *response = std::move(*r);
    reactor->Finish(grpc::Status::OK);
  });
  return reactor;
}

grpc::ServerUnaryReactor* PrefillGrpcService::GetWorkerInfo(
    grpc::CallbackServerContext* context, const internal::v1::GetWorkerInfoRequest* request,
    internal::v1::WorkerInfo* response) {
  *response = worker_->Info();
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerWriteReactor<internal::v1::LoadReport>* PrefillGrpcService::WatchLoad(
    grpc::CallbackServerContext* context, const internal::v1::WatchLoadRequest* request) {
  return worker_->publisher()->Watch(*request);
}

}  // namespace pdserve
