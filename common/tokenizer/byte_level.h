// GPT-2's reversible map between bytes and printable code points, used by byte-level BPE
// (GPT-2, Llama 3, Qwen2/3): every byte becomes one visible character before BPE runs.
#ifndef PDSERVE_COMMON_TOKENIZER_BYTE_LEVEL_H_
#define PDSERVE_COMMON_TOKENIZER_BYTE_LEVEL_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace pdserve {

// Code point standing for byte b.
uint32_t ByteToCodePoint(uint8_t b);
// The byte a code point stands for, or nullopt if it is not one of the 256.
std::optional<uint8_t> CodePointToByte(uint32_t cp);
// Maps every byte of `bytes` to its character (UTF-8 encoded).
std::string BytesToByteLevel(std::string_view bytes);
// The inverse; characters outside the map are copied through as UTF-8.
std::string ByteLevelToBytes(std::string_view text);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_TOKENIZER_BYTE_LEVEL_H_
