// A context-free grammar over bytes, the form every constraint compiles to (structured outputs):
// rules of alternatives, each a sequence of elements that are either a set of bytes or another
// rule. Code points live only in the text syntax (grammar_parser): a character class becomes
// the UTF-8 byte sequences of its code points, a repetition becomes right-recursive helper
// rules. The checks that make matching terminate are done once, here: no left recursion, and
// the root derives at least one string.
//
// Immutable once built; shared by every request with the same constraint.
#ifndef PDSERVE_COMMON_STRUCTURED_GRAMMAR_H_
#define PDSERVE_COMMON_STRUCTURED_GRAMMAR_H_

#include <bitset>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"

namespace pdserve::structured {

using ByteSet = std::bitset<256>;

struct GrammarElement {
  enum class Kind : uint8_t { kBytes, kRule };
  Kind kind = Kind::kBytes;
  int32_t index = 0;  // kBytes: Grammar::byte_set(index); kRule: the rule's id.
  bool operator==(const GrammarElement& o) const { return kind == o.kind && index == o.index; }
};

using GrammarSequence = std::vector<GrammarElement>;

struct GrammarRule {
  std::string name;  // Helper rules: the rule they came from, then "::" and what they are.
  std::vector<GrammarSequence> alternatives;  // An empty one matches the empty string.
};

class Grammar {
 public:
  // Bounds on what a constraint may compile to (an error names them, never a slow request).
  static constexpr int64_t kMaxRules = 1 << 16;
  static constexpr int64_t kMaxElements = 1 << 20;

  int32_t AddRule(std::string name);  // An empty rule; returns its id.
  GrammarRule& rule(int32_t id) { return rules_[static_cast<size_t>(id)]; }
  const GrammarRule& rule(int32_t id) const { return rules_[static_cast<size_t>(id)]; }
  int32_t num_rules() const { return static_cast<int32_t>(rules_.size()); }
  int32_t ByteSetIndex(const ByteSet& set);  // Interned: equal sets share an index.
  const ByteSet& byte_set(int32_t index) const { return byte_sets_[static_cast<size_t>(index)]; }
  int32_t root() const { return root_; }
  void set_root(int32_t id) { root_ = id; }
  int64_t num_elements() const;

  // The checks above, and the tables matching needs; InvalidArgument naming the rule.
  absl::Status Finalize();
  bool nullable(int32_t id) const { return nullable_[static_cast<size_t>(id)]; }
  // Some rule reaches itself in tail position without consuming a byte ((x?)*): the matcher's
  // expansion must then skip stacks it has already seen.
  bool epsilon_cycles() const { return epsilon_cycles_; }

  // The grammar in the text syntax (bytes as \xHH classes): for messages and tests.
  std::string ToString() const;

 private:
  std::vector<GrammarRule> rules_;
  std::vector<ByteSet> byte_sets_;
  std::unordered_map<ByteSet, int32_t> byte_set_index_;
  std::vector<bool> nullable_;
  int32_t root_ = -1;
  bool epsilon_cycles_ = false;
};

}  // namespace pdserve::structured

#endif  // PDSERVE_COMMON_STRUCTURED_GRAMMAR_H_
