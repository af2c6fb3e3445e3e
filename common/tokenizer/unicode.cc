#include "common/tokenizer/unicode.h"

namespace pdserve {
namespace {

// Length of the valid UTF-8 sequence at text[pos], or 0 if it is invalid (WHATWG / Rust rules:
// the maximal invalid prefix is replaced by one U+FFFD).
size_t ValidSequenceLength(std::string_view text, size_t pos, size_t* invalid_len) {
  const auto b = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
  const uint8_t c = b(pos);
  *invalid_len = 1;
  if (c < 0x80) return 1;
  size_t need;
  uint8_t lo = 0x80, hi = 0xbf;
  if (c >= 0xc2 && c <= 0xdf) {
    need = 1;
  } else if (c >= 0xe0 && c <= 0xef) {
    need = 2;
    if (c == 0xe0) lo = 0xa0;
    if (c == 0xed) hi = 0x9f;  // No surrogates.
  } else if (c >= 0xf0 && c <= 0xf4) {
    need = 3;
    if (c == 0xf0) lo = 0x90;
    if (c == 0xf4) hi = 0x8f;
  } else {
    return 0;
  }
  for (size_t k = 1; k <= need; ++k) {
    if (pos + k >= text.size()) {
      *invalid_len = k;
      return 0;
    }
    const uint8_t x = b(pos + k);
    const uint8_t l = k == 1 ? lo : 0x80;
    const uint8_t h = k == 1 ? hi : 0xbf;
    if (x < l || x > h) {
      *invalid_len = k;
      return 0;
    }
  }
  return need + 1;
}

}  // namespace

bool IsValidUtf8(std::string_view text, size_t* bad_offset) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t invalid_len;
    const size_t n = ValidSequenceLength(text, pos, &invalid_len);
    if (n == 0) {
      if (bad_offset) *bad_offset = pos;
      return false;
    }
    pos += n;
  }
  return true;
}

uint32_t NextCodePoint(std::string_view text, size_t* pos) {
  const uint8_t c = static_cast<uint8_t>(text[*pos]);
  if (c < 0x80) {
    ++*pos;
    return c;
  }
  int extra = c >= 0xf0 ? 3 : c >= 0xe0 ? 2 : 1;
  uint32_t cp = c & (0x3f >> extra);
  ++*pos;
  while (extra-- > 0 && *pos < text.size()) {
    cp = (cp << 6) | (static_cast<uint8_t>(text[*pos]) & 0x3f);
    ++*pos;
  }
  return cp;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xc0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xe0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else {
    out->push_back(static_cast<char>(0xf0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
}

std::string Utf8Lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t pos = 0;
  while (pos < bytes.size()) {
    size_t invalid_len;
    const size_t n = ValidSequenceLength(bytes, pos, &invalid_len);
    if (n == 0) {
      out += "\xEF\xBF\xBD";
      pos += invalid_len;
    } else {
      out.append(bytes.substr(pos, n));
      pos += n;
    }
  }
  return out;
}

bool IsUnicodeWhitespace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0d) || cp == 0x20 || cp == 0x85 || cp == 0xa0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f ||
         cp == 0x205f || cp == 0x3000;
}

}  // namespace pdserve
