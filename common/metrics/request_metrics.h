// Per-request latency and token metrics with vLLM's names and buckets, shared by every role:
// workers observe their engine's outputs, the router what its clients see. Labels model_name and
// role on every series.
#ifndef PDSERVE_COMMON_METRICS_REQUEST_METRICS_H_
#define PDSERVE_COMMON_METRICS_REQUEST_METRICS_H_

#include <atomic>

#include <cstdint>
#include <string>

#include "common/metrics/metrics.h"

namespace pdserve::metrics {

// One request that has ended.
struct FinishedRequest {
  std::string finish_reason;  // "stop", "length", "abort".
  int64_t generation_tokens = 0;
  double e2e_seconds = 0;
  double ttft_seconds = 0;    // Used for the time per output token when generation_tokens > 1.
  // Phase times (the engine's definitions); the router has none.
  bool has_phases = false;
  double queue_seconds = 0, prefill_seconds = 0, decode_seconds = 0;
};

class RequestMetrics {
 public:
  RequestMetrics(Registry* registry, const std::string& model_name, const std::string& role);

  // The request's first token arrived `ttft_seconds` after it did; its prompt was counted.
  void FirstToken(double ttft_seconds, int64_t prompt_tokens);
  // A later token arrived `gap_seconds` after the previous one.
  void NextToken(double gap_seconds);
  void Finished(const FinishedRequest& r);

  // Totals so far (the router's online planner differences them over its interval).
  double prompt_tokens() const { return prompt_tokens_.value(); }
  double generation_tokens() const { return generation_tokens_.value(); }
  int64_t first_tokens() const { return first_tokens_.load(std::memory_order_relaxed); }

 private:
  std::string model_name_, role_;
  Histogram& ttft_;
  Histogram& itl_;
  Histogram& tpot_;
  Histogram& e2e_;
  Histogram& queue_;
  Histogram& prefill_;
  Histogram& decode_;
  Counter& prompt_tokens_;
  Counter& generation_tokens_;
  Family<Counter>& success_;  // By finish reason: declared at start, so it reads 0, not absent.
  std::atomic<int64_t> first_tokens_{0};
};

}  // namespace pdserve::metrics

#endif  // PDSERVE_COMMON_METRICS_REQUEST_METRICS_H_
