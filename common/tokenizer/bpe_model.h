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
  int32_t byte_ids_[256];  // <0xNN> ids when byte_fallback, else -1.
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_TOKENIZER_BPE_MODEL_H_
