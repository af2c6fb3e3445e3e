#include "loadgen/workload.h"

#include <algorithm>
#include <cmath>

#include "common/base/rng.h"
#include "common/base/strings.h"

namespace pdserve {
namespace {

std::vector<int32_t> RandomTokens(SplitMix64& rng, int64_t n, int64_t lo, int64_t hi) {
  std::vector<int32_t> out(n);
  for (int32_t& t : out) t = static_cast<int32_t>(lo + rng.Next() % static_cast<uint64_t>(hi - lo));
  return out;
}

// Uniform integer in [len * (1 - r), len * (1 + r)], at least 1.
int64_t RangeLength(SplitMix64& rng, int64_t len, double r) {
  const int64_t lo = std::max<int64_t>(1, static_cast<int64_t>(std::floor(len * (1 - r))));
  const int64_t hi = std::max(lo, static_cast<int64_t>(std::ceil(len * (1 + r))));
  return lo + static_cast<int64_t>(rng.Next() % static_cast<uint64_t>(hi - lo + 1));
}

// Log-normal with the given median and log-space sigma, clamped to [lo, hi].
int64_t LogNormalLength(SplitMix64& rng, int64_t median, double sigma, int64_t lo, int64_t hi) {
  const double x = static_cast<double>(median) * std::exp(sigma * rng.Normal());
  return std::clamp(static_cast<int64_t>(std::llround(x)), lo, hi);
}

// ShareGPT's user turns and replies are both right-skewed: most are short, a few run to
// thousands of tokens. These spreads give p90/p50 of about 3.6 (prompts) and 2.8 (replies).
constexpr double kChatInputSigma = 1.0;
constexpr double kChatOutputSigma = 0.8;
constexpr int64_t kChatMaxTurns = 4;
constexpr int64_t kChatMinTurn = 4;  // Shortest user turn, in tokens.

absl::Status Validate(const WorkloadOptions& o) {
  if (o.kind != "shared-prefix" && o.kind != "random" && o.kind != "synthetic-chat") {
    return absl::InvalidArgumentError(
        Str("--workload: '", o.kind, "' is not random, shared-prefix or synthetic-chat"));
  }
  // Counts and lengths are bounded before anything is allocated for them: no model has a longer
  // context than kMaxWorkloadLength, and the prompts of a workload live in memory at once.
  auto bounded = [](int64_t v, int64_t lo, int64_t hi, const char* flag) -> absl::Status {
    if (v < lo || v > hi) return absl::InvalidArgumentError(Str(flag, ": must be in [", lo, ", ", hi, "]"));
    return absl::OkStatus();
  };
  for (absl::Status s : {bounded(o.num_prompts, 1, kMaxWorkloadPrompts, "--num-prompts"),
                         bounded(o.input_len, 1, kMaxWorkloadLength, "--input-len"),
                         bounded(o.output_len, 1, kMaxWorkloadLength, "--output-len"),
                         bounded(o.prefix_len, 0, kMaxWorkloadLength, "--prefix-len"),
                         bounded(o.groups, 1, kMaxWorkloadPrompts, "--groups"),
                         bounded(o.max_prompt_len, 0, kMaxWorkloadLength, "--max-prompt-len")}) {
    if (!s.ok()) return s;
  }
  if (!(o.range_ratio >= 0 && o.range_ratio < 1)) {
    return absl::InvalidArgumentError("--range-ratio: must be in [0, 1)");
  }
  if (o.groups < 1) return absl::InvalidArgumentError("--groups: must be >= 1");
  if (o.prefix_len < 0) return absl::InvalidArgumentError("--prefix-len: must be >= 0");
  if (!(o.rate > 0)) return absl::InvalidArgumentError("--request-rate: must be > 0 or inf");
  if (!(o.burstiness > 0) || std::isinf(o.burstiness)) {
    return absl::InvalidArgumentError("--burstiness: must be a finite number > 0");
  }
  if (o.max_prompt_len < 0 || (o.max_prompt_len > 0 && o.max_prompt_len < kChatMinTurn)) {
    return absl::InvalidArgumentError(
        Str("--max-prompt-len: must be 0 (16 x --input-len) or at least ", kChatMinTurn));
  }
  if (o.vocab_size <= o.first_token + 1) {
    return absl::InvalidArgumentError(Str("vocabulary of ", o.vocab_size, " is too small"));
  }
  // The tokens the prompts hold at most (a conversation's history up to its cap).
  const double longest = o.kind == "synthetic-chat"
                             ? static_cast<double>(o.max_prompt_len > 0 ? o.max_prompt_len : 16 * o.input_len)
                             : static_cast<double>(o.input_len) * (1 + o.range_ratio) +
                                   static_cast<double>(o.kind == "shared-prefix" ? o.prefix_len : 0);
  if (static_cast<double>(o.num_prompts) * longest > static_cast<double>(kMaxWorkloadTokens)) {
    return absl::InvalidArgumentError(
        Str("--num-prompts x the prompt length: up to ", static_cast<int64_t>(static_cast<double>(o.num_prompts) * longest),
            " prompt tokens, more than ", kMaxWorkloadTokens, " (", kMaxWorkloadTokens * 4 >> 30,
            " GiB); fewer or shorter prompts"));
  }
  return absl::OkStatus();
}

}  // namespace

double SampleGamma(SplitMix64& rng, double shape) {
  if (shape < 1) {
    // Gamma(a) = Gamma(a + 1) * U^(1/a).
    double u = rng.Uniform();
    if (u < 1e-300) u = 1e-300;
    return SampleGamma(rng, shape + 1) * std::pow(u, 1.0 / shape);
  }
  const double d = shape - 1.0 / 3.0;
  const double c = 1.0 / std::sqrt(9.0 * d);
  for (;;) {
    double x, v;
    do {
      x = rng.Normal();
      v = 1.0 + c * x;
    } while (v <= 0);
    v = v * v * v;
    const double u = rng.Uniform();
    if (u < 1.0 - 0.0331 * x * x * x * x) return d * v;
    if (std::log(u) < 0.5 * x * x + d * (1.0 - v + std::log(v))) return d * v;
  }
}

absl::StatusOr<std::vector<BenchRequest>> MakeWorkload(const WorkloadOptions& o) {
  if (absl::Status s = Validate(o); !s.ok()) return s;
  SplitMix64 rng(o.seed);
  std::vector<std::vector<int32_t>> systems;
  if (o.kind == "shared-prefix") {
    for (int64_t g = 0; g < o.groups; ++g) {
      systems.push_back(RandomTokens(rng, o.prefix_len, o.first_token, o.vocab_size));
    }
  }
  // synthetic-chat: the open conversations' histories and the turns each has left.
  struct Conversation {
    int64_t id;
    std::vector<int32_t> history;
    int64_t turns_left;
  };
  std::vector<Conversation> open;
  int64_t conversations = 0;
  const int64_t max_prompt = o.max_prompt_len > 0 ? o.max_prompt_len : 16 * o.input_len;

  std::vector<BenchRequest> out;
  out.reserve(o.num_prompts);
  SplitMix64 arrivals(o.seed ^ 0x5bd1e995ull);  // Arrival times independent of the prompts.
  double t = 0;
  for (int64_t i = 0; i < o.num_prompts; ++i) {
    BenchRequest r;
    if (std::isfinite(o.rate) && i > 0) {
      t += SampleGamma(arrivals, o.burstiness) / (o.rate * o.burstiness);
    }
    r.arrival_seconds = t;
    if (o.kind == "synthetic-chat") {
      // Continue an open conversation half the time (always, if too many are open).
      if (open.empty() || (open.size() < 16 && rng.Uniform() < 0.5)) {
        open.push_back({conversations++, {},
                        1 + static_cast<int64_t>(rng.Next() % kChatMaxTurns)});
      }
      const size_t pick = rng.Next() % open.size();
      Conversation& c = open[pick];
      const int64_t user = LogNormalLength(rng, o.input_len, kChatInputSigma, kChatMinTurn, max_prompt);
      const std::vector<int32_t> turn = RandomTokens(rng, user, o.first_token, o.vocab_size);
      c.history.insert(c.history.end(), turn.begin(), turn.end());
      if (static_cast<int64_t>(c.history.size()) > max_prompt) {
        // Too long for the model: keep the latest turn, as a chat client trims its context.
        c.history.erase(c.history.begin(), c.history.end() - std::min(user, max_prompt));
      }
      r.prompt = c.history;
      r.group = c.id;
      r.output_tokens = LogNormalLength(rng, o.output_len, kChatOutputSigma, 1, 8 * o.output_len);
      // The reply joins the history as the next turn's context (its tokens are synthetic: the
      // server's actual reply is not known when the stream is made).
      const std::vector<int32_t> reply =
          RandomTokens(rng, r.output_tokens, o.first_token, o.vocab_size);
      c.history.insert(c.history.end(), reply.begin(), reply.end());
      if (--c.turns_left == 0) open.erase(open.begin() + static_cast<std::ptrdiff_t>(pick));
    } else {
      if (o.kind == "shared-prefix") {
        r.group = static_cast<int64_t>(rng.Next() % static_cast<uint64_t>(o.groups));
        r.prompt = systems[r.group];
      }
      const int64_t n = RangeLength(rng, o.input_len, o.range_ratio);
      const std::vector<int32_t> tail = RandomTokens(rng, n, o.first_token, o.vocab_size);
      r.prompt.insert(r.prompt.end(), tail.begin(), tail.end());
      r.output_tokens = RangeLength(rng, o.output_len, o.range_ratio);
    }
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace pdserve
