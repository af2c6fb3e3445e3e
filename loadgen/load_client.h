// Sends a workload (workload.h) to a router's public API at its arrival times, one stream per
// request, and measures what a user sees, with vLLM's definitions (benchmarks/serve):
//   TTFT  send -> first token-bearing message;
//   ITL   gap between consecutive token-bearing messages (one per gap);
//   TPOT  (E2E - TTFT) / (completion tokens - 1), for requests with more than one token;
//   E2E   send -> stream end.
// Summarize turns the per-request results into the figures of `pdserve bench`.
#ifndef PDSERVE_LOADGEN_LOAD_CLIENT_H_
#define PDSERVE_LOADGEN_LOAD_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "loadgen/workload.h"

namespace grpc {
class Channel;
}

namespace pdserve {

struct RequestResult {
  absl::Status status;
  double ttft_seconds = 0;
  double e2e_seconds = 0;
  std::vector<double> itl_seconds;
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;
  int64_t completion_tokens = 0;
  double TpotSeconds() const;  // 0 for one token.
};

struct LoadOptions {
  std::string api_key;           // Sent as "authorization: Bearer KEY" when set.
  double timeout_seconds = 300;  // Deadline of each request.
  // Streams open at once: that many threads take requests in arrival order (a request that finds
  // them all busy starts late, as in vLLM). 0 = unbounded: a thread per request.
  int64_t max_concurrency = 0;
  bool progress = false;         // A progress bar on stderr.
  // "grpc" (pdserve.v1.Generate), or the OpenAI HTTP API at http_address (a router's
  // --http-listen): "openai-completions" (the prompt's token ids) or "openai-chat" (the prompt
  // detokenized into one user message, rendered by the model's chat template, so its token count
  // differs). TTFT is measured to the first SSE chunk with content.
  std::string endpoint = "grpc";
  std::string http_address;
};

struct LoadRun {
  std::vector<RequestResult> results;
  double wall_seconds = 0;  // First send to last completion.
};

// Blocks until every request has ended (or failed). `channel`: the router's public port.
LoadRun RunLoad(const std::shared_ptr<grpc::Channel>& channel,
                const std::vector<BenchRequest>& requests, const LoadOptions& options);

// Nearest-rank percentile of `values` (p in [0, 100]); 0 when empty.
double Percentile(std::vector<double> values, double p);

struct Distribution {
  double mean = 0, p50 = 0, p90 = 0, p99 = 0;
};
Distribution Describe(const std::vector<double>& values);

// Service-level objectives for goodput (DistServe): a request is good when it meets every one
// that is set (> 0), in milliseconds.
struct Slo {
  double ttft_ms = 0, tpot_ms = 0, e2e_ms = 0;
  bool any() const { return ttft_ms > 0 || tpot_ms > 0 || e2e_ms > 0; }
};

// Parses "ttft:MS tpot:MS e2el:MS" (any subset, spaces or commas; vLLM's --goodput keys).
absl::Status ParseSlo(const std::string& text, Slo* slo);

struct LoadSummary {
  int64_t ok = 0, failed = 0, good = 0;
  std::string first_error;
  double duration_seconds = 0;
  int64_t prompt_tokens = 0, completion_tokens = 0;
  double hit_rate = 0;  // Sum of cached prompt tokens over the sum of prompt tokens.
  Distribution ttft, tpot, itl, e2e;  // Seconds.
  double requests_per_second = 0;
  double output_tokens_per_second = 0;
  double total_tokens_per_second = 0;  // Prompt + generated.
  double goodput = 0;                  // Good requests per second (0 without an SLO).
};

LoadSummary Summarize(const LoadRun& run, const Slo& slo = {});

}  // namespace pdserve

#endif  // PDSERVE_LOADGEN_LOAD_CLIENT_H_
