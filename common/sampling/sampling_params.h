// What a request asks of the sampler. Field names and defaults follow vLLM's SamplingParams.
#ifndef PDSERVE_COMMON_SAMPLING_SAMPLING_PARAMS_H_
#define PDSERVE_COMMON_SAMPLING_SAMPLING_PARAMS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/structured/constraint.h"

namespace pdserve {

struct SamplingParams {
  // First: the engine checks it for every running sequence every step (Sequence keeps it in the
  // same cache line as its other per-step fields).
  int32_t max_tokens = 16;
  float temperature = 1.0f;   // 0: greedy.
  int32_t top_k = 0;          // 0 or -1: off.
  float top_p = 1.0f;         // (0, 1].
  float min_p = 0.0f;         // [0, 1].
  float repetition_penalty = 1.0f;  // > 0; 1 off. Prompt and output tokens (HF/vLLM semantics).
  float frequency_penalty = 0.0f;   // [-2, 2]; output tokens.
  float presence_penalty = 0.0f;    // [-2, 2]; output tokens.
  std::optional<uint64_t> seed;     // Same seed, same tokens, whatever shares the batch.
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  int32_t logprobs = 0;  // Top-N alternatives to report besides the chosen token; 0 none.
  // Speculative decoding for this request: -1 as the worker is set (--speculative), 0 off, k at
  // most k drafted tokens per step (never more than the worker's --num-speculative-tokens). The
  // output is the same either way; only its speed changes.
  int32_t num_speculative_tokens = -1;
  // Structured outputs: the output is a string of this constraint's language (null: any). The
  // engine compiles it (cached) and masks every step's logits with it before sampling.
  std::shared_ptr<const structured::OutputConstraint> constraint;
  // The LoRA adapter the request runs with (its OpenAI `model` when that names an adapter);
  // empty: the base model. Not sampling, but it travels with the request on every hop as these
  // do, and the engine resolves it (EngineOptions::lora).
  std::string lora_name;

  static constexpr int32_t kMaxLogprobs = 20;
  static constexpr int32_t kMaxSpeculativeTokens = 16;

  // InvalidArgument naming the field and the accepted range. `vocab_size` bounds token ids.
  absl::Status Validate(int64_t vocab_size) const;
  bool greedy() const { return temperature == 0.0f || top_k == 1; }
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_SAMPLING_SAMPLING_PARAMS_H_
