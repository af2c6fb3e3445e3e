#include "common/structured/token_trie.h"

#include <algorithm>
#include <numeric>

namespace pdserve::structured {
namespace {

// Bytes by kind, for the subtree test: controls, whitespace controls, space, '"', '\\', digits,
// upper and lower letters, other ASCII punctuation, UTF-8 continuation and lead bytes.
constexpr int kNumKinds = 14;
int ByteKind(uint8_t b) {
  if (b < 0x09) return 0;
  if (b <= 0x0D) return 1;
  if (b < 0x20) return 2;
  if (b == ' ') return 3;
  if (b == '"') return 4;
  if (b == '\\') return 5;
  if (b >= '0' && b <= '9') return 6;
  if (b >= 'A' && b <= 'Z') return 7;
  if (b >= 'a' && b <= 'z') return 8;
  if (b < 0x80) return 9;
  if (b < 0xC0) return 10;
  if (b < 0xE0) return 11;
  if (b < 0xF0) return 12;
  return 13;
}
static_assert(kNumKinds <= 16);

}  // namespace

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
    nodes_[p.node].sub_begin = static_cast<uint32_t>(p.begin);
    nodes_[p.node].sub_end = static_cast<uint32_t>(p.end);
    for (size_t t = p.begin; t < p.end; ++t) {  // Each token's bytes past depth: O(total bytes x depth).
      for (size_t d = p.depth; d < bytes(t).size(); ++d) {
        nodes_[p.node].kinds_below |= static_cast<uint16_t>(1u << ByteKind(static_cast<uint8_t>(bytes(t)[d])));
      }
    }
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
  sorted_ = std::move(order);
}

void TokenTrie::FillMask(const GrammarMatcher& matcher, std::vector<uint8_t>* allowed) const {
  allowed->assign(static_cast<size_t>(vocab_size_), 0);
  absl::flat_hash_map<int32_t, uint16_t> memo;
  Walk(0, matcher, matcher.state(), /*loops=*/-1, allowed, &memo);
}

uint16_t TokenTrie::SelfLoops(const GrammarMatcher& m, int32_t state,
                              absl::flat_hash_map<int32_t, uint16_t>* memo) const {
  if (auto it = memo->find(state); it != memo->end()) return it->second;
  uint16_t broken = 0;  // Kinds with a byte that moves the state (or is refused).
  for (int b = 0; b < 256; ++b) {
    const int kind = ByteKind(static_cast<uint8_t>(b));
    if ((broken >> kind) & 1) continue;
    if (m.Next(state, static_cast<uint8_t>(b)) != state) broken |= static_cast<uint16_t>(1u << kind);
  }
  const uint16_t loops = static_cast<uint16_t>(~broken & ((1u << kNumKinds) - 1));
  memo->emplace(state, loops);
  return loops;
}

void TokenTrie::Walk(uint32_t node, const GrammarMatcher& m, int32_t state, int32_t loops,
                     std::vector<uint8_t>* allowed, absl::flat_hash_map<int32_t, uint16_t>* memo) const {
  const Node& n = nodes_[node];
  ByteSet next;  // A copy, made when first needed: Next may add states (and move them).
  bool next_known = false;
  for (uint32_t c = n.first_child; c < n.first_child + n.num_children; ++c) {
    const Node& child = nodes_[c];
    int32_t after = state;
    if (loops < 0 || !((loops >> ByteKind(child.byte)) & 1)) {  // Else it keeps the state.
      if (!next_known) {
        next = m.NextBytes(state);
        next_known = true;
      }
      if (!next[child.byte]) continue;
      after = m.Next(state, child.byte);
      if (after < 0) continue;
    }
    int32_t child_loops = -1;
    if (after == state) {
      // Which kinds of byte keep this state, learnt once it pays (small subtrees are cheaper to
      // walk than the 256 transitions are to test).
      if (loops < 0 && child.sub_end - child.sub_begin >= 16) loops = SelfLoops(m, state, memo);
      child_loops = loops;
      if (loops >= 0 && (child.kinds_below & ~loops) == 0) {  // Every byte below keeps it.
        for (uint32_t t = child.sub_begin; t < child.sub_end; ++t) {
          (*allowed)[static_cast<size_t>(sorted_[t])] = 1;
        }
        continue;
      }
    }
    for (int32_t t = child.first_token; t < child.first_token + child.num_tokens; ++t) {
      (*allowed)[static_cast<size_t>(tokens_[static_cast<size_t>(t)])] = 1;
    }
    if (child.num_children > 0) Walk(c, m, after, child_loops, allowed, memo);
  }
}

}  // namespace pdserve::structured
