#include "common/structured/grammar_matcher.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"

namespace pdserve::structured {

// The tables a matcher and its copies share: hash-consed stack nodes, interned states and the
// transitions between them. Append-only.
class MatcherStates {
 public:
  static constexpr size_t kMaxTransitions = size_t{1} << 21;  // ~40 MiB of cache at most.

  explicit MatcherStates(std::shared_ptr<const Grammar> grammar) : grammar_(std::move(grammar)) {}

  struct State {
    std::vector<int32_t> stacks;  // Sorted stack ids, each top a byte set.
    ByteSet next;                 // The bytes some stack's top takes.
    bool accepting = false;       // The root can end here.
  };
  const State& state(int32_t id) const { return states_[static_cast<size_t>(id)]; }

  int32_t Initial() {
    Expansion x;
    const int32_t root = grammar_->root();
    const size_t alts = grammar_->rule(root).alternatives.size();
    for (size_t a = 0; a < alts; ++a) Expand(Push(Frame(static_cast<uint64_t>(root), a, 0), -1), &x);
    return Intern(std::move(x.stacks), x.accepting);
  }

  int32_t Next(int32_t id, uint8_t byte) {
    const uint64_t key = static_cast<uint64_t>(id) << 8 | byte;
    if (auto it = transitions_.find(key); it != transitions_.end()) return it->second;
    int32_t next = -1;
    if (state(id).next[byte]) {
      Expansion x;
      const std::vector<int32_t> from = state(id).stacks;  // Interning may move states_.
      for (int32_t s : from) {
        if (!grammar_->byte_set(TopElement(s).index)[byte]) continue;
        Expand(Step(s), &x);
      }
      if (!x.stacks.empty() || x.accepting) next = Intern(std::move(x.stacks), x.accepting);
    }
    // A cache: past its bound it starts again (the states stay; ids held by matchers stay valid).
    if (transitions_.size() >= kMaxTransitions) transitions_.clear();
    transitions_.emplace(key, next);
    return next;
  }

 private:
  // A frame: rule, alternative, and the position of the next element in it.
  static uint64_t Frame(uint64_t rule, uint64_t alt, uint64_t pos) { return rule << 44 | alt << 24 | pos; }
  static int32_t Rule(uint64_t f) { return static_cast<int32_t>(f >> 44); }
  static size_t Alt(uint64_t f) { return static_cast<size_t>((f >> 24) & 0xFFFFF); }
  static size_t Pos(uint64_t f) { return static_cast<size_t>(f & 0xFFFFFF); }

  struct NodeKey {
    uint64_t frame;
    int32_t below;
    bool operator==(const NodeKey& o) const { return frame == o.frame && below == o.below; }
    template <typename H>
    friend H AbslHashValue(H h, const NodeKey& k) {
      return H::combine(std::move(h), k.frame, k.below);
    }
  };

  int32_t Push(uint64_t frame, int32_t below) {
    auto [it, inserted] = node_ids_.try_emplace(NodeKey{frame, below}, static_cast<int32_t>(nodes_.size()));
    if (inserted) nodes_.push_back({frame, below});
    return it->second;
  }
  const GrammarSequence& Alternative(uint64_t f) const { return grammar_->rule(Rule(f)).alternatives[Alt(f)]; }
  const GrammarElement& TopElement(int32_t s) const {
    const uint64_t f = nodes_[static_cast<size_t>(s)].frame;
    return Alternative(f)[Pos(f)];
  }

  // Moves past stack s's top element; a tail position's frame is dropped (the caller continues
  // directly), so right recursion does not grow stacks.
  int32_t Step(int32_t s) {
    const NodeKey n = nodes_[static_cast<size_t>(s)];
    const size_t next = Pos(n.frame) + 1;
    if (next == Alternative(n.frame).size()) return n.below;
    return Push(Frame(static_cast<uint64_t>(Rule(n.frame)), Alt(n.frame), next), n.below);
  }

  // One transition's expansion (or the initial state's): the stacks found, whether the root
  // completed, and what bounds the work. An ambiguous grammar with nullable repetitions in each
  // other (("a"* "b"*)* nested) reaches exponentially many stacks; past the budget the rest are
  // dropped, as Intern drops stacks past kMaxStacks (fewer strings stay reachable, never one the
  // grammar refuses), so one byte costs bounded time whatever the grammar.
  struct Expansion {
    std::vector<int32_t> stacks;
    bool accepting = false;
    absl::flat_hash_set<int32_t> seen;  // Only where the grammar has epsilon cycles.
    int64_t visits = 0;
  };
  static constexpr int64_t kMaxVisits = 64 * static_cast<int64_t>(GrammarMatcher::kMaxStacks);

