// Conversions between the wire messages and the engine's types, shared by the tiers.
#ifndef PDSERVE_COMMON_RPC_PROTO_CONVERT_H_
#define PDSERVE_COMMON_RPC_PROTO_CONVERT_H_

#include <string>

#include "absl/status/statusor.h"
#include "common/engine/llm_engine.h"
#include "common/rpc/sampling_proto.h"
#include "common/sampling/sampling_params.h"
#include "pdserve/internal/v1/worker.pb.h"
#include "pdserve/v1/generation.pb.h"

namespace pdserve {

// The worker's KV layout, as a message and as the transport's handshake string.
internal::v1::KvLayout MakeKvLayout(const LLMEngine& engine, const std::string& fingerprint);
std::string LayoutString(const internal::v1::KvLayout& layout);

// A fingerprint of the model's architecture: XXH64 of every ModelConfig field that shapes its
// computation (family, sizes, heads, norm epsilon, rope and its scaling, biases, window, tied
// output), hex. A checkpoint directory and a GGUF file of the same model (any weight format) agree,
// so tiers may load different formats; two models of different shapes never do. (Like the
// safetensors headers it replaced, it cannot tell two fine-tunes of one shape apart.)
absl::StatusOr<std::string> ModelFingerprint(const std::string& model_path);

void FillTopLogprobs(const TokenOutput& t, v1::TokenLogprobs* out);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_RPC_PROTO_CONVERT_H_
