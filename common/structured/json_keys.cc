#include "common/structured/json_keys.h"

namespace pdserve::structured {
namespace {

constexpr uint64_t kFnvBasis = 14695981039346656037ull;
constexpr uint64_t kFnvPrime = 1099511628211ull;

void HashByte(JsonKeyTracker::Lexer& lx, uint8_t b) { lx.hash = (lx.hash ^ b) * kFnvPrime; }

// A decoded code point, hashed as its UTF-8 bytes (so an escape hashes as the raw character).
void HashCodePoint(JsonKeyTracker::Lexer& lx, uint32_t cp) {
  if (cp < 0x80) {
    HashByte(lx, static_cast<uint8_t>(cp));
  } else if (cp < 0x800) {
    HashByte(lx, static_cast<uint8_t>(0xC0 | (cp >> 6)));
    HashByte(lx, static_cast<uint8_t>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    HashByte(lx, static_cast<uint8_t>(0xE0 | (cp >> 12)));
    HashByte(lx, static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F)));
    HashByte(lx, static_cast<uint8_t>(0x80 | (cp & 0x3F)));
  } else {
    HashByte(lx, static_cast<uint8_t>(0xF0 | (cp >> 18)));
    HashByte(lx, static_cast<uint8_t>(0x80 | ((cp >> 12) & 0x3F)));
    HashByte(lx, static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F)));
    HashByte(lx, static_cast<uint8_t>(0x80 | (cp & 0x3F)));
  }
}

// A high surrogate not followed by its low half stands for itself (as Python decodes it).
void FlushHigh(JsonKeyTracker::Lexer& lx) {
  if (lx.high != 0) HashCodePoint(lx, lx.high);
  lx.high = 0;
}

int HexDigit(uint8_t b) {
  if (b >= '0' && b <= '9') return b - '0';
  if (b >= 'a' && b <= 'f') return b - 'a' + 10;
  if (b >= 'A' && b <= 'F') return b - 'A' + 10;
  return 0;  // Not JSON: the grammar never lets it through.
}

}  // namespace

// One byte of the output; false where it closes a key its object has already.
template <typename Frames>
bool StepJsonKeys(JsonKeyTracker::Lexer& lx, Frames& frames, uint8_t b) {
  using Lexer = JsonKeyTracker::Lexer;
  switch (lx.mode) {
    case Lexer::kOutside:
      switch (b) {
        case '{': frames.Push(true); lx.expect_key = true; break;
        case '[': frames.Push(false); lx.expect_key = false; break;
        case '}': case ']': frames.Pop(); lx.expect_key = false; break;
        case ',': lx.expect_key = frames.TopIsObject(); break;
        case ':': lx.expect_key = false; break;
        case '"':
          lx.mode = Lexer::kString;
          lx.key = lx.expect_key && frames.TopIsObject();
          lx.expect_key = false;
          lx.hash = kFnvBasis;
          lx.high = 0;
          break;
        default: break;  // Numbers, literals, whitespace.
      }
      return true;
    case Lexer::kString:
      if (b == '"') {
        FlushHigh(lx);
        lx.mode = Lexer::kOutside;
        if (lx.key) {
          if (frames.Has(lx.hash)) return false;
          frames.Add(lx.hash);
        }
      } else if (b == '\\') {
        lx.mode = Lexer::kEscape;
      } else {
        FlushHigh(lx);
        HashByte(lx, b);
      }
      return true;
    case Lexer::kEscape: {
      if (b == 'u') {
        lx.mode = Lexer::kHex;
        lx.hex_left = 4;
        lx.hex = 0;
        return true;
      }
      FlushHigh(lx);
      uint8_t c = b;  // " \ / stand for themselves.
      switch (b) {
        case 'b': c = '\b'; break;
        case 'f': c = '\f'; break;
        case 'n': c = '\n'; break;
        case 'r': c = '\r'; break;
        case 't': c = '\t'; break;
        default: break;
      }
      HashByte(lx, c);
      lx.mode = Lexer::kString;
      return true;
    }
    case Lexer::kHex:
      lx.hex = lx.hex * 16 + static_cast<uint32_t>(HexDigit(b));
      if (--lx.hex_left > 0) return true;
      lx.mode = Lexer::kString;
      if (lx.high != 0 && lx.hex >= 0xDC00 && lx.hex <= 0xDFFF) {
        HashCodePoint(lx, 0x10000 + ((lx.high - 0xD800) << 10) + (lx.hex - 0xDC00));
        lx.high = 0;
      } else {
        FlushHigh(lx);
        if (lx.hex >= 0xD800 && lx.hex <= 0xDBFF) {
          lx.high = lx.hex;
        } else {
          HashCodePoint(lx, lx.hex);
        }
      }
      return true;
  }
  return true;
}

bool JsonKeyTracker::Advance(std::string_view bytes) {
  if (!Lookahead(*this).Feed(bytes)) return false;
  for (char c : bytes) StepJsonKeys(lexer_, *this, static_cast<uint8_t>(c));
  return true;
}

bool JsonKeyTracker::Lookahead::Feed(std::string_view bytes) {
  for (char c : bytes) {
    if (!StepJsonKeys(lexer_, *this, static_cast<uint8_t>(c))) return false;
  }
  return true;
}

bool JsonKeyTracker::Lookahead::TopIsObject() const {
  if (!local_.empty()) return local_.back().object;
  return top_ >= 0 && tracker_.frames_[static_cast<size_t>(top_)].object;
}

bool JsonKeyTracker::Lookahead::Has(uint64_t key) const {
  if (!local_.empty()) {
    for (uint64_t k : local_.back().keys) {
      if (k == key) return true;
    }
    return false;
  }
  if (top_ < 0) return false;
  if (tracker_.frames_[static_cast<size_t>(top_)].keys.contains(key)) return true;
  for (const auto& [frame, k] : added_) {
    if (frame == top_ && k == key) return true;
  }
  return false;
}

void JsonKeyTracker::Lookahead::Add(uint64_t key) {
  if (!local_.empty()) {
    local_.back().keys.push_back(key);
  } else if (top_ >= 0) {
    added_.push_back({top_, key});
  }
}

void JsonKeyTracker::Lookahead::Pop() {
  if (!local_.empty()) {
    local_.pop_back();
  } else if (top_ >= 0) {
    --top_;
  }
}

}  // namespace pdserve::structured
