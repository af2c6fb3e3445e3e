// The cost model of one engine step that the capacity planner's simulator charges instead of a
// forward pass (issue 40), and its least-squares fit to measured steps (`pdserve profile`).
//
// A step runs chunks: a prefill chunk of n tokens after `context` tokens already in the KV
// cache, or a decode row (n = 1). Its time is modelled as
//   t = a + b * tokens + c * prefill_pairs + d * sequences + e * decode_context
//       + f * (the step has no prefill chunk)
// with tokens = sum n; prefill_pairs = sum over chunks of n > 1 of n * (context + (n + 1) / 2)
// (causal attention's query-key pairs: compute); decode_context = sum over decode rows of
// context + 1 (the keys each row reads: on a GPU, KV bytes); sequences = the chunks. a is what a
// step costs whatever it runs (the layers launched); b the per-token matrix work; d per sequence
// (sampling, bookkeeping); f what a step of decode rows alone pays beyond that: its weights are
// read for few rows, so the read is not hidden behind compute as a prefill chunk's is (on this
// project's CPUs a 1-row decode step costs what a 16-token prefill chunk does less ~30%; without
// f the fit's intercept split the difference, 20% off on both). Prefill chunks, decode batches
// and the mixed steps chunked prefill makes are all such steps, so one fit covers them.
#ifndef PDSERVE_PLANNER_STEP_TIME_H_
#define PDSERVE_PLANNER_STEP_TIME_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pdserve {

struct StepShape {
  int64_t tokens = 0;
  int64_t sequences = 0;
  double prefill_pairs = 0;
  double decode_context = 0;

  void AddChunk(int64_t n, int64_t context) {
    if (n == 1) return AddDecodeRows(1, context + 1);
    tokens += n;
    sequences += 1;
    prefill_pairs += static_cast<double>(n) * (static_cast<double>(context) + (n + 1) / 2.0);
  }
  // `rows` decode rows (one token each) whose keys, each row's new token counted, sum to `keys`:
  // AddChunk(1, c) for each row at once (a caller sums the rows in registers).
  void AddDecodeRows(int64_t rows, int64_t keys) {
    tokens += rows;
    sequences += rows;
    decode_context += static_cast<double>(keys);
  }
};

struct StepTimeSample {
  StepShape shape;
  double seconds = 0;
  std::string kind;  // "prefill" or "decode": where the point came from (informational).
};

struct StepTimeModel {
  // Seconds; per token; per prefill pair; per sequence; per decode row's key; seconds more for
  // a step of decode rows alone.
  double a = 0, b = 0, c = 0, d = 0, e = 0, f = 0;

  double Predict(const StepShape& s) const {
    return a + b * static_cast<double>(s.tokens) + c * s.prefill_pairs +
           d * static_cast<double>(s.sequences) + e * s.decode_context +
           (s.prefill_pairs == 0 ? f : 0.0);
  }
};

// Least squares over the samples, each weighted by 1 / seconds (so the fit minimises relative
// error: a 5 ms decode step matters as much as a 500 ms prefill chunk), with every coefficient
// kept >= 0 (a coefficient the data drive negative is dropped and the rest refitted).
// InvalidArgument when there are fewer samples than coefficients or a sample is not positive.
absl::StatusOr<StepTimeModel> FitStepTime(const std::vector<StepTimeSample>& samples);

// The largest relative error |predicted - measured| / measured over the samples.
double MaxRelativeError(const StepTimeModel& model, const std::vector<StepTimeSample>& samples);

}  // namespace pdserve

#endif  // PDSERVE_PLANNER_STEP_TIME_H_
