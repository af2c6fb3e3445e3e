// A worker's Prometheus metrics (role "prefill" or "decode"): request latencies and tokens from
// its engine's outputs, load and cache state from its WorkerInfo snapshot (copied by a collector
// at scrape time), and the KV transfers it takes part in.
//
// Observe and the transfer methods are called on the worker's scheduler thread; `info` on the
// scraping thread. The registry outlives this object; destroy this object before what `info`
// reads (a scrape in progress finishes first).
#ifndef PDSERVE_COMMON_RPC_WORKER_METRICS_H_
#define PDSERVE_COMMON_RPC_WORKER_METRICS_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "common/engine/llm_engine.h"
#include "common/metrics/metrics.h"
#include "common/metrics/request_metrics.h"
#include "pdserve/internal/v1/worker.pb.h"

namespace pdserve {

class WorkerMetrics {
 public:
  // `registry` null: one of its own (nothing exports it). `info` gives the worker's snapshot.
  WorkerMetrics(metrics::Registry* registry, const std::string& model_name,
                const std::string& role, std::function<internal::v1::WorkerInfo()> info);

  // One engine output (a token and/or the end of a request).
  void Observe(const RequestOutput& out);
  // A KV transfer this worker received completely, `seconds` after it was announced.
  void TransferDone(double seconds);
  // A transfer that failed; `reason` is a short label (lease_expired also counts the lease).
  void TransferFailed(const std::string& reason);
  // A given-up transfer's reservation returned once its sender's late puts had landed.
  void QuarantineReleased();
  void SetReservations(int64_t active);

 private:
  // Gauges and totals from a WorkerInfo snapshot (before each scrape).
  void Collect(const internal::v1::WorkerInfo& info);
  // Speculative decoding's counters, once a worker reports them (vLLM's spec_decode names).
  void CollectSpeculative(const internal::v1::WorkerInfo& info);
  void CollectStructured(const internal::v1::WorkerInfo& info);
  void CollectKvOffload(const internal::v1::KvOffloadInfo& offload);
  // vllm:prompt_tokens_cached_by_source_total's sources.
  void CollectCachedBySource(const internal::v1::WorkerInfo& info);
  void CollectKvTier(const internal::v1::KvTierInfo& tier);
  void CollectLora(const internal::v1::WorkerInfo& info);

  std::unique_ptr<metrics::Registry> own_registry_;
  metrics::Registry* registry_;
  const std::string model_name_, role_;
  std::vector<std::string> lora_info_labels_;  // The lora_requests_info series now exported.
  metrics::RequestMetrics requests_;
  metrics::Gauge& running_;
  metrics::Gauge& waiting_;
  metrics::Gauge& kv_usage_;
  metrics::Gauge& kv_blocks_total_;
  metrics::Counter& prefix_queries_;
  metrics::Counter& prefix_hits_;
  metrics::Counter& preemptions_;
  metrics::Counter& step_seconds_;
  metrics::Counter& transfer_bytes_;
  metrics::Counter& transfer_pages_;
  metrics::Counter& transfers_;
  metrics::Histogram& transfer_seconds_;
  metrics::Gauge& reservations_;
  metrics::Counter& lease_expired_;
  metrics::Counter& quarantine_released_;
  metrics::Family<metrics::Counter>& transfer_failures_;  // By reason, declared at start.
  metrics::CollectorHandle collector_;  // Last: removed first.
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_RPC_WORKER_METRICS_H_
