// Parsing public requests whose string fields may not be UTF-8 (see lenient.proto).
#ifndef PDSERVE_ROUTER_LENIENT_REQUEST_H_
#define PDSERVE_ROUTER_LENIENT_REQUEST_H_

#include <string>

#include "absl/status/statusor.h"
#include "pdserve/v1/generation.pb.h"

namespace pdserve {

// InvalidArgument naming the field when a string is not UTF-8 ("prompt.text", "request_id",
// "sampling.stop") or the bytes are not a request at all.
absl::StatusOr<v1::GenerateRequest> ParseGenerateRequest(const std::string& bytes);
absl::StatusOr<v1::TokenizeRequest> ParseTokenizeRequest(const std::string& bytes);

}  // namespace pdserve

#endif  // PDSERVE_ROUTER_LENIENT_REQUEST_H_
