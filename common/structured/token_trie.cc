#include "common/structured/token_trie.h"

#include <algorithm>
#include <numeric>

namespace pdserve::structured {

TokenTrie::TokenTrie(const std::vector<std::string>& token_bytes)
    : vocab_size_(static_cast<int64_t>(token_bytes.size())) {
  // Tokens sorted by their bytes: each node's subtree is a contiguous run, built breadth-first
  // so that a node's children are adjacent.
  std::vector<int32_t> order(token_bytes.size());
  std::iota(order.begin(), order.end(), 0);
  order.erase(std::remove_if(order.begin(), order.end(), [&](int32_t t) { return token_bytes[static_cast<size_t>(t)].empty(); }),
              order.end());
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return token_bytes[static_cast<size_t>(a)] < token_bytes[static_cast<size_t>(b)];
  });
  struct Pending {
    uint32_t node;
    size_t begin, end;  // The tokens under it, in `order`.
    size_t depth;
  };
  nodes_.push_back(Node{});
  std::vector<Pending> queue = {{0, 0, order.size(), 0}};
  for (size_t q = 0; q < queue.size(); ++q) {
    const Pending p = queue[q];
    const auto bytes = [&](size_t i) -> const std::string& { return token_bytes[static_cast<size_t>(order[i])]; };
    size_t i = p.begin;
    // Tokens that end at this node come first (shortest sorts first).
    nodes_[p.node].first_token = static_cast<int32_t>(tokens_.size());
    while (i < p.end && bytes(i).size() == p.depth) tokens_.push_back(order[i++]);
    nodes_[p.node].num_tokens = static_cast<int32_t>(tokens_.size()) - nodes_[p.node].first_token;
    nodes_[p.node].first_child = static_cast<uint32_t>(nodes_.size());
    while (i < p.end) {
      const uint8_t b = static_cast<uint8_t>(bytes(i)[p.depth]);
      size_t j = i;
      while (j < p.end && static_cast<uint8_t>(bytes(j)[p.depth]) == b) ++j;
      Node child;
      child.byte = b;
      queue.push_back({static_cast<uint32_t>(nodes_.size()), i, j, p.depth + 1});
      nodes_.push_back(child);
      ++nodes_[p.node].num_children;
      i = j;
    }
  }
}

void TokenTrie::FillMask(const GrammarMatcher& matcher, std::vector<uint8_t>* allowed) const {
  allowed->assign(static_cast<size_t>(vocab_size_), 0);
  Walk(0, matcher, matcher.state(), allowed);
}

void TokenTrie::Walk(uint32_t node, const GrammarMatcher& m, int32_t state,
                     std::vector<uint8_t>* allowed) const {
  const Node& n = nodes_[node];
  const ByteSet next = m.NextBytes(state);  // A copy: Next may add states (and move them).
  for (uint32_t c = n.first_child; c < n.first_child + n.num_children; ++c) {
    const Node& child = nodes_[c];
    if (!next[child.byte]) continue;
    const int32_t after = m.Next(state, child.byte);
    if (after < 0) continue;
    for (int32_t t = child.first_token; t < child.first_token + child.num_tokens; ++t) {
      (*allowed)[static_cast<size_t>(tokens_[static_cast<size_t>(t)])] = 1;
    }
    if (child.num_children > 0) Walk(c, m, after, allowed);
  }
}

}  // namespace pdserve::structured
