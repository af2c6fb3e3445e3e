// Finds added tokens (special or not) in raw text before the model sees it: at the leftmost
// position where any added token starts, the longest one wins (a byte trie). Immutable after
// construction; thread-safe.
#ifndef PDSERVE_COMMON_TOKENIZER_ADDED_TOKENS_H_
#define PDSERVE_COMMON_TOKENIZER_ADDED_TOKENS_H_

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace pdserve {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;
  bool lstrip = false;       // Swallow whitespace on the left.
  bool rstrip = false;       // Swallow whitespace on the right.
  bool single_word = false;  // Only when not inside a word.
};

class AddedTokenMatcher {
 public:
  explicit AddedTokenMatcher(const std::vector<AddedToken>& tokens);

  struct Match {
    size_t begin = 0;  // Of the text this token consumes (including stripped whitespace).
    size_t end = 0;
    size_t token = 0;  // Index into the constructor's vector.
  };
  // The first match at or after `from`, or false.
  bool FindNext(std::string_view text, size_t from, Match* match) const;
  bool empty() const { return nodes_.size() == 1; }

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> children;  // Sorted by byte.
    int32_t token = -1;
  };
  int32_t Child(int32_t node, uint8_t byte) const;

  const std::vector<AddedToken>& tokens_;
  std::vector<Node> nodes_;
  std::array<bool, 256> first_byte_{};
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_TOKENIZER_ADDED_TOKENS_H_
