// Constraints over one vocabulary: a worker's cache of compiled constraints, and each
// constrained request's matcher and allowed-token masks.
//
// A constraint is compiled once per distinct text (LRU, bounded) and its matcher's lazily built
// tables are shared by every request with it; a mask is computed once per matcher state (a
// bitset over the vocabulary, kept up to a memory bound), so the steady state of a constrained
// request is a table lookup per token. Not thread-safe: one cache per engine, used from the
// engine's thread.
#ifndef PDSERVE_COMMON_STRUCTURED_TOKEN_CONSTRAINT_H_
#define PDSERVE_COMMON_STRUCTURED_TOKEN_CONSTRAINT_H_

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/structured/constraint.h"
#include "common/structured/grammar_matcher.h"
#include "common/structured/json_keys.h"
#include "common/structured/token_trie.h"

namespace pdserve::structured {

// A token mask: bit t of words[t / 64] set where token t may come next.
struct TokenMask {
  std::vector<uint64_t> words;
  int64_t allowed = 0;  // Bits set.
  bool Test(int32_t t) const { return (words[static_cast<size_t>(t) >> 6] >> (t & 63)) & 1; }
};

class ConstraintCache;
struct CompiledConstraint;

// One request's place in its constraint.
class TokenConstraint {
 public:
  TokenConstraint(ConstraintCache* cache, std::shared_ptr<CompiledConstraint> compiled);
  ~TokenConstraint();

  // Advances by the token's bytes; false (nothing changed) where the constraint refuses it.
  // End-of-sequence tokens are the caller's (see Mask).
  bool Accept(int32_t token);
  // The tokens allowed next, end-of-sequence ones where the output may end here. Valid until the
  // cache's masks are flushed (a Mask of any of its requests that passes the memory bound), or
  // this constraint's next Mask or Accept. For JSON outputs, the state's mask less the tokens
  // that would repeat a key of an open object (json_keys.h).
  const TokenMask& Mask();
  // The mask of this state is computed (Mask costs a lookup).
  bool MaskReady() const;
  // Computes this state's mask now (another thread's, while the owner waits), not counted as a
  // lookup.
  void PrepareMask();
  bool CanEnd() const { return matcher_.CanEnd(); }
  // Tokens that `Accept` in order: the longest prefix of `tokens` this constraint allows
  // (speculative drafts), without advancing.
  size_t AllowedPrefix(const std::vector<int32_t>& tokens) const;

 private:
  ConstraintCache* cache_;
  std::shared_ptr<CompiledConstraint> compiled_;
  GrammarMatcher matcher_;
  std::unique_ptr<JsonKeyTracker> keys_;  // JSON outputs only.
  TokenMask own_mask_;                     // The state's mask with repeated keys taken out.
};

class ConstraintCache {
 public:
  // token_bytes[id]: what token id writes into the text (empty: never allowed, as special
  // tokens are); vocab_size >= token_bytes.size() (a model's padding ids are never allowed).
  ConstraintCache(std::vector<std::string> token_bytes, int64_t vocab_size,
                  std::vector<int32_t> eos_ids, size_t max_grammars = 64,
                  int64_t max_mask_bytes = int64_t{256} << 20);
  ~ConstraintCache();

  // A request's matcher at the start of its output; InvalidArgument naming the constraint's
  // field where it does not compile.
  absl::StatusOr<std::unique_ptr<TokenConstraint>> Start(const OutputConstraint& c);

  int64_t vocab_size() const { return vocab_size_; }
  int64_t compiled() const { return compiled_count_; }     // Compilations (cache misses).
  int64_t masks_computed() const { return masks_computed_; }
  int64_t mask_lookups() const { return mask_lookups_; }

 private:
  friend class TokenConstraint;
  const std::string& bytes(int32_t token) const;
  const TokenMask& MaskFor(CompiledConstraint* c, const GrammarMatcher& m, bool lookup = true);
  // `mask` less the tokens that would close a key `keys` has in that object: `mask` itself if
  // none would, else *out.
  const TokenMask& WithoutRepeatedKeys(const TokenMask& mask, const JsonKeyTracker& keys,
                                       TokenMask* out) const;

  std::vector<std::string> token_bytes_;
  // Tokens with a '"' in their bytes, the ones that may close keys: with one (they matter only
  // inside a key's string), and with more (they may open and close one).
  std::vector<int32_t> one_quote_tokens_, quotes_tokens_;
  TokenTrie trie_;
  int64_t vocab_size_;
  std::vector<int32_t> eos_ids_;
  size_t max_grammars_;
  int64_t max_mask_bytes_;
  int64_t mask_bytes_ = 0;  // Of the masks computed since the last flush (evicted ones too).
  std::list<std::string> lru_;  // Keys, most recent first.
  absl::flat_hash_map<std::string, std::pair<std::shared_ptr<CompiledConstraint>,
                                             std::list<std::string>::iterator>> grammars_;
  std::vector<std::weak_ptr<CompiledConstraint>> live_;  // For a mask-cache flush.
  std::vector<uint8_t> scratch_;
  int64_t compiled_count_ = 0, masks_computed_ = 0, mask_lookups_ = 0;
};

}  // namespace pdserve::structured

#endif  // PDSERVE_COMMON_STRUCTURED_TOKEN_CONSTRAINT_H_
