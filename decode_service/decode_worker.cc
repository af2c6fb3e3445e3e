#include "decode_service/decode_worker.h"

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <chrono>

#include "common/base/file_util.h"
#include "common/base/log.h"
#include "common/base/status_macros.h"
#include "common/base/strings.h"
#include "common/kvevents/kv_event_publisher.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/grpc_workarounds.h"
#include "common/rpc/proto_convert.h"
#include "common/rpc/sampling_proto.h"
#include "common/rpc/server_builder.h"
#include "common/tracing/span.h"

namespace pdserve {

// A remote prefill in flight: the RPC's state lives here until its callback has run.
struct DecodeWorker::Remote {
  uint64_t tag = 0;
  std::vector<int32_t> prompt;  // To prefill here if the remote path fails.
  SamplingParams params;
  std::string prefill_address;
  bool tier_loading = false;  // The reservation is loading from the KV cache tiers: no call yet.
  std::chrono::steady_clock::time_point start, deadline;
  grpc::ClientContext context;
  internal::v1::PrefillRequest request;
  internal::v1::PrefillResponse response;
  grpc::Status rpc_status;
  bool replied = false;  // The RPC finished (set on the scheduler thread).
};

absl::StatusOr<std::unique_ptr<DecodeWorker>> DecodeWorker::Create(
    const DecodeWorkerOptions& options) {
  std::unique_ptr<DecodeWorker> w(new DecodeWorker(options));
  w->mailbox_->worker = w.get();
  PD_ASSIGN_OR_RETURN(w->core_, WorkerCore::Create(options.model_dir, options.engine,
                                                   options.transport, options.transport_options));
  w->engine_ = w->core_.engine.get();
  w->transport_ = w->core_.transport.get();
  w->metrics_ = std::make_unique<WorkerMetrics>(options.metrics, options.served_model_name.empty() ? BaseName(options.model_dir) : options.served_model_name,
                                                "decode", [raw = w.get()] { return raw->Info(); });
  w->PublishInfo();
  w->thread_ = std::thread([raw = w.get()] { raw->Loop(); });
  return w;
}

DecodeWorker::~DecodeWorker() {
  {
    std::lock_guard<std::mutex> lock(mailbox_->mu);
    mailbox_->worker = nullptr;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  commands_.Stop();
  if (thread_.joinable()) thread_.join();
}

void DecodeWorker::Submit(DecodeJob job, std::shared_ptr<DecodeSink> sink) {
  bool refuse;
  {
    std::lock_guard<std::mutex> lock(mu_);
    refuse = draining_ || stop_;
  }
  if (refuse) {  // Outside the lock: a sink may call back into this worker.
    sink->OnError(absl::UnavailableError("decode worker is shutting down"));
    return;
  }
  Post([this, job = std::move(job), sink = std::move(sink)]() mutable {
    Start(std::move(job), std::move(sink));
  });
}

void DecodeWorker::Cancel(const std::string& request_id) {
  Post([this, request_id] {
    auto it = active_.find(request_id);
    if (it == active_.end()) return;
    it->second.span.AddEvent("cancelled");
    std::vector<RequestOutput> aborted;
    if (it->second.remote && !it->second.remote->tier_loading) {
      it->second.remote->context.TryCancel();
      DropReservation(request_id, it->second.remote->tag, &aborted);
    } else {  // Running, queued, or its reservation loading from the tiers (the engine holds it).
      engine_->Abort(request_id, &aborted);
    }
    for (const RequestOutput& out : aborted) metrics_->Observe(out);
    active_.erase(it);
  });
}

internal::v1::WorkerInfo DecodeWorker::Info() {
  std::lock_guard<std::mutex> lock(mu_);
  return info_;
}

void DecodeWorker::Drain(absl::Duration timeout) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    draining_ = true;
  }
  publisher_.Shutdown();
  const auto deadline = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(timeout);
  while (std::chrono::steady_clock::now() < deadline) {
    if (Info().running() + Info().waiting() == 0) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  Post([this] {
    for (auto& [id, active] : active_) {
      if (active.remote) active.remote->context.TryCancel();
      std::vector<RequestOutput> aborted;
      engine_->Abort(id, &aborted);
      for (const RequestOutput& out : aborted) metrics_->Observe(out);
      active.sink->OnError(absl::UnavailableError("decode worker shut down"));
    }
    active_.clear();
  });
}

void DecodeWorker::Start(DecodeJob job, std::shared_ptr<DecodeSink> sink) {
  const std::string id = job.request_id;
  if (active_.contains(id)) {
    sink->OnError(absl::AlreadyExistsError(Str("request_id '", id, "' is already running")));
    return;
  }
  if (options_.max_waiting > 0) {
    int64_t waiting = engine_->Stats().waiting;
    for (const auto& [other, a] : active_) waiting += a.remote != nullptr;
    if (waiting >= options_.max_waiting) {
      sink->OnError(absl::ResourceExhaustedError(
          Str("decode worker is full: ", waiting, " requests waiting (--max-waiting ",
              options_.max_waiting, "); retry later")));
      return;
    }
  }
  Active& active = active_[id];
  active.sink = std::move(sink);
  active.span = Span::FromHeaders(options_.tracer, "pdserve.decode", SpanKind::kServer,
                                  job.traceparent, job.tracestate);
  if (active.span.recording()) {
    active.span.Set("pdserve.role", "decode");
    active.span.Set("pdserve.request_id", id);
    active.span.Set("gen_ai.usage.input_tokens", static_cast<int64_t>(job.prompt.size()));
    active.span.Set("pdserve.resumed_tokens", static_cast<int64_t>(job.resume.size()));
  }
  // Conditional disaggregation: a prompt whose part this pool has not cached is short is cheaper
  // to prefill here than to send across.
  if (!job.prefill_address.empty() && job.resume.empty() &&
      static_cast<int64_t>(job.prompt.size()) - engine_->CachedPrefixTokens(job.prompt, job.params.lora_name) >
          options_.local_prefill_tokens) {
    StartRemote(std::move(job), active);
    return;
  }
  RequestOptions options;
  options.resume_output = std::move(job.resume);
  active.phase = active.span.Child("pdserve.decode.prefill");
  if (absl::Status s = engine_->AddRequest(id, std::move(job.prompt), job.params, options); !s.ok()) {
    active.span.SetError(std::string(s.message()));
    active.sink->OnError(s);
    active_.erase(id);
    return;
  }
  ++local_prefills_;
}

void DecodeWorker::StartRemote(DecodeJob job, Active& active) {
  const std::string id = job.request_id;
  // A reservation holds its blocks until the pages arrive, and cannot be preempted meanwhile:
  // keep a block per running sequence free so they can grow, else queue the request here.
  Span reserve = active.span.Child("pdserve.decode.reserve");
  const EngineStats stats = engine_->Stats();
  const int64_t bs = engine_->kv_spec().block_size;
  const int64_t needed = (static_cast<int64_t>(job.prompt.size()) + bs - 1) / bs;
  absl::StatusOr<RemotePrefillPlan> plan =
      stats.kv.free_blocks + stats.kv.cached_blocks - needed < stats.running
          ? absl::StatusOr<RemotePrefillPlan>(absl::ResourceExhaustedError("pool is busy"))
          : engine_->ReserveForRemotePrefill(id, job.prompt, job.params);
  if (!plan.ok()) {
    reserve.SetError(std::string(plan.status().message()));
    reserve.End();
    if (plan.status().code() == absl::StatusCode::kResourceExhausted) {
      // No room to reserve now: queue it here; the scheduler admits it when blocks free up.
      active.phase = active.span.Child("pdserve.decode.prefill");
      if (absl::Status s = engine_->AddRequest(id, std::move(job.prompt), job.params); !s.ok()) {
        active.sink->OnError(s);
        active_.erase(id);
      } else {
        ++local_prefills_;
      }
      return;
    }
    active.sink->OnError(plan.status());
    active_.erase(id);
    return;
  }
  if (reserve.recording()) {
    reserve.Set("pdserve.cached_tokens", static_cast<int64_t>(plan->cached_tokens));
    reserve.Set("pdserve.reserved_blocks", static_cast<int64_t>(plan->blocks.size()) - plan->cached_tokens / bs);
    reserve.Set("pdserve.tier_loading", plan->tier_loading);
  }
  reserve.End();
  auto remote = std::make_shared<Remote>();
  remote->tag = next_tag_++;
  remote->prompt = std::move(job.prompt);
  remote->params = job.params;
  remote->prefill_address = job.prefill_address;
  remote->start = std::chrono::steady_clock::now();
  active.remote = remote;
  if (plan->tier_loading) {
    // The pool's prefix, then the tiers': the prefill worker is asked for the rest once loaded.
    remote->tier_loading = true;
    active.phase = active.span.Child("pdserve.decode.tier_load");
    return;
  }
  SendPrefill(id, active, plan->cached_tokens);
}

void DecodeWorker::SendLoadedReservations() {
  loaded_.clear();
  engine_->TakeTierReservations(&loaded_);
  for (const TierReservation& r : loaded_) {
    auto it = active_.find(r.request_id);
    if (it == active_.end() || !it->second.remote || !it->second.remote->tier_loading) continue;
    it->second.remote->tier_loading = false;
    if (it->second.phase.recording()) it->second.phase.Set("pdserve.cached_tokens", r.cached_tokens);
    it->second.phase.End();
    SendPrefill(r.request_id, it->second, r.cached_tokens);
  }
}

void DecodeWorker::SendPrefill(const std::string& id, Active& active, int64_t cached_tokens) {
  const std::shared_ptr<Remote>& remote = active.remote;
  const KvCacheSpec& spec = engine_->kv_spec();
  KvPool& pool = engine_->kv_pool();
  const int64_t first_block = cached_tokens / spec.block_size;
  const absl::Span<const BlockId> blocks = engine_->BlockTable(id);
  const SamplingParams& params = remote->params;
  std::vector<ByteRange> ranges;
  remote->deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.lease_ms);
  internal::v1::PrefillRequest& r = remote->request;
  r.set_request_id(id);
  r.mutable_prompt_ids()->Assign(remote->prompt.begin(), remote->prompt.end());
  r.set_seed(*params.seed);
  v1::SamplingParams* sp = r.mutable_sampling();
  sp->set_temperature(params.temperature);
  sp->set_top_p(params.top_p);
  sp->set_top_k(params.top_k);
  sp->set_min_p(params.min_p);
  sp->set_repetition_penalty(params.repetition_penalty);
  sp->set_frequency_penalty(params.frequency_penalty);
  sp->set_presence_penalty(params.presence_penalty);
  sp->set_logprobs(params.logprobs);
  if (params.constraint != nullptr) ToProto(*params.constraint, sp->mutable_constraint());
  sp->set_lora_name(params.lora_name);
  *r.mutable_layout() = core_.layout;
  r.set_transport_endpoint(transport_->endpoint());
  r.set_transfer_tag(remote->tag);
  r.set_first_block(static_cast<int32_t>(first_block));
  r.set_dst_pool_blocks(pool.num_blocks());
  for (size_t b = static_cast<size_t>(first_block); b < blocks.size(); ++b) {
    r.add_dst_blocks(blocks[b]);
    for (int64_t layer = 0; layer < spec.num_layers; ++layer) {
      const uint64_t off = pool.PageOffset(layer, blocks[b]);
      ranges.push_back({off, off + spec.PageBytes()});
    }
  }
  if (absl::Status s = transport_->Expect(remote->tag, std::move(ranges)); !s.ok()) {
    engine_->Abort(id, nullptr);
    active.sink->OnError(s);
    active_.erase(id);
    return;
  }
  remote->context.set_deadline(std::chrono::system_clock::now() +
                               std::chrono::milliseconds(options_.lease_ms));
  // From the Prefill call to the pages checked: the prefill worker's spans are its children.
  active.phase = active.span.Child("pdserve.decode.remote_prefill", SpanKind::kClient);
  if (active.phase.context().valid()) {
    remote->context.AddMetadata("traceparent", active.phase.traceparent());
    if (!active.phase.context().tracestate.empty()) {
      remote->context.AddMetadata("tracestate", active.phase.context().tracestate);
    }
  }
  if (active.phase.recording()) {
    active.phase.Set("pdserve.prefill_worker", remote->prefill_address);
    active.phase.Set("pdserve.transport", transport_->endpoint());
  }
  internal::v1::PrefillWorker::Stub* stub = PrefillStub(remote->prefill_address);
  stub->async()->Prefill(&remote->context, &remote->request, &remote->response,
                         [this, id, remote](grpc::Status status) {
                           remote->rpc_status = std::move(status);
                           Post([this, id, remote] { OnPrefillReply(id, remote); });
                         });
  ++remote_prefills_;
}

