#include "router/request_validator.h"

#include <algorithm>
#include <optional>

#include "common/base/strings.h"
#include "common/model/lora_registry.h"
#include "common/rpc/sampling_proto.h"
#include "common/structured/constraint.h"
#include "common/tokenizer/unicode.h"

namespace pdserve {
namespace {

// A LoRA adapter's name, as a request names it (an unknown one is echoed in the error).

absl::Status Invalid(std::string_view field, std::string_view why) {
  return absl::InvalidArgumentError(Str(field, ": ", why));
}

}  // namespace

absl::StatusOr<RoutedRequest> ValidateGenerateRequest(const v1::GenerateRequest& request,
                                                      const Tokenizer& tokenizer,
                                                      const RequestLimits& limits,
                                                      std::chrono::system_clock::time_point deadline,
                                                      uint64_t fallback_seed) {
  RoutedRequest out;
  if (request.request_id().size() > limits.max_request_id_bytes) {
    return Invalid("request_id", Str("is longer than ", limits.max_request_id_bytes, " bytes"));
  }
  const int64_t vocab = limits.vocab_size;
  switch (request.prompt_case()) {
    case v1::GenerateRequest::kText: {
      if (request.text().empty()) return Invalid("prompt.text", "is empty");
      size_t bad = 0;
      if (!IsValidUtf8(request.text(), &bad)) {
        return Invalid("prompt.text", Str("is not valid UTF-8 (first bad byte at offset ", bad, ")"));
      }
      // A text that cannot fit the context whatever it encodes to is refused before the work of
      // encoding it (a 10 MB prompt costs a second of CPU).
      if (request.text().size() > tokenizer.MaxTextBytes(limits.context_length)) {
        return Invalid("prompt", Str("a text of ", request.text().size(),
                                     " bytes is more tokens than the context length of ",
                                     limits.context_length));
      }
      auto ids = tokenizer.Encode(request.text(),
                                  request.has_add_special_tokens() ? request.add_special_tokens() : true);
      if (!ids.ok()) return Invalid("prompt.text", std::string(ids.status().message()));
      out.prompt = std::move(*ids);
      break;
    }
    case v1::GenerateRequest::kTokenIds:
      out.prompt.assign(request.token_ids().ids().begin(), request.token_ids().ids().end());
      if (out.prompt.empty()) return Invalid("prompt.token_ids", "is empty");
      for (size_t i = 0; i < out.prompt.size(); ++i) {
        if (out.prompt[i] < 0 || out.prompt[i] >= vocab) {
          return Invalid("prompt.token_ids", Str("id ", out.prompt[i], " at position ", i,
                                                 " is outside the vocabulary of ", vocab));
        }
      }
      break;
    default:
      return Invalid("prompt", "is missing (set text or token_ids)");
  }
  if (out.prompt.empty()) return Invalid("prompt", "is empty");
  const int64_t context = limits.context_length;
  if (static_cast<int64_t>(out.prompt.size()) >= context) {
    return Invalid("prompt", Str(out.prompt.size(), " tokens do not fit the context length of ",
                                 context, " (at least one token must be generated)"));
  }
  const v1::SamplingParams& sp = request.sampling();
  if (sp.has_max_tokens() && sp.max_tokens() < 1) {
    return Invalid("sampling.max_tokens", Str("must be >= 1, got ", sp.max_tokens()));
  }
  if (sp.has_max_tokens() && static_cast<int64_t>(out.prompt.size()) + sp.max_tokens() > context) {
    return Invalid("sampling.max_tokens",
                   Str(sp.max_tokens(), " plus the ", out.prompt.size(),
                       "-token prompt exceed the context length of ", context));
  }
  if (sp.lora_name().size() > kMaxLoraNameBytes) {
    return Invalid("sampling.lora_name", Str("is ", sp.lora_name().size(), " bytes; at most ",
                                             kMaxLoraNameBytes));
  }
  out.params = FromProto(sp, sp.has_seed() ? sp.seed() : fallback_seed);
  if (!sp.has_max_tokens() && sp.max_tokens_to_context()) {
    out.params.max_tokens = static_cast<int32_t>(
        std::min<int64_t>(context - static_cast<int64_t>(out.prompt.size()), INT32_MAX));
  }
  if (absl::Status s = out.params.Validate(vocab); !s.ok()) {
    return absl::InvalidArgumentError(Str("sampling.", s.message()));
  }
  if (out.params.constraint != nullptr) {
    // Compiled here to answer a bad constraint at once; workers compile it again (cached).
    if (auto g = structured::CompileConstraint(*out.params.constraint); !g.ok()) {
      return absl::InvalidArgumentError(Str("sampling.constraint.", g.status().message()));
    }
  } else if (sp.has_constraint() && sp.constraint().kind_case() == v1::Constraint::KIND_NOT_SET) {
    return Invalid("sampling.constraint", "sets none of json_schema, json_object, regex, choice, grammar");
  }
  if (static_cast<size_t>(sp.stop_size()) > limits.max_stop_strings) {
    return Invalid("sampling.stop", Str("has ", sp.stop_size(), " strings; at most ",
                                        limits.max_stop_strings));
  }
  for (const std::string& s : sp.stop()) {
    if (s.empty() || s.size() > limits.max_stop_string_bytes || !IsValidUtf8(s)) {
      return Invalid("sampling.stop", Str("each stop string must be 1..",
                                          limits.max_stop_string_bytes, " bytes of UTF-8"));
    }
    out.stop.push_back(s);
  }
  out.skip_special_tokens = sp.has_skip_special_tokens() ? sp.skip_special_tokens() : true;
  out.include_stop_str = sp.include_stop_str_in_output();
  out.deadline = deadline;
  if (request.timeout_ms() > 0) {
    out.deadline = std::min(deadline, std::chrono::system_clock::now() +
                                          std::chrono::milliseconds(request.timeout_ms()));
  }
  return out;
}

}  // namespace pdserve
