#include "common/metrics/request_metrics.h"

#include "common/metrics/buckets.h"

namespace pdserve::metrics {
namespace {

const std::vector<std::string> kLabels = {"model_name", "role"};

Histogram& Hist(Registry* r, const std::string& suffix, const std::string& help,
                const std::vector<double>& bounds, const std::vector<std::string>& values) {
  return r->AddHistogram("pdserve_" + suffix, help, kLabels, bounds, "vllm:" + suffix).With(values);
}

}  // namespace

RequestMetrics::RequestMetrics(Registry* registry, const std::string& model_name,
                               const std::string& role)
    : model_name_(model_name),
      role_(role),
      ttft_(Hist(registry, "time_to_first_token_seconds", "Time to first token in seconds.",
                 TtftBuckets(), {model_name, role})),
      itl_(Hist(registry, "inter_token_latency_seconds",
                "Time between consecutive tokens of a request in seconds.", TokenLatencyBuckets(),
                {model_name, role})),
      tpot_(Hist(registry, "request_time_per_output_token_seconds",
                 "Per request: time per output token after the first, in seconds.",
                 TokenLatencyBuckets(), {model_name, role})),
      e2e_(Hist(registry, "e2e_request_latency_seconds", "End-to-end request latency in seconds.",
                RequestLatencyBuckets(), {model_name, role})),
      queue_(Hist(registry, "request_queue_time_seconds",
                  "Time a request waited before it was first scheduled, in seconds.",
                  RequestLatencyBuckets(), {model_name, role})),
      prefill_(Hist(registry, "request_prefill_time_seconds",
                    "Time from first scheduled to first token, in seconds.",
                    RequestLatencyBuckets(), {model_name, role})),
      decode_(Hist(registry, "request_decode_time_seconds",
                   "Time from first to last token, in seconds.", RequestLatencyBuckets(),
                   {model_name, role})),
      prompt_tokens_(registry
                         ->AddCounter("pdserve_prompt_tokens_total", "Prompt tokens processed.",
                                      kLabels, "vllm:prompt_tokens_total")
                         .With({model_name, role})),
      generation_tokens_(registry
                             ->AddCounter("pdserve_generation_tokens_total",
                                          "Tokens generated.", kLabels,
                                          "vllm:generation_tokens_total")
                             .With({model_name, role})),
      success_(registry->AddCounter("pdserve_request_success_total",
                                    "Requests finished, by finish reason.",
                                    {"model_name", "role", "finished_reason"},
                                    "vllm:request_success_total")) {}

void RequestMetrics::FirstToken(double ttft_seconds, int64_t prompt_tokens) {
  ttft_.Observe(ttft_seconds);
  prompt_tokens_.Inc(static_cast<double>(prompt_tokens));
  generation_tokens_.Inc();
  first_tokens_.fetch_add(1, std::memory_order_relaxed);
}

void RequestMetrics::NextToken(double gap_seconds) {
  itl_.Observe(gap_seconds);
  generation_tokens_.Inc();
}

void RequestMetrics::Finished(const FinishedRequest& r) {
  // Children are created on first use: a reason that never happened has no series (the family
  // is declared, with its HELP and TYPE, from the start).
  success_.With({model_name_, role_, r.finish_reason}).Inc();
  e2e_.Observe(r.e2e_seconds);
  if (r.generation_tokens > 1) {
    const double after_first = r.has_phases ? r.decode_seconds : r.e2e_seconds - r.ttft_seconds;
    tpot_.Observe(after_first / static_cast<double>(r.generation_tokens - 1));
  }
  if (r.has_phases) {
    queue_.Observe(r.queue_seconds);
    prefill_.Observe(r.prefill_seconds);
    decode_.Observe(r.decode_seconds);
  }
}

}  // namespace pdserve::metrics
