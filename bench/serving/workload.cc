#include "bench/serving/workload.h"

#include <cmath>

#include "common/base/rng.h"
#include "common/base/strings.h"

namespace pdserve {
namespace {

std::vector<int32_t> RandomTokens(SplitMix64& rng, int64_t n, int64_t lo, int64_t hi) {
  std::vector<int32_t> out(n);
  for (int32_t& t : out) t = static_cast<int32_t>(lo + rng.Next() % static_cast<uint64_t>(hi - lo));
  return out;
}

}  // namespace

absl::StatusOr<std::vector<BenchRequest>> MakeWorkload(const WorkloadOptions& o) {
  if (o.kind != "shared-prefix" && o.kind != "random") {
    return absl::InvalidArgumentError(Str("--workload: '", o.kind, "' is not shared-prefix or random"));
  }
  if (o.requests < 1) return absl::InvalidArgumentError("--requests: must be >= 1");
  if (o.groups < 1) return absl::InvalidArgumentError("--groups: must be >= 1");
  if (o.system_tokens < 0 || o.suffix_tokens < 1) {
    return absl::InvalidArgumentError("--system-tokens must be >= 0 and --suffix-tokens >= 1");
  }
  if (o.output_tokens < 1) return absl::InvalidArgumentError("--output-tokens: must be >= 1");
  if (o.vocab_size <= o.first_token + 1) {
    return absl::InvalidArgumentError(Str("vocabulary of ", o.vocab_size, " is too small"));
  }
  SplitMix64 rng(o.seed);
  std::vector<std::vector<int32_t>> systems;
  for (int64_t g = 0; g < o.groups; ++g) {
    systems.push_back(RandomTokens(rng, o.system_tokens, o.first_token, o.vocab_size));
  }
  std::vector<BenchRequest> out;
  double t = 0;
  for (int64_t i = 0; i < o.requests; ++i) {
    BenchRequest r;
    if (o.rate > 0 && i > 0) t += -std::log(1.0 - rng.Uniform()) / o.rate;
    r.arrival_seconds = o.rate > 0 ? t : 0;
    if (o.kind == "shared-prefix") {
      r.group = static_cast<int64_t>(rng.Next() % static_cast<uint64_t>(o.groups));
      r.prompt = systems[r.group];
    }
    const int64_t n = o.kind == "shared-prefix" ? o.suffix_tokens : o.system_tokens + o.suffix_tokens;
    const std::vector<int32_t> tail = RandomTokens(rng, n, o.first_token, o.vocab_size);
    r.prompt.insert(r.prompt.end(), tail.begin(), tail.end());
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace pdserve
