// libFuzzer target: the public edge on arbitrary bytes: the lenient GenerateRequest parser, then
// every field's validation with a real tokenizer. Accepted requests must be within the limits.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/tokenizer/tokenizer.h"
#include "fuzz/trained_tokenizer.h"
#include "router/lenient_request.h"
#include "router/request_validator.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto request = pdserve::ParseGenerateRequest(std::string(reinterpret_cast<const char*>(data), size));
  if (!request.ok()) return 0;
  pdserve::RequestLimits limits;
  limits.vocab_size = 1024;
  limits.context_length = 512;
  auto routed = pdserve::ValidateGenerateRequest(*request, pdserve::FuzzTokenizer(), limits,
                                                 std::chrono::system_clock::now(), 7);
  if (routed.ok()) {
    if (routed->prompt.empty() || static_cast<int64_t>(routed->prompt.size()) >= limits.context_length) {
      __builtin_trap();
    }
    for (int32_t id : routed->prompt) {
      if (id < 0 || id >= limits.vocab_size) __builtin_trap();
    }
    if (routed->stop.size() > limits.max_stop_strings) __builtin_trap();
    if (routed->params.logprobs > pdserve::SamplingParams::kMaxLogprobs) __builtin_trap();
  } else if (routed.status().code() != absl::StatusCode::kInvalidArgument) {
    __builtin_trap();
  }
  return 0;
}
