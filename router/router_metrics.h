// The router's Prometheus metrics (role "router"): what clients see (latency, tokens, outcomes),
// the routing decisions per tier and worker, and which workers are up (copied from the worker
// pools at scrape time). Thread-safe.
#ifndef PDSERVE_ROUTER_ROUTER_METRICS_H_
#define PDSERVE_ROUTER_ROUTER_METRICS_H_

#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "common/metrics/metrics.h"
#include "common/metrics/request_metrics.h"
#include "router/worker_pool.h"

namespace pdserve {

class RouterMetrics {
 public:
  // `registry` null: one of its own (nothing exports it). `pools` gives each tier's worker stats
  // ("prefill", "decode") and the count of refused workers; called at scrape time, so destroy
  // this object before what it reads.
  struct PoolSnapshot {
    std::vector<std::pair<std::string, std::vector<WorkerPool::WorkerStats>>> tiers;
    int64_t refusals = 0;
  };
  RouterMetrics(metrics::Registry* registry, const std::string& model_name,
                const std::string& policy, std::function<PoolSnapshot()> pools);

  metrics::RequestMetrics& requests() { return requests_; }
  void Decision(const std::string& tier, const std::string& worker);
  // Where the chosen worker of `tier` finds a routed prompt's blocks, as the router sees it: its
  // pool's prefix cache, its KV cache tiers (disk, shared store), or none (computed).
  void PromptBlocks(const std::string& tier, int64_t pool, int64_t kv_tier, int64_t prompt_blocks);
  void Prefill(bool local);
  // A request that ended without finishing (validation, no worker, a worker's error).
  void Failed(const std::string& code);
  void Running(int delta) { running_.Inc(delta); }
  // A request continued on another decode worker after its stream broke.
  void Resumed() { resumes_.Inc(); }
  int64_t resumes() const { return static_cast<int64_t>(resumes_.value()); }

 private:
  void Collect(const PoolSnapshot& snapshot);

  std::unique_ptr<metrics::Registry> own_registry_;
  metrics::Registry* registry_;
  const std::string model_name_, policy_;
  metrics::RequestMetrics requests_;
  metrics::Gauge& running_;
  metrics::Counter& local_prefills_;
  metrics::Counter& remote_prefills_;
  metrics::Counter& refused_;
  metrics::Counter& resumes_;
  metrics::Family<metrics::Counter>& decisions_;
  metrics::Family<metrics::Counter>& prompt_blocks_;
  metrics::Family<metrics::Counter>& failures_;
  metrics::Family<metrics::Gauge>& worker_up_;
  std::mutex collect_mu_;
  std::set<std::vector<std::string>> up_series_;  // worker_up children now exported.
  metrics::CollectorHandle collector_;            // Last: removed first.
};

}  // namespace pdserve

#endif  // PDSERVE_ROUTER_ROUTER_METRICS_H_
