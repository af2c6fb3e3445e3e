// A vocabulary's tokens by their bytes, for the allowed-token mask of a constrained step: a walk
// of the trie from the matcher's state visits each byte prefix once and drops a whole subtree
// as soon as the grammar refuses its prefix, and takes a whole subtree without visiting it where
// every byte below it leaves the matcher's state as it is (inside a JSON string, most of a
// vocabulary: each node knows which kinds of bytes its subtree holds).
#ifndef PDSERVE_COMMON_STRUCTURED_TOKEN_TRIE_H_
#define PDSERVE_COMMON_STRUCTURED_TOKEN_TRIE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"

#include "common/structured/grammar_matcher.h"

namespace pdserve::structured {

class TokenTrie {
 public:
  // token_bytes[id]: the bytes token id stands for; empty for tokens a constraint never allows
  // (special tokens: EOS is the caller's, allowed where the matcher can end).
  explicit TokenTrie(const std::vector<std::string>& token_bytes);

  // allowed[id] (resized to the vocabulary, cleared first): the matcher accepts all of the
  // token's bytes from its state.
  void FillMask(const GrammarMatcher& matcher, std::vector<uint8_t>* allowed) const;
  int64_t vocab_size() const { return vocab_size_; }
  int64_t num_nodes() const { return static_cast<int64_t>(nodes_.size()); }

 private:
  struct Node {
    uint32_t first_child = 0;  // Children are nodes_[first_child, first_child + num_children).
    uint16_t num_children = 0;
    uint8_t byte = 0;
    int32_t first_token = 0;  // Tokens ending here: tokens_[first_token, first_token + num_tokens).
    int32_t num_tokens = 0;
    // The subtree's tokens (this node's and below): sorted_[sub_begin, sub_end); and the kinds of
    // bytes past this node's on their way (ByteKinds).
    uint32_t sub_begin = 0, sub_end = 0;
    uint16_t kinds_below = 0;
  };
  // Which kinds of byte leave `state` where it is (bit k: every byte of kind k), memoized per walk.
  uint16_t SelfLoops(const GrammarMatcher& m, int32_t state,
                     absl::flat_hash_map<int32_t, uint16_t>* memo) const;
  // `loops`: SelfLoops of `state` where known, else -1.
  void Walk(uint32_t node, const GrammarMatcher& m, int32_t state, int32_t loops,
            std::vector<uint8_t>* allowed, absl::flat_hash_map<int32_t, uint16_t>* memo) const;

  std::vector<Node> nodes_;  // nodes_[0]: the root (the empty prefix).
  std::vector<int32_t> tokens_;
  std::vector<int32_t> sorted_;  // Tokens sorted by their bytes: a subtree is a contiguous run.
  int64_t vocab_size_ = 0;
};

}  // namespace pdserve::structured

#endif  // PDSERVE_COMMON_STRUCTURED_TOKEN_TRIE_H_
