// Speculative decoding without a draft model: tokens proposed from the request's own prompt and
// output (n-gram prompt lookup, or suffix decoding over a SuffixTrie of the request and of the
// worker's recent outputs), verified by the next forward pass as one chunk. The engine keeps
// a drafted token exactly when the seeded sampler, walking the chunk's positions, samples it, so
// the output equals plain decoding token for token and logprob for logprob (the kernels give a
// position the same bits inside a chunk as alone, and the sampler is keyed by output position).
//
// Pure functions and plain state; the engine (llm_engine.cc) drives them on its thread.
#ifndef PDSERVE_COMMON_ENGINE_SPECULATIVE_H_
#define PDSERVE_COMMON_ENGINE_SPECULATIVE_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/sampling/sampling_params.h"

namespace pdserve {

enum class SpeculativeMethod { kNone, kNgram, kSuffix };

absl::StatusOr<SpeculativeMethod> ParseSpeculativeMethod(std::string_view name);
std::string_view SpeculativeMethodName(SpeculativeMethod method);

struct SpeculativeOptions {
  SpeculativeMethod method = SpeculativeMethod::kNone;
  int32_t num_tokens = 5;  // The most drafted tokens per step (a request may ask for fewer).
  int32_t ngram_min = 2;   // Shortest suffix of the context matched (prompt_lookup_min).
  int32_t ngram_max = 4;   // Longest (prompt_lookup_max); tried first.
  int32_t suffix_depth = 24;        // Suffix: longest substring indexed (match + draft).
  double suffix_min_prob = 0.1;     // Suffix: a drafted token's least share of continuations.
  // Keep only the drafted tokens that the measured cost of this machine's steps says pay
  // (BudgetDrafts), and pause drafting that costs more than it saves (DraftLedger). Off: every draft the per-request adaptation allows; for tests, whose counts
  // must not depend on how fast the machine ran the steps (the output is the same either way).
  bool step_budget = true;

  static constexpr int32_t kMaxTokens = SamplingParams::kMaxSpeculativeTokens;
  static constexpr int32_t kMaxNgram = 16;
  static constexpr int32_t kMaxSuffixDepth = 64;
  // InvalidArgument naming the flag.
  absl::Status Validate() const;
  bool enabled() const { return method != SpeculativeMethod::kNone && num_tokens > 0; }
};

// Prompt lookup: for n from max_n down to min_n, finds the latest earlier occurrence of the last n
// tokens of `context` and appends to *out (cleared first) up to `k` tokens that followed it.
// Returns the number proposed (0: no match). O(len * max_n).
int32_t NgramPropose(absl::Span<const int32_t> context, int32_t min_n, int32_t max_n, int32_t k,
                     std::vector<int32_t>* out);

// Per-request adaptation: how many tokens to draft next, from how the last drafts fared. A
// request whose drafts are rejected drafts fewer and, after a run of misses, pauses drafting for
// a doubling number of steps (up to kMaxPause), so text that does not repeat pays little.
struct SpeculationState {
  static constexpr int32_t kMaxPause = 16;
  static constexpr double kPrior = 0.5;   // Where the estimate drifts without evidence,
  static constexpr double kRelax = 0.05;  // by this share per step.
  // The chance that a drafted token is accepted once the ones before it were (a moving average
  // of accepted / tried, tried = accepted + the first rejected).
  double acceptance = 1.0;
  int32_t misses = 0;  // Drafts in a row with nothing accepted.
  int32_t pause = 0;   // Steps left without drafting.

  // The draft length to ask for this step (0: skip), at most `k`; counts a paused step.
  int32_t NextLength(int32_t k);
  void Record(int32_t drafted, int32_t accepted);
  // A decode step without a draft verified (none proposed, or the step's budget cut it): the
  // estimate drifts back towards kPrior, so a request is not shut out for good by early misses.
  void Idle();
};

// What a decode step costs by its rows, T = a + b * rows, fitted by exponentially weighted least
// squares over the engine's recent decode steps. Below the ridge (a memory-bound step: weights
// read once whatever the rows) b is small and drafts are nearly free; past it (many rows: compute)
// each drafted row costs about what a plain one does.
class StepCostModel {
 public:
  void Observe(int64_t rows, double seconds);
  // True once the steps seen span enough different row counts for a slope.
  bool ready() const { return ready_; }
  double a() const { return a_; }
  double b() const { return b_; }

 private:
  static constexpr double kDecay = 0.97;  // A step's weight halves after ~23 more.
  double s0_ = 0, s1_ = 0, s2_ = 0, sy_ = 0, sxy_ = 0;
  bool ready_ = false;
  double a_ = 0, b_ = 0;
};

// Whether drafting pays the engine as a whole, by what it measured: each step that verified
// drafts adds to a moving balance what its accepted tokens saved (a plain decode token's time
// each) less what the drafts cost (the drafting itself, their rows in the forward pass and their
// sampling). BudgetDrafts prices only the rows; where the drafting and sampling are a large
// share of a short step (a small model's), the balance goes negative and drafting pauses for a
// doubling number of steps (kMinPause..kMaxPause), then probes again.
class DraftLedger {
 public:
  static constexpr int32_t kEvidence = 8;  // Drafting steps before a verdict.
  static constexpr int32_t kMinPause = 8;
  static constexpr int32_t kMaxPause = 128;
  // True while paused; counts a paused step.
  bool Paused();
  void Record(double saved_seconds, double cost_seconds);
  int32_t pause() const { return pause_; }

 private:
  double balance_ = 0;  // Seconds saved per drafting step, a moving average.
  int32_t steps_ = 0;   // Drafting steps since the last verdict.
  int32_t pause_ = 0;
  int32_t next_pause_ = kMinPause;
};

// Trims drafts to what pays for itself in one step: a drafted token at position i of a request
// whose acceptance is q is kept with probability q^(i+1); taken in order of that probability, a
// token stays while it adds at least as many expected tokens per second as the step gives
// (p * T >= b * E, T and E the step's time and expected tokens so far, starting from
// `base_rows` rows that produce `base_tokens`). lengths[r] (request r's draft) may only shrink.
void BudgetDrafts(const StepCostModel& cost, int64_t base_rows, double base_tokens,
                  absl::Span<const double> acceptance, absl::Span<int32_t> lengths);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_ENGINE_SPECULATIVE_H_
