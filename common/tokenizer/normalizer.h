// The "normalizer" of tokenizer.json: text -> text before pre-tokenization. Supported: NFC, NFD,
// NFKC, NFKD (ICU), Prepend, Replace (string or regex), Lowercase, Strip, Sequence.
// Immutable after Parse; thread-safe.
#ifndef PDSERVE_COMMON_TOKENIZER_NORMALIZER_H_
#define PDSERVE_COMMON_TOKENIZER_NORMALIZER_H_

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"

namespace pdserve {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // `text` is valid UTF-8; so is the result.
  virtual std::string Normalize(std::string_view text) const = 0;

  // nullptr for a JSON null. Unimplemented naming the type for anything unsupported.
  static absl::StatusOr<std::unique_ptr<Normalizer>> Parse(const nlohmann::json& j);
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_TOKENIZER_NORMALIZER_H_
