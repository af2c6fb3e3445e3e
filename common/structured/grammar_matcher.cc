#include "common/structured/grammar_matcher.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"

namespace pdserve::structured {

// Hash-consed stack nodes: (frame, below) -> id, so a stack is one id and equal stacks are
// equal ids. Append-only.
class StackPool {
 public:
  // A frame: rule, alternative, and the position of the next element in it.
  static uint64_t Frame(uint64_t rule, uint64_t alt, uint64_t pos) { return rule << 44 | alt << 24 | pos; }
  static int32_t Rule(uint64_t f) { return static_cast<int32_t>(f >> 44); }
  static size_t Alt(uint64_t f) { return static_cast<size_t>((f >> 24) & 0xFFFFF); }
  static size_t Pos(uint64_t f) { return static_cast<size_t>(f & 0xFFFFFF); }

  int32_t Push(uint64_t frame, int32_t below) {
    auto [it, inserted] = ids_.try_emplace(Key{frame, below}, static_cast<int32_t>(nodes_.size()));
    if (inserted) nodes_.push_back({frame, below});
    return it->second;
  }
  uint64_t frame(int32_t id) const { return nodes_[static_cast<size_t>(id)].frame; }
  int32_t below(int32_t id) const { return nodes_[static_cast<size_t>(id)].below; }

 private:
  struct Key {
    uint64_t frame;
    int32_t below;
    bool operator==(const Key& o) const { return frame == o.frame && below == o.below; }
    template <typename H>
    friend H AbslHashValue(H h, const Key& k) {
      return H::combine(std::move(h), k.frame, k.below);
    }
  };
  struct Node {
    uint64_t frame;
    int32_t below;
  };
  std::vector<Node> nodes_;
  absl::flat_hash_map<Key, int32_t> ids_;
};

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> grammar)
    : grammar_(std::move(grammar)), pool_(std::make_shared<StackPool>()) {
  Reset();
}

GrammarMatcher::GrammarMatcher(const GrammarMatcher&) = default;
GrammarMatcher& GrammarMatcher::operator=(const GrammarMatcher&) = default;
GrammarMatcher::GrammarMatcher(GrammarMatcher&&) noexcept = default;
GrammarMatcher& GrammarMatcher::operator=(GrammarMatcher&&) noexcept = default;
GrammarMatcher::~GrammarMatcher() = default;

void GrammarMatcher::Reset() {
  stacks_.clear();
  accepting_ = false;
  const int32_t root = grammar_->root();
  const size_t alts = grammar_->rule(root).alternatives.size();
  for (size_t a = 0; a < alts; ++a) {
    Expand(pool_->Push(StackPool::Frame(static_cast<uint64_t>(root), a, 0), -1), &stacks_, &accepting_);
  }
  Settle(&stacks_);
}

int32_t GrammarMatcher::Step(int32_t s) const {
  const uint64_t f = pool_->frame(s);
  const size_t size = grammar_->rule(StackPool::Rule(f)).alternatives[StackPool::Alt(f)].size();
  const size_t next = StackPool::Pos(f) + 1;
  // Nothing left in this alternative: return straight to the caller.
  if (next == size) return pool_->below(s);
  return pool_->Push(StackPool::Frame(static_cast<uint64_t>(StackPool::Rule(f)), StackPool::Alt(f), next),
                     pool_->below(s));
}

void GrammarMatcher::Expand(int32_t s, std::vector<int32_t>* out, bool* accepting) const {
  std::vector<int32_t>& work = work_;
  work.clear();
  absl::flat_hash_set<int32_t> seen;  // Only where the grammar has epsilon cycles.
  const size_t limit = out->size() + 4 * kMaxStacks;
  while (true) {
    if (grammar_->epsilon_cycles() && !seen.insert(s).second) {
      // Expanded already: the same outcomes again.
    } else if (s < 0) {
      *accepting = true;
    } else {
      const uint64_t f = pool_->frame(s);
      const GrammarSequence& alt = grammar_->rule(StackPool::Rule(f)).alternatives[StackPool::Alt(f)];
      if (StackPool::Pos(f) == alt.size()) {  // An empty alternative.
        s = pool_->below(s);
        continue;
      }
      const GrammarElement& e = alt[StackPool::Pos(f)];
      if (e.kind == GrammarElement::Kind::kBytes) {
        out->push_back(s);
      } else {
        const int32_t caller = Step(s);  // The caller continues after the reference.
        const size_t alts = grammar_->rule(e.index).alternatives.size();
        for (size_t a = 0; a < alts; ++a) {
          work.push_back(pool_->Push(StackPool::Frame(static_cast<uint64_t>(e.index), a, 0), caller));
        }
      }
    }
    if (work.empty() || out->size() > limit) return;
    s = work.back();
    work.pop_back();
  }
}

void GrammarMatcher::Settle(std::vector<int32_t>* stacks) {
  std::sort(stacks->begin(), stacks->end());
  stacks->erase(std::unique(stacks->begin(), stacks->end()), stacks->end());
  if (stacks->size() > kMaxStacks) stacks->resize(kMaxStacks);
  next_bytes_.reset();
  for (int32_t s : *stacks) {
    const uint64_t f = pool_->frame(s);
    next_bytes_ |= grammar_->byte_set(
        grammar_->rule(StackPool::Rule(f)).alternatives[StackPool::Alt(f)][StackPool::Pos(f)].index);
  }
}

bool GrammarMatcher::Advance(uint8_t byte) {
  if (!next_bytes_[byte]) return false;
  std::vector<int32_t> next;
  bool accepting = false;
  for (int32_t s : stacks_) {
    const uint64_t f = pool_->frame(s);
    const GrammarElement& e = grammar_->rule(StackPool::Rule(f)).alternatives[StackPool::Alt(f)][StackPool::Pos(f)];
    if (!grammar_->byte_set(e.index)[byte]) continue;
    Expand(Step(s), &next, &accepting);
  }
  if (next.empty() && !accepting) return false;
  Settle(&next);
  stacks_ = std::move(next);
  accepting_ = accepting;
  return true;
}

bool GrammarMatcher::Advance(std::string_view bytes) {
  GrammarMatcher copy = *this;
  for (char c : bytes) {
    if (!copy.Advance(static_cast<uint8_t>(c))) return false;
  }
  *this = std::move(copy);
  return true;
}

}  // namespace pdserve::structured
