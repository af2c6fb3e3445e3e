// Wire sampling parameters (pdserve.v1.SamplingParams) to the sampler's. Protobuf only.
#ifndef PDSERVE_COMMON_RPC_SAMPLING_PROTO_H_
#define PDSERVE_COMMON_RPC_SAMPLING_PROTO_H_

#include <cstdint>
#include <memory>
#include <optional>

#include "common/sampling/sampling_params.h"
#include "pdserve/v1/generation.pb.h"

namespace pdserve {

// vLLM's defaults for unset fields. `seed` overrides the message's (the router resolves one per
// request). Stop strings are the router's business and are not copied.
SamplingParams FromProto(const v1::SamplingParams& p, std::optional<uint64_t> seed);

// Structured outputs' constraint from and to the wire (null: none set).
std::shared_ptr<const structured::OutputConstraint> FromProto(const v1::Constraint& c);
void ToProto(const structured::OutputConstraint& c, v1::Constraint* out);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_RPC_SAMPLING_PROTO_H_
