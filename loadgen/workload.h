// Request streams for `pdserve bench`: what is sent and when. Deterministic for a seed
// (common/base/rng.h), so two policies or two servers see the same stream.
//
// random: every prompt distinct, `input_len` tokens, `output_len` generated (both drawn uniformly
// from [len * (1 - range_ratio), len * (1 + range_ratio)], as vLLM's --random-range-ratio).
// shared-prefix: `groups` system prompts of `prefix_len` tokens; each request one of them
// (uniformly) followed by a distinct random-workload user part.
// synthetic-chat: conversations shaped like ShareGPT's, generated (no download). User turns and
// replies have log-normal lengths with medians `input_len` and `output_len` (a long right tail,
// as real chat); a conversation has 1-4 turns, and turn k's prompt is the whole history (earlier
// user turns and replies of their generated lengths) plus the new user turn, so later turns reuse
// the earlier ones' KV. Turns of different conversations interleave in arrival order.
//
// Arrivals: a renewal process at `rate` requests per second whose gaps are Gamma distributed
// with shape `burstiness` (1 = Poisson; < 1 burstier, > 1 more regular; the mean gap stays
// 1 / rate), as vLLM's --burstiness. rate = infinity: all at time 0.
#ifndef PDSERVE_LOADGEN_WORKLOAD_H_
#define PDSERVE_LOADGEN_WORKLOAD_H_

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pdserve {

// Bounds on what a workload may ask for, checked before anything is allocated.
inline constexpr int64_t kMaxWorkloadPrompts = 10'000'000;
inline constexpr int64_t kMaxWorkloadLength = int64_t{1} << 24;  // Tokens: past any model's context.
inline constexpr int64_t kMaxWorkloadTokens = int64_t{1} << 30;  // All prompts together (4 GiB).

struct WorkloadOptions {
  std::string kind = "random";  // random, shared-prefix or synthetic-chat
  int64_t num_prompts = 100;
  int64_t input_len = 256;
  int64_t output_len = 64;
  double range_ratio = 0;  // random, shared-prefix: lengths uniform in len * [1 - r, 1 + r].
  int64_t groups = 8;          // shared-prefix
  int64_t prefix_len = 256;    // shared-prefix
  double rate = std::numeric_limits<double>::infinity();  // Requests per second.
  double burstiness = 1.0;
  int64_t max_prompt_len = 0;  // synthetic-chat: cap on a prompt (0: 16 x input_len).
  int64_t vocab_size = 0;      // Token ids are drawn from [first_token, vocab_size).
  int64_t first_token = 0;
  uint64_t seed = 1;
};

struct BenchRequest {
  std::vector<int32_t> prompt;
  int64_t output_tokens = 1;   // max_tokens, EOS ignored.
  double arrival_seconds = 0;  // From the start of the run.
  int64_t group = -1;          // shared-prefix: which system prompt; synthetic-chat: conversation.
};

absl::StatusOr<std::vector<BenchRequest>> MakeWorkload(const WorkloadOptions& options);

// A Gamma(shape, 1) variate (Marsaglia and Tsang); used for the arrival gaps.
class SplitMix64;
double SampleGamma(SplitMix64& rng, double shape);

}  // namespace pdserve

#endif  // PDSERVE_LOADGEN_WORKLOAD_H_
