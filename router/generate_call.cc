#include "router/generate_call.h"

#include <grpcpp/alarm.h>
#include <grpcpp/client_context.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>

#include "absl/status/status.h"
#include "common/base/log.h"
#include "common/base/strings.h"
#include "common/rpc/byte_buffer.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/stream_coalesce.h"
#include "common/rpc/stream_writer.h"
#include "common/tokenizer/incremental_detokenizer.h"
#include "common/tracing/span.h"
#include "router/decode_stream.h"
#include "router/lenient_request.h"

namespace pdserve {
namespace {

class GenerateCall;

std::string Metadata(const grpc::CallbackServerContext& context, const char* name) {
  const auto& md = context.client_metadata();
  auto it = md.find(name);
  return it == md.end() ? "" : std::string(it->second.data(), it->second.size());
}

// One try on a decode worker. Its outputs reach the call through OnResponse, then its end
// through OnAttemptDone, once, never concurrently; Cancel may come from any thread, any time.
class Attempt {
 public:
  virtual ~Attempt() = default;
  virtual void Start(internal::v1::DecodeRequest request, std::chrono::system_clock::time_point deadline) = 0;
  virtual void Cancel() = 0;
  const Route& route() const { return route_; }
  virtual bool shared() const { return false; }

 protected:
  Attempt(GenerateCall* call, Route route, Span span)
      : call_(call), route_(std::move(route)), span_(std::move(span)) {}
  // Ends the attempt's span and tells the call.
  void Ended(const grpc::Status& status);

  GenerateCall* const call_;
  const Route route_;
  Span span_;  // pdserve.router.decode_attempt: this try, from the call to its end.
};

// On a Generate stream of its own. Deletes itself after telling the call that it ended.
class DecodeAttempt : public Attempt, public grpc::ClientReadReactor<internal::v1::DecodeResponse> {
 public:
  DecodeAttempt(GenerateCall* call, Route route, Span span) : Attempt(call, std::move(route), std::move(span)) {}

  void Start(internal::v1::DecodeRequest request, std::chrono::system_clock::time_point deadline) override {
    request_ = std::move(request);
    context_.set_deadline(deadline);
    // The decode worker's spans join this attempt's (W3C trace context in the metadata).
    if (span_.context().valid()) {
      context_.AddMetadata("traceparent", span_.traceparent());
      if (!span_.context().tracestate.empty()) {
        context_.AddMetadata("tracestate", span_.context().tracestate);
      }
    }
    WorkerPool::DecodeStub(*route_.decode.worker)->async()->Generate(&context_, &request_, this);
    StartRead(&response_);
    StartCall();
  }
  void Cancel() override { context_.TryCancel(); }

 private:
  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& status) override {
    Ended(status);
    delete this;
  }

