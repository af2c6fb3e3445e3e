// The router's handler: the worker registry (static lists or DNS), the choice of workers
// (routing_policy.h over each tier's WorkerPool), conditional disaggregation, request
// validation and tokenization. router_grpc_service.h serves the public API over it.
// Thread-safe after Create.
#ifndef PDSERVE_ROUTER_ROUTER_H_
#define PDSERVE_ROUTER_ROUTER_H_

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/base/dtype.h"
#include "common/model/model_config.h"
#include "common/sampling/sampling_params.h"
#include "common/tokenizer/tokenizer.h"
#include "pdserve/internal/v1/worker.grpc.pb.h"
#include "pdserve/v1/generation.pb.h"
#include "common/metrics/metrics.h"
#include "common/rpc/api_keys.h"
#include "router/discovery.h"
#include "router/lora_updates.h"
#include "router/request_validator.h"
#include "router/router_metrics.h"
#include "router/routing_policy.h"
#include "router/worker_pool.h"

namespace pdserve {

class Tracer;

struct RouterOptions {
  std::string model_dir;  // config.json and tokenizer files, or a GGUF file; no weights are read.
  std::string tokenizer;  // A tokenizer directory instead of the model's (empty: the model's).
  // Comma-separated host:port or dns:///name:port entries (discovery.h).
  std::string prefill;    // May be empty: decode workers prefill.
  std::string decode;     // At least one worker.
  absl::Duration worker_wait = absl::Seconds(60);  // How long Create waits for decode workers.
  absl::Duration discovery_interval = absl::Seconds(5);
  RoutingOptions routing;          // Both tiers.
  int64_t block_size = 16;         // Must equal the workers' (others are refused).
  KvDType kv_dtype = KvDType::kF32;  // Likewise: pages of another dtype cannot be exchanged.
  std::string served_model_name;     // ModelInfo.name and the metrics' model_name (empty: the
                                     // model directory's name).
  bool kv_events = true;           // false: predict caches from this router's decisions.
  absl::Duration approx_ttl = absl::Seconds(120);
  absl::Duration recent_half_life = absl::Seconds(2);  // Of the load this router just sent.
  // Conditional disaggregation: prefill on the decode worker when the prompt's part that the
  // chosen decode worker has not cached is at most this many tokens, or when every prefill
  // worker has at least `prefill_max_waiting` requests queued.
  int64_t local_prefill_tokens = 32;
  int64_t prefill_max_waiting = 8;
  size_t max_stop_strings = 16;
  size_t max_stop_string_bytes = 256;
  // How many times one request may continue on another decode worker after its stream broke.
  int64_t max_resumes = 2;
  // Tokens a message to a client carries (vLLM's --stream-interval): 1, one engine step each (one
  // token, or a speculative step's accepted tokens); N > 1, every N tokens and the last, and
  // a client that falls behind gets what waits for it folded into one message.
  int64_t stream_interval = 1;
  // One GenerateMany stream per decode worker for all of this router's requests there, a message
  // a step (decode_stream.h); false: a Generate stream a request, a message a token. Off by
  // default until a drain race is understood: with it on, a router stopping together with its
  // workers cut a client's stream in 3 of 15 runs of test_lifecycle's shutdown test.
  bool shared_decode_streams = false;
  // Backpressure: requests in flight through this router beyond which new ones are refused with
  // RESOURCE_EXHAUSTED (and a retry hint) instead of queued. 0: no limit.
  int64_t max_inflight = 1024;
  int64_t retry_after_ms = 1000;  // The hint: trailer grpc-retry-pushback-ms.
  metrics::Registry* metrics = nullptr;  // Role "router"; null: not exported.
  // Calls to the workers (mutual TLS); null: insecure.
  std::shared_ptr<grpc::ChannelCredentials> worker_credentials;
  // Channels to use for these worker addresses instead of connecting (`serve`: in-process ones).
  absl::flat_hash_map<std::string, std::shared_ptr<grpc::Channel>> worker_channels;
  ApiKeys api_keys;  // Required on the public API when set.
  Tracer* tracer = nullptr;  // Each request's spans (not owned); null: no tracing.
  // Adapters may be loaded and unloaded through this router (lora_updates.h).
  bool lora_runtime_updates = false;
};

// Limits on a route: a resumed request avoids the decode workers that failed it and is
// prefilled on the decode worker (it recomputes prompt + delivered tokens).
struct RouteConstraints {
  std::vector<const WorkerPool::Worker*> exclude_decode;
  bool retry = false;         // Not a new request (RouterStats.requests counts it once).
  bool local_prefill = false;  // Prefill on the decode worker.
  std::string lora_name;       // Only workers that serve this LoRA adapter (empty: any).
};

// Where one request goes.
struct Route {
  WorkerPool::Pick decode;
  std::optional<WorkerPool::Pick> prefill;  // Unset: the decode worker prefills.
};

class Router {
 public:
  // Loads the model's config and tokenizer, connects to the workers and waits (up to
  // worker_wait) until every one answers GetWorkerInfo with the same model and KV layout.
  static absl::StatusOr<std::unique_ptr<Router>> Create(const RouterOptions& options);

