// UTF-8 helpers for the tokenizer. Pure functions, thread-safe.
#ifndef PDSERVE_COMMON_TOKENIZER_UNICODE_H_
#define PDSERVE_COMMON_TOKENIZER_UNICODE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace pdserve {

// True when `text` is well-formed UTF-8 (no overlongs, surrogates or code points > U+10FFFF).
// On failure *bad_offset (if given) is the byte offset of the first bad sequence.
bool IsValidUtf8(std::string_view text, size_t* bad_offset = nullptr);

// Decodes the code point at text[*pos] and advances *pos. Requires valid UTF-8.
uint32_t NextCodePoint(std::string_view text, size_t* pos);

void AppendUtf8(uint32_t code_point, std::string* out);

// Replaces each invalid sequence by U+FFFD, as Rust's String::from_utf8_lossy does (which is what
// Hugging Face tokenizers return when decoded bytes are not UTF-8).
std::string Utf8Lossy(std::string_view bytes);

// The Unicode White_Space property (what `\s` means in the regexes of tokenizer.json files).
bool IsUnicodeWhitespace(uint32_t cp);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_TOKENIZER_UNICODE_H_
