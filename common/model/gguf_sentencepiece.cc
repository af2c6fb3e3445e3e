#include "common/model/gguf_sentencepiece.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string_view>
#include <unordered_map>

namespace pdserve {
namespace {

// Python splits a str by characters: a split point is a byte that does not continue a UTF-8
// sequence.
bool CharBoundary(std::string_view s, size_t k) {
  return (static_cast<unsigned char>(s[k]) & 0xC0) != 0x80;
}

}  // namespace

std::vector<Merge> MergesFromScores(const std::vector<std::string>& pieces,
                                    const std::vector<float>& scores) {
  // transformers: vocab = {piece: id} (a repeated piece keeps its last id); the pieces are walked
  // as dict(vocab_scores) holds them (first position, last score).
  struct Entry {
    size_t id;
    float score;
  };
  std::unordered_map<std::string_view, Entry> vocab;
  std::vector<size_t> order;
  for (size_t i = 0; i < pieces.size(); ++i) {
    float s = i < scores.size() ? scores[i] : 0.0f;
    if (std::isnan(s)) s = -std::numeric_limits<float>::infinity();  // Keeps the sort ordered.
    auto [it, first] = vocab.insert_or_assign(pieces[i], Entry{i, s});
    if (first) order.push_back(i);
  }
  struct Candidate {
    size_t left_id, right_id;
    float score;
    size_t piece, split;
  };
  std::vector<Candidate> all;
  std::vector<Candidate> local;
  for (size_t i : order) {
    const std::string_view p = pieces[i];
    local.clear();
    for (size_t k = 1; k < p.size(); ++k) {
      if (!CharBoundary(p, k)) continue;
      auto l = vocab.find(p.substr(0, k));
      if (l == vocab.end()) continue;
      auto r = vocab.find(p.substr(k));
      if (r == vocab.end()) continue;
      local.push_back({l->second.id, r->second.id, vocab.at(p).score, i, k});
    }
    std::sort(local.begin(), local.end(), [](const Candidate& a, const Candidate& b) {
      return a.left_id != b.left_id ? a.left_id < b.left_id : a.right_id < b.right_id;
    });
    all.insert(all.end(), local.begin(), local.end());
  }
  std::stable_sort(all.begin(), all.end(),
                   [](const Candidate& a, const Candidate& b) { return a.score > b.score; });
  std::vector<Merge> merges;
  merges.reserve(all.size());
  for (const Candidate& c : all) {
    const std::string& p = pieces[c.piece];
    merges.emplace_back(p.substr(0, c.split), p.substr(c.split));
  }
  return merges;
}

std::vector<float> ScoresFromMerges(const std::vector<std::string>& pieces,
                                    const std::vector<PieceType>& types,
                                    const std::vector<Merge>& merges) {
  std::unordered_map<std::string, size_t> first_rank;
  for (size_t r = 0; r < merges.size(); ++r) {
    first_rank.emplace(merges[r].first + merges[r].second, r);
  }
  std::vector<float> scores(pieces.size());
  for (size_t i = 0; i < pieces.size(); ++i) {
    auto it = first_rank.find(pieces[i]);
    const PieceType t = i < types.size() ? types[i] : PieceType::kNormal;
    if (it != first_rank.end()) {
      scores[i] = -static_cast<float>(it->second);
    } else if (t == PieceType::kControl || t == PieceType::kUnknown || t == PieceType::kByte) {
      scores[i] = 0.0f;
    } else {
      scores[i] = -static_cast<float>(merges.size() + i);
    }
  }
  return scores;
}

}  // namespace pdserve
