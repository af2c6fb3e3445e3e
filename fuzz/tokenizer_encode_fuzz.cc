// libFuzzer target: encoding arbitrary text with a byte-level BPE tokenizer (Llama 3 layout,
// trained by pdserve make-model's trainer), then decoding: valid UTF-8 must come back unchanged.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/unicode.h"
#include "fuzz/trained_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const pdserve::Tokenizer& t = pdserve::FuzzTokenizer();
  auto ids = t.Encode(text, /*add_special_tokens=*/false);
  if (!ids.ok()) {
    if (pdserve::IsValidUtf8(text)) __builtin_trap();  // Only invalid UTF-8 may be refused.
    return 0;
  }
  // Byte-level BPE round-trips (without Hugging Face's clean-up of spaces before punctuation,
  // which this tokenizer_config.json asks for and which is not reversible).
  auto back = t.Decode(*ids, pdserve::DecodeOptions{false, false});
  if (!back.ok() || *back != text) __builtin_trap();
  (void)t.Encode(text, /*add_special_tokens=*/true);
  return 0;
}
