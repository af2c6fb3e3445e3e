// Sends a workload (workload.h) to a router's public API at its arrival times, one stream per
// request, and measures what a user sees: time to first token, time per output token, the
// prompt tokens the server reports as cached. Summarize turns the per-request results into the
// figures of `pdserve bench`.
#ifndef PDSERVE_BENCH_SERVING_LOAD_CLIENT_H_
#define PDSERVE_BENCH_SERVING_LOAD_CLIENT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "bench/serving/workload.h"

namespace pdserve {

struct RequestResult {
  absl::Status status;
  double ttft_seconds = 0;
  double tpot_seconds = 0;  // (last token - first token) / (completion tokens - 1); 0 for one token.
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;
  int64_t completion_tokens = 0;
};

struct LoadRun {
  std::vector<RequestResult> results;
  double wall_seconds = 0;  // First send to last completion.
};

// Blocks until every request has ended (or failed). `timeout_seconds` bounds each request.
LoadRun RunLoad(const std::string& server, const std::vector<BenchRequest>& requests,
                int64_t output_tokens, double timeout_seconds);

// Nearest-rank percentile of `values` (p in [0, 100]); 0 when empty.
double Percentile(std::vector<double> values, double p);

struct LoadSummary {
  int64_t ok = 0, failed = 0;
  std::string first_error;
  double hit_rate = 0;  // Sum of cached prompt tokens over the sum of prompt tokens.
  double ttft_p50 = 0, ttft_p90 = 0, tpot_p50 = 0, tpot_p90 = 0;
  double requests_per_second = 0;
  double output_tokens_per_second = 0;
};

LoadSummary Summarize(const LoadRun& run);

}  // namespace pdserve

#endif  // PDSERVE_BENCH_SERVING_LOAD_CLIENT_H_