  // Expands rule references from stack s until each stack's top is a byte set, adding those to
  // x->stacks and setting x->accepting if one empties (the root completed). Where the grammar
  // has epsilon cycles, a stack expanded already in this transition is skipped (its outcomes
  // are in; without cycles repeats are few and the set would cost more than it saves).
  void Expand(int32_t s, Expansion* x) {
    work_.clear();
    const size_t limit = 4 * GrammarMatcher::kMaxStacks;
    while (true) {
      if (++x->visits > kMaxVisits || x->stacks.size() > limit) return;
      if (grammar_->epsilon_cycles() && !x->seen.insert(s).second) {
        // Expanded already: the same outcomes again.
      } else if (s < 0) {
        x->accepting = true;
      } else {
        const NodeKey n = nodes_[static_cast<size_t>(s)];
        const GrammarSequence& alt = Alternative(n.frame);
        if (Pos(n.frame) == alt.size()) {  // An empty alternative.
          s = n.below;
          continue;
        }
        const GrammarElement& e = alt[Pos(n.frame)];
        if (e.kind == GrammarElement::Kind::kBytes) {
          x->stacks.push_back(s);
        } else {
          const int32_t caller = Step(s);  // The caller continues after the reference.
          const size_t alts = grammar_->rule(e.index).alternatives.size();
          for (size_t a = 0; a < alts; ++a) {
            work_.push_back(Push(Frame(static_cast<uint64_t>(e.index), a, 0), caller));
          }
        }
      }
      if (work_.empty()) return;
      s = work_.back();
      work_.pop_back();
    }
  }

  int32_t Intern(std::vector<int32_t> stacks, bool accepting) {
    std::sort(stacks.begin(), stacks.end());
    stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
    if (stacks.size() > GrammarMatcher::kMaxStacks) stacks.resize(GrammarMatcher::kMaxStacks);
    std::vector<int32_t> key = stacks;
    key.push_back(accepting ? -1 : -2);
    auto [it, inserted] = state_ids_.try_emplace(std::move(key), static_cast<int32_t>(states_.size()));
    if (inserted) {
      State st;
      st.accepting = accepting;
      for (int32_t s : stacks) st.next |= grammar_->byte_set(TopElement(s).index);
      st.stacks = std::move(stacks);
      states_.push_back(std::move(st));
    }
    return it->second;
  }

  std::shared_ptr<const Grammar> grammar_;
  std::vector<NodeKey> nodes_;
  absl::flat_hash_map<NodeKey, int32_t> node_ids_;
  std::vector<State> states_;
  absl::flat_hash_map<std::vector<int32_t>, int32_t> state_ids_;
  absl::flat_hash_map<uint64_t, int32_t> transitions_;
  std::vector<int32_t> work_;
};

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> grammar)
    : grammar_(std::move(grammar)), states_(std::make_shared<MatcherStates>(grammar_)) {
  Reset();
}

GrammarMatcher::GrammarMatcher(const GrammarMatcher&) = default;
GrammarMatcher& GrammarMatcher::operator=(const GrammarMatcher&) = default;
GrammarMatcher::GrammarMatcher(GrammarMatcher&&) noexcept = default;
GrammarMatcher& GrammarMatcher::operator=(GrammarMatcher&&) noexcept = default;
GrammarMatcher::~GrammarMatcher() = default;

void GrammarMatcher::Reset() { state_ = states_->Initial(); }

int64_t GrammarMatcher::num_stacks() const { return static_cast<int64_t>(states_->state(state_).stacks.size()); }

int32_t GrammarMatcher::Next(int32_t state, uint8_t byte) const { return states_->Next(state, byte); }

const ByteSet& GrammarMatcher::NextBytes(int32_t state) const { return states_->state(state).next; }

bool GrammarMatcher::CanEnd(int32_t state) const { return states_->state(state).accepting; }

bool GrammarMatcher::Advance(uint8_t byte) {
  const int32_t next = states_->Next(state_, byte);
  if (next < 0) return false;
  state_ = next;
  return true;
}

bool GrammarMatcher::Advance(std::string_view bytes) {
  int32_t s = state_;
  for (char c : bytes) {
    s = states_->Next(s, static_cast<uint8_t>(c));
    if (s < 0) return false;
  }
  state_ = s;
  return true;
}

}  // namespace pdserve::structured