  grpc::ClientContext context_;
  internal::v1::DecodeRequest request_;
  internal::v1::DecodeResponse response_;
};

// On the decode worker's shared stream (decode_stream.h). Kept alive by the stream while it runs
// and by its deadline's alarm; the call holds a plain pointer until OnAttemptDone.
class SharedDecodeAttempt : public Attempt,
                            public DecodeStreamListener,
                            public std::enable_shared_from_this<SharedDecodeAttempt> {
 public:
  SharedDecodeAttempt(GenerateCall* call, Route route, Span span, std::shared_ptr<DecodeStreamClient> stream)
      : Attempt(call, std::move(route), std::move(span)), stream_(std::move(stream)) {}

  bool shared() const override { return true; }

  void Start(internal::v1::DecodeRequest request, std::chrono::system_clock::time_point deadline) override {
    auto self = shared_from_this();
    const bool traced = span_.context().valid();
    uint64_t id = 0;
    if (!stream_->Begin(self, request, traced ? span_.traceparent() : "",
                        traced ? span_.context().tracestate : "", &id)) {
      // The stream closed since the call got it (its worker went away): ended like a broken one.
      alarm_.Set(std::chrono::system_clock::now(), [self](bool) {
        self->End(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the decode stream closed"));
      });
      return;
    }
    id_.store(id);
    if (cancelled_.load()) stream_->Cancel(id);  // A Cancel that came while it began.
    if (deadline != std::chrono::system_clock::time_point::max()) {
      // The request's deadline, which a Generate stream's context would carry: the attempt ends
      // then even if the worker cannot be heard. Not set once it ended (its end may have come
      // already): the alarm would keep it alive until then.
      std::lock_guard<std::mutex> lock(mu_);
      if (!ended_) {
        alarm_.Set(deadline, [self, id](bool fired) {
          if (!fired) return;
          self->stream_->Abandon(id);
          self->End(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "Deadline Exceeded"));
        });
      }
    }
  }
  void Cancel() override {
    cancelled_.store(true);
    if (const uint64_t id = id_.load(); id != 0) stream_->Cancel(id);
  }

  void OnItem(const internal::v1::DecodeStreamItem& item) override;
  void OnStreamEnd(const grpc::Status& status) override {
    alarm_.Cancel();
    End(status);
  }

 private:
  void End(const grpc::Status& status) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (ended_) return;
      ended_ = true;
    }
    Ended(status);
  }

  const std::shared_ptr<DecodeStreamClient> stream_;
  std::atomic<uint64_t> id_{0};  // The stream's id for it, once begun.
  std::atomic<bool> cancelled_{false};
  grpc::Alarm alarm_;
  std::mutex mu_;      // Delivery against an end from the alarm.
  bool ended_ = false;  // Guarded by mu_.
};

// Lives until gRPC is done with the public call and with the current attempt (a reference each).
class GenerateCall : public StreamWriter<grpc::ByteBuffer> {
 public:
  GenerateCall(Router* router, grpc::CallbackServerContext* context, const grpc::ByteBuffer& raw)
      : router_(router), context_(context) {
    // The request's span: under the client's trace when it sent a traceparent, else a new
    // trace that --trace-sample-ratio samples. Attributes follow OpenTelemetry's GenAI
    // conventions where they apply.
    span_ = Span::FromHeaders(router_->options().tracer, "pdserve.generate", SpanKind::kServer,
                              Metadata(*context, "traceparent"), Metadata(*context, "tracestate"));
    if (span_.recording()) {
      span_.Set("gen_ai.operation.name", "text_completion");
      span_.Set("gen_ai.request.model", router_->model_info().name());
      span_.Set("pdserve.role", "router");
    }
    if (absl::Status auth = router_->api_keys().Check(*context); !auth.ok()) {
      End(ToGrpcStatus(auth));
      return;
    }
    auto parsed = ParseGenerateRequest(ByteBufferToString(raw));
    if (!parsed.ok()) {
      End(ToGrpcStatus(parsed.status()));
      return;
    }
    const v1::GenerateRequest& request = *parsed;
    Span prepare = span_.Child("pdserve.router.prepare");  // Validation and tokenization.
    auto routed = router_->Prepare(request, context->deadline());
    if (!routed.ok()) {
      prepare.SetError(std::string(routed.status().message()));
      prepare.End();
      End(ToGrpcStatus(routed.status()));
      return;
    }
    routed_ = std::move(*routed);
    prepare.Set("gen_ai.usage.input_tokens", static_cast<int64_t>(routed_.prompt.size()));
    prepare.End();
    if (span_.recording()) {
      span_.Set("gen_ai.request.id", routed_.request_id);
      span_.Set("gen_ai.usage.input_tokens", static_cast<int64_t>(routed_.prompt.size()));
      span_.Set("gen_ai.request.max_tokens", static_cast<int64_t>(routed_.params.max_tokens));
      span_.Set("gen_ai.request.temperature", static_cast<double>(routed_.params.temperature));
      span_.Set("gen_ai.request.top_p", static_cast<double>(routed_.params.top_p));
      span_.Set("gen_ai.request.seed", static_cast<int64_t>(*routed_.params.seed));
    }
    detok_ = std::make_unique<IncrementalDetokenizer>(&router_->tokenizer(),
                                                      routed_.skip_special_tokens, routed_.prompt);
    for (const std::string& s : routed_.stop) max_stop_ = std::max(max_stop_, s.size());
    internal::v1::DecodeRequest& d = downstream_request_;
    d.set_request_id(routed_.downstream_id);
    d.mutable_prompt_ids()->Assign(routed_.prompt.begin(), routed_.prompt.end());
    *d.mutable_sampling() = request.sampling();
    d.mutable_sampling()->set_max_tokens(routed_.params.max_tokens);  // Resolved from the context.
    d.set_seed(*routed_.params.seed);
    Span admit = span_.Child("pdserve.router.admit");
    if (absl::Status admitted = router_->Admit(); !admitted.ok()) {
      admit.SetError(std::string(admitted.message()));
      admit.End();
      End(ToGrpcStatus(admitted));
      return;
    }
    admit.End();
    Span routing = span_.Child("pdserve.router.route");
    RouteConstraints constraints;
    constraints.lora_name = routed_.params.lora_name;
    auto route = router_->RouteRequest(routed_.prompt, constraints);
    if (!route.ok()) {
      routing.SetError(std::string(route.status().message()));
      routing.End();
      router_->Release();
      End(ToGrpcStatus(route.status()));
      return;
    }
    routing.Set("pdserve.decode_worker", WorkerPool::Address(*route->decode.worker));
    routing.Set("pdserve.prefill_worker",
                route->prefill ? WorkerPool::Address(*route->prefill->worker) : "local");
    routing.End();
    router_->metrics().Running(1);
    StartAttempt(std::move(*route));
  }