internal::v1::PrefillWorker::Stub* DecodeWorker::PrefillStub(const std::string& address) {
  auto it = stubs_.find(address);
  if (it != stubs_.end()) return it->second.get();
  PinGrpcCallbackQueue();
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  auto channel = grpc::CreateCustomChannel(
      address,
      options_.prefill_credentials ? options_.prefill_credentials : grpc::InsecureChannelCredentials(),
      args);
  auto stub = internal::v1::PrefillWorker::NewStub(channel);
  return stubs_.emplace(address, std::move(stub)).first->second.get();
}

void DecodeWorker::OnPrefillReply(const std::string& request_id,
                                  const std::shared_ptr<Remote>& remote) {
  auto it = active_.find(request_id);
  if (it == active_.end() || it->second.remote != remote) return;  // Cancelled meanwhile.
  remote->replied = true;
  if (!remote->rpc_status.ok()) {
    // The RPC's deadline is the lease.
    FallBackToLocal(request_id, FromGrpcStatus(remote->rpc_status),
                    remote->rpc_status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED
                        ? "lease_expired"
                        : "prefill_rpc_error");
    return;
  }
  CheckRemotes();
}

void DecodeWorker::CheckRemotes() {
  const auto now = std::chrono::steady_clock::now();
  struct Failed {
    std::string id;
    absl::Status why;
    const char* reason;
  };
  std::vector<Failed> failed;
  std::vector<std::string> ready;
  for (auto& [id, active] : active_) {
    const std::shared_ptr<Remote>& remote = active.remote;
    if (!remote || remote->tier_loading) continue;
    const TransferPoll poll = transport_->Poll(remote->tag);
    if (poll.state == TransferState::kFailed) {
      failed.push_back({id, poll.status,
                        poll.status.code() == absl::StatusCode::kDataLoss ? "checksum_mismatch"
                                                                          : "transport_error"});
    } else if (remote->replied && poll.state == TransferState::kDone) {
      const internal::v1::TransferSummary& sent = remote->response.transfer();
      if (sent.pages() != poll.stats.pages || sent.bytes() != poll.stats.bytes ||
          sent.checksum() != poll.stats.checksum) {
        failed.push_back({id,
                          absl::DataLossError("transfer summary does not match the pages received"),
                          "summary_mismatch"});
      } else {
        ready.push_back(id);
      }
    } else if (now > remote->deadline) {
      failed.push_back({id, absl::DeadlineExceededError("remote prefill lease expired"),
                        "lease_expired"});
    }
  }
  for (const Failed& f : failed) FallBackToLocal(f.id, f.why, f.reason);
  for (const std::string& id : ready) {
    Active& active = active_[id];
    std::shared_ptr<Remote> remote = std::move(active.remote);
    Span verify = active.span.Child("pdserve.decode.verify");
    const TransferPoll poll = transport_->Poll(remote->tag);
    transport_->Release(remote->tag);
    if (active.phase.recording()) {
      active.phase.Set("pdserve.transfer_pages", static_cast<int64_t>(poll.stats.pages));
      active.phase.Set("pdserve.transfer_bytes", static_cast<int64_t>(poll.stats.bytes));
      active.phase.Set("pdserve.prefill_cached_tokens",
                       static_cast<int64_t>(remote->response.cached_tokens()));
    }
    active.phase.End();
    ++transfers_.completed;
    transfers_.pages += poll.stats.pages;
    transfers_.bytes += poll.stats.bytes;
    metrics_->TransferDone(std::chrono::duration<double>(now - remote->start).count());
    const internal::v1::PrefillResponse& p = remote->response;
    SampledToken first;
    first.token = p.first_token();
    first.logprob = p.logprob();
    for (const auto& top : p.top_logprobs().top()) {
      first.top_logprobs.emplace_back(top.token_id(), top.logprob());
    }
    absl::Status completed = engine_->CompleteRemotePrefill(id, first, p.cached_tokens(), &outputs_);
    if (!completed.ok()) verify.SetError(std::string(completed.message()));
    verify.End();
    if (!completed.ok()) FallBackToLocal(id, completed, "bad_first_token");
  }
}

