#include "common/sampling/sampler.h"

#include <cmath>
#include <map>
#include <set>

#include "gtest/gtest.h"

namespace pdserve {
namespace {

std::vector<float> LogitsOf(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(static_cast<float>(std::log(p)));
  return l;
}

std::map<int32_t, double> Frequencies(const std::vector<float>& logits, SamplingParams p, int n) {
  Sampler sampler;
  std::map<int32_t, double> f;
  for (int i = 0; i < n; ++i) {
    SamplerState s;
    s.Init(static_cast<uint64_t>(i) * 7919 + 1, {});
    f[sampler.Sample(logits.data(), logits.size(), p, s).token] += 1.0 / n;
  }
  return f;
}

TEST(SamplerTest, GreedyTakesArgmaxLowestIdOnTies) {
  Sampler sampler;
  SamplingParams p;
  p.temperature = 0;
  SamplerState s;
  std::vector<float> l = {0.1f, 2.0f, -1.0f, 2.0f};
  EXPECT_EQ(sampler.Sample(l.data(), 4, p, s).token, 1);
}

TEST(SamplerTest, LogprobsAreLogSoftmaxOfRawLogits) {
  Sampler sampler;
  SamplingParams p;
  p.temperature = 0;
  p.logprobs = 3;
  p.repetition_penalty = 1.5f;  // Must not change the reported logprobs.
  SamplerState s;
  s.Init(0, {2});
  std::vector<float> l = {1.0f, 3.0f, 2.5f, -4.0f, 0.0f};
  const SampledToken t = sampler.Sample(l.data(), 5, p, s);
  double z = 0;
  for (float x : l) z += std::exp(double(x));
  EXPECT_EQ(t.token, 1);
  EXPECT_NEAR(t.logprob, 3.0 - std::log(z), 1e-6);
  ASSERT_EQ(t.top_logprobs.size(), 3u);
  EXPECT_EQ(t.top_logprobs[0].first, 1);
  EXPECT_EQ(t.top_logprobs[1].first, 2);
  EXPECT_EQ(t.top_logprobs[2].first, 0);
  EXPECT_NEAR(t.top_logprobs[2].second, 1.0 - std::log(z), 1e-6);
}

TEST(SamplerTest, TemperatureOneFollowsTheDistribution) {
  SamplingParams p;
  auto f = Frequencies(LogitsOf({0.5, 0.3, 0.2}), p, 20000);
  EXPECT_NEAR(f[0], 0.5, 0.02);
  EXPECT_NEAR(f[1], 0.3, 0.02);
  EXPECT_NEAR(f[2], 0.2, 0.02);
}

TEST(SamplerTest, TopKTopPMinPRestrictAndRenormalise) {
  const auto logits = LogitsOf({0.5, 0.3, 0.15, 0.05});
  SamplingParams k;
  k.top_k = 2;
  auto fk = Frequencies(logits, k, 20000);
  EXPECT_EQ(fk.size(), 2u);
  EXPECT_NEAR(fk[0], 0.5 / 0.8, 0.02);
  SamplingParams tp;
  tp.top_p = 0.7f;  // 0.5 < 0.7 <= 0.8: keeps tokens 0 and 1.
  auto fp = Frequencies(logits, tp, 20000);
  EXPECT_EQ(fp.size(), 2u);
  EXPECT_NEAR(fp[1], 0.3 / 0.8, 0.02);
  SamplingParams mp;
  mp.min_p = 0.5f;  // Keeps p >= 0.25.
  auto fm = Frequencies(logits, mp, 5000);
  EXPECT_EQ(fm.size(), 2u);
  SamplingParams k1;
  k1.top_k = 1;
  EXPECT_EQ(Frequencies(logits, k1, 100).size(), 1u);
}

TEST(SamplerTest, PenaltiesFollowVllmSemantics) {
  Sampler sampler;
  SamplingParams p;
  p.temperature = 0;
  std::vector<float> l = {3.0f, 2.0f, -1.0f};
  SamplerState s;
  s.Init(0, {0});  // Token 0 is in the prompt.
  p.repetition_penalty = 2.0f;  // 3 -> 1.5: token 1 (2.0) wins.
  EXPECT_EQ(sampler.Sample(l.data(), 3, p, s).token, 1);
  p.repetition_penalty = 1.0f;
  p.frequency_penalty = 0.6f;  // Output-only: token 1 seen twice -> 2 - 1.2 = 0.8.
  s.Accept(1);
  s.Accept(1);
  EXPECT_EQ(sampler.Sample(l.data(), 3, p, s).token, 0);
  std::vector<float> l2 = {1.0f, 1.5f, -1.0f};
  p.frequency_penalty = 0;
  p.presence_penalty = 1.0f;  // 1.5 -> 0.5 once, whatever the count.
  EXPECT_EQ(sampler.Sample(l2.data(), 3, p, s).token, 0);
}

TEST(SamplerTest, SeededDrawDependsOnlyOnSeedAndPosition) {
  Sampler a, b;
  SamplingParams p;
  std::vector<float> l(1000);
  for (int i = 0; i < 1000; ++i) l[i] = std::sin(i * 0.37f) * 3;
  SamplerState s1, s2;
  s1.Init(42, {});
  s2.Init(42, {});
  std::vector<int32_t> x, y;
  for (int step = 0; step < 50; ++step) {
    x.push_back(a.Sample(l.data(), 1000, p, s1).token);
    s1.Accept(x.back());
    // A different sampler object, with unrelated draws in between.
    SamplerState other;
    other.Init(7, {});
    b.Sample(l.data(), 1000, p, other);
    y.push_back(b.Sample(l.data(), 1000, p, s2).token);
    s2.Accept(y.back());
  }
  EXPECT_EQ(x, y);
  EXPECT_GT(std::set<int32_t>(x.begin(), x.end()).size(), 5u);  // It does sample.
}

TEST(SamplingParamsTest, ValidationNamesTheField) {
  SamplingParams p;
  p.top_p = 0;
  EXPECT_NE(p.Validate(100).message().find("top_p"), absl::string_view::npos);
  p = {};
  p.temperature = -1;
  EXPECT_NE(p.Validate(100).message().find("temperature"), absl::string_view::npos);
  p = {};
  p.stop_token_ids = {100};
  EXPECT_NE(p.Validate(100).message().find("stop_token_ids"), absl::string_view::npos);
  p = {};
  p.logprobs = 21;
  EXPECT_NE(p.Validate(100).message().find("logprobs"), absl::string_view::npos);
  p = {};
  p.max_tokens = 0;
  EXPECT_EQ(p.Validate(100).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(SamplingParams{}.Validate(100).ok());
}

}  // namespace
}  // namespace pdserve
