#include "common/structured/utf8_ranges.h"

#include <algorithm>

namespace pdserve::structured {

int EncodeUtf8(uint32_t c, uint8_t buf[4]) {
  if (c < 0x80) {
    buf[0] = static_cast<uint8_t>(c);
    return 1;
  }
  if (c < 0x800) {
    buf[0] = static_cast<uint8_t>(0xC0 | (c >> 6));
    buf[1] = static_cast<uint8_t>(0x80 | (c & 0x3F));
    return 2;
  }
  if (c < 0x10000) {
    buf[0] = static_cast<uint8_t>(0xE0 | (c >> 12));
    buf[1] = static_cast<uint8_t>(0x80 | ((c >> 6) & 0x3F));
    buf[2] = static_cast<uint8_t>(0x80 | (c & 0x3F));
    return 3;
  }
  buf[0] = static_cast<uint8_t>(0xF0 | (c >> 18));
  buf[1] = static_cast<uint8_t>(0x80 | ((c >> 12) & 0x3F));
  buf[2] = static_cast<uint8_t>(0x80 | ((c >> 6) & 0x3F));
  buf[3] = static_cast<uint8_t>(0x80 | (c & 0x3F));
  return 4;
}

void Utf8Sequences(uint32_t lo, uint32_t hi, std::vector<ByteRangeSequence>* out) {
  // Where the encoded length changes.
  for (uint32_t limit : {0x7Fu, 0x7FFu, 0xFFFFu}) {
    if (lo <= limit && limit < hi) {
      Utf8Sequences(lo, limit, out);
      Utf8Sequences(limit + 1, hi, out);
      return;
    }
  }
  uint8_t a[4], b[4];
  const int n = EncodeUtf8(lo, a);
  // Where the low i continuation bytes would not run their whole range in each step.
  for (int i = 1; i < n; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        Utf8Sequences(lo, lo | m, out);
        Utf8Sequences((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        Utf8Sequences(lo, (hi & ~m) - 1, out);
        Utf8Sequences(hi & ~m, hi, out);
        return;
      }
    }
  }
  EncodeUtf8(hi, b);
  ByteRangeSequence seq;
  for (int i = 0; i < n; ++i) seq.push_back({a[i], b[i]});
  out->push_back(std::move(seq));
}

CodeRanges NormalizeRanges(CodeRanges r) {
  std::sort(r.begin(), r.end());
  CodeRanges merged;
  for (const auto& [lo, hi] : r) {
    if (!merged.empty() && lo <= merged.back().second + 1) {
      merged.back().second = std::max(merged.back().second, hi);
    } else {
      merged.push_back({lo, hi});
    }
  }
  CodeRanges out;
  for (const auto& [lo, hi] : merged) {
    if (lo < 0xD800 && hi >= 0xD800) {
      out.push_back({lo, 0xD7FF});
      if (hi > 0xDFFF) out.push_back({0xE000, hi});
    } else if (lo >= 0xD800 && lo <= 0xDFFF) {
      if (hi > 0xDFFF) out.push_back({0xE000, hi});
    } else {
      out.push_back({lo, hi});
    }
  }
  return out;
}

CodeRanges ComplementRanges(const CodeRanges& r) {
  CodeRanges out;
  uint32_t next = 0;
  for (const auto& [lo, hi] : r) {
    if (lo > next) out.push_back({next, lo - 1});
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) out.push_back({next, kMaxCodePoint});
  return NormalizeRanges(out);
}

}  // namespace pdserve::structured
