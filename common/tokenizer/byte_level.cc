#include "common/tokenizer/byte_level.h"

#include <array>

#include "common/tokenizer/unicode.h"

namespace pdserve {
namespace {

struct Tables {
  std::array<uint32_t, 256> to_cp;
  std::array<int16_t, 324> from_cp;  // Every mapped code point is below 324.
  std::array<std::string, 256> to_utf8;
  Tables() {
    from_cp.fill(-1);
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      to_cp[b] = printable ? static_cast<uint32_t>(b) : next++;
      from_cp[to_cp[b]] = static_cast<int16_t>(b);
      AppendUtf8(to_cp[b], &to_utf8[b]);
    }
  }
};

const Tables& GetTables() {
  static const Tables tables;
  return tables;
}

}  // namespace

uint32_t ByteToCodePoint(uint8_t b) { return GetTables().to_cp[b]; }

std::optional<uint8_t> CodePointToByte(uint32_t cp) {
  if (cp >= 324) return std::nullopt;
  const int16_t b = GetTables().from_cp[cp];
  if (b < 0) return std::nullopt;
  return static_cast<uint8_t>(b);
}

std::string BytesToByteLevel(std::string_view bytes) {
  const Tables& t = GetTables();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out += t.to_utf8[static_cast<uint8_t>(c)];
  return out;
}

std::string ByteLevelToBytes(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t start = pos;
    const uint32_t cp = NextCodePoint(text, &pos);
    if (auto b = CodePointToByte(cp)) {
      out.push_back(static_cast<char>(*b));
    } else {
      out.append(text.substr(start, pos - start));
    }
  }
  return out;
}

}  // namespace pdserve
