#include "prefill_service/prefill_grpc_service.h"

#include "common/rpc/grpc_status.h"
#include "common/rpc/lora_admin.h"

namespace pdserve {
namespace {

// One Prefill call. A cancelled call (the decode worker gave up: its client left or its lease
// ran out) cancels the job when it has not started sending pages.
class PrefillCall : public grpc::ServerUnaryReactor {
 public:
  PrefillCall(PrefillWorker* worker, grpc::CallbackServerContext* context,
              const internal::v1::PrefillRequest& request, internal::v1::PrefillResponse* response)
      : worker_(worker) {
    const auto& md = context->client_metadata();
    std::string traceparent, tracestate;
    if (auto it = md.find("traceparent"); it != md.end()) traceparent.assign(it->second.data(), it->second.size());
    if (auto it = md.find("tracestate"); it != md.end()) tracestate.assign(it->second.data(), it->second.size());
    // The reactor and response stay valid until Finish; the worker calls `done` exactly once.
    ticket_ = worker_->Submit(request, [this, response](absl::StatusOr<internal::v1::PrefillResponse> r) {
      if (!r.ok()) {
        Finish(ToGrpcStatus(r.status()));
        return;
      }
      *response = std::move(*r);
      Finish(grpc::Status::OK);
    }, std::move(traceparent), std::move(tracestate));
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
  return new PrefillCall(worker_, context, *request, response);
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

grpc::ServerUnaryReactor* PrefillGrpcService::LoadLoraAdapter(
    grpc::CallbackServerContext* context, const internal::v1::LoadLoraAdapterRequest* request,
    internal::v1::LoraAdapterChange* response) {
  return ServeLoadLoraAdapter(context, worker_->lora(), [w = worker_] { w->RefreshInfo(); }, request,
                              response);
}

grpc::ServerUnaryReactor* PrefillGrpcService::UnloadLoraAdapter(
    grpc::CallbackServerContext* context, const internal::v1::UnloadLoraAdapterRequest* request,
    internal::v1::LoraAdapterChange* response) {
  return ServeUnloadLoraAdapter(context, worker_->lora(), [w = worker_] { w->RefreshInfo(); }, request,
                                response);
}

}  // namespace pdserve