  // Checks every field and tokenizes; InvalidArgument naming the field and the reason.
  absl::StatusOr<RoutedRequest> Prepare(const v1::GenerateRequest& request,
                                        std::chrono::system_clock::time_point deadline) const;
  // Chooses the decode worker and, unless the prompt is better prefilled there, the prefill
  // worker (the tier's policy on both). Unavailable when no decode worker is usable.
  absl::StatusOr<Route> RouteRequest(const std::vector<int32_t>& prompt,
                                     const RouteConstraints& constraints = {});
  // The request routed by RouteRequest has ended.
  void Done(const Route& route);
  // The shared stream to a decode worker (RouterOptions::shared_decode_streams); null: the
  // request takes a stream of its own (off, an older worker, or the router stopping).
  std::shared_ptr<DecodeStreamClient> DecodeStream(const std::shared_ptr<WorkerPool::Worker>& worker);
  // Admission of a request into the router (Release when it ends): ResourceExhausted when
  // max_inflight are in flight.
  absl::Status Admit();
  void Release() { inflight_.fetch_sub(1); }

  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const RouterOptions& options() const { return options_; }
  const ApiKeys& api_keys() const { return options_.api_keys; }
  v1::ModelInfo model_info() const;
  internal::v1::RouterStats Stats() const;
  RouterMetrics& metrics() { return *metrics_; }
  // Runtime LoRA adapter loads and unloads; null unless lora_runtime_updates.
  LoraUpdates* lora_updates() { return lora_updates_.get(); }
  ~Router();
  // Stops discovery and the workers' load watches: no call to a worker starts after it returns
  // (`serve`, once its public calls are over, before its workers' servers shut down: a channel
  // in-process must not start calls after its server shut down). Idempotent.
  void Stop();

 private:
  Router() = default;
  int64_t ContextLength() const;

  RouterOptions options_;
  ModelConfig config_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::shared_ptr<NumericsWatch> numerics_;  // Both pools' workers' arithmetic.
  std::unique_ptr<WorkerPool> decode_;
  std::unique_ptr<WorkerPool> prefill_;
  std::unique_ptr<Discovery> decode_discovery_;
  std::unique_ptr<Discovery> prefill_discovery_;
  std::unique_ptr<LoraUpdates> lora_updates_;  // After the pools: destroyed before them.
  v1::ModelInfo model_info_;
  std::string instance_;  // Random, per router process: part of every downstream id.
  std::atomic<uint64_t> next_request_{1};
  std::atomic<int64_t> requests_{0}, local_prefills_{0}, remote_prefills_{0}, fallbacks_{0};
  std::atomic<int64_t> inflight_{0};
  std::unique_ptr<RouterMetrics> metrics_;  // Last: reads the pools at scrape time.
};

}  // namespace pdserve

#endif  // PDSERVE_ROUTER_ROUTER_H_
