#include "common/engine/speculative.h"

#include <algorithm>
#include <cmath>

#include "common/base/strings.h"

namespace pdserve {

absl::StatusOr<SpeculativeMethod> ParseSpeculativeMethod(std::string_view name) {
  if (name == "none" || name.empty()) return SpeculativeMethod::kNone;
  if (name == "ngram") return SpeculativeMethod::kNgram;
  if (name == "suffix") return SpeculativeMethod::kSuffix;
  return absl::InvalidArgumentError(
      Str("--speculative: '", name, "' is not a method; use none, ngram or suffix"));
}

std::string_view SpeculativeMethodName(SpeculativeMethod method) {
  switch (method) {
    case SpeculativeMethod::kNone: return "none";
    case SpeculativeMethod::kNgram: return "ngram";
    case SpeculativeMethod::kSuffix: return "suffix";
  }
  return "none";
}

absl::Status SpeculativeOptions::Validate() const {
  if (num_tokens < 0 || num_tokens > kMaxTokens) {
    return absl::InvalidArgumentError(Str("--num-speculative-tokens: ", num_tokens,
                                          " is outside [0, ", kMaxTokens, "]"));
  }
  if (ngram_min < 1 || ngram_min > kMaxNgram) {
    return absl::InvalidArgumentError(
        Str("--spec-ngram-min: ", ngram_min, " is outside [1, ", kMaxNgram, "]"));
  }
  if (ngram_max < ngram_min || ngram_max > kMaxNgram) {
    return absl::InvalidArgumentError(Str("--spec-ngram-max: ", ngram_max, " is outside [",
                                          ngram_min, " (--spec-ngram-min), ", kMaxNgram, "]"));
  }
  if (suffix_depth < 2 || suffix_depth > kMaxSuffixDepth) {
    return absl::InvalidArgumentError(
        Str("--spec-suffix-depth: ", suffix_depth, " is outside [2, ", kMaxSuffixDepth, "]"));
  }
  if (!(suffix_min_prob >= 0 && suffix_min_prob <= 1)) {
    return absl::InvalidArgumentError(
        Str("--spec-suffix-min-prob: ", suffix_min_prob, " is outside [0, 1]"));
  }
  return absl::OkStatus();
}

int32_t NgramPropose(absl::Span<const int32_t> context, int32_t min_n, int32_t max_n, int32_t k,
                     std::vector<int32_t>* out) {
  out->clear();
  const int64_t len = static_cast<int64_t>(context.size());
  if (k <= 0) return 0;
  for (int64_t n = std::min<int64_t>(max_n, len - 1); n >= min_n; --n) {
    const int32_t* suffix = context.data() + len - n;
    // Latest start j < len - n whose n tokens equal the suffix (the suffix itself excluded).
    for (int64_t j = len - n - 1; j >= 0; --j) {
      if (context[j] != suffix[0] || !std::equal(suffix, suffix + n, context.data() + j)) continue;
      const int64_t from = j + n;
      const int64_t count = std::min<int64_t>(k, len - from);
      out->assign(context.begin() + from, context.begin() + from + count);
      return static_cast<int32_t>(count);
    }
  }
  return 0;
}

int32_t SpeculationState::NextLength(int32_t k) {
  if (pause > 0) {
    --pause;
    return 0;
  }
  // The run of acceptances to expect, q / (1 - q), plus one to probe for more.
  const double run = acceptance >= 1 ? k : acceptance / (1 - acceptance);
  return std::clamp(static_cast<int32_t>(std::lround(std::min<double>(run, k))) + 1, 1, k);
}

void SpeculationState::Record(int32_t drafted, int32_t accepted) {
  if (drafted <= 0) return;
  // Tokens tried: the accepted ones and the first rejected one, if any.
  const int32_t tried = accepted + (accepted < drafted ? 1 : 0);
  acceptance = 0.5 * acceptance + 0.5 * static_cast<double>(accepted) / tried;
  if (accepted > 0) {
    misses = 0;
    return;
  }
  ++misses;
  if (misses >= 2) pause = std::min(kMaxPause, 1 << std::min(misses - 2, 4));
}

void SpeculationState::Idle() { acceptance += kRelax * (kPrior - acceptance); }

void StepCostModel::Observe(int64_t rows, double seconds) {
  const double x = static_cast<double>(rows);
  s0_ = kDecay * s0_ + 1;
  s1_ = kDecay * s1_ + x;
  s2_ = kDecay * s2_ + x * x;
  sy_ = kDecay * sy_ + seconds;
  sxy_ = kDecay * sxy_ + x * seconds;
  const double mean = s1_ / s0_;
  const double variance = s2_ / s0_ - mean * mean;
  // Refit only while the rows vary (a step or two off the mean in recent history); otherwise the
  // last slope stands.
  if (s0_ < 8 || variance < 1.0) return;
  const double b = (s0_ * sxy_ - s1_ * sy_) / (s0_ * s2_ - s1_ * s1_);
  b_ = std::max(0.0, b);
  a_ = std::max(0.0, (sy_ - b_ * s1_) / s0_);
  ready_ = true;
}

bool DraftLedger::Paused() {
  if (pause_ == 0) return false;
  --pause_;
  return true;
}

void DraftLedger::Record(double saved_seconds, double cost_seconds) {
  balance_ += (steps_ == 0 ? 1.0 : 0.2) * (saved_seconds - cost_seconds - balance_);
  if (++steps_ < kEvidence) return;
  if (balance_ < 0) {
    pause_ = next_pause_;
    next_pause_ = std::min(2 * next_pause_, kMaxPause);
    steps_ = 0;  // A fresh verdict after the pause.
  } else {
    next_pause_ = kMinPause;
  }
}

void BudgetDrafts(const StepCostModel& cost, int64_t base_rows, double base_tokens,
                  absl::Span<const double> acceptance, absl::Span<int32_t> lengths) {
  if (!cost.ready() || cost.b() <= 0) return;  // No slope yet, or rows are free: keep them all.
  struct Candidate {
    double p;
    size_t request;
  };
  std::vector<Candidate> candidates;
  for (size_t r = 0; r < lengths.size(); ++r) {
    double p = 1;
    for (int32_t i = 0; i < lengths[r]; ++i) {
      p *= std::clamp(acceptance[r], 0.0, 1.0);
      candidates.push_back({p, r});
    }
  }
  // Most likely first; within a request the probabilities fall, so its kept tokens are a prefix.
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const Candidate& x, const Candidate& y) { return x.p > y.p; });
  std::vector<int32_t> kept(lengths.size(), 0);
  double t = cost.a() + cost.b() * static_cast<double>(base_rows);
  double e = base_tokens;
  for (const Candidate& c : candidates) {
    if (c.p * t < cost.b() * e) break;
    ++kept[c.request];
    t += cost.b();
    e += c.p;
  }
  for (size_t r = 0; r < lengths.size(); ++r) lengths[r] = std::min(lengths[r], kept[r]);
}

}  // namespace pdserve
