#include "common/tokenizer/added_tokens.h"

#include <algorithm>

#include "common/tokenizer/unicode.h"

namespace pdserve {
namespace {

bool IsWordByte(uint8_t c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
         c >= 0x80;
}

// Start of the code point that ends right before `pos`.
size_t PreviousCodePoint(std::string_view text, size_t pos) {
  size_t p = pos - 1;
  while (p > 0 && (static_cast<uint8_t>(text[p]) & 0xc0) == 0x80) --p;
  return p;
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(const std::vector<AddedToken>& tokens) : tokens_(tokens) {
  nodes_.emplace_back();
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::string& s = tokens[i].content;
    if (s.empty()) continue;
    first_byte_[static_cast<uint8_t>(s[0])] = true;
    int32_t node = 0;
    for (char ch : s) {
      const uint8_t c = static_cast<uint8_t>(ch);
      int32_t next = Child(node, c);
      if (next < 0) {
        next = static_cast<int32_t>(nodes_.size());
        nodes_.emplace_back();
        auto& kids = nodes_[node].children;
        kids.insert(std::lower_bound(kids.begin(), kids.end(), std::make_pair(c, int32_t{0})),
                    {c, next});
      }
      node = next;
    }
    nodes_[node].token = static_cast<int32_t>(i);  // A later duplicate wins, as in the JSON order.
  }
}

int32_t AddedTokenMatcher::Child(int32_t node, uint8_t byte) const {
  const auto& kids = nodes_[node].children;
  auto it = std::lower_bound(kids.begin(), kids.end(), std::make_pair(byte, int32_t{0}));
  if (it == kids.end() || it->first != byte) return -1;
  return it->second;
}

bool AddedTokenMatcher::FindNext(std::string_view text, size_t from, Match* match) const {
  for (size_t i = from; i < text.size(); ++i) {
    if (!first_byte_[static_cast<uint8_t>(text[i])]) continue;
    int32_t node = 0, best = -1;
    size_t best_end = i;
    for (size_t j = i; j < text.size(); ++j) {
      node = Child(node, static_cast<uint8_t>(text[j]));
      if (node < 0) break;
      if (nodes_[node].token >= 0) {
        best = nodes_[node].token;
        best_end = j + 1;
      }
    }
    if (best < 0) continue;
    const AddedToken& tok = tokens_[best];
    if (tok.single_word) {
      const bool left_ok = i == 0 || !IsWordByte(static_cast<uint8_t>(text[i - 1]));
      const bool right_ok = best_end == text.size() || !IsWordByte(static_cast<uint8_t>(text[best_end]));
      if (!left_ok || !right_ok) continue;
    }
    size_t begin = i, end = best_end;
    if (tok.lstrip) {
      while (begin > from) {
        const size_t p = PreviousCodePoint(text, begin);
        size_t q = p;
        if (!IsUnicodeWhitespace(NextCodePoint(text, &q))) break;
        begin = p;
      }
    }
    if (tok.rstrip) {
      while (end < text.size()) {
        size_t q = end;
        if (!IsUnicodeWhitespace(NextCodePoint(text, &q))) break;
        end = q;
      }
    }
    *match = Match{begin, end, static_cast<size_t>(best)};
    return true;
  }
  return false;
}

}  // namespace pdserve
