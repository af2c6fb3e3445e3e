#include "decode_service/decode_grpc_service.h"

#include "common/rpc/grpc_status.h"
#include "common/rpc/lora_admin.h"
#include "common/rpc/stream_coalesce.h"
#include "common/rpc/stream_writer.h"
#include "decode_service/decode_messages.h"

namespace pdserve {
namespace {

class GenerateCall;

// Bridges the worker's scheduler thread to the reactor; detached when the call is over.
class Sink : public DecodeSink {
 public:
  explicit Sink(GenerateCall* call) : call_(call) {}
  void OnOutput(const RequestOutput& output) override;
  void OnError(const absl::Status& status) override;
  void Detach() {
    std::lock_guard<std::mutex> lock(mu_);
    call_ = nullptr;
  }

 private:
  std::mutex mu_;
  GenerateCall* call_;
};

class GenerateCall : public StreamWriter<internal::v1::DecodeResponse> {
 public:
  GenerateCall(DecodeWorker* worker, grpc::CallbackServerContext* context,
               const internal::v1::DecodeRequest& request)
      : worker_(worker), request_id_(request.request_id()), sink_(std::make_shared<Sink>(this)) {
    const auto& md = context->client_metadata();
    auto header = [&](const char* name) {
      auto it = md.find(name);
      return it == md.end() ? std::string() : std::string(it->second.data(), it->second.size());
    };
    DecodeJob job = ToDecodeJob(request, header("traceparent"), header("tracestate"));
    worker_->Submit(std::move(job), sink_);
  }

 private:
  void OnClientGone() override { worker_->Cancel(request_id_); }
  void OnFinished() override {
    sink_->Detach();
    delete this;
  }

  DecodeWorker* worker_;
  const std::string request_id_;
  std::shared_ptr<Sink> sink_;
};

void Sink::OnOutput(const RequestOutput& output) {
  internal::v1::DecodeResponse r;
  ToDecodeResponse(output, &r);
  std::lock_guard<std::mutex> lock(mu_);
  if (call_ == nullptr) return;
  // A stream behind the engine gets the steps it missed in one message (the router splits them).
  call_->PushOrMerge(std::move(r), CoalesceDecodeResponse);
  if (output.finished) call_->Close(grpc::Status::OK);
}

void Sink::OnError(const absl::Status& status) {
  std::lock_guard<std::mutex> lock(mu_);
  if (call_ != nullptr) call_->Close(ToGrpcStatus(status));
}

}  // namespace

grpc::ServerWriteReactor<internal::v1::DecodeResponse>* DecodeGrpcService::Generate(
    grpc::CallbackServerContext* context, const internal::v1::DecodeRequest* request) {
  return new GenerateCall(worker_, context, *request);
}

grpc::ServerBidiReactor<internal::v1::DecodeStreamRequest, internal::v1::DecodeStreamResponse>*
DecodeGrpcService::GenerateMany(grpc::CallbackServerContext* context) {
  return streams_.Start(context);
}

grpc::ServerUnaryReactor* DecodeGrpcService::GetWorkerInfo(
    grpc::CallbackServerContext* context, const internal::v1::GetWorkerInfoRequest* request,
    internal::v1::WorkerInfo* response) {
  *response = worker_->Info();
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerWriteReactor<internal::v1::LoadReport>* DecodeGrpcService::WatchLoad(
    grpc::CallbackServerContext* context, const internal::v1::WatchLoadRequest* request) {
  return worker_->publisher()->Watch(*request);
}

grpc::ServerUnaryReactor* DecodeGrpcService::LoadLoraAdapter(
    grpc::CallbackServerContext* context, const internal::v1::LoadLoraAdapterRequest* request,
    internal::v1::LoraAdapterChange* response) {
  return ServeLoadLoraAdapter(context, worker_->lora(), [w = worker_] { w->RefreshInfo(); }, request,
                              response);
}

grpc::ServerUnaryReactor* DecodeGrpcService::UnloadLoraAdapter(
    grpc::CallbackServerContext* context, const internal::v1::UnloadLoraAdapterRequest* request,
    internal::v1::LoraAdapterChange* response) {
  return ServeUnloadLoraAdapter(context, worker_->lora(), [w = worker_] { w->RefreshInfo(); }, request,
                                response);
}

}  // namespace pdserve
