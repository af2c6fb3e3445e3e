// Suffix decoding's index: every substring of up to max_depth tokens of the sequences appended,
// with how often each occurred and, per substring, its most frequent continuation. A draft
// follows the longest suffix of a context found in the index, then the most frequent next token
// while its share of the continuations stays at least min_prob (a confidence cut, as suffix
// decoding in Arctic Inference and vLLM does).
//
// Memory: up to max_depth nodes per appended token (a node per new substring), so callers bound
// what they append. Not thread-safe.
#ifndef PDSERVE_COMMON_ENGINE_SUFFIX_TRIE_H_
#define PDSERVE_COMMON_ENGINE_SUFFIX_TRIE_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"

namespace pdserve {

class SuffixTrie {
 public:
  explicit SuffixTrie(int32_t max_depth);

  // Appends a token to the current sequence: each substring ending with it (up to max_depth
  // tokens) gains an occurrence.
  void Append(int32_t token);
  void Append(absl::Span<const int32_t> tokens) {
    for (int32_t t : tokens) Append(t);
  }
  // The next Append starts a new sequence (no substring spans the boundary).
  void EndSequence();
  // Empties the index; its memory stays allocated for what is appended next.
  void Clear();
  // Room for `tokens` more appended tokens without growing the index's tables on the way (a
  // prompt indexed at once: growing them is half of its cost).
  void Reserve(int64_t tokens);

  struct Draft {
    int32_t match_length = 0;  // Context tokens matched (0: nothing proposed).
    double score = 0;          // Sum of the proposed tokens' shares (expected accepted tokens).
  };
  // Appends to *out (cleared first) up to k tokens, and no more than the match is long,
  // continuing the longest suffix of `context` (at most max_depth - k tokens, so that k fit in
  // the index) that occurred with a continuation.
  Draft Propose(absl::Span<const int32_t> context, int32_t k, double min_prob,
                std::vector<int32_t>* out) const;
  // Where a context matched, kept between calls (ProposeFrom) for a context that grows by a few
  // tokens at a time.
  struct Cursor {
    int32_t node = -1;         // The node of the context's longest suffix in the index (-1: search).
    int32_t match_length = 0;  // Its length.
    int64_t context_size = 0;  // The context's length then.
    uint64_t generation = 0;   // The index's Clears before it (a Clear invalidates it).
  };
  // Propose for a context that has only grown since `cursor` was set on it: the longest suffix
  // in the index is extended by the new tokens (a lookup each) and searched for again
  // (Propose's walks) only where that fails or the index was cleared. While the index does not
  // change, the draft is Propose's; where it learned a longer match since, it may be shorter
  // (a draft is a guess: the output does not depend on it).
  Draft ProposeFrom(absl::Span<const int32_t> context, int32_t k, double min_prob, Cursor* cursor,
                    std::vector<int32_t>* out) const;
  // The same for the context that is the current sequence itself (what was appended since the
  // last EndSequence), in O(max_depth): its suffixes' nodes are at hand.
  Draft ProposeForCurrent(int32_t k, double min_prob, std::vector<int32_t>* out) const;

  int64_t num_nodes() const { return static_cast<int64_t>(nodes_.size()); }
  int32_t max_depth() const { return max_depth_; }

 private:
  struct Node {
    int32_t count = 0;          // Occurrences of this substring.
    int32_t continuations = 0;  // Of them, followed by a token (the children's counts' sum).
    int32_t best_child = -1;    // Most frequent continuation (the first to reach its count).
    int32_t token = -1;         // The last token of the substring.
  };
  static uint64_t Key(int32_t node, int32_t token) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(node)) << 32) | static_cast<uint32_t>(token);
  }
  int32_t Child(int32_t node, int32_t token) const;
  // The node of `context`'s last m tokens, or -1 if they are not in the index.
  int32_t Walk(absl::Span<const int32_t> context, int64_t m) const;
  // The length of the longest suffix of `context` in the index, and its node.
  std::pair<int64_t, int32_t> LongestPresent(absl::Span<const int32_t> context) const;
  // The node of the longest suffix of `context` of at most `cap` tokens that occurred with a
  // continuation, and its length ({-1, 0} if none), given the longest in the index and its node.
  std::pair<int32_t, int32_t> LongestContinued(absl::Span<const int32_t> context, int64_t present,
                                               int32_t present_node, int64_t cap) const;
  // Drafts from `node`, a matched suffix of match_length tokens.
  Draft Continue(int32_t node, int32_t match_length, int32_t k, double min_prob,
                 std::vector<int32_t>* out) const;

  const int32_t max_depth_;
  std::vector<Node> nodes_;  // nodes_[0]: the empty substring.
  absl::flat_hash_map<uint64_t, int32_t> children_;
  std::vector<int32_t> active_;  // Nodes of the substrings ending at the last token, shortest first.
  std::vector<int32_t> next_active_;
  uint64_t generation_ = 0;
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_ENGINE_SUFFIX_TRIE_H_
