#include "common/tokenizer/bpe_model.h"

#include <queue>

#include "common/base/strings.h"
#include "absl/strings/str_format.h"
#include "common/tokenizer/unicode.h"

namespace pdserve {

absl::StatusOr<BpeModel> BpeModel::Create(
    absl::flat_hash_map<std::string, int32_t> vocab,
    const std::vector<std::pair<std::string, std::string>>& merges, Options options) {
  BpeModel m;
  m.options_ = std::move(options);
  int32_t max_id = -1;
  for (const auto& [token, id] : vocab) {
    if (id < 0) return absl::InvalidArgumentError(Str("vocab: negative id for ", token));
    max_id = std::max(max_id, id);
  }
  if (max_id > (1 << 24)) {
    return absl::InvalidArgumentError(Str("vocab: implausible id ", max_id));
  }
  m.id_to_token_.resize(max_id + 1);
  m.has_id_.assign(max_id + 1, false);
  for (const auto& [token, id] : vocab) {
    if (m.has_id_[id]) {
      return absl::InvalidArgumentError(Str("vocab: id ", id, " is used twice"));
    }
    m.id_to_token_[id] = token;
    m.has_id_[id] = true;
  }
  m.vocab_ = std::move(vocab);
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    auto ia = m.vocab_.find(a), ib = m.vocab_.find(b), iab = m.vocab_.find(a + b);
    if (ia == m.vocab_.end() || ib == m.vocab_.end() || iab == m.vocab_.end()) {
      return absl::InvalidArgumentError(Str("merges[", rank, "] ('", a, "', '", b,
                                                     "') uses a token that is not in the vocab"));
    }
    // A pair listed twice keeps its last rank, as Hugging Face tokenizers' map does.
    m.merges_.insert_or_assign(PairKey(ia->second, ib->second),
                               Merge{static_cast<int32_t>(rank), iab->second});
  }
  if (!m.options_.unk_token.empty()) {
    auto it = m.vocab_.find(m.options_.unk_token);
    if (it == m.vocab_.end()) {
      return absl::InvalidArgumentError(
          Str("unk_token '", m.options_.unk_token, "' is not in the vocab"));
    }
    m.unk_id_ = it->second;
  }
  for (int b = 0; b < 256; ++b) {
    m.byte_ids_[b] = -1;
    if (m.options_.byte_fallback) {
      auto it = m.vocab_.find(absl::StrFormat("<0x%02X>", b));
      if (it != m.vocab_.end()) m.byte_ids_[b] = it->second;
    }
  }
  return m;
}

const std::string* BpeModel::TokenOf(int32_t id) const {
  if (id < 0 || id >= static_cast<int32_t>(id_to_token_.size()) || !has_id_[id]) return nullptr;
  return &id_to_token_[id];
}

std::optional<int32_t> BpeModel::IdOf(std::string_view token) const {
  auto it = vocab_.find(AsAbsl(token));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

absl::Status BpeModel::EncodeWord(std::string_view word, std::vector<int32_t>* ids) const {
  if (word.empty()) return absl::OkStatus();
  if (options_.ignore_merges) {
    auto it = vocab_.find(AsAbsl(word));
    if (it != vocab_.end()) {
      ids->push_back(it->second);
      return absl::OkStatus();
    }
  }
  // Symbols: one per character to start with, linked so merges are O(1).
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  size_t pos = 0;
  while (pos < word.size()) {
    const size_t start = pos;
    NextCodePoint(word, &pos);
    const std::string_view ch = word.substr(start, pos - start);
    auto it = vocab_.find(AsAbsl(ch));
    auto push = [&](int32_t id) {
      const int32_t index = static_cast<int32_t>(symbols.size());
      symbols.push_back({id, index - 1, index + 1});
    };
    if (it != vocab_.end()) {
      push(it->second);
    } else if (options_.byte_fallback && byte_ids_[static_cast<uint8_t>(ch[0])] >= 0) {
      for (char c : ch) {
        const int32_t id = byte_ids_[static_cast<uint8_t>(c)];
        if (id < 0) {
          return absl::InvalidArgumentError(
              absl::StrFormat("no byte-fallback token <0x%02X>", static_cast<uint8_t>(c)));
        }
        push(id);
      }
    } else if (unk_id_ >= 0) {
      // fuse_unk is not applied: consecutive unknowns each give one unk.
      push(unk_id_);
    } else {
      return absl::InvalidArgumentError(
          Str("character '", ch, "' has no token and the model has no unk_token"));
    }
  }
  if (!symbols.empty()) symbols.back().next = -1;

  // Lowest rank first; on equal rank the leftmost pair first.
  struct Candidate {
    int32_t rank;
    int32_t left;
    int32_t left_id;
    int32_t right_id;
    int32_t merged_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : left > o.left;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  auto consider = [&](int32_t left) {
    if (left < 0) return;
    const int32_t right = symbols[left].next;
    if (right < 0) return;
    auto it = merges_.find(PairKey(symbols[left].id, symbols[right].id));
    if (it == merges_.end()) return;
    queue.push({it->second.rank, left, symbols[left].id, symbols[right].id, it->second.merged_id});
  };
  for (int32_t i = 0; i < static_cast<int32_t>(symbols.size()); ++i) consider(i);
  std::vector<bool> dead(symbols.size(), false);
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    if (dead[c.left]) continue;
    const int32_t right = symbols[c.left].next;
    // Stale entry: a neighbour merged since this pair was queued.
    if (right < 0 || symbols[c.left].id != c.left_id || symbols[right].id != c.right_id) continue;
    symbols[c.left].id = c.merged_id;
    dead[right] = true;
    symbols[c.left].next = symbols[right].next;
    if (symbols[right].next >= 0) symbols[symbols[right].next].prev = c.left;
    consider(symbols[c.left].prev);
    consider(c.left);
  }
  for (int32_t i = 0; i >= 0 && i < static_cast<int32_t>(symbols.size()); i = symbols[i].next) {
    ids->push_back(symbols[i].id);
  }
  return absl::OkStatus();
}

}  // namespace pdserve