  // From the current attempt (its callbacks are serialized, and attempts do not overlap).
  void OnResponse(const internal::v1::DecodeResponse& d) {
    if (d.step_tokens_size() == 0 || router_->options().stream_interval > 1) {
      if (!stopped_) Relay(d);
      return;
    }
    // The decode worker folded steps its stream was behind on: the client still gets one
    // message a step (its --stream-interval is 1).
    for (const internal::v1::DecodeResponse& step : SplitDecodeResponse(d)) {
      if (!stopped_) Relay(step);
    }
  }
  void OnAttemptDone(Attempt* attempt, const grpc::Status& status);

 private:
  void StartAttempt(Route route) {
    internal::v1::DecodeRequest request = downstream_request_;
    // A retry gets its own id on the workers (the old one may still be winding down).
    if (attempts_ > 0) request.set_request_id(Str(routed_.downstream_id, "~", attempts_));
    if (route.prefill) request.set_prefill_address(WorkerPool::Address(*route.prefill->worker));
    request.mutable_resume_output_ids()->Assign(generated_.begin(), generated_.end());
    Span span;
    {
      std::lock_guard<std::mutex> lock(span_mu_);
      span = span_.Child("pdserve.router.decode_attempt", SpanKind::kClient);
    }
    if (span.recording()) {
      span.Set("pdserve.attempt", static_cast<int64_t>(attempts_));
      span.Set("pdserve.decode_worker", WorkerPool::Address(*route.decode.worker));
      span.Set("pdserve.prefill_worker",
               route.prefill ? WorkerPool::Address(*route.prefill->worker) : "local");
      span.Set("pdserve.resumed_tokens", static_cast<int64_t>(generated_.size()));
      span.Set("pdserve.downstream_id", request.request_id());
    }
    ++attempts_;
    // The worker's shared stream when it has one (the attempt then owns itself).
    std::shared_ptr<SharedDecodeAttempt> shared;
    Attempt* attempt;
    if (auto stream = router_->DecodeStream(route.decode.worker); stream != nullptr) {
      shared = std::make_shared<SharedDecodeAttempt>(this, std::move(route), std::move(span), std::move(stream));
      attempt = shared.get();
    } else {
      attempt = new DecodeAttempt(this, std::move(route), std::move(span));
    }
    refs_.fetch_add(1);
    {
      std::lock_guard<std::mutex> lock(mu_);
      attempt_ = attempt;
      if (client_gone_) attempt->Cancel();  // Ends at once: OnAttemptDone winds up.
    }
    attempt->Start(std::move(request), routed_.deadline);
  }

