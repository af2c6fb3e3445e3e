#include "prefill_service/prefill_grpc_service.h"

#include "common/rpc/grpc_status.h"

namespace pdserve {
namespace {

// One Prefill call. A cancelled call (the decode worker gave up: its client left or its lease
// ran out) cancels the job when it has not started sending pages.
class PrefillCall : public grpc::ServerUnaryReactor {
 public:
  PrefillCall(PrefillWorker* worker, const internal::v1::PrefillRequest& request,
              internal::v1::PrefillResponse* response)
      : worker_(worker) {
    // The reactor and response stay valid until Finish; the worker calls `done` exactly once.
    ticket_ = worker_->Submit(request, [this, response](absl::StatusOr<internal::v1::PrefillResponse> r) {
      if (!r.ok()) {
        Finish(ToGrpcStatus(r.status()));
        return;
      }
      *response = std::move(*r);
      Finish(grpc::Status::OK);
    });
  }

 private:
  void OnCancel() override { worker_->Cancel(ticket_); }
  void OnDone() override { delete this; }

  PrefillWorker* const worker_;
  uint64_t ticket_ = 0;
};

}  // namespace

grpc::ServerUnaryReactor* PrefillGrpcService::Prefill(grpc::CallbackServerContext* context,
                                                      const internal::v1::PrefillRequest* request,
                                                      internal::v1::PrefillResponse* response) {
  return new PrefillCall(worker_, *request, response);
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