void DecodeWorker::FallBackToLocal(const std::string& request_id, const absl::Status& why,
                                   const std::string& reason) {
  auto it = active_.find(request_id);
  if (it == active_.end()) return;
  std::shared_ptr<Remote> remote = std::move(it->second.remote);
  ++transfers_.failures;
  metrics_->TransferFailed(reason);
  PD_LOG(Warning) << "request " << request_id << ": remote prefill failed (" << why
                  << "); prefilling locally";
  it->second.phase.SetError(Str(reason, ": ", why.message()));
  it->second.phase = it->second.span.Child("pdserve.decode.prefill");
  it->second.phase.Set("pdserve.fallback", reason);
  remote->context.TryCancel();
  DropReservation(request_id, remote->tag, nullptr);
  if (absl::Status s = engine_->AddRequest(request_id, remote->prompt, remote->params); !s.ok()) {
    it->second.sink->OnError(s);
    active_.erase(it);
    return;
  }
  ++local_prefills_;
}

void DecodeWorker::DropReservation(const std::string& request_id, uint64_t tag,
                                   std::vector<RequestOutput>* outputs) {
  auto kept = std::make_shared<std::string>();
  std::weak_ptr<Mailbox> mailbox = mailbox_;
  const bool quiescent = transport_->ReleaseUnfinished(tag, [mailbox, kept] {
    // On a transport thread: hand the blocks back on the scheduler thread (after this function
    // returned there, so *kept is set).
    auto box = mailbox.lock();
    if (!box) return;
    std::lock_guard<std::mutex> lock(box->mu);
    if (box->worker == nullptr) return;
    DecodeWorker* w = box->worker;
    w->Post([w, kept] {
      w->engine_->ReleaseHeld(*kept);
      --w->quarantined_;
      if (w->metrics_ != nullptr) w->metrics_->QuarantineReleased();
    });
  });
  if (quiescent) {
    engine_->Abort(request_id, outputs);  // Frees the reservation.
    return;
  }
  *kept = engine_->AbortKeepingBlocks(request_id, outputs);
  ++quarantined_;
  PD_LOG(Debug) << "request " << request_id << ": reservation kept until transfer " << tag
                << " is quiescent";
}

