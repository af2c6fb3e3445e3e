#include "common/rpc/stream_coalesce.h"

namespace pdserve {

bool CoalesceDecodeResponse(internal::v1::DecodeResponse& waiting,
                            const internal::v1::DecodeResponse& next) {
  if (!waiting.finish_reason().empty() || waiting.token_ids_size() >= kMaxFoldedTokens) return false;
  if (waiting.step_tokens_size() == 0) waiting.add_step_tokens(waiting.token_ids_size());
  if (next.step_tokens_size() == 0) {
    waiting.add_step_tokens(next.token_ids_size());
  } else {
    waiting.mutable_step_tokens()->MergeFrom(next.step_tokens());
  }
  waiting.mutable_token_ids()->MergeFrom(next.token_ids());
  waiting.mutable_logprobs()->MergeFrom(next.logprobs());
  waiting.mutable_top_logprobs()->MergeFrom(next.top_logprobs());
  waiting.set_finish_reason(next.finish_reason());
  if (next.has_usage()) *waiting.mutable_usage() = next.usage();
  return true;
}

std::vector<internal::v1::DecodeResponse> SplitDecodeResponse(const internal::v1::DecodeResponse& folded) {
  int64_t sum = 0;
  for (int32_t n : folded.step_tokens()) {
    if (n < 0) return {folded};
    sum += n;
  }
  const bool aligned = folded.logprobs_size() == folded.token_ids_size() &&
                       folded.top_logprobs_size() == folded.token_ids_size();
  if (folded.step_tokens_size() <= 1 || sum != folded.token_ids_size() || !aligned) return {folded};
  std::vector<internal::v1::DecodeResponse> steps(folded.step_tokens_size());
  int at = 0;
  for (int s = 0; s < folded.step_tokens_size(); ++s) {
    internal::v1::DecodeResponse& step = steps[s];
    for (int end = at + folded.step_tokens(s); at < end; ++at) {
      step.add_token_ids(folded.token_ids(at));
      step.add_logprobs(folded.logprobs(at));
      *step.add_top_logprobs() = folded.top_logprobs(at);
    }
  }
  // A step without tokens carries nothing alone (the last keeps the finish reason).
  std::vector<internal::v1::DecodeResponse> kept;
  for (size_t s = 0; s < steps.size(); ++s) {
    if (steps[s].token_ids_size() > 0 || s + 1 == steps.size()) kept.push_back(std::move(steps[s]));
  }
  steps = std::move(kept);
  steps.back().set_finish_reason(folded.finish_reason());
  if (folded.has_usage()) *steps.back().mutable_usage() = folded.usage();
  return steps;
}

bool CoalesceGenerateResponse(v1::GenerateResponse& waiting, const v1::GenerateResponse& next) {
  if (!waiting.finish_reason().empty() || waiting.token_ids_size() >= kMaxFoldedTokens) return false;
  waiting.mutable_token_ids()->MergeFrom(next.token_ids());
  waiting.mutable_logprobs()->MergeFrom(next.logprobs());
  waiting.mutable_top_logprobs()->MergeFrom(next.top_logprobs());
  waiting.mutable_text()->append(next.text());
  waiting.set_finish_reason(next.finish_reason());
  if (next.has_usage()) *waiting.mutable_usage() = next.usage();
  return true;
}

}  // namespace pdserve
