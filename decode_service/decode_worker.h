// The decode tier's handler: owns the KV pool (through an LLMEngine), reserves blocks for
// prompts a prefill worker computes, runs continuous batching and hands tokens to per-request
// sinks. Speaks absl::Status; decode_grpc_service.h is the thin gRPC layer over it.
//
// Life of a request: a short prompt, or one without a prefill worker, is prefilled here. Otherwise
// the worker reserves the prompt's blocks (reusing its own cached prefix), announces the transfer
// to its KV transport, and asks the prefill worker to write the missing pages into those blocks.
// When the prefill worker answers and every page has arrived with a matching checksum, the
// sequence joins the running batch with the first token the prefill worker sampled. A failed,
// corrupted or late transfer frees the reservation and the prompt is prefilled here instead: the
// request still completes.
//
// Threading: one scheduler thread owns the engine and all request state; public methods post to it
// and are thread-safe. Sinks are called on the scheduler thread.
#ifndef PDSERVE_DECODE_SERVICE_DECODE_WORKER_H_
#define PDSERVE_DECODE_SERVICE_DECODE_WORKER_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/engine/llm_engine.h"
#include "common/metrics/metrics.h"
#include "common/rpc/load_publisher.h"
#include "common/rpc/worker_core.h"
#include "common/rpc/worker_metrics.h"
#include "common/tracing/span.h"
#include <grpcpp/security/credentials.h>

#include "pdserve/internal/v1/worker.grpc.pb.h"

namespace pdserve {

class KvEventPublisher;
class Tracer;

struct DecodeWorkerOptions {
  std::string model_dir;
  std::string served_model_name;  // The metrics' model_name (empty: the model directory's name).
  EngineOptions engine;
  std::string transport = "tcp";
  // Listen and advertised addresses, TLS and send timeout of the KV transport (the layout is
  // filled in from the engine).
  KvTransportOptions transport_options;
  // Prompts of at most this many tokens are prefilled here even when a prefill worker is given.
  int64_t local_prefill_tokens = 32;
  // How long a remote prefill may take, RPC and pages included, before the reservation is
  // dropped and the prompt prefilled here.
  int64_t lease_ms = 60000;
  // Backpressure: a request that finds this many waiting (queued, or awaiting a remote prefill)
  // is refused with ResourceExhausted instead of queueing without limit. 0: no limit.
  int64_t max_waiting = 512;
  // Where the worker's metrics go (role "decode"); null: a registry of its own, not exported.
  metrics::Registry* metrics = nullptr;
  // Calls to prefill workers (mutual TLS); null: insecure.
  std::shared_ptr<grpc::ChannelCredentials> prefill_credentials;
  // Publishes the prefix cache's events in vLLM's format too (--kv-events-publisher); not owned,
  // outlives the worker; null: off.
  KvEventPublisher* kv_events = nullptr;
  Tracer* tracer = nullptr;  // Each request's spans (not owned); null: no tracing.
};

// Receives one request's outputs, on the worker's scheduler thread.
class DecodeSink {
 public:
  virtual ~DecodeSink() = default;
  virtual void OnOutput(const RequestOutput& output) = 0;  // The last one has finished set.
  virtual void OnError(const absl::Status& status) = 0;    // No further calls but Flush.
  // After the outputs of one pass of the scheduler loop went out (to every sink that got one):
  // a sink that gathers several requests' outputs into one message sends it now.
  virtual void Flush() {}
};

struct DecodeJob {
  std::string request_id;
  std::vector<int32_t> prompt;
  SamplingParams params;
  std::string prefill_address;  // Empty: prefill here.
  // Resumption (another decode worker died): output already delivered, recomputed here with the
  // prompt. Always prefilled locally.
  std::vector<int32_t> resume;
  std::string traceparent, tracestate;  // The router's W3C trace context (empty: none).
};

class DecodeWorker {
 public:
  static absl::StatusOr<std::unique_ptr<DecodeWorker>> Create(const DecodeWorkerOptions& options);
  ~DecodeWorker();

