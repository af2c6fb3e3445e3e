#include "common/structured/token_constraint.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/container/node_hash_map.h"
#include "common/base/strings.h"

namespace pdserve::structured {

struct CompiledConstraint {
  std::shared_ptr<const Grammar> grammar;
  GrammarMatcher prototype;  // Its tables are shared by every request's copy.
  absl::node_hash_map<int32_t, TokenMask> masks;  // By matcher state (stable references).
  bool json = false;  // The output is JSON: its keys are tracked (json_keys.h).
  CompiledConstraint(std::shared_ptr<const Grammar> g, bool json_output)
      : grammar(g), prototype(g), json(json_output) {}
};

TokenConstraint::TokenConstraint(ConstraintCache* cache, std::shared_ptr<CompiledConstraint> compiled)
    : cache_(cache), compiled_(std::move(compiled)), matcher_(compiled_->prototype) {
  if (compiled_->json) keys_ = std::make_unique<JsonKeyTracker>();
}

TokenConstraint::~TokenConstraint() = default;

bool TokenConstraint::Accept(int32_t token) {
  const std::string& b = cache_->bytes(token);
  if (b.empty()) return false;
  if (keys_ != nullptr && !JsonKeyTracker::Lookahead(*keys_).Feed(b)) return false;
  if (!matcher_.Advance(b)) return false;
  if (keys_ != nullptr) keys_->Advance(b);
  return true;
}

const TokenMask& TokenConstraint::Mask() {
  const TokenMask& mask = cache_->MaskFor(compiled_.get(), matcher_);
  if (keys_ == nullptr) return mask;
  return cache_->WithoutRepeatedKeys(mask, *keys_, &own_mask_);
}

bool TokenConstraint::MaskReady() const { return compiled_->masks.contains(matcher_.state()); }

void TokenConstraint::PrepareMask() { cache_->MaskFor(compiled_.get(), matcher_, /*lookup=*/false); }

size_t TokenConstraint::AllowedPrefix(const std::vector<int32_t>& tokens) const {
  int32_t state = matcher_.state();
  std::optional<JsonKeyTracker::Lookahead> keys;
  if (keys_ != nullptr) keys.emplace(*keys_);
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::string& b = cache_->bytes(tokens[i]);
    if (b.empty()) return i;
    if (keys.has_value() && !keys->Feed(b)) return i;
    for (char c : b) {
      state = matcher_.Next(state, static_cast<uint8_t>(c));
      if (state < 0) return i;
    }
  }
  return tokens.size();
}

namespace {

std::vector<std::string> Truncated(std::vector<std::string> v, int64_t n) {
  if (static_cast<int64_t>(v.size()) > n) v.resize(static_cast<size_t>(n));
  return v;
}

}  // namespace

ConstraintCache::ConstraintCache(std::vector<std::string> token_bytes, int64_t vocab_size,
                                 std::vector<int32_t> eos_ids, size_t max_grammars,
                                 int64_t max_mask_bytes)
    : token_bytes_(Truncated(std::move(token_bytes), vocab_size)),
      trie_(token_bytes_),
      vocab_size_(vocab_size),
      eos_ids_(std::move(eos_ids)),
      max_grammars_(std::max<size_t>(1, max_grammars)),
      max_mask_bytes_(max_mask_bytes) {
  for (size_t t = 0; t < token_bytes_.size(); ++t) {
    const auto quotes = std::count(token_bytes_[t].begin(), token_bytes_[t].end(), '"');
    if (quotes == 1) one_quote_tokens_.push_back(static_cast<int32_t>(t));
    if (quotes > 1) quotes_tokens_.push_back(static_cast<int32_t>(t));
  }
}

ConstraintCache::~ConstraintCache() = default;

const std::string& ConstraintCache::bytes(int32_t token) const {
  static const std::string kNone;
  if (token < 0 || static_cast<size_t>(token) >= token_bytes_.size()) return kNone;
  return token_bytes_[static_cast<size_t>(token)];
}

