#include "common/tracing/trace_context.h"

namespace pdserve {
namespace {

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;  // Upper case is invalid in traceparent.
}

template <size_t N>
bool ParseHex(std::string_view s, std::array<uint8_t, N>* out) {
  if (s.size() != 2 * N) return false;
  for (size_t i = 0; i < N; ++i) {
    const int hi = HexDigit(s[2 * i]), lo = HexDigit(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    (*out)[i] = static_cast<uint8_t>(hi * 16 + lo);
  }
  return true;
}

template <size_t N>
bool AllZero(const std::array<uint8_t, N>& a) {
  for (uint8_t b : a) {
    if (b != 0) return false;
  }
  return true;
}

}  // namespace

bool TraceContext::valid() const { return !AllZero(trace_id) && !AllZero(span_id); }

std::optional<TraceContext> ParseTraceparent(std::string_view h) {
  // version "-" trace-id "-" parent-id "-" flags: 2 + 1 + 32 + 1 + 16 + 1 + 2 = 55 characters;
  // a later version may append "-" and more.
  if (h.size() < 55 || h[2] != '-' || h[35] != '-' || h[52] != '-') return std::nullopt;
  std::array<uint8_t, 1> version{}, flags{};
  if (!ParseHex(h.substr(0, 2), &version) || version[0] == 0xff) return std::nullopt;
  if (h.size() > 55 && (version[0] == 0 || h[55] != '-')) return std::nullopt;
  TraceContext c;
  if (!ParseHex(h.substr(3, 32), &c.trace_id) || !ParseHex(h.substr(36, 16), &c.span_id) ||
      !ParseHex(h.substr(53, 2), &flags)) {
    return std::nullopt;
  }
  if (!c.valid()) return std::nullopt;
  c.flags = flags[0];
  return c;
}

std::string HexId(const uint8_t* bytes, size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = kDigits[bytes[i] >> 4];
    out[2 * i + 1] = kDigits[bytes[i] & 15];
  }
  return out;
}

std::string FormatTraceparent(const TraceContext& c) {
  return "00-" + HexId(c.trace_id.data(), 16) + "-" + HexId(c.span_id.data(), 8) + "-" +
         HexId(&c.flags, 1);
}

}  // namespace pdserve
