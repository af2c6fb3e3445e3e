// Request streams for `pdserve bench`: what is sent and when.
//
// shared-prefix: `groups` groups, each a `system_tokens`-token common prefix (a system prompt)
// followed by a distinct `suffix_tokens`-token user part; requests pick a group uniformly and
// arrive as a Poisson process of `rate` requests per second. random: every prompt distinct.
// Deterministic for a seed (common/base/rng.h), so two policies see the same stream.
#ifndef PDSERVE_BENCH_SERVING_WORKLOAD_H_
#define PDSERVE_BENCH_SERVING_WORKLOAD_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pdserve {

struct WorkloadOptions {
  std::string kind = "shared-prefix";  // shared-prefix or random
  int64_t requests = 96;
  double rate = 4.0;  // Requests per second (Poisson); <= 0: all at once.
  int64_t groups = 8;
  int64_t system_tokens = 256;
  int64_t suffix_tokens = 32;
  int64_t output_tokens = 16;
  int64_t vocab_size = 0;   // Token ids are drawn from [first_token, vocab_size).
  int64_t first_token = 0;
  uint64_t seed = 1;
};

struct BenchRequest {
  std::vector<int32_t> prompt;
  double arrival_seconds = 0;  // From the start of the run.
  int64_t group = -1;          // shared-prefix: which system prompt; random: -1.
};

absl::StatusOr<std::vector<BenchRequest>> MakeWorkload(const WorkloadOptions& options);

}  // namespace pdserve

#endif  // PDSERVE_BENCH_SERVING_WORKLOAD_H_
