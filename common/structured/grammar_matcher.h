// Where a constrained output stands in its grammar, advanced a byte at a time: a pushdown
// matcher over the Grammar's byte-level rules (the set of parse stacks the bytes so far allow,
// each stack's top the byte set that may come next). Also what the token mask is computed from
// (token_trie).
//
// Copyable (a copy is an independent state); not thread-safe.
#ifndef PDSERVE_COMMON_STRUCTURED_GRAMMAR_MATCHER_H_
#define PDSERVE_COMMON_STRUCTURED_GRAMMAR_MATCHER_H_

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "common/structured/grammar.h"

namespace pdserve::structured {

class GrammarMatcher {
 public:
  // Parse stacks kept at most (an ambiguous grammar's extra ones are dropped: the output still
  // matches the grammar, only fewer of its strings stay reachable).
  static constexpr size_t kMaxStacks = 1 << 12;

  explicit GrammarMatcher(std::shared_ptr<const Grammar> grammar);

  // Consumes `byte` if the grammar allows it here; false, and nothing consumed, if not.
  bool Advance(uint8_t byte);
  // All of `bytes`, or (false) none of them.
  bool Advance(std::string_view bytes);
  // What was consumed is a whole match of the root rule (EOS may come).
  bool CanEnd() const { return accepting_; }
  // Some byte may come next.
  bool CanContinue() const { return !stacks_.empty(); }
  // The bytes that may come next.
  ByteSet NextBytes() const;
  void Reset();
  int64_t num_stacks() const { return static_cast<int64_t>(stacks_.size()); }
  const Grammar& grammar() const { return *grammar_; }

 private:
  // A stack frame: rule, alternative, and the position of the next element in it.
  using Frame = uint64_t;
  using Stack = std::vector<Frame>;
  static Frame MakeFrame(uint64_t rule, uint64_t alt, uint64_t pos) { return rule << 44 | alt << 24 | pos; }
  static int32_t FrameRule(Frame f) { return static_cast<int32_t>(f >> 44); }
  static int32_t FrameAlt(Frame f) { return static_cast<int32_t>((f >> 24) & 0xFFFFF); }
  static int32_t FramePos(Frame f) { return static_cast<int32_t>(f & 0xFFFFFF); }
  const GrammarElement& Top(const Stack& s) const;
  // Moves past the top frame's element (a tail position's frame is dropped).
  void Step(Stack* s) const;
  // Expands rule references until each stack's top is a byte set, adding those to *out and
  // setting *accepting if one empties (the root completed).
  void Expand(Stack s, std::vector<Stack>* out, bool* accepting) const;
  void Settle(std::vector<Stack>* stacks);  // Sorted, unique, bounded.

  std::shared_ptr<const Grammar> grammar_;
  std::vector<Stack> stacks_;
  bool accepting_ = false;
};

}  // namespace pdserve::structured

#endif  // PDSERVE_COMMON_STRUCTURED_GRAMMAR_MATCHER_H_
