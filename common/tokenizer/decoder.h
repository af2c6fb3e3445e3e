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
  // One token's string to the bytes it adds in the middle of a text: the chain without what only
  // touches a text's ends (a first token's stripped space, Strip after Fuse) and without the
  // repair of invalid UTF-8 (a token may hold part of a character). `fused`: a Fuse came before
  // (later steps then see whole texts).
  virtual void MidSequence(std::string* token, bool* fused) const = 0;

  // nullptr for a JSON null (tokens are then joined as they are).
  static absl::StatusOr<std::unique_ptr<Decoder>> Parse(const nlohmann::json& j);
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_TOKENIZER_DECODER_H_
