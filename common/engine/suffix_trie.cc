#include "common/engine/suffix_trie.h"

#include <algorithm>

#include "common/base/check.h"

namespace pdserve {

SuffixTrie::SuffixTrie(int32_t max_depth) : max_depth_(max_depth) {
  PD_CHECK(max_depth >= 2);
  Clear();
}

void SuffixTrie::Clear() {
  nodes_.assign(1, Node{});
  children_.clear();
  active_.clear();
}

void SuffixTrie::EndSequence() { active_.clear(); }

int32_t SuffixTrie::Child(int32_t node, int32_t token) const {
  auto it = children_.find(Key(node, token));
  return it == children_.end() ? -1 : it->second;
}

void SuffixTrie::Append(int32_t token) {
  // Extend the empty substring and each active one (they end at the previous token); the
  // longest, at max_depth already, cannot grow.
  next_active_.clear();
  const size_t extend = std::min<size_t>(active_.size(), static_cast<size_t>(max_depth_ - 1));
  for (size_t i = 0; i <= extend; ++i) {
    const int32_t parent = i == 0 ? 0 : active_[i - 1];
    auto [it, inserted] = children_.try_emplace(Key(parent, token), static_cast<int32_t>(nodes_.size()));
    if (inserted) {
      Node n;
      n.token = token;
      nodes_.push_back(n);
    }
    const int32_t child = it->second;
    Node& c = nodes_[static_cast<size_t>(child)];
    ++c.count;
    Node& p = nodes_[static_cast<size_t>(parent)];
    ++p.continuations;
    if (p.best_child < 0 || (p.best_child != child && c.count > nodes_[static_cast<size_t>(p.best_child)].count)) {
      p.best_child = child;
    }
    next_active_.push_back(child);
  }
  active_.swap(next_active_);
}

SuffixTrie::Draft SuffixTrie::Propose(absl::Span<const int32_t> context, int32_t k, double min_prob,
                                      std::vector<int32_t>* out) const {
  out->clear();
  Draft d;
  if (k <= 0) return d;
  const int64_t len = static_cast<int64_t>(context.size());
  const auto walk = [&](int64_t m) {  // The node of the context's last m tokens, or -1.
    int32_t at = 0;
    for (int64_t i = len - m; i < len && at >= 0; ++i) at = Child(at, context[i]);
    return at;
  };
  // The longest suffix in the index (if m tokens are, so are their last m - 1: a binary search),
  // then the longest from there that occurred with a continuation, leaving depth for k tokens.
  int64_t lo = 0, hi = std::min<int64_t>(len, std::max(1, max_depth_ - k));
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (walk(mid) >= 0) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  int32_t node = -1;
  for (int64_t m = lo; m >= 1 && node < 0; --m) {
    const int32_t at = walk(m);
    if (nodes_[static_cast<size_t>(at)].continuations > 0) {
      node = at;
      d.match_length = static_cast<int32_t>(m);
    }
  }
  if (node < 0) return d;
  return Continue(node, d.match_length, k, min_prob, out);
}

SuffixTrie::Draft SuffixTrie::ProposeForCurrent(int32_t k, double min_prob,
                                                std::vector<int32_t>* out) const {
  out->clear();
  if (k <= 0) return {};
  // active_[i] is the suffix of i + 1 tokens: the longest one within the cap that continued.
  const int64_t longest = std::min<int64_t>(static_cast<int64_t>(active_.size()), std::max(1, max_depth_ - k));
  for (int64_t m = longest; m >= 1; --m) {
    const int32_t node = active_[static_cast<size_t>(m - 1)];
    if (nodes_[static_cast<size_t>(node)].continuations > 0) {
      return Continue(node, static_cast<int32_t>(m), k, min_prob, out);
    }
  }
  return {};
}

SuffixTrie::Draft SuffixTrie::Continue(int32_t node, int32_t match_length, int32_t k,
                                       double min_prob, std::vector<int32_t>* out) const {
  Draft d;
  d.match_length = match_length;
  // No longer than the match it follows (Arctic's max_spec_factor 1): one matched token is weak
  // evidence for five more.
  k = std::min(k, d.match_length);
  // Follow the most frequent continuation while it is likely enough (the index ends at
  // max_depth: a draft is short).
  for (int32_t depth = d.match_length; static_cast<int32_t>(out->size()) < k && depth < max_depth_; ++depth) {
    const Node& n = nodes_[static_cast<size_t>(node)];
    if (n.best_child < 0 || n.continuations == 0) break;
    const Node& c = nodes_[static_cast<size_t>(n.best_child)];
    const double prob = static_cast<double>(c.count) / n.continuations;
    if (prob < min_prob) break;
    out->push_back(c.token);
    d.score += prob;
    node = n.best_child;
  }
  if (out->empty()) d.match_length = 0;
  return d;
}

}  // namespace pdserve
