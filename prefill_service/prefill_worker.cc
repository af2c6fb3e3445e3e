#include "prefill_service/prefill_worker.h"

#include "common/base/file_util.h"
#include "common/base/log.h"
#include "common/base/status_macros.h"
#include "common/base/strings.h"
#include "common/kvevents/kv_event_publisher.h"
#include "common/rpc/proto_convert.h"
#include "common/transport/layout_check.h"

namespace pdserve {

absl::StatusOr<std::unique_ptr<PrefillWorker>> PrefillWorker::Create(
    const PrefillWorkerOptions& options) {
  std::unique_ptr<PrefillWorker> w(new PrefillWorker(options));
  PD_ASSIGN_OR_RETURN(w->core_, WorkerCore::Create(options.model_dir, options.engine,
                                                   options.transport, options.transport_options));
  w->engine_ = w->core_.engine.get();
  w->transport_ = w->core_.transport.get();
  w->metrics_ = std::make_unique<WorkerMetrics>(options.metrics, options.served_model_name.empty() ? BaseName(options.model_dir) : options.served_model_name,
                                                "prefill", [raw = w.get()] { return raw->Info(); });
  w->engine_->SetLayerObserver(
      [raw = w.get()](int64_t layer, const SchedulerOutput& schedule) { raw->OnLayer(layer, schedule); });
  w->PublishInfo();
  w->thread_ = std::thread([raw = w.get()] { raw->Loop(); });
  return w;
}

PrefillWorker::~PrefillWorker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  commands_.Stop();
  if (thread_.joinable()) thread_.join();
}

uint64_t PrefillWorker::Submit(const internal::v1::PrefillRequest& request, Done done,
                               std::string traceparent, std::string tracestate) {
  const uint64_t ticket = next_ticket_.fetch_add(1);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (draining_ || stop_) {
      done(absl::UnavailableError("prefill worker is shutting down"));
      return ticket;
    }
    ++in_flight_;
  }
  Span span = Span::FromHeaders(options_.tracer, "pdserve.prefill", SpanKind::kServer, traceparent,
                                tracestate);
  if (span.recording()) {
    span.Set("pdserve.role", "prefill");
    span.Set("pdserve.request_id", request.request_id());
    span.Set("gen_ai.usage.input_tokens", static_cast<int64_t>(request.prompt_ids_size()));
    span.Set("pdserve.transfer_tag", static_cast<int64_t>(request.transfer_tag()));
  }
  auto held = std::make_shared<Span>(std::move(span));  // Commands are copyable; a Span is not.
  Post([this, request, ticket, done = std::move(done), held]() mutable {
    Start(request, std::move(done), ticket, std::move(*held));
  });
  return ticket;
}

void PrefillWorker::Cancel(uint64_t ticket) {
  Post([this, ticket] {
    auto t = tickets_.find(ticket);
    if (t == tickets_.end()) return;  // Answered, or already sending its pages.
    auto it = jobs_.find(t->second);
    if (it == jobs_.end()) return;
    const int64_t first = it->second.request.first_block();
    for (int64_t sent : it->second.sent_upto) {
      if (sent > first) return;  // Pages are queued on the transport: let it finish.
    }
    Job job = std::move(it->second);
    jobs_.erase(it);
    tickets_.erase(t);
    job.span.AddEvent("cancelled");
    std::vector<RequestOutput> aborted;
    engine_->Abort(job.engine_id, &aborted);  // Frees its blocks.
    for (const RequestOutput& out : aborted) metrics_->Observe(out);
    {
      std::lock_guard<std::mutex> lock(mu_);
      --in_flight_;
    }
    job.done(absl::CancelledError("prefill cancelled by its caller"));
  });
}

internal::v1::WorkerInfo PrefillWorker::Info() {
  std::lock_guard<std::mutex> lock(mu_);
  return info_;
}

