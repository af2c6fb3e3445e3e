#include "common/structured/grammar_matcher.h"

#include <algorithm>
#include <set>
#include <utility>

namespace pdserve::structured {

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> grammar) : grammar_(std::move(grammar)) {
  Reset();
}

void GrammarMatcher::Reset() {
  stacks_.clear();
  accepting_ = false;
  const int32_t root = grammar_->root();
  const size_t alts = grammar_->rule(root).alternatives.size();
  for (size_t a = 0; a < alts; ++a) Expand({MakeFrame(static_cast<uint64_t>(root), a, 0)}, &stacks_, &accepting_);
  Settle(&stacks_);
}

const GrammarElement& GrammarMatcher::Top(const Stack& s) const {
  const Frame f = s.back();
  return grammar_->rule(FrameRule(f)).alternatives[static_cast<size_t>(FrameAlt(f))][static_cast<size_t>(FramePos(f))];
}

void GrammarMatcher::Step(Stack* s) const {
  const Frame f = s->back();
  const size_t size = grammar_->rule(FrameRule(f)).alternatives[static_cast<size_t>(FrameAlt(f))].size();
  const uint64_t next = static_cast<uint64_t>(FramePos(f)) + 1;
  if (next == size) {
    s->pop_back();  // Nothing left in this alternative: return straight to the caller.
  } else {
    s->back() = MakeFrame(static_cast<uint64_t>(FrameRule(f)), static_cast<uint64_t>(FrameAlt(f)), next);
  }
}

void GrammarMatcher::Expand(Stack s, std::vector<Stack>* out, bool* accepting) const {
  std::vector<Stack> work;
  std::set<Stack> seen;  // Only where the grammar has epsilon cycles.
  while (true) {
    if (grammar_->epsilon_cycles() && !seen.insert(s).second) {
      // Expanded already: the same outcomes again.
    } else if (s.empty()) {
      *accepting = true;
    } else {
      const Frame f = s.back();
      const GrammarSequence& alt = grammar_->rule(FrameRule(f)).alternatives[static_cast<size_t>(FrameAlt(f))];
      if (static_cast<size_t>(FramePos(f)) == alt.size()) {  // An empty alternative.
        s.pop_back();
        continue;
      }
      const GrammarElement& e = alt[static_cast<size_t>(FramePos(f))];
      if (e.kind == GrammarElement::Kind::kBytes) {
        out->push_back(std::move(s));
      } else {
        Step(&s);  // The caller continues after the reference.
        const size_t alts = grammar_->rule(e.index).alternatives.size();
        for (size_t a = 0; a < alts; ++a) {
          Stack callee = a + 1 == alts ? std::move(s) : s;
          callee.push_back(MakeFrame(static_cast<uint64_t>(e.index), a, 0));
          work.push_back(std::move(callee));
        }
      }
    }
    if (work.empty() || out->size() > 4 * kMaxStacks) return;
    s = std::move(work.back());
    work.pop_back();
  }
}

void GrammarMatcher::Settle(std::vector<Stack>* stacks) {
  std::sort(stacks->begin(), stacks->end());
  stacks->erase(std::unique(stacks->begin(), stacks->end()), stacks->end());
  if (stacks->size() > kMaxStacks) stacks->resize(kMaxStacks);
}

bool GrammarMatcher::Advance(uint8_t byte) {
  std::vector<Stack> next;
  bool accepting = false;
  for (const Stack& s : stacks_) {
    if (!grammar_->byte_set(Top(s).index)[byte]) continue;
    Stack t = s;
    Step(&t);
    Expand(std::move(t), &next, &accepting);
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

ByteSet GrammarMatcher::NextBytes() const {
  ByteSet out;
  for (const Stack& s : stacks_) out |= grammar_->byte_set(Top(s).index);
  return out;
}

}  // namespace pdserve::structured