absl::StatusOr<std::unique_ptr<TokenConstraint>> ConstraintCache::Start(const OutputConstraint& c) {
  std::string key = c.Key();
  auto it = grammars_.find(key);
  if (it != grammars_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second.second);
    return std::make_unique<TokenConstraint>(this, it->second.first);
  }
  auto grammar = CompileConstraint(c);
  if (!grammar.ok()) return grammar.status();
  ++compiled_count_;
  const bool json = c.kind == OutputConstraint::Kind::kJsonSchema || c.kind == OutputConstraint::Kind::kJsonObject;
  auto compiled = std::make_shared<CompiledConstraint>(*grammar, json);
  if (grammars_.size() >= max_grammars_) {
    grammars_.erase(lru_.back());
    lru_.pop_back();
  }
  lru_.push_front(key);
  grammars_.emplace(std::move(key), std::make_pair(compiled, lru_.begin()));
  live_.erase(std::remove_if(live_.begin(), live_.end(), [](const auto& w) { return w.expired(); }),
              live_.end());
  live_.push_back(compiled);
  return std::make_unique<TokenConstraint>(this, std::move(compiled));
}

const TokenMask& ConstraintCache::MaskFor(CompiledConstraint* c, const GrammarMatcher& m, bool lookup) {
  mask_lookups_ += lookup ? 1 : 0;
  auto it = c->masks.find(m.state());
  if (it != c->masks.end()) return it->second;
  const int64_t words = (vocab_size_ + 63) / 64;
  if (mask_bytes_ + words * 8 > max_mask_bytes_) {
    // Over the bound: count what the live constraints hold (evicted ones freed theirs), and if
    // that is over too, start their caches again.
    mask_bytes_ = 0;
    for (const auto& w : live_) {
      if (auto live = w.lock()) mask_bytes_ += static_cast<int64_t>(live->masks.size()) * words * 8;
    }
    if (mask_bytes_ + words * 8 > max_mask_bytes_) {
      for (const auto& w : live_) {
        if (auto live = w.lock()) live->masks.clear();
      }
      mask_bytes_ = 0;
    }
  }
  ++masks_computed_;
  trie_.FillMask(m, &scratch_);
  TokenMask mask;
  mask.words.assign(static_cast<size_t>(words), 0);
  for (size_t t = 0; t < scratch_.size(); ++t) {
    if (scratch_[t]) mask.words[t >> 6] |= uint64_t{1} << (t & 63);
  }
  if (m.CanEnd()) {
    for (int32_t e : eos_ids_) {
      if (e >= 0 && e < vocab_size_) mask.words[static_cast<size_t>(e) >> 6] |= uint64_t{1} << (e & 63);
    }
  }
  for (uint64_t w : mask.words) mask.allowed += __builtin_popcountll(w);
  mask_bytes_ += words * 8;
  return c->masks.emplace(m.state(), std::move(mask)).first->second;
}

// Costs a read through the tracker's lookahead (no allocation unless the token opens an object)
// of each allowed token with two or more quotes, and inside a key's string of those with one
// too: a small share of a vocabulary, only for JSON constraints.
const TokenMask& ConstraintCache::WithoutRepeatedKeys(const TokenMask& mask, const JsonKeyTracker& keys,
                                                      TokenMask* out) const {
  bool copied = false;
  auto check = [&](const std::vector<int32_t>& tokens) {
    for (int32_t t : tokens) {
      if (!mask.Test(t) || JsonKeyTracker::Lookahead(keys).Feed(token_bytes_[static_cast<size_t>(t)])) continue;
      if (!copied) {
        *out = mask;
        copied = true;
      }
      out->words[static_cast<size_t>(t) >> 6] &= ~(uint64_t{1} << (t & 63));
      --out->allowed;
    }
  };
  if (keys.InKey()) check(one_quote_tokens_);
  check(quotes_tokens_);
  return copied ? *out : mask;
}

}  // namespace pdserve::structured
