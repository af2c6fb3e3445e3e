#include "planner/step_time.h"

#include <array>
#include <cmath>

#include "common/base/strings.h"

namespace pdserve {
namespace {

constexpr int kTerms = 6;

std::array<double, kTerms> Features(const StepShape& s) {
  return {1.0, static_cast<double>(s.tokens), s.prefill_pairs, static_cast<double>(s.sequences),
          s.decode_context, s.prefill_pairs == 0 ? 1.0 : 0.0};
}

// Solves the normal equations over the terms marked active (Gaussian elimination with partial
// pivoting); false when they are singular.
bool Solve(const std::vector<StepTimeSample>& samples, const std::array<bool, kTerms>& active,
           std::array<double, kTerms>* x) {
  std::vector<int> idx;
  for (int i = 0; i < kTerms; ++i) {
    if (active[i]) idx.push_back(i);
  }
  const int n = static_cast<int>(idx.size());
  // Columns scaled to unit size first: the features span ~10 orders of magnitude.
  std::array<double, kTerms> scale{};
  for (const StepTimeSample& s : samples) {
    const auto f = Features(s.shape);
    for (int i = 0; i < kTerms; ++i) scale[i] = std::max(scale[i], std::abs(f[i]));
  }
  std::vector<std::vector<double>> m(n, std::vector<double>(n + 1, 0.0));
  for (const StepTimeSample& s : samples) {
    const auto f = Features(s.shape);
    const double w = 1.0 / s.seconds;  // Rows divided by the measurement: relative error.
    for (int r = 0; r < n; ++r) {
      const double fr = f[idx[r]] / scale[idx[r]] * w;
      for (int c = 0; c < n; ++c) m[r][c] += fr * f[idx[c]] / scale[idx[c]] * w;
      m[r][n] += fr * s.seconds * w;
    }
  }
  for (int col = 0; col < n; ++col) {
    int pivot = col;
    for (int r = col + 1; r < n; ++r) {
      if (std::abs(m[r][col]) > std::abs(m[pivot][col])) pivot = r;
    }
    if (std::abs(m[pivot][col]) < 1e-12) return false;
    std::swap(m[col], m[pivot]);
    for (int r = 0; r < n; ++r) {
      if (r == col) continue;
      const double k = m[r][col] / m[col][col];
      for (int c = col; c <= n; ++c) m[r][c] -= k * m[col][c];
    }
  }
  x->fill(0.0);
  for (int r = 0; r < n; ++r) (*x)[idx[r]] = m[r][n] / m[r][r] / scale[idx[r]];
  return true;
}

}  // namespace

absl::StatusOr<StepTimeModel> FitStepTime(const std::vector<StepTimeSample>& samples) {
  if (samples.size() < kTerms) {
    return absl::InvalidArgumentError(
        Str("step time fit: ", samples.size(), " samples for ", kTerms, " coefficients"));
  }
  for (const StepTimeSample& s : samples) {
    if (!(s.seconds > 0) || !std::isfinite(s.seconds) || s.shape.tokens < 1 || s.shape.sequences < 1) {
      return absl::InvalidArgumentError(
          Str("step time fit: a sample of ", s.shape.tokens, " tokens in ", s.seconds, " s"));
    }
  }
  std::array<bool, kTerms> active{};
  for (const StepTimeSample& s : samples) {
    const auto f = Features(s.shape);
    for (int i = 0; i < kTerms; ++i) active[i] = active[i] || f[i] != 0;  // A term no sample has: 0.
  }
  std::array<double, kTerms> x{};
  for (;;) {
    bool solved = Solve(samples, active, &x);
    // Terms the samples cannot tell apart (e.g. sequences when every step had one): drop the
    // last active one and retry.
    if (!solved) {
      int last = kTerms - 1;
      while (last > 0 && !active[last]) --last;
      if (last == 0) return absl::InvalidArgumentError("step time fit: the samples are degenerate");
      active[last] = false;
      continue;
    }
    int most_negative = -1;
    for (int i = 0; i < kTerms; ++i) {
      if (active[i] && x[i] < 0 && (most_negative < 0 || x[i] < x[most_negative])) most_negative = i;
    }
    if (most_negative < 0) break;
    active[most_negative] = false;
    bool any = false;
    for (bool a : active) any |= a;
    if (!any) return absl::InvalidArgumentError("step time fit: no coefficient stays positive");
  }
  return StepTimeModel{x[0], x[1], x[2], x[3], x[4], x[5]};
}

double MaxRelativeError(const StepTimeModel& model, const std::vector<StepTimeSample>& samples) {
  double worst = 0;
  for (const StepTimeSample& s : samples) {
    worst = std::max(worst, std::abs(model.Predict(s.shape) - s.seconds) / s.seconds);
  }
  return worst;
}

}  // namespace pdserve