void PrefillWorker::Drain(absl::Duration timeout) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    draining_ = true;
  }
  publisher_.Shutdown();
  const auto deadline = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(timeout);
  while (std::chrono::steady_clock::now() < deadline) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (in_flight_ == 0) return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void PrefillWorker::Start(const internal::v1::PrefillRequest& request, Done done,
                          uint64_t ticket, Span span) {
  auto fail = [&](const absl::Status& s) {
    span.SetError(std::string(s.message()));
    {
      std::lock_guard<std::mutex> lock(mu_);
      --in_flight_;
    }
    done(s);
  };
  if (absl::Status s = CheckLayouts(core_.layout_string, LayoutString(request.layout())); !s.ok()) {
    return fail(s);
  }
  const KvCacheSpec& spec = engine_->kv_spec();
  const int64_t blocks = (request.prompt_ids_size() + spec.block_size - 1) / spec.block_size;
  if (request.first_block() < 0 || request.first_block() >= blocks ||
      request.dst_blocks_size() != blocks - request.first_block() ||
      request.dst_pool_blocks() <= 0) {
    return fail(absl::InvalidArgumentError(Str(
        "prefill request '", request.request_id(), "': ", request.dst_blocks_size(),
        " destination blocks from block ", request.first_block(), " do not cover a ",
        request.prompt_ids_size(), "-token prompt of ", blocks, " blocks")));
  }
  for (int32_t b : request.dst_blocks()) {
    if (b < 0 || b >= request.dst_pool_blocks()) {
      return fail(absl::InvalidArgumentError(Str("destination block ", b, " is outside the ",
                                                 request.dst_pool_blocks(), "-block pool")));
    }
  }
  Job job;
  job.ticket = ticket;
  job.request = request;
  job.done = std::move(done);
  job.engine_id = Str(request.request_id(), "#", next_job_++);
  job.sent_upto.assign(spec.num_layers, request.first_block());
  job.start = std::chrono::steady_clock::now();
  job.span = std::move(span);
  job.phase = job.span.Child("pdserve.prefill.queue");  // Until its first chunk is computed.
  SamplingParams params = FromProto(request.sampling(), request.seed());
  params.max_tokens = 1;  // The decode worker samples the rest.
  params.ignore_eos = true;
  params.stop_token_ids.clear();
  std::vector<int32_t> prompt(request.prompt_ids().begin(), request.prompt_ids().end());
  RequestOptions hold;
  hold.hold_blocks_after_finish = true;  // Until every page is sent.
  if (absl::Status s = engine_->AddRequest(job.engine_id, std::move(prompt), params, hold);
      !s.ok()) {
    span = std::move(job.span);
    return fail(s);
  }
  tickets_[ticket] = job.engine_id;
  jobs_.emplace(job.engine_id, std::move(job));
}

// Runs inside Step, after `layer`'s KV of the whole batch is stored: send every page of that
// layer whose block is now final (all its tokens computed, or the prompt's last block once the
// prompt is done), from the first block the decode worker lacks.
void PrefillWorker::OnLayer(int64_t layer, const SchedulerOutput& schedule) {
  const KvCacheSpec& spec = engine_->kv_spec();
  KvPool& pool = engine_->kv_pool();
  std::vector<PageCopy> pages;
  for (const ScheduledChunk& chunk : schedule.chunks) {
    auto it = jobs_.find(chunk.seq->request_id);
    if (it == jobs_.end()) continue;
    Job& job = it->second;
    if (layer == 0 && job.span.recording()) {
      if (!job.computing) {
        job.computing = true;
        job.phase.End();  // The queue: its first chunk is being computed.
        job.phase = job.span.Child("pdserve.prefill.compute");
      }
      job.chunk = job.phase.Child("pdserve.prefill.chunk");
      job.chunk.Set("pdserve.chunk_tokens", static_cast<int64_t>(chunk.num_tokens));
      job.chunk.Set("pdserve.chunk_start", static_cast<int64_t>(chunk.seq->num_computed));
    }
    if (!job.error.ok()) continue;
    const int64_t total = job.request.prompt_ids_size();
    const int64_t computed = chunk.seq->num_computed + chunk.num_tokens;
    const int64_t final_blocks = computed >= total ? (total + spec.block_size - 1) / spec.block_size
                                                   : computed / spec.block_size;
    const auto table = engine_->BlockTable(job.engine_id);
    pages.clear();
    for (int64_t b = job.sent_upto[layer]; b < final_blocks; ++b) {
      const int64_t dst_block = job.request.dst_blocks(static_cast<int>(b - job.request.first_block()));
      pages.push_back(PageCopy{
          pool.PageOffset(layer, table[b]),
          static_cast<uint64_t>(layer * job.request.dst_pool_blocks() + dst_block) * spec.PageBytes(),
          spec.PageBytes()});
    }
    if (pages.empty()) continue;
    job.sent_upto[layer] = final_blocks;
    if (absl::Status s = transport_->Submit(job.request.transport_endpoint(),
                                            job.request.transfer_tag(), pages);
        !s.ok()) {
      job.error = s;
    }
  }
}

