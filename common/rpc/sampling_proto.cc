#include "common/rpc/sampling_proto.h"

namespace pdserve {

SamplingParams FromProto(const v1::SamplingParams& p, std::optional<uint64_t> seed) {
  SamplingParams s;
  if (p.has_temperature()) s.temperature = p.temperature();
  if (p.has_top_p()) s.top_p = p.top_p();
  s.top_k = p.top_k();
  s.min_p = p.min_p();
  if (p.has_repetition_penalty()) s.repetition_penalty = p.repetition_penalty();
  s.frequency_penalty = p.frequency_penalty();
  s.presence_penalty = p.presence_penalty();
  if (seed) {
    s.seed = *seed;
  } else if (p.has_seed()) {
    s.seed = p.seed();
  }
  if (p.has_max_tokens()) s.max_tokens = p.max_tokens();
  s.stop_token_ids.assign(p.stop_token_ids().begin(), p.stop_token_ids().end());
  s.ignore_eos = p.ignore_eos();
  s.logprobs = p.logprobs();
  if (p.has_num_speculative_tokens()) s.num_speculative_tokens = p.num_speculative_tokens();
  return s;
}

}  // namespace pdserve
