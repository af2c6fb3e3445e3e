#include "common/base/hex.h"

namespace pdserve {

std::string HexEncode(std::string_view bytes) {
  static const char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out;
}

absl::StatusOr<std::string> HexDecode(std::string_view hex) {
  if (hex.size() % 2 != 0) return absl::InvalidArgumentError("odd number of hex digits");
  auto value = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) {
    const int hi = value(hex[2 * i]), lo = value(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return absl::InvalidArgumentError("not a hex digit");
    out[i] = static_cast<char>(hi * 16 + lo);
  }
  return out;
}

}  // namespace pdserve
