// Where a constrained output stands in its grammar, advanced a byte at a time: a pushdown
// matcher over the Grammar's byte-level rules (the set of parse stacks the bytes so far allow,
// each stack's top the byte set that may come next). Also what the token mask is computed from
// (token_trie).
//
// Built lazily like a DFA: stacks are persistent and hash-consed (a stack is the id of its top
// node: a frame and the id of the stack below), a state (a set of stacks, and whether the root
// can end there) is interned as an id, and each (state, byte) transition is computed once and
// cached. A matcher is a state id; a copy shares the tables. Copies of one matcher must stay on
// one thread (they add to the same tables); matchers made separately share nothing.
#ifndef PDSERVE_COMMON_STRUCTURED_GRAMMAR_MATCHER_H_
#define PDSERVE_COMMON_STRUCTURED_GRAMMAR_MATCHER_H_

#include <cstdint>
#include <memory>
#include <string_view>

#include "common/structured/grammar.h"

namespace pdserve::structured {

class MatcherStates;

class GrammarMatcher {
 public:
  // Parse stacks kept at most per state (an ambiguous grammar's extra ones are dropped: the
  // output still matches the grammar, only fewer of its strings stay reachable).
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
  bool CanEnd() const { return CanEnd(state_); }
  // Some byte may come next.
  bool CanContinue() const { return NextBytes(state_).any(); }
  // The bytes that may come next (a reference valid until the next Advance or Next of this
  // matcher or a copy: they may add states).
  const ByteSet& NextBytes() const { return NextBytes(state_); }
  void Reset();
  int64_t num_stacks() const;
  const Grammar& grammar() const { return *grammar_; }

  // For walks over many byte strings from one state (token_trie): states as ids.
  int32_t state() const { return state_; }
  // The state after `byte`, or -1 where the byte is refused (computed once, then cached).
  int32_t Next(int32_t state, uint8_t byte) const;
  const ByteSet& NextBytes(int32_t state) const;
  bool CanEnd(int32_t state) const;

 private:
  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<MatcherStates> states_;
  int32_t state_ = 0;
};

}  // namespace pdserve::structured

#endif  // PDSERVE_COMMON_STRUCTURED_GRAMMAR_MATCHER_H_