void DecodeWorker::Trace(Active& active, const RequestOutput& out) {
  if (!active.span.recording()) return;
  if (active.tokens == 0 && !out.tokens.empty()) {
    // The first token: prefill (or the remote prefill's verification) is over.
    active.phase.End();
    active.phase = active.span.Child("pdserve.decode.generate");
    active.span.AddEvent("first_token");
  }
  // An event per kTraceTokens tokens, not a span per token.
  constexpr int64_t kTraceTokens = 16;
  const int64_t before = active.tokens;
  active.tokens += static_cast<int64_t>(out.tokens.size());
  if (active.tokens / kTraceTokens > before / kTraceTokens) {
    active.phase.AddEvent("tokens", {{"gen_ai.usage.output_tokens", active.tokens}});
  }
  if (out.finished) {
    active.phase.Set("gen_ai.usage.output_tokens", active.tokens);
    active.span.Set("gen_ai.usage.output_tokens", static_cast<int64_t>(out.completion_tokens));
    active.span.Set("gen_ai.response.finish_reasons", std::vector<std::string>{out.finish_reason});
    active.span.Set("pdserve.cached_tokens", static_cast<int64_t>(out.cached_tokens));
    // Before the last message goes out: the router's attempt span, which ends when the stream
    // does, then holds this one.
    active.phase.End();
    active.span.End();
  }
}