void PrefillWorker::Complete(const RequestOutput& output) {
  auto it = jobs_.find(output.request_id);
  if (it == jobs_.end()) return;
  Job job = std::move(it->second);
  jobs_.erase(it);
  tickets_.erase(job.ticket);
  job.chunk.End();
  job.phase.End();
  auto finish = [this](Done& done, absl::StatusOr<internal::v1::PrefillResponse> r) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      --in_flight_;
    }
    done(std::move(r));
  };
  if (!job.error.ok() || output.tokens.empty()) {
    transport_->Abort(job.request.transport_endpoint(), job.request.transfer_tag());
    engine_->ReleaseHeld(job.engine_id);
    ++transfers_.failures;
    metrics_->TransferFailed(job.error.ok() ? "no_token" : "send_error");
    job.span.SetError(job.error.ok() ? "prefill produced no token" : std::string(job.error.message()));
    finish(job.done, job.error.ok() ? absl::InternalError("prefill produced no token") : job.error);
    return;
  }
  job.span.Set("pdserve.cached_tokens", static_cast<int64_t>(output.cached_tokens));
  // Until the transport has sent every page (the pages of earlier layers went during compute).
  job.phase = job.span.Child("pdserve.prefill.transfer", SpanKind::kProducer);
  job.phase.Set("pdserve.transport", job.request.transport_endpoint());
  internal::v1::PrefillResponse response;
  response.set_first_token(output.tokens[0].token);
  response.set_logprob(output.tokens[0].logprob);
  FillTopLogprobs(output.tokens[0], response.mutable_top_logprobs());
  response.set_cached_tokens(static_cast<int32_t>(output.cached_tokens));
  const std::string engine_id = job.engine_id;
  const auto start = job.start;
  auto shared = std::make_shared<Job>(std::move(job));
  // The blocks stay held until the transport has sent every page.
  transport_->Finish(
      shared->request.transport_endpoint(), shared->request.transfer_tag(),
      [this, shared, response, engine_id, start, finish](absl::StatusOr<TransferStats> sent) mutable {
        Post([this, shared, response, engine_id, start, sent = std::move(sent), finish]() mutable {
          engine_->ReleaseHeld(engine_id);
          if (!sent.ok()) {
            ++transfers_.failures;
            metrics_->TransferFailed("send_error");
            shared->phase.SetError(std::string(sent.status().message()));
            shared->span.SetError(std::string(sent.status().message()));
            finish(shared->done, sent.status());
            return;
          }
          if (shared->phase.recording()) {
            shared->phase.Set("pdserve.transfer_pages", static_cast<int64_t>(sent->pages));
            shared->phase.Set("pdserve.transfer_bytes", static_cast<int64_t>(sent->bytes));
          }
          shared->phase.End();
          shared->span.End();
          ++transfers_.completed;
          transfers_.pages += sent->pages;
          transfers_.bytes += sent->bytes;
          const double seconds =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          metrics_->TransferDone(seconds);
          internal::v1::TransferSummary* t = response.mutable_transfer();
          t->set_pages(sent->pages);
          t->set_bytes(sent->bytes);
          t->set_checksum(sent->checksum);
          t->set_seconds(seconds);
          finish(shared->done, std::move(response));
        });
      });
}

void PrefillWorker::RefreshInfo(std::chrono::milliseconds timeout) {
  commands_.Run([this] { PublishInfo(); }, timeout);
}

void PrefillWorker::PublishInfo() {
  internal::v1::WorkerInfo info = MakeWorkerInfo("prefill", core_, transfers_, 0);
  events_.clear();
  engine_->DrainKvEvents(&events_);
  publisher_.Publish(info, events_);
  if (options_.kv_events != nullptr) options_.kv_events->Publish(events_);
  std::lock_guard<std::mutex> lock(mu_);
  info_ = std::move(info);
}

void PrefillWorker::Loop() {
  for (;;) {
    bool stopped = false;
    // Asleep until a command, or every 20 ms while the KV cache tiers' stores have events to publish.
    auto commands = commands_.Take(engine_->HasScheduledWork(),
                                   std::chrono::milliseconds(engine_->TierEventsPending() ? 20 : 0), &stopped);
    if (stopped) return;
    for (auto& c : commands) c();
    if (engine_->HasScheduledWork()) {
      if (absl::Status s = engine_->Step(&outputs_); !s.ok()) {
        PD_LOG(Error) << "prefill step failed: " << s;
      }
      for (auto& [id, job] : jobs_) job.chunk.End();  // This step's chunks are computed.
      for (const RequestOutput& out : outputs_) {
        metrics_->Observe(out);
        if (out.finished) Complete(out);
      }
      outputs_.clear();
    }
    PublishInfo();
  }
}

}  // namespace pdserve
