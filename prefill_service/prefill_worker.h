// The prefill tier's handler: computes prompts' KV on its own engine (batched, chunked under a
// token budget, reusing its own prefix cache) and writes the pages the decode worker lacks into
// the blocks it reserved, layer by layer as each layer of a chunk completes, so the transfer
// overlaps the compute. Answers with the first token (sampled with the request's seed, so it is
// the token the decode worker would have sampled) and a transfer summary.
//
// Threading: one scheduler thread owns the engine; public methods are thread-safe; `done`
// callbacks run on that thread or on a transport thread.
#ifndef PDSERVE_PREFILL_SERVICE_PREFILL_WORKER_H_
#define PDSERVE_PREFILL_SERVICE_PREFILL_WORKER_H_

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/engine/llm_engine.h"
#include "common/metrics/metrics.h"
#include "common/rpc/load_publisher.h"
#include "common/rpc/worker_core.h"
#include "common/rpc/worker_metrics.h"
#include "common/tracing/span.h"
#include "pdserve/internal/v1/worker.pb.h"

namespace pdserve {

class KvEventPublisher;
class Tracer;

struct PrefillWorkerOptions {
  std::string model_dir;
  std::string served_model_name;  // The metrics' model_name (empty: the model directory's name).
  EngineOptions engine;
  std::string transport = "tcp";
  // Listen and advertised addresses, TLS and send timeout of the KV transport (the layout is
  // filled in from the engine).
  KvTransportOptions transport_options;
  // Where the worker's metrics go (role "prefill"); null: a registry of its own, not exported.
  metrics::Registry* metrics = nullptr;
  // Publishes the prefix cache's events in vLLM's format too (--kv-events-publisher); not owned,
  // outlives the worker; null: off.
  KvEventPublisher* kv_events = nullptr;
  Tracer* tracer = nullptr;  // Each job's spans (not owned); null: no tracing.
};

class PrefillWorker {
 public:
  using Done = std::function<void(absl::StatusOr<internal::v1::PrefillResponse>)>;

  static absl::StatusOr<std::unique_ptr<PrefillWorker>> Create(const PrefillWorkerOptions& options);
  ~PrefillWorker();

  // Returns a ticket for Cancel. `done` is called exactly once. `traceparent`/`tracestate`: the
  // caller's W3C trace context (empty: none).
  uint64_t Submit(const internal::v1::PrefillRequest& request, Done done,
                  std::string traceparent = "", std::string tracestate = "");
  // The caller no longer wants the answer (its RPC was cancelled: the client left or the decode
  // worker's lease ran out). A job that has not sent a page yet is dropped, its blocks freed and
  // `done` called with Cancelled; one already sending finishes (its blocks must stay valid until
  // the transport has read them).
  void Cancel(uint64_t ticket);
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
  void Drain(absl::Duration timeout);

 private:
  struct Job {
    uint64_t ticket = 0;
    internal::v1::PrefillRequest request;
    Done done;
    std::string engine_id;           // Unique per job (request id + tag).
    std::vector<int64_t> sent_upto;  // Per layer: blocks [first_block, sent_upto) submitted.
    absl::Status error;              // A failed submit: finish with it.
    std::chrono::steady_clock::time_point start;
    // Tracing: the job's span; its phase (queue, compute, transfer) and the chunk being computed.
    Span span, phase, chunk;
    bool computing = false;  // Its first chunk was scheduled.
  };

  explicit PrefillWorker(const PrefillWorkerOptions& options) : options_(options) {}
  void Post(std::function<void()> command) { commands_.Post(std::move(command)); }
  void Loop();
  void Start(const internal::v1::PrefillRequest& request, Done done, uint64_t ticket, Span span);
  void OnLayer(int64_t layer, const SchedulerOutput& schedule);
  void Complete(const RequestOutput& output);
  void PublishInfo();

  const PrefillWorkerOptions options_;
  WorkerCore core_;
  LLMEngine* engine_ = nullptr;       // core_.engine
  KvTransport* transport_ = nullptr;  // core_.transport

  // Scheduler-thread state.
  absl::flat_hash_map<std::string, Job> jobs_;  // By engine id.
  absl::flat_hash_map<uint64_t, std::string> tickets_;  // Jobs in jobs_: ticket -> engine id.
  std::vector<RequestOutput> outputs_;
  uint64_t next_job_ = 1;
  TransferCounters transfers_;

  CommandQueue commands_;
  std::mutex mu_;
  bool stop_ = false;
  bool draining_ = false;
  int64_t in_flight_ = 0;  // Jobs not yet answered (guarded by mu_).
  internal::v1::WorkerInfo info_;
  std::vector<KvEvent> events_;  // Scheduler thread: drained from the engine each loop.
  LoadPublisher publisher_;
  std::unique_ptr<WorkerMetrics> metrics_;  // Reads Info() at scrape time.
  std::atomic<uint64_t> next_ticket_{1};
  std::thread thread_;
};

}  // namespace pdserve

#endif  // PDSERVE_PREFILL_SERVICE_PREFILL_WORKER_H_