void DecodeWorker::Dispatch(std::vector<RequestOutput>& outputs) {
  for (RequestOutput& out : outputs) {
    auto it = active_.find(out.request_id);
    if (it == active_.end()) continue;
    metrics_->Observe(out);
    Trace(it->second, out);
    it->second.sink->OnOutput(out);
    if (flush_.empty() || flush_.back() != it->second.sink) flush_.push_back(it->second.sink);
    if (out.finished) active_.erase(it);
  }
  outputs.clear();
  for (const std::shared_ptr<DecodeSink>& sink : flush_) sink->Flush();
  flush_.clear();
}

void DecodeWorker::RefreshInfo(std::chrono::milliseconds timeout) {
  commands_.Run([this] { PublishInfo(); }, timeout);
}

void DecodeWorker::PublishInfo() {
  int64_t remote_pending = 0;
  for (const auto& [id, a] : active_) remote_pending += a.remote != nullptr;
  internal::v1::WorkerInfo info = MakeWorkerInfo("decode", core_, transfers_, remote_pending);
  metrics_->SetReservations(remote_pending);
  info.set_remote_prefills(remote_prefills_);
  info.set_local_prefills(local_prefills_);
  events_.clear();
  engine_->DrainKvEvents(&events_);
  publisher_.Publish(info, events_);
  if (options_.kv_events != nullptr) options_.kv_events->Publish(events_);
  std::lock_guard<std::mutex> lock(mu_);
  info_ = std::move(info);
}

void DecodeWorker::Loop() {
  for (;;) {
    bool remotes = false;
    for (const auto& [id, a] : active_) remotes |= a.remote != nullptr;
    // Poll every millisecond while pages are on their way, every 20 while the KV cache tiers'
    // stores have events to publish; otherwise sleep until a command.
    bool stopped = false;
    auto commands = commands_.Take(engine_->HasScheduledWork(),
                                   std::chrono::milliseconds(remotes ? 1 : engine_->TierEventsPending() ? 20 : 0),
                                   &stopped);
    if (stopped) return;
    for (auto& c : commands) c();
    CheckRemotes();
    // A remote prefill's first token (and what the commands produced) goes out now, not after
    // the next step: that would add a whole decode step to the request's TTFT.
    Dispatch(outputs_);
    if (engine_->HasScheduledWork()) {
      if (absl::Status s = engine_->Step(&outputs_); !s.ok()) {
        PD_LOG(Error) << "decode step failed: " << s;
      }
      SendLoadedReservations();
    }
    Dispatch(outputs_);
    PublishInfo();
  }
}

}  // namespace pdserve
