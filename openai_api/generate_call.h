// One Generate call to the router on gRPC's callback API: the HTTP gateway holds no thread while
// a generation streams. Messages and the end arrive on gRPC's threads, one at a time per call.
#ifndef PDSERVE_OPENAI_API_GENERATE_CALL_H_
#define PDSERVE_OPENAI_API_GENERATE_CALL_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>

#include "pdserve/v1/generation.grpc.pb.h"

namespace pdserve::openai {

class GenerateCall : public grpc::ClientReadReactor<v1::GenerateResponse> {
 public:
  using OnMessage = std::function<void(const v1::GenerateResponse&)>;
  using OnEnd = std::function<void(const grpc::Status&)>;

  // Starts the call; `on_end` runs once, last. `metadata`: the client's headers passed on to the
  // router as gRPC metadata (Authorization, W3C traceparent and tracestate; lower-case names).
  // The call keeps itself alive until its end.
  static std::shared_ptr<GenerateCall> Start(
      v1::Generation::Stub* stub, const std::vector<std::pair<std::string, std::string>>& metadata,
      const v1::GenerateRequest& request, OnMessage on_message, OnEnd on_end) {
    auto call = std::shared_ptr<GenerateCall>(
        new GenerateCall(request, std::move(on_message), std::move(on_end)));
    call->self_ = call;
    for (const auto& [name, value] : metadata) call->context_.AddMetadata(name, value);
    stub->async()->Generate(&call->context_, &call->request_, call.get());
    call->StartRead(&call->response_);
    call->StartCall();
    return call;
  }

  // Ends the call early (the router aborts the request, freeing its KV blocks). Any thread.
  void Cancel() { context_.TryCancel(); }

 private:
  GenerateCall(const v1::GenerateRequest& request, OnMessage on_message, OnEnd on_end)
      : request_(request), on_message_(std::move(on_message)), on_end_(std::move(on_end)) {}

  void OnReadDone(bool ok) override {
    if (!ok) return;  // The stream ended: OnDone follows.
    on_message_(response_);
    StartRead(&response_);
  }

  void OnDone(const grpc::Status& status) override {
    std::shared_ptr<GenerateCall> self = std::move(self_);  // Freed when this returns (or later).
    on_end_(status);
  }

  grpc::ClientContext context_;
  v1::GenerateRequest request_;
  v1::GenerateResponse response_;
  OnMessage on_message_;
  OnEnd on_end_;
  std::shared_ptr<GenerateCall> self_;
};

}  // namespace pdserve::openai

#endif  // PDSERVE_OPENAI_API_GENERATE_CALL_H_
