#include "decode_service/decode_messages.h"

#include "common/rpc/proto_convert.h"
#include "common/rpc/sampling_proto.h"

namespace pdserve {

DecodeJob ToDecodeJob(const internal::v1::DecodeRequest& request, std::string traceparent,
                      std::string tracestate) {
  DecodeJob job;
  job.traceparent = std::move(traceparent);
  job.tracestate = std::move(tracestate);
  job.request_id = request.request_id();
  job.prompt.assign(request.prompt_ids().begin(), request.prompt_ids().end());
  job.params = FromProto(request.sampling(), request.seed());
  job.prefill_address = request.prefill_address();
  job.resume.assign(request.resume_output_ids().begin(), request.resume_output_ids().end());
  return job;
}

void ToDecodeResponse(const RequestOutput& output, internal::v1::DecodeResponse* out) {
  for (const TokenOutput& t : output.tokens) {
    out->add_token_ids(t.token);
    out->add_logprobs(t.logprob);
    FillTopLogprobs(t, out->add_top_logprobs());
  }
  if (output.finished) {
    out->set_finish_reason(output.finish_reason);
    out->mutable_usage()->set_prompt_tokens(static_cast<int32_t>(output.prompt_tokens));
    out->mutable_usage()->set_completion_tokens(static_cast<int32_t>(output.completion_tokens));
    out->mutable_usage()->set_cached_tokens(static_cast<int32_t>(output.cached_tokens));
  }
}

}  // namespace pdserve