  void CancelAttempt() {
    std::lock_guard<std::mutex> lock(mu_);
    if (attempt_ != nullptr) attempt_->Cancel();
  }

  // Whether a broken decode stream is worth continuing elsewhere: the worker died, went away or
  // was full, not the request's own deadline or a cancel of ours.
  static bool Resumable(const grpc::Status& status) {
    switch (status.error_code()) {
      case grpc::StatusCode::OK:  // Ended without finishing.
      case grpc::StatusCode::UNAVAILABLE:
      case grpc::StatusCode::UNKNOWN:
      case grpc::StatusCode::ABORTED:
      case grpc::StatusCode::INTERNAL:
      case grpc::StatusCode::RESOURCE_EXHAUSTED:  // That worker's queue is full: try another.
        return true;
      default:
        return false;
    }
  }

  void OnClientGone() override {
    // A client that cancels (or whose deadline passes) ends the request as vLLM counts it:
    // finished_reason "abort".
    if (!recorded_.exchange(true)) Record("abort");
    std::lock_guard<std::mutex> lock(mu_);
    client_gone_ = true;
    if (attempt_ != nullptr) attempt_->Cancel();
  }
  void OnFinished() override { Unref(); }

  void Unref() {
    if (refs_.fetch_sub(1) == 1) delete this;
  }

  // Closes the public stream; the first end of the request is what the metrics count. A full
  // router or worker answers RESOURCE_EXHAUSTED with gRPC's retry pushback trailer.
  void End(const grpc::Status& status) {
    EndSpan(status);
    if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED && !ended_.exchange(true)) {
      context_->AddTrailingMetadata("grpc-retry-pushback-ms",
                                    std::to_string(router_->options().retry_after_ms));
    }
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

