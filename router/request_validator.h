// The public edge's check of a Generate request: every field, with InvalidArgument naming the
// field and the reason, and the prompt tokenized. No gRPC, no workers: the router calls it, and
// so does its fuzzer.
#ifndef PDSERVE_ROUTER_REQUEST_VALIDATOR_H_
#define PDSERVE_ROUTER_REQUEST_VALIDATOR_H_

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/sampling/sampling_params.h"
#include "common/tokenizer/tokenizer.h"
#include "pdserve/v1/generation.pb.h"

namespace pdserve {

// What the router sends down for one validated request.
struct RoutedRequest {
  std::string request_id;     // The client's, or one the router made.
  std::string downstream_id;  // Unique across routers and clients: the workers' id for it.
  std::vector<int32_t> prompt;
  SamplingParams params;  // seed resolved
  std::vector<std::string> stop;
  bool include_stop_str = false;  // The matched stop string stays at the end of the text.
  bool skip_special_tokens = true;
  std::chrono::system_clock::time_point deadline;
};

struct RequestLimits {
  int64_t vocab_size = 0;
  int64_t context_length = 0;  // Prompt + max_tokens must fit.
  size_t max_stop_strings = 16;
  size_t max_stop_string_bytes = 256;
  size_t max_request_id_bytes = 256;
};

// Fills everything but the ids; `deadline` is the call's (a shorter timeout_ms wins). The seed
// is the request's, or `fallback_seed` when it has none.
absl::StatusOr<RoutedRequest> ValidateGenerateRequest(const v1::GenerateRequest& request,
                                                      const Tokenizer& tokenizer,
                                                      const RequestLimits& limits,
                                                      std::chrono::system_clock::time_point deadline,
                                                      uint64_t fallback_seed);

}  // namespace pdserve

#endif  // PDSERVE_ROUTER_REQUEST_VALIDATOR_H_
