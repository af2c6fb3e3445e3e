#include "planner/step_time.h"

#include <gtest/gtest.h>

#include <random>

namespace pdserve {
namespace {

std::vector<StepTimeSample> Grid(const StepTimeModel& truth, double noise, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> jitter(1 - noise, 1 + noise);
  std::vector<StepTimeSample> out;
  for (int64_t n : {32, 128, 512}) {
    for (int64_t ctx : {0, 256, 1024}) {
      StepShape s;
      s.AddChunk(n, ctx);
      out.push_back({s, truth.Predict(s) * jitter(rng), "prefill"});
    }
  }
  for (int64_t batch : {1, 8, 32}) {
    for (int64_t ctx : {64, 512}) {
      StepShape s;
      for (int64_t i = 0; i < batch; ++i) s.AddChunk(1, ctx);
      out.push_back({s, truth.Predict(s) * jitter(rng), "decode"});
    }
  }
  return out;
}

TEST(StepCost, ShapeCountsTokensSequencesAndCausalPairs) {
  StepShape s;
  s.AddChunk(4, 10);  // Rows see 11, 12, 13, 14 keys: 4 * (10 + 2.5) = 50.
  s.AddChunk(1, 7);   // A decode row: 8 keys.
  s.AddChunk(1, 2);
  EXPECT_EQ(s.tokens, 6);
  EXPECT_EQ(s.sequences, 3);
  EXPECT_DOUBLE_EQ(s.prefill_pairs, 50);
  EXPECT_DOUBLE_EQ(s.decode_context, 11);
}

TEST(StepCost, DecodeRowsAtOnceEqualOneChunkEach) {
  StepShape each, once;
  each.AddChunk(3, 5);
  once.AddChunk(3, 5);
  int64_t keys = 0;
  for (int64_t ctx : {7, 0, 130}) {
    each.AddChunk(1, ctx);
    keys += ctx + 1;
  }
  once.AddDecodeRows(3, keys);
  EXPECT_EQ(once.tokens, each.tokens);
  EXPECT_EQ(once.sequences, each.sequences);
  EXPECT_EQ(once.prefill_pairs, each.prefill_pairs);
  EXPECT_EQ(once.decode_context, each.decode_context);
  EXPECT_EQ(once.decode_context, 140);
}

TEST(StepCost, ExactSamplesGiveBackTheModel) {
  const StepTimeModel truth{2e-3, 5e-5, 2e-9, 1e-5, 3e-8, 4e-3};
  auto fit = FitStepTime(Grid(truth, 0, 1));
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_NEAR(fit->a / truth.a, 1, 1e-6);
  EXPECT_NEAR(fit->b / truth.b, 1, 1e-6);
  EXPECT_NEAR(fit->c / truth.c, 1, 1e-6);
  EXPECT_NEAR(fit->d / truth.d, 1, 1e-6);
  EXPECT_NEAR(fit->e / truth.e, 1, 1e-6);
  EXPECT_NEAR(fit->f / truth.f, 1, 1e-6);
}

TEST(StepCost, OnlyStepsOfDecodeRowsAlonePayTheDecodeOnlyTerm) {
  const StepTimeModel m{1e-3, 0, 0, 0, 0, 5e-3};
  StepShape decode;
  decode.AddChunk(1, 10);
  decode.AddChunk(1, 20);
  EXPECT_DOUBLE_EQ(m.Predict(decode), 6e-3);
  StepShape mixed = decode;  // Chunked prefill beside decode rows: the chunk's compute hides the read.
  mixed.AddChunk(64, 0);
  EXPECT_DOUBLE_EQ(m.Predict(mixed), 1e-3);
  StepShape prefill;
  prefill.AddChunk(2, 0);
  EXPECT_DOUBLE_EQ(m.Predict(prefill), 1e-3);
}

TEST(StepCost, PrefillOrDecodeSamplesAloneCannotTellTheDecodeOnlyTermApart) {
  // Without decode steps (or without prefill chunks) the term is the intercept's twin: dropped.
  std::vector<StepTimeSample> samples;
  const StepTimeModel truth{2e-3, 5e-5, 2e-9, 0, 0, 0};
  for (int64_t n : {16, 64, 256, 512}) {
    for (int64_t ctx : {0, 512}) {
      StepShape s;
      s.AddChunk(n, ctx);
      samples.push_back({s, truth.Predict(s), "prefill"});
    }
  }
  auto fit = FitStepTime(samples);
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_EQ(fit->f, 0);
  EXPECT_NEAR(fit->a / truth.a, 1, 1e-6);
  EXPECT_NEAR(fit->b / truth.b, 1, 1e-6);
}

TEST(StepCost, NoisySamplesFitWithinTheNoise) {
  const StepTimeModel truth{2e-3, 5e-5, 2e-9, 1e-5, 3e-8, 4e-3};
  const auto samples = Grid(truth, 0.05, 7);
  auto fit = FitStepTime(samples);
  ASSERT_TRUE(fit.ok());
  EXPECT_LT(MaxRelativeError(*fit, samples), 0.12);
}

TEST(StepCost, CoefficientsStayNonNegative) {
  // Decode steps that get cheaper per sequence than a plain line through them would say: the
  // unconstrained fit gives d < 0; the constrained one drops it.
  std::vector<StepTimeSample> samples;
  for (int64_t batch : {1, 2, 4, 8, 16}) {
    StepShape s;
    for (int64_t i = 0; i < batch; ++i) s.AddChunk(1, 100);
    samples.push_back({s, 1e-3 + 1e-4 * std::sqrt(static_cast<double>(batch)), "decode"});
  }
  StepShape p;
  p.AddChunk(256, 0);
  samples.push_back({p, 5e-3, "prefill"});
  auto fit = FitStepTime(samples);
  ASSERT_TRUE(fit.ok()) << fit.status();
  for (double v : {fit->a, fit->b, fit->c, fit->d, fit->e, fit->f}) EXPECT_GE(v, 0);
}

TEST(StepCost, TooFewOrBadSamplesAreRefused) {
  StepShape s;
  s.AddChunk(8, 0);
  EXPECT_FALSE(FitStepTime({{s, 1e-3, "prefill"}}).ok());
  std::vector<StepTimeSample> bad(6, {s, 1e-3, "prefill"});
  bad[2].seconds = -1;
  EXPECT_NE(FitStepTime(bad).status().message().find("8 tokens in -1 s"), std::string::npos);
}

}  // namespace
}  // namespace pdserve