  // The request's span ends with the request's first end (later calls change nothing).
  void EndSpan(const grpc::Status& status) {
    std::lock_guard<std::mutex> lock(span_mu_);
    if (!span_.recording()) return;
    span_.Set("gen_ai.usage.output_tokens", static_cast<int64_t>(completion_tokens_));
    if (finished_) span_.Set("gen_ai.response.finish_reasons", std::vector<std::string>{finish_reason_});
    span_.Set("pdserve.attempts", static_cast<int64_t>(attempts_));
    if (!status.ok()) {
      span_.SetError(Str(absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code())),
                         ": ", status.error_message()));
    }
    span_.End();
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

  void Relay(const internal::v1::DecodeResponse& d) {
    v1::GenerateResponse out;
    out.set_request_id(routed_.request_id);
    const Clock::time_point now = Clock::now();
    // A worker's "stop" is an EOS or a stop_token_ids token: as vLLM does, its text is not part of
    // the output (unless include_stop_str_in_output), whether or not special tokens are skipped.
    const bool drop_stop_token = d.finish_reason() == "stop" && !routed_.include_stop_str;
    const bool last = !d.finish_reason().empty();
    std::string finish = d.finish_reason();
    // Stop strings: cut at the first one, finish with "stop" and stop the decode worker. Checked
    // after each token, so that tokens past the one completing a stop string (several arrive
    // together when speculative drafts were accepted) are not returned or counted: the output
    // is what one token per message gives.
    size_t cut = std::string::npos;
    size_t matched = 0;  // The length of the stop string found at `cut` (the first listed there).
    for (int i = 0; i < d.token_ids_size() && cut == std::string::npos; ++i) {
      if (!got_first_) {
        got_first_ = true;
        first_token_ = now;
        {
          std::lock_guard<std::mutex> lock(span_mu_);
          span_.AddEvent("first_token", {{"gen_ai.server.time_to_first_token",
                                          Seconds(now - arrival_)}});
        }
        router_->metrics().requests().FirstToken(Seconds(now - arrival_),
                                                 static_cast<int64_t>(routed_.prompt.size()));
      } else {
        router_->metrics().requests().NextToken(i == 0 ? Seconds(now - last_token_) : 0.0);
      }
      last_token_ = now;
      generated_.push_back(d.token_ids(i));
      out.add_token_ids(d.token_ids(i));
      out.add_logprobs(d.logprobs(i));
      *out.add_top_logprobs() = d.top_logprobs(i);
      ++completion_tokens_;
      if (!(drop_stop_token && i + 1 == d.token_ids_size())) {
        auto delta = detok_->Next(d.token_ids(i));
        if (delta.ok()) pending_text_ += *delta;
      }
      if (last && i + 1 == d.token_ids_size()) pending_text_ += detok_->Finish();
      for (const std::string& s : routed_.stop) {
        const size_t at = pending_text_.find(s);
        if (at < cut) {
          cut = at;
          matched = s.size();
        }
      }
    }
    if (cut != std::string::npos) {
      if (routed_.include_stop_str) cut += matched;
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
    Send(std::move(out));
    if (stopped_) {
      End(grpc::Status::OK);
      CancelAttempt();  // The decode worker stops generating.
    }
  }

  // One message a step when --stream-interval is 1; else every N tokens (and the last), folded
  // into the message still waiting for the client when it is behind.
  void Send(v1::GenerateResponse out) {
    const int64_t interval = router_->options().stream_interval;
    if (interval <= 1) {
      Push(MessageToByteBuffer(out));
      return;
    }
    if (held_tokens_ == 0) {
      held_ = std::move(out);
    } else {
      CoalesceGenerateResponse(held_, out);
    }
    held_tokens_ = held_.token_ids_size();
    if (held_tokens_ < interval && held_.finish_reason().empty()) return;
    bool folded = false;
    PushOrMerge(MessageToByteBuffer(held_), [&](grpc::ByteBuffer& waiting, const grpc::ByteBuffer&) {
      if (!CoalesceGenerateResponse(waiting_, held_)) return false;
      waiting = MessageToByteBuffer(waiting_);
      folded = true;
      return true;
    });
    if (!folded) waiting_ = std::move(held_);
    held_.Clear();
    held_tokens_ = 0;
  }

  Router* router_;
  grpc::CallbackServerContext* const context_;
  std::mutex span_mu_;  // span_: the constructor, the attempts' callbacks and End touch it.
  Span span_;           // pdserve.generate: the request at this router.
  std::atomic<bool> ended_{false};  // The retry hint was added.
  const Clock::time_point arrival_ = Clock::now();
  Clock::time_point first_token_, last_token_;
  bool got_first_ = false;
  std::string finish_reason_;
  std::atomic<bool> recorded_{false};  // The request's end was counted.
  RoutedRequest routed_;
  std::unique_ptr<IncrementalDetokenizer> detok_;
  internal::v1::DecodeRequest downstream_request_;  // The first attempt's request.
  std::vector<int32_t> generated_;  // Token ids relayed to the client.
  std::string pending_text_;
  // --stream-interval above 1: what waits for the interval, and the last message pushed (the
  // one a lagging client's next tokens fold into while it is still queued).
  v1::GenerateResponse held_, waiting_;
  int64_t held_tokens_ = 0;
  size_t max_stop_ = 0;
  int32_t completion_tokens_ = 0;
  bool finished_ = false;
  bool stopped_ = false;
  int attempts_ = 0;
  bool fell_back_ = false;  // Started again off a shared stream its worker does not serve.
  std::vector<std::shared_ptr<WorkerPool::Worker>> failed_;  // Decode workers that broke it.
  std::mutex mu_;
  Attempt* attempt_ = nullptr;        // Guarded by mu_.
  bool client_gone_ = false;          // Guarded by mu_.
  std::atomic<int> refs_{1};
};

