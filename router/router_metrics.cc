#include "router/router_metrics.h"

namespace pdserve {
namespace {

const std::vector<std::string> kLabels = {"model_name", "role"};

}  // namespace

RouterMetrics::RouterMetrics(metrics::Registry* registry, const std::string& model_name,
                             const std::string& policy, std::function<PoolSnapshot()> pools)
    : own_registry_(registry == nullptr ? std::make_unique<metrics::Registry>() : nullptr),
      registry_(registry == nullptr ? own_registry_.get() : registry),
      model_name_(model_name),
      policy_(policy),
      requests_(registry_, model_name, "router"),
      running_(registry_
                   ->AddGauge("pdserve_num_requests_running",
                              "Requests in the running batch.", kLabels,
                              "vllm:num_requests_running")
                   .With({model_name, "router"})),
      local_prefills_(registry_
                          ->AddCounter("pdserve_router_local_prefill_total",
                                       "Requests the router sent to a decode worker to prefill "
                                       "itself (short uncached part, or prefill tier saturated).",
                                       kLabels)
                          .With({model_name, "router"})),
      remote_prefills_(registry_
                           ->AddCounter("pdserve_router_remote_prefill_total",
                                        "Requests the router sent through a prefill worker.",
                                        kLabels)
                           .With({model_name, "router"})),
      refused_(registry_
                   ->AddCounter("pdserve_router_refused_workers_total",
                                "Workers refused for a different block size, hash scheme or "
                                "model.",
                                kLabels)
                   .With({model_name, "router"})),
      resumes_(registry_
                   ->AddCounter("pdserve_router_resumes_total",
                                "Requests continued on another decode worker (or retried) after "
                                "their decode stream broke.",
                                kLabels)
                   .With({model_name, "router"})),
      decisions_(registry_->AddCounter("pdserve_router_decisions_total",
                                       "Routing decisions by policy, tier and worker.",
                                       {"model_name", "role", "policy", "tier", "worker"})),
      prompt_blocks_(registry_->AddCounter("pdserve_router_prompt_blocks_total",
                                           "Routed prompts' blocks by where the chosen worker finds them, as the "
                                           "router predicts: pool (its prefix cache), kv_tier (its KV cache tiers: "
                                           "disk, shared store) or compute.",
                                           {"model_name", "role", "tier", "source"})),
      failures_(registry_->AddCounter("pdserve_request_failures_total",
                                      "Requests that ended with an error, by gRPC status code.",
                                      {"model_name", "role", "code"})),
      worker_up_(registry_->AddGauge("pdserve_worker_up",
                                     "1 when the router can route to the worker (reporting, same "
                                     "model and layout), else 0.",
                                     {"model_name", "role", "tier", "worker"})),
      collector_(registry_, [this, pools = std::move(pools)] { Collect(pools()); }) {}

void RouterMetrics::Decision(const std::string& tier, const std::string& worker) {
  decisions_.With({model_name_, "router", policy_, tier, worker}).Inc();
}

void RouterMetrics::PromptBlocks(const std::string& tier, int64_t pool, int64_t kv_tier, int64_t prompt_blocks) {
  const int64_t held = std::min(pool + kv_tier, prompt_blocks);
  prompt_blocks_.With({model_name_, "router", tier, "pool"}).Inc(static_cast<double>(std::min(pool, prompt_blocks)));
  prompt_blocks_.With({model_name_, "router", tier, "kv_tier"}).Inc(static_cast<double>(held - std::min(pool, prompt_blocks)));
  prompt_blocks_.With({model_name_, "router", tier, "compute"}).Inc(static_cast<double>(prompt_blocks - held));
}

void RouterMetrics::Prefill(bool local) { (local ? local_prefills_ : remote_prefills_).Inc(); }

void RouterMetrics::Failed(const std::string& code) {
  failures_.With({model_name_, "router", code}).Inc();
}

void RouterMetrics::Collect(const PoolSnapshot& snapshot) {
  std::lock_guard<std::mutex> lock(collect_mu_);
  std::set<std::vector<std::string>> now;
  for (const auto& [tier, workers] : snapshot.tiers) {
    for (const WorkerPool::WorkerStats& w : workers) {
      std::vector<std::string> labels = {model_name_, "router", tier, w.address};
      worker_up_.With(labels).Set(w.healthy && !w.refused ? 1 : 0);
      now.insert(std::move(labels));
    }
  }
  for (const auto& gone : up_series_) {
    if (!now.contains(gone)) worker_up_.Remove(gone);  // Left the pool (e.g. DNS).
  }
  up_series_ = std::move(now);
  refused_.SetTotal(static_cast<double>(snapshot.refusals));
}

}  // namespace pdserve