  void Submit(DecodeJob job, std::shared_ptr<DecodeSink> sink);
  void Cancel(const std::string& request_id);
  // The KV transport for the ready line and logs (ucx: the UCX transports it may use).
  std::string TransportDescription() const { return transport_->description(); }
  internal::v1::WorkerInfo Info();
  // Load reports and KV events for routers (WatchLoad).
  LoadPublisher* publisher() { return &publisher_; }
  // Its LoRA adapters (--lora-modules, runtime loads); null when it takes none.
  std::shared_ptr<LoraRegistry> lora() const { return engine_->lora(); }
  // Makes Info() and the load reports show a change made off the scheduler thread (a runtime
  // LoRA adapter change); returns once they do, or after `timeout` (a stopped worker).
  void RefreshInfo(std::chrono::milliseconds timeout = std::chrono::seconds(5));
  // Stops taking requests (new ones fail with Unavailable) and waits up to `timeout` for the
  // running ones; what is left is cancelled.
  void Drain(absl::Duration timeout);

 private:
  struct Remote;
  struct Active {
    std::shared_ptr<DecodeSink> sink;
    std::shared_ptr<Remote> remote;  // Set while a remote prefill is in flight.
    // Tracing: the request's span here and its current phase's (reserve, remote_prefill or
    // prefill, then generate), and the tokens streamed so far.
    Span span, phase;
    int64_t tokens = 0;
  };

  explicit DecodeWorker(const DecodeWorkerOptions& options) : options_(options) {}
  void Post(std::function<void()> command) { commands_.Post(std::move(command)); }
  void Loop();
  void Start(DecodeJob job, std::shared_ptr<DecodeSink> sink);
  // Reserves the prompt's blocks and asks the prefill worker for their pages (after the tiers'
  // blocks are loaded into the reservation, when the KV cache tiers hold some).
  void StartRemote(DecodeJob job, Active& active);
  // The Prefill call for the reservation's pages after its first `cached_tokens` tokens.
  void SendPrefill(const std::string& request_id, Active& active, int64_t cached_tokens);
  // The reservations whose tier loads ended: their Prefill calls go out.
  void SendLoadedReservations();
  void OnPrefillReply(const std::string& request_id, const std::shared_ptr<Remote>& remote);
  void CheckRemotes();
  // `reason` labels kv_transfer_failures_total.
  void FallBackToLocal(const std::string& request_id, const absl::Status& why,
                       const std::string& reason);
  // Ends a remote prefill that did not complete: the transfer is released and the reservation
  // freed, or, while a one-sided transport's sender may still write into it, kept (quarantined)
  // until the transport reports it quiescent.
  void DropReservation(const std::string& request_id, uint64_t tag,
                       std::vector<RequestOutput>* outputs);
  void Dispatch(std::vector<RequestOutput>& outputs);
  void Trace(Active& active, const RequestOutput& out);  // Its spans' phases and events.
  void PublishInfo();
  internal::v1::PrefillWorker::Stub* PrefillStub(const std::string& address);

  const DecodeWorkerOptions options_;
  WorkerCore core_;
  LLMEngine* engine_ = nullptr;       // core_.engine
  KvTransport* transport_ = nullptr;  // core_.transport

  // Scheduler-thread state.
  absl::flat_hash_map<std::string, Active> active_;
  absl::flat_hash_map<std::string, std::unique_ptr<internal::v1::PrefillWorker::Stub>> stubs_;
  uint64_t next_tag_ = 1;
  std::vector<RequestOutput> outputs_;
  std::vector<std::shared_ptr<DecodeSink>> flush_;  // Dispatch's scratch: the sinks it fed.
  std::vector<TierReservation> loaded_;  // SendLoadedReservations' scratch.
  TransferCounters transfers_;
  int64_t remote_prefills_ = 0, local_prefills_ = 0;
  int64_t quarantined_ = 0;  // Reservations kept until their transfer is quiescent.

  // Lets transport callbacks reach the scheduler thread only while this worker exists.
  struct Mailbox {
    std::mutex mu;
    DecodeWorker* worker = nullptr;
  };
  std::shared_ptr<Mailbox> mailbox_ = std::make_shared<Mailbox>();

  // Shared with other threads.
  CommandQueue commands_;
  std::mutex mu_;
  bool stop_ = false;
  bool draining_ = false;
  internal::v1::WorkerInfo info_;
  std::vector<KvEvent> events_;  // Scheduler thread: drained from the engine each loop.
  LoadPublisher publisher_;
  std::unique_ptr<WorkerMetrics> metrics_;  // Reads Info() at scrape time.
  std::thread thread_;
};

}  // namespace pdserve

#endif  // PDSERVE_DECODE_SERVICE_DECODE_WORKER_H_
