// Turns one row of logits into the next token: penalties, temperature, min-p, top-k, top-p, then
// a draw from a counter-based generator keyed by (seed, output position). The draw depends only
// on the request, never on what else is in the batch, which is what makes seeded sampling
// reproducible under continuous batching (and after a preempted request is recomputed).
//
// Logprobs are log-softmax of the raw model logits (before penalties and temperature), as vLLM
// reports them by default.
//
// Thread-safety: a Sampler holds scratch buffers; use one per thread.
#ifndef PDSERVE_COMMON_SAMPLING_SAMPLER_H_
#define PDSERVE_COMMON_SAMPLING_SAMPLER_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"
#include "common/sampling/sampling_params.h"

namespace pdserve {

// Per-request state the sampler needs across steps.
struct SamplerState {
  uint64_t seed = 0;
  int64_t num_generated = 0;                         // Output position of the next draw.
  absl::flat_hash_map<int32_t, int32_t> output_counts;  // For frequency/presence penalties.
  absl::flat_hash_map<int32_t, bool> seen;              // Prompt + output (repetition penalty).

  // `max_new_tokens` sizes the tables so that Accept never grows them.
  void Init(uint64_t seed_value, absl::Span<const int32_t> prompt, int64_t max_new_tokens = 0);
  void Accept(int32_t token);
};

struct SampledToken {
  int32_t token = -1;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top_logprobs;  // Best first; size = params.logprobs.
};

class Sampler {
 public:
  // `allowed` (structured outputs): a bitset over the vocabulary (bit t of word t / 64); only
  // tokens whose bit is set are drawn (at least one must be). Null: every token.
  SampledToken Sample(const float* logits, int64_t vocab_size, const SamplingParams& params,
                      const SamplerState& state, const uint64_t* allowed = nullptr);

 private:
  struct Candidate {
    float logit;
    int32_t id;
  };
  std::vector<float> work_;
  std::vector<int32_t> order_;
  std::vector<Candidate> packed_;  // top_p's selection.
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_SAMPLING_SAMPLER_H_
