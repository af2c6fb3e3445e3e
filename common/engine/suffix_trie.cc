#include "common/engine/suffix_trie.h"

#include <algorithm>
#include <tuple>

#include "common/base/check.h"

namespace pdserve {

SuffixTrie::SuffixTrie(int32_t max_depth) : max_depth_(max_depth) {
  PD_CHECK(max_depth >= 2);
  Clear();
}

void SuffixTrie::Clear() {
  nodes_.assign(1, Node{});
  // absl's clear() frees a table of more than 127 slots; erasing keeps it, so an index cleared
  // for reuse (LLMEngine recycles a finished request's for the next) fills memory already mapped.
  children_.erase(children_.begin(), children_.end());
  active_.clear();
  ++generation_;
}

void SuffixTrie::Reserve(int64_t tokens) {
  // A token adds at most max_depth nodes (fewer where substrings repeat).
  const size_t more = static_cast<size_t>(std::max<int64_t>(0, tokens)) * static_cast<size_t>(max_depth_);
  nodes_.reserve(nodes_.size() + more);
  children_.reserve(children_.size() + more);
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

int32_t SuffixTrie::Walk(absl::Span<const int32_t> context, int64_t m) const {
  const int64_t len = static_cast<int64_t>(context.size());
  int32_t at = 0;
  for (int64_t i = len - m; i < len && at >= 0; ++i) at = Child(at, context[i]);
  return at;
}

std::pair<int64_t, int32_t> SuffixTrie::LongestPresent(absl::Span<const int32_t> context) const {
  // If m tokens are in the index, so are their last m - 1: a binary search.
  int64_t lo = 0, hi = std::min<int64_t>(static_cast<int64_t>(context.size()), max_depth_);
  int32_t node = 0;  // The root: the empty suffix.
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    const int32_t at = Walk(context, mid);
    if (at >= 0) {
      lo = mid;
      node = at;
    } else {
      hi = mid - 1;
    }
  }
  return {lo, node};
}

std::pair<int32_t, int32_t> SuffixTrie::LongestContinued(absl::Span<const int32_t> context,
                                                         int64_t present, int32_t present_node,
                                                         int64_t cap) const {
  // The longest from the longest in the index, within the cap, that occurred with a continuation.
  for (int64_t m = std::min(present, cap); m >= 1; --m) {
    const int32_t at = m == present ? present_node : Walk(context, m);
    if (nodes_[static_cast<size_t>(at)].continuations > 0) return {at, static_cast<int32_t>(m)};
  }
  return {-1, 0};
}

SuffixTrie::Draft SuffixTrie::Propose(absl::Span<const int32_t> context, int32_t k, double min_prob,
                                      std::vector<int32_t>* out) const {
  out->clear();
  if (k <= 0) return {};
  const auto [present, present_node] = LongestPresent(context);
  // Leave depth for k tokens.
  const auto [node, length] = LongestContinued(context, present, present_node, std::max(1, max_depth_ - k));
  if (node < 0) return {};
  return Continue(node, length, k, min_prob, out);
}

SuffixTrie::Draft SuffixTrie::ProposeFrom(absl::Span<const int32_t> context, int32_t k,
                                          double min_prob, Cursor* cursor,
                                          std::vector<int32_t>* out) const {
  out->clear();
  const int64_t len = static_cast<int64_t>(context.size());
  // The context's longest suffix in the index: if p tokens were and g more came, it is at most
  // p + g long (a longer one would have been longer before), so it is p + g where the index
  // continues the match with the g tokens, and searched for where not.
  int32_t node = -1;
  int64_t present = 0;
  if (cursor->node >= 0 && cursor->generation == generation_ && cursor->context_size <= len) {
    node = cursor->node;
    present = cursor->match_length;
    for (int64_t i = cursor->context_size; i < len && node >= 0; ++i, ++present) {
      node = Child(node, context[i]);
    }
    // At the index's depth the match cannot grow, only slide: its last max_depth tokens.
    if (node < 0 && present > max_depth_ && len >= max_depth_) {
      present = max_depth_;
      node = Walk(context, present);
    }
  }
  if (node < 0) std::tie(present, node) = LongestPresent(context);
  cursor->node = node;
  cursor->match_length = static_cast<int32_t>(present);
  cursor->context_size = len;
  cursor->generation = generation_;
  if (k <= 0) return {};
  const auto [at, length] = LongestContinued(context, present, node, std::max(1, max_depth_ - k));
  if (at < 0) return {};
  return Continue(at, length, k, min_prob, out);
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
