// Byte-pair encoding with ranked merges (the "BPE" model of tokenizer.json).
// Immutable after construction; thread-safe.
#ifndef PDSERVE_COMMON_TOKENIZER_BPE_MODEL_H_
#define PDSERVE_COMMON_TOKENIZER_BPE_MODEL_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"

namespace pdserve {

class BpeModel {
 public:
  struct Options {
    bool ignore_merges = false;  // Llama 3: a word that is itself in the vocab is one token.
    bool byte_fallback = false;  // SentencePiece: unknown characters become <0xNN> tokens.
    std::string unk_token;       // Empty: no unknown token (unknown characters are an error).
  };

  // `vocab`: token string -> id. `merges`: pairs in rank order (first = applied first).
  static absl::StatusOr<BpeModel> Create(
      absl::flat_hash_map<std::string, int32_t> vocab,
      const std::vector<std::pair<std::string, std::string>>& merges, Options options);

  // Appends the ids of one pre-tokenized word (already byte-level mapped when applicable).
  // Fails only when a character has no token and there is neither byte fallback nor unk.
  //
  // The word is first cut where no merge can ever join its two sides: between characters a and b
  // when no merge rule's left part ends with a and right part starts with b. Pieces then merge
  // independently (a merge only changes its neighbours' candidate pairs), so the result equals
  // BPE on the whole word, while a SentencePiece "word" (a whole line) costs O(n) instead of
  // O(n log n) and common pieces come from a per-thread cache.
  absl::Status EncodeWord(std::string_view word, std::vector<int32_t>* ids) const;

  // Token string for id, or nullptr when id is not in the vocab.
  const std::string* TokenOf(int32_t id) const;
  std::optional<int32_t> IdOf(std::string_view token) const;
  int32_t max_id() const { return static_cast<int32_t>(id_to_token_.size()) - 1; }
  size_t num_merges() const { return merges_.size(); }

 private:
  struct PairHash {
    size_t operator()(uint64_t key) const { return absl::Hash<uint64_t>()(key); }
  };
  struct Merge {
    int32_t rank;
    int32_t merged_id;
  };
  static uint64_t PairKey(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  Options options_;
  absl::flat_hash_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;  // Holes (ids not in the vocab) are empty strings.
  std::vector<bool> has_id_;
  absl::flat_hash_map<uint64_t, Merge> merges_;
  int32_t unk_id_ = -1;
  int32_t byte_ids_[256];   // <0xNN> ids when byte_fallback, else -1.
  int32_t ascii_ids_[128];  // Id of each one-character ASCII token, or -1 (skips a hash lookup).
  // (last code point of a merge's left part, first code point of its right part), for merges
  // whose two are both ASCII in a bitmap, the others in a set.
  std::vector<bool> ascii_joins_;  // [128 * 128]
  absl::flat_hash_set<uint64_t> joins_;
  uint64_t cache_key_ = 0;  // Identifies this model in the per-thread piece cache.

  absl::Status EncodePiece(std::string_view piece, std::vector<int32_t>* ids) const;
  bool CanJoin(uint32_t left, uint32_t right) const {
    if (left < 128 && right < 128) return ascii_joins_[left * 128 + right];
    return joins_.contains((static_cast<uint64_t>(left) << 32) | right);
  }
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_TOKENIZER_BPE_MODEL_H_
