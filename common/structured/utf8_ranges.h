// Code point ranges as UTF-8 byte-range sequences: how a character class of the grammar syntax
// becomes rules over bytes. The classic split (as RE2 and Go's regexp compile classes): a range
// is cut where the encoded length changes and where a continuation byte would not span its
// whole 0x80-0xBF, until each piece is a product of per-byte ranges.
#ifndef PDSERVE_COMMON_STRUCTURED_UTF8_RANGES_H_
#define PDSERVE_COMMON_STRUCTURED_UTF8_RANGES_H_

#include <cstdint>
#include <utility>
#include <vector>

namespace pdserve::structured {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;

using CodeRanges = std::vector<std::pair<uint32_t, uint32_t>>;  // Inclusive.
using ByteRange = std::pair<uint8_t, uint8_t>;  // Inclusive.
using ByteRangeSequence = std::vector<ByteRange>;

// Appends to *out the sequences whose byte strings are exactly the UTF-8 encodings of the code
// points lo..hi (inclusive, lo <= hi <= kMaxCodePoint; surrogates are the caller's to exclude).
void Utf8Sequences(uint32_t lo, uint32_t hi, std::vector<ByteRangeSequence>* out);

// Sorted, merged, without the surrogates.
CodeRanges NormalizeRanges(CodeRanges r);
// The code points outside `r` (normalized).
CodeRanges ComplementRanges(const CodeRanges& r);

// The UTF-8 encoding of one code point (1-4 bytes) into buf; returns its length.
int EncodeUtf8(uint32_t code_point, uint8_t buf[4]);

}  // namespace pdserve::structured

#endif  // PDSERVE_COMMON_STRUCTURED_UTF8_RANGES_H_
