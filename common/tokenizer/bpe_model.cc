#include "common/tokenizer/bpe_model.h"

#include <algorithm>
#include <atomic>

#include "common/base/status_macros.h"
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
  // Where merges can join two characters (see EncodeWord).
  m.ascii_joins_.assign(128 * 128, false);
  for (const auto& [a, b] : merges) {
    size_t pos = 0, last = 0;
    while (pos < a.size()) {
      last = pos;
      NextCodePoint(a, &pos);
    }
    size_t q = last;
    const uint32_t left = NextCodePoint(a, &q);
    size_t r = 0;
    const uint32_t right = NextCodePoint(b, &r);
    if (left < 128 && right < 128) {
      m.ascii_joins_[left * 128 + right] = true;
    } else {
      m.joins_.insert((static_cast<uint64_t>(left) << 32) | right);
    }
  }
  static std::atomic<uint64_t> next_key{1};
  m.cache_key_ = next_key.fetch_add(1);
  for (int c = 0; c < 128; ++c) {
    auto it = m.vocab_.find(std::string(1, static_cast<char>(c)));
    m.ascii_ids_[c] = it == m.vocab_.end() ? -1 : it->second;
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

namespace {

struct Symbol {
  int32_t id;
  int32_t prev;
  int32_t next;
};

// Lowest rank first; on equal rank the leftmost pair first (Hugging Face's order).
struct Candidate {
  int32_t rank;
  int32_t left;
  int32_t left_id;
  int32_t right_id;
  int32_t merged_id;
};
// std::*_heap comparator (a max-heap of "later"): a functor so it inlines.
struct Later {
  bool operator()(const Candidate& a, const Candidate& b) const {
    return a.rank != b.rank ? a.rank > b.rank : a.left > b.left;
  }
};

// Pieces shorter than this are cached per thread.
constexpr size_t kMaxCachedPiece = 48;
constexpr size_t kMaxCacheEntries = 1 << 16;

// Per-thread buffers: words are encoded millions of times, their storage is reused.
struct Scratch {
  std::vector<Symbol> symbols;
  std::vector<Candidate> heap;
  // Piece -> ids, for the model `cache_key`; cleared when another model comes or when full.
  uint64_t cache_key = 0;
  absl::flat_hash_map<std::string, std::vector<int32_t>> cache;
};
Scratch& ThreadScratch() {
  thread_local Scratch scratch;
  return scratch;
}

}  // namespace

absl::Status BpeModel::EncodeWord(std::string_view word, std::vector<int32_t>* ids) const {
  if (word.empty()) return absl::OkStatus();
  if (options_.ignore_merges) {
    auto it = vocab_.find(AsAbsl(word));
    if (it != vocab_.end()) {
      ids->push_back(it->second);
      return absl::OkStatus();
    }
  }
  Scratch& scratch = ThreadScratch();
  if (scratch.cache_key != cache_key_ || scratch.cache.size() >= kMaxCacheEntries) {
    scratch.cache.clear();
    scratch.cache_key = cache_key_;
  }
  size_t start = 0, pos = 0;
  uint32_t prev = 0;
  while (pos < word.size()) {
    const size_t at = pos;
    const uint32_t cp = NextCodePoint(word, &pos);
    if (at > start && !CanJoin(prev, cp)) {
      PD_RETURN_IF_ERROR(EncodePiece(word.substr(start, at - start), ids));
      start = at;
    }
    prev = cp;
  }
  return EncodePiece(word.substr(start), ids);
}

absl::Status BpeModel::EncodePiece(std::string_view word, std::vector<int32_t>* ids) const {
  Scratch& scratch = ThreadScratch();
  const bool cacheable = word.size() < kMaxCachedPiece;
  if (cacheable) {
    auto hit = scratch.cache.find(AsAbsl(word));
    if (hit != scratch.cache.end()) {
      ids->insert(ids->end(), hit->second.begin(), hit->second.end());
      return absl::OkStatus();
    }
  }
  const size_t first_id = ids->size();
  std::vector<Symbol>& symbols = scratch.symbols;
  symbols.clear();
  auto push = [&](int32_t id) {
    const int32_t index = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, index - 1, index + 1});
  };
  size_t pos = 0;
  while (pos < word.size()) {
    const uint8_t lead = static_cast<uint8_t>(word[pos]);
    if (lead < 0x80 && ascii_ids_[lead] >= 0) {
      push(ascii_ids_[lead]);
      ++pos;
      continue;
    }
    const size_t start = pos;
    NextCodePoint(word, &pos);
    const std::string_view ch = word.substr(start, pos - start);
    auto it = vocab_.find(AsAbsl(ch));
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
      push(unk_id_);
    } else {
      return absl::InvalidArgumentError(
          Str("character '", ch, "' has no token and the model has no unk_token"));
    }
  }
  symbols.back().next = -1;

  std::vector<Candidate>& heap = scratch.heap;
  heap.clear();
  auto consider = [&](int32_t left) {
    if (left < 0) return;
    const int32_t right = symbols[left].next;
    if (right < 0) return;
    auto it = merges_.find(PairKey(symbols[left].id, symbols[right].id));
    if (it == merges_.end()) return;
    heap.push_back({it->second.rank, left, symbols[left].id, symbols[right].id, it->second.merged_id});
    std::push_heap(heap.begin(), heap.end(), Later());
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(symbols.size()); ++i) consider(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), Later());
    const Candidate c = heap.back();
    heap.pop_back();
    Symbol& left = symbols[c.left];
    const int32_t right = left.next;
    // Stale entry: a neighbour merged since this pair was queued (a merged-away symbol has its
    // id set to -1, so it never matches).
    if (left.id != c.left_id || right < 0 || symbols[right].id != c.right_id) continue;
    left.id = c.merged_id;
    symbols[right].id = -1;
    left.next = symbols[right].next;
    if (left.next >= 0) symbols[left.next].prev = c.left;
    consider(left.prev);
    consider(c.left);
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next) ids->push_back(symbols[i].id);
  if (cacheable) {
    scratch.cache.emplace(std::string(word), std::vector<int32_t>(ids->begin() + first_id, ids->end()));
  }
  return absl::OkStatus();
}

}  // namespace pdserve
