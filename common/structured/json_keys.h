// Duplicate keys in a constrained JSON output: a grammar cannot remember which keys an object
// already has, so a JSON constraint (json_schema, json_object) pairs its matcher with this
// tracker, which reads the output's bytes (valid JSON: the grammar sees to that), keeps the
// keys of every open object (as 64-bit hashes of their decoded characters, so "\u0061" and "a"
// are one key) and refuses the byte that would close a key its object has already. The token
// mask drops the tokens that would do so (token_constraint), so no object of the output repeats
// a key, as JSON Schema's validators (and Python's json with a duplicate-rejecting hook) expect.
// A hash collision (2^-64 a pair) would only forbid a key that is new: the output stays valid.
//
// Not thread-safe: one request's, on its engine's thread. A Lookahead reads ahead of a tracker
// without changing it, and must not outlive it or see it change.
#ifndef PDSERVE_COMMON_STRUCTURED_JSON_KEYS_H_
#define PDSERVE_COMMON_STRUCTURED_JSON_KEYS_H_

#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"

namespace pdserve::structured {

class JsonKeyTracker {
 public:
  // Where the reader stands in the text (small: a Lookahead copies it).
  struct Lexer {
    enum Mode : uint8_t { kOutside, kString, kEscape, kHex };
    Mode mode = kOutside;
    bool key = false;         // The string being read is a key.
    bool expect_key = false;  // Outside strings: the next string of the top object is a key.
    uint8_t hex_left = 0;     // \u digits still to come.
    uint32_t hex = 0;
    uint32_t high = 0;        // A high surrogate waiting for its low half.
    uint64_t hash = 0;        // FNV-1a of the string's decoded UTF-8 so far.
  };

  // Bytes fed after the tracker's, as if consumed, without changing it.
  class Lookahead {
   public:
    explicit Lookahead(const JsonKeyTracker& tracker)
        : tracker_(tracker), lexer_(tracker.lexer_), top_(static_cast<int>(tracker.frames_.size()) - 1) {}
    // False at the first byte that closes a repeated key (the lookahead is then spent).
    bool Feed(std::string_view bytes);

   private:
    template <typename Frames>
    friend bool StepJsonKeys(Lexer& lexer, Frames& frames, uint8_t byte);
    // The frames as the reader sees them: the tracker's up to top_, then the ones opened here.
    bool TopIsObject() const;
    bool Has(uint64_t key) const;
    void Add(uint64_t key);
    void Push(bool object) { local_.push_back({object, {}}); }
    void Pop();

    struct LocalFrame {
      bool object = false;
      std::vector<uint64_t> keys;
    };
    const JsonKeyTracker& tracker_;
    Lexer lexer_;
    int top_;  // The tracker's frame on top once local_ is empty; -1: none.
    std::vector<LocalFrame> local_;
    std::vector<std::pair<int, uint64_t>> added_;  // Keys added to the tracker's frames.
  };

  // Consumes `bytes` if none of them closes a repeated key; false, and nothing consumed, if one
  // does.
  bool Advance(std::string_view bytes);
  // Inside a key's string: the next '"' (unescaped) would close it. Elsewhere a token with one
  // quote cannot close a key (it opens one, or closes a value), only one with two or more can.
  bool InKey() const { return lexer_.key && lexer_.mode != Lexer::kOutside; }

 private:
  template <typename Frames>
  friend bool StepJsonKeys(Lexer& lexer, Frames& frames, uint8_t byte);
  // The tracker's own frames, as the reader sees them.
  bool TopIsObject() const { return !frames_.empty() && frames_.back().object; }
  bool Has(uint64_t key) const { return !frames_.empty() && frames_.back().keys.contains(key); }
  void Add(uint64_t key) {
    if (!frames_.empty()) frames_.back().keys.insert(key);
  }
  void Push(bool object) { frames_.push_back({object, {}}); }
  void Pop() {
    if (!frames_.empty()) frames_.pop_back();
  }

  struct Frame {
    bool object = false;
    absl::flat_hash_set<uint64_t> keys;
  };

  Lexer lexer_;
  std::vector<Frame> frames_;  // Open arrays and objects, innermost last.
};

}  // namespace pdserve::structured

#endif  // PDSERVE_COMMON_STRUCTURED_JSON_KEYS_H_
