// Where a constrained output stands in its grammar, advanced a byte at a time: a pushdown
// matcher over the Grammar's byte-level rules (the set of parse stacks the bytes so far allow,
// each stack's top the byte set that may come next). Also what the token mask is computed from
// (token_trie).
//
// Stacks are persistent and hash-consed in a pool that a matcher shares with its copies: a
// stack is the id of its top node (a frame and the id of the stack below it), equal stacks have
// equal ids, and a copy or a step copies a few ids, not frames. Copies of one matcher must stay
// on one thread (they append to the same pool); matchers made separately share nothing.
#ifndef PDSERVE_COMMON_STRUCTURED_GRAMMAR_MATCHER_H_
#define PDSERVE_COMMON_STRUCTURED_GRAMMAR_MATCHER_H_

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "common/structured/grammar.h"

namespace pdserve::structured {

class StackPool;

class GrammarMatcher {
 public:
  // Parse stacks kept at most (an ambiguous grammar's extra ones are dropped: the output still
  // matches the grammar, only fewer of its strings stay reachable).
  static constexpr size_t kMaxStacks = 1 << 12;

  explicit GrammarMatcher(std::shared_ptr<const Grammar> grammar);
  GrammarMatcher(const GrammarMatcher&);
  GrammarMatcher& operator=(const GrammarMatcher&);
  GrammarMatcher(GrammarMatcher&&) noexcept;
  GrammarMatcher& operator=(GrammarMatcher&&) noexcept;
  ~GrammarMatcher();

  // Consumes `byte` if the grammar allows it here; false, and nothing consumed, if not.
  bool Advance(uint8_t byte);
  // All of `bytes`, or (false) none of them.
  bool Advance(std::string_view bytes);
  // What was consumed is a whole match of the root rule (EOS may come).
  bool CanEnd() const { return accepting_; }
  // Some byte may come next.
  bool CanContinue() const { return !stacks_.empty(); }
  // The bytes that may come next.
  const ByteSet& NextBytes() const { return next_bytes_; }
  void Reset();
  int64_t num_stacks() const { return static_cast<int64_t>(stacks_.size()); }
  const Grammar& grammar() const { return *grammar_; }

 private:
  // Expands rule references from stack `s` until each stack's top is a byte set, adding those
  // to *out and setting *accepting if one empties (the root completed).
  void Expand(int32_t s, std::vector<int32_t>* out, bool* accepting) const;
  // Moves past stack s's top element (a tail position's frame is dropped); the new stack.
  int32_t Step(int32_t s) const;
  void Settle(std::vector<int32_t>* stacks);  // Sorted, unique, bounded; next_bytes_.

  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<StackPool> pool_;
  std::vector<int32_t> stacks_;  // Ids of the stacks (-1: the empty stack is never kept).
  ByteSet next_bytes_;
  bool accepting_ = false;
  mutable std::vector<int32_t> work_;  // Expand's, kept for its capacity.
};

}  // namespace pdserve::structured

#endif  // PDSERVE_COMMON_STRUCTURED_GRAMMAR_MATCHER_H_
