// The "decoder" of tokenizer.json: token strings -> text. Supported: ByteLevel, Metaspace,
// Replace, ByteFallback, Fuse, Strip, Sequence. Immutable after Parse; thread-safe.
#ifndef PDSERVE_COMMON_TOKENIZER_DECODER_H_
#define PDSERVE_COMMON_TOKENIZER_DECODER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"

namespace pdserve {

class Decoder {
 public:
  virtual ~Decoder() = default;
  // Rewrites the token strings in place (some steps fuse them into one).
  virtual void DecodeChain(std::vector<std::string>* tokens) const = 0;

  // nullptr for a JSON null (tokens are then joined as they are).
  static absl::StatusOr<std::unique_ptr<Decoder>> Parse(const nlohmann::json& j);
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_TOKENIZER_DECODER_H_
