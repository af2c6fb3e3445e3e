// libFuzzer target: tokenizer.json loading (and, when it loads, encoding and decoding with it,
// and each token's bytes).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view json(reinterpret_cast<const char*>(data), size);
  auto tokenizer = pdserve::Tokenizer::FromJson(json, "", "fuzz/tokenizer.json");
  if (tokenizer.ok()) {
    auto ids = (*tokenizer)->Encode("Hello, world! 123 éà", true);
    if (ids.ok()) {
      (void)(*tokenizer)->Decode(*ids, false);
      for (int32_t id : *ids) (void)(*tokenizer)->TokenBytes(id);  // Each decoder's MidSequence.
    }
    (void)(*tokenizer)->TokenBytes(-1);
  }
  return 0;
}
