#include "router/lenient_request.h"

#include "common/base/strings.h"
#include "common/tokenizer/unicode.h"
#include "pdserve/internal/v1/lenient.pb.h"

namespace pdserve {
namespace {

absl::Status CheckUtf8(const std::string& s, std::string_view field) {
  size_t bad = 0;
  if (IsValidUtf8(s, &bad)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      Str(field, ": is not valid UTF-8 (first bad byte at offset ", bad, ")"));
}

// Lenient and strict messages share the wire format: once the strings are known to be UTF-8,
// re-parse the same bytes strictly.
template <typename Strict>
absl::StatusOr<Strict> Reparse(const std::string& bytes) {
  Strict strict;
  if (!strict.ParseFromString(bytes)) return absl::InvalidArgumentError("malformed request");
  return strict;
}

}  // namespace

absl::StatusOr<v1::GenerateRequest> ParseGenerateRequest(const std::string& bytes) {
  internal::v1::LenientGenerateRequest lenient;
  if (!lenient.ParseFromString(bytes)) {
    return absl::InvalidArgumentError("request: not a pdserve.v1.GenerateRequest");
  }
  if (absl::Status s = CheckUtf8(lenient.request_id(), "request_id"); !s.ok()) return s;
  if (lenient.has_text()) {
    if (absl::Status s = CheckUtf8(lenient.text(), "prompt.text"); !s.ok()) return s;
  }
  for (const std::string& stop : lenient.sampling().stop()) {
    if (absl::Status s = CheckUtf8(stop, "sampling.stop"); !s.ok()) return s;
  }
  if (absl::Status s = CheckUtf8(lenient.sampling().lora_name(), "sampling.lora_name"); !s.ok()) return s;
  const auto& c = lenient.sampling().constraint();
  for (const auto& [text, field] : {std::pair{&c.json_schema(), "sampling.constraint.json_schema"},
                                    std::pair{&c.regex(), "sampling.constraint.regex"},
                                    std::pair{&c.grammar(), "sampling.constraint.grammar"},
                                    std::pair{&c.json_whitespace(), "sampling.constraint.json_whitespace"}}) {
    if (absl::Status s = CheckUtf8(*text, field); !s.ok()) return s;
  }
  for (const std::string& choice : c.choice().choices()) {
    if (absl::Status s = CheckUtf8(choice, "sampling.constraint.choice"); !s.ok()) return s;
  }
  return Reparse<v1::GenerateRequest>(bytes);
}

absl::StatusOr<v1::TokenizeRequest> ParseTokenizeRequest(const std::string& bytes) {
  internal::v1::LenientTokenizeRequest lenient;
  if (!lenient.ParseFromString(bytes)) {
    return absl::InvalidArgumentError("request: not a pdserve.v1.TokenizeRequest");
  }
  if (absl::Status s = CheckUtf8(lenient.text(), "text"); !s.ok()) return s;
  return Reparse<v1::TokenizeRequest>(bytes);
}

}  // namespace pdserve
