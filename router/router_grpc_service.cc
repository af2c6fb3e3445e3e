#include "router/router_grpc_service.h"

#include <grpcpp/client_context.h>
#include <grpcpp/support/byte_buffer.h>

#include <atomic>
#include <chrono>
#include <optional>

#include "absl/status/status.h"
#include "common/base/strings.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/stream_writer.h"
#include "common/tokenizer/incremental_detokenizer.h"
#include "router/lenient_request.h"

namespace pdserve {
namespace {

// One public Generate call and the decode stream behind it. Lives until both gRPC sides are
// done with it (two references).
std::string ToString(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!buffer.Dump(&slices).ok()) return out;
  for (const grpc::Slice& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

grpc::ByteBuffer ToByteBuffer(const google::protobuf::Message& message) {
  const std::string bytes = message.SerializeAsString();
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

class GenerateCall : public StreamWriter<grpc::ByteBuffer>,
                     public grpc::ClientReadReactor<internal::v1::DecodeResponse> {
 public:
  GenerateCall(Router* router, grpc::CallbackServerContext* context,
               const grpc::ByteBuffer& raw)
      : router_(router) {
    auto parsed = ParseGenerateRequest(ToString(raw));
    if (!parsed.ok()) {
      End(ToGrpcStatus(parsed.status()));
      return;
    }
    const v1::GenerateRequest& request = *parsed;
    auto routed = router_->Prepare(request, context->deadline());
    if (!routed.ok()) {
      End(ToGrpcStatus(routed.status()));
      return;
    }
    routed_ = std::move(*routed);
    detok_ = std::make_unique<IncrementalDetokenizer>(&router_->tokenizer(),
                                                      routed_.skip_special_tokens, routed_.prompt);
    for (const std::string& s : routed_.stop) max_stop_ = std::max(max_stop_, s.size());
    internal::v1::DecodeRequest& d = downstream_request_;
    d.set_request_id(routed_.downstream_id);
    d.mutable_prompt_ids()->Assign(routed_.prompt.begin(), routed_.prompt.end());
    *d.mutable_sampling() = request.sampling();
    d.set_seed(*routed_.params.seed);
    auto route = router_->RouteRequest(routed_.prompt);
    if (!route.ok()) {
      End(ToGrpcStatus(route.status()));
      return;
    }
    route_ = std::move(*route);
    router_->metrics().Running(1);
    if (route_->prefill) d.set_prefill_address(WorkerPool::Address(*route_->prefill->worker));
    client_context_.set_deadline(routed_.deadline);
    refs_.fetch_add(1);
    WorkerPool::DecodeStub(*route_->decode.worker)
        ->async()
        ->Generate(&client_context_, &downstream_request_, this);
    StartRead(&downstream_response_);
    StartCall();
  }

 private:
  // Downstream (decode worker) side.
  void OnReadDone(bool ok) override {
    if (!ok) return;  // The stream ended; OnDone follows.
    if (!stopped_) Relay(downstream_response_);
    StartRead(&downstream_response_);
  }

  void OnDone(const grpc::Status& status) override {
    router_->Done(*route_);
    router_->metrics().Running(-1);
    if (!stopped_) {
      if (status.ok() && finished_) {
        End(grpc::Status::OK);
      } else if (status.ok()) {
        End(grpc::Status(grpc::StatusCode::INTERNAL, "decode worker ended the stream early"));
      } else {
        End(status);
      }
    }
    Unref();
  }

  // Client side.
  void OnClientGone() override {
    // A client that cancels (or whose deadline passes) ends the request as vLLM counts it:
    // finished_reason "abort".
    if (!recorded_.exchange(true)) Record("abort");
    client_context_.TryCancel();
  }
  void OnFinished() override { Unref(); }

  // Closes the public stream; the first end of the request is what the metrics count.
  void End(const grpc::Status& status) {
    if (!recorded_.exchange(true)) {
      if (status.ok() && finished_) {
        Record(finish_reason_);
      } else if (status.ok()) {
        router_->metrics().Failed("INTERNAL");
      } else {
        router_->metrics().Failed(
            absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code())));
      }
    }
    Close(status);
  }

  void Record(const std::string& finish_reason) {
    metrics::FinishedRequest f;
    f.finish_reason = finish_reason;
    f.generation_tokens = completion_tokens_;
    f.e2e_seconds = Seconds(Clock::now() - arrival_);
    f.ttft_seconds = got_first_ ? Seconds(first_token_ - arrival_) : 0.0;
    router_->metrics().requests().Finished(f);
  }

  using Clock = std::chrono::steady_clock;
  static double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

  void Unref() {
    if (refs_.fetch_sub(1) == 1) delete this;
  }

  void Relay(const internal::v1::DecodeResponse& d) {
    v1::GenerateResponse out;
    out.set_request_id(routed_.request_id);
    std::string text;
    const Clock::time_point now = Clock::now();
    for (int i = 0; i < d.token_ids_size(); ++i) {
      if (!got_first_) {
        got_first_ = true;
        first_token_ = now;
        router_->metrics().requests().FirstToken(Seconds(now - arrival_),
                                                 static_cast<int64_t>(routed_.prompt.size()));
      } else {
        router_->metrics().requests().NextToken(i == 0 ? Seconds(now - last_token_) : 0.0);
      }
      last_token_ = now;
      out.add_token_ids(d.token_ids(i));
      out.add_logprobs(d.logprobs(i));
      *out.add_top_logprobs() = d.top_logprobs(i);
      auto delta = detok_->Next(d.token_ids(i));
      if (delta.ok()) text += *delta;
    }
    completion_tokens_ += d.token_ids_size();
    const bool last = !d.finish_reason().empty();
    if (last) text += detok_->Finish();
    pending_text_ += text;
    std::string finish = d.finish_reason();
    // Stop strings: cut at the first one, finish with "stop" and stop the decode worker.
    size_t cut = std::string::npos;
    for (const std::string& s : routed_.stop) cut = std::min(cut, pending_text_.find(s));
    if (cut != std::string::npos) {
      out.set_text(pending_text_.substr(0, cut));
      pending_text_.clear();
      finish = "stop";
      stopped_ = true;
    } else if (last || max_stop_ == 0) {
      out.set_text(pending_text_);
      pending_text_.clear();
    } else {
      // Hold back what could still be the start of a stop string (whole characters only).
      size_t keep = std::min(pending_text_.size(), max_stop_ - 1);
      size_t emit = pending_text_.size() - keep;
      while (emit > 0 && emit < pending_text_.size() &&
             (static_cast<uint8_t>(pending_text_[emit]) & 0xc0) == 0x80) {
        --emit;
      }
      out.set_text(pending_text_.substr(0, emit));
      pending_text_.erase(0, emit);
    }
    if (!finish.empty()) {
      finished_ = true;
      finish_reason_ = finish;
      out.set_finish_reason(finish);
      v1::Usage* u = out.mutable_usage();
      u->set_prompt_tokens(static_cast<int32_t>(routed_.prompt.size()));
      u->set_completion_tokens(completion_tokens_);
      u->set_cached_tokens(last ? d.usage().cached_tokens() : 0);
    }
    Push(ToByteBuffer(out));
    if (stopped_) {
      End(grpc::Status::OK);
      client_context_.TryCancel();
    }
  }

  Router* router_;
  const Clock::time_point arrival_ = Clock::now();
  Clock::time_point first_token_, last_token_;
  bool got_first_ = false;
  std::string finish_reason_;
  std::atomic<bool> recorded_{false};  // The request's end was counted.
  RoutedRequest routed_;
  std::optional<Route> route_;  // Set once the call goes down.
  std::unique_ptr<IncrementalDetokenizer> detok_;
  grpc::ClientContext client_context_;
  internal::v1::DecodeRequest downstream_request_;
  internal::v1::DecodeResponse downstream_response_;
  std::string pending_text_;
  size_t max_stop_ = 0;
  int32_t completion_tokens_ = 0;
  bool finished_ = false;
  bool stopped_ = false;
  std::atomic<int> refs_{1};
};

}  // namespace

grpc::ServerWriteReactor<grpc::ByteBuffer>* GenerationService::Generate(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  return new GenerateCall(router_, context, *request);
}

grpc::ServerUnaryReactor* GenerationService::Tokenize(grpc::CallbackServerContext* context,
                                                      const grpc::ByteBuffer* request,
                                                      grpc::ByteBuffer* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  auto parsed = ParseTokenizeRequest(ToString(*request));
  if (!parsed.ok()) {
    reactor->Finish(ToGrpcStatus(parsed.status()));
    return reactor;
  }
  auto ids = router_->tokenizer().Encode(parsed->text(), parsed->add_special_tokens());
  if (!ids.ok()) {
    reactor->Finish(ToGrpcStatus(absl::InvalidArgumentError(Str("text: ", ids.status().message()))));
    return reactor;
  }
  v1::TokenizeResponse out;
  out.mutable_token_ids()->Assign(ids->begin(), ids->end());
  *response = ToByteBuffer(out);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* GenerationService::GetModelInfo(grpc::CallbackServerContext* context,
                                                          const v1::GetModelInfoRequest* request,
                                                          v1::ModelInfo* response) {
  *response = router_->model_info();
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace pdserve

namespace pdserve {

grpc::ServerUnaryReactor* RouterAdminService::GetRouterStats(
    grpc::CallbackServerContext* context, const internal::v1::GetRouterStatsRequest* request,
    internal::v1::RouterStats* response) {
  *response = router_->Stats();
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace pdserve
