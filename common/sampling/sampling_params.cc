#include "common/sampling/sampling_params.h"

#include <cmath>

#include "common/base/strings.h"

namespace pdserve {
namespace {

absl::Status Bad(const char* field, const std::string& why) {
  return absl::InvalidArgumentError(Str(field, ": ", why));
}

}  // namespace

absl::Status SamplingParams::Validate(int64_t vocab_size) const {
  if (!std::isfinite(temperature) || temperature < 0) {
    return Bad("temperature", Str("must be >= 0, got ", temperature));
  }
  if (top_k < -1) return Bad("top_k", Str("must be -1, 0 (off) or positive, got ", top_k));
  if (!(top_p > 0 && top_p <= 1)) return Bad("top_p", Str("must be in (0, 1], got ", top_p));
  if (!(min_p >= 0 && min_p <= 1)) return Bad("min_p", Str("must be in [0, 1], got ", min_p));
  if (!(repetition_penalty > 0) || !std::isfinite(repetition_penalty)) {
    return Bad("repetition_penalty", Str("must be > 0, got ", repetition_penalty));
  }
  if (!(frequency_penalty >= -2 && frequency_penalty <= 2)) {
    return Bad("frequency_penalty", Str("must be in [-2, 2], got ", frequency_penalty));
  }
  if (!(presence_penalty >= -2 && presence_penalty <= 2)) {
    return Bad("presence_penalty", Str("must be in [-2, 2], got ", presence_penalty));
  }
  if (max_tokens < 1) return Bad("max_tokens", Str("must be >= 1, got ", max_tokens));
  if (logprobs < 0 || logprobs > kMaxLogprobs) {
    return Bad("logprobs", Str("must be in [0, ", kMaxLogprobs, "], got ", logprobs));
  }
  if (num_speculative_tokens < -1 || num_speculative_tokens > kMaxSpeculativeTokens) {
    return Bad("num_speculative_tokens", Str("must be -1 (the worker's setting), 0 (off) or up to ",
                                             kMaxSpeculativeTokens, ", got ",
                                             num_speculative_tokens));
  }
  for (int32_t id : stop_token_ids) {
    if (id < 0 || id >= vocab_size) {
      return Bad("stop_token_ids", Str("holds ", id, ", outside the vocabulary of ", vocab_size));
    }
  }
  return absl::OkStatus();
}

}  // namespace pdserve