void GenerateCall::OnAttemptDone(Attempt* attempt, const grpc::Status& status) {
  router_->Done(attempt->route());
  bool gone;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (attempt_ == attempt) attempt_ = nullptr;
    gone = client_gone_;
  }
  grpc::Status end = status;
  if (stopped_ || finished_) {
    end = grpc::Status::OK;  // Ended by a stop string, or the last message is out.
  } else if (!gone && attempt->shared() && status.error_code() == grpc::StatusCode::UNIMPLEMENTED &&
             !fell_back_ && std::chrono::system_clock::now() < routed_.deadline) {
    // A decode worker from before GenerateMany (a rolling upgrade): the pool no longer offers
    // its shared stream, so the request starts again on a stream of its own. Not a resumption.
    fell_back_ = true;
    RouteConstraints c;
    c.retry = true;
    c.local_prefill = !generated_.empty();
    c.lora_name = routed_.params.lora_name;
    for (const auto& w : failed_) c.exclude_decode.push_back(w.get());
    if (auto route = router_->RouteRequest(routed_.prompt, c); route.ok()) {
      StartAttempt(std::move(*route));
      Unref();
      return;
    }
    end = grpc::Status(grpc::StatusCode::UNAVAILABLE, "no decode worker is available");
  } else if (!gone && Resumable(status) && attempts_ <= router_->options().max_resumes &&
             std::chrono::system_clock::now() < routed_.deadline) {
    failed_.push_back(attempt->route().decode.worker);
    RouteConstraints c;
    for (const auto& w : failed_) c.exclude_decode.push_back(w.get());
    c.retry = true;
    c.local_prefill = !generated_.empty();
    c.lora_name = routed_.params.lora_name;
    auto route = router_->RouteRequest(routed_.prompt, c);
    if (route.ok()) {
      PD_LOG(Warning) << "request " << routed_.request_id << ": decode stream broke after "
                      << generated_.size() << " tokens (" << status.error_message()
                      << "); continuing on " << WorkerPool::Address(*route->decode.worker);
      router_->metrics().Resumed();
      StartAttempt(std::move(*route));
      Unref();  // The ended attempt's reference.
      return;
    }
    if (status.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED) {
      end = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                         Str("the decode worker failed (", status.error_message(),
                             ") and no other decode worker is available"));
    }
  } else if (status.ok()) {
    end = grpc::Status(grpc::StatusCode::INTERNAL, "decode worker ended the stream early");
  }
  // The slot is free before the client can see the end: a client that sends its next request
  // when this one's response is complete never finds the router still full of it.
  router_->metrics().Running(-1);
  router_->Release();
  End(end);
  Unref();
}

void Attempt::Ended(const grpc::Status& status) {
  if (!status.ok()) {
    span_.SetError(Str(absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code())),
                       ": ", status.error_message()));
  }
  span_.End();
  call_->OnAttemptDone(this, status);
}

void SharedDecodeAttempt::OnItem(const internal::v1::DecodeStreamItem& item) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (ended_) return;
    if (item.has_response()) call_->OnResponse(item.response());
    if (!item.end()) return;
    ended_ = true;
  }
  alarm_.Cancel();
  Ended(grpc::Status(static_cast<grpc::StatusCode>(item.status_code()), item.status_message()));
}

void DecodeAttempt::OnReadDone(bool ok) {
  if (!ok) return;  // The stream ended; OnDone follows.
  call_->OnResponse(response_);
  StartRead(&response_);
}

}  // namespace

grpc::ServerWriteReactor<grpc::ByteBuffer>* StartGenerateCall(Router* router,
                                                              grpc::CallbackServerContext* context,
                                                              const grpc::ByteBuffer& request) {
  return new GenerateCall(router, context, request);
}

}  // namespace pdserve
