#include "common/sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>

#include "common/base/rng.h"
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

// The sampler's draw against a plain implementation of the same rule (every candidate sorted at
// once, sums in the same order): equal tokens, including on large flat distributions where the
// sampler grows its sorted head in steps and carries the running sum across them, with top-k,
// min-p and masks.
int32_t ReferenceDraw(const std::vector<float>& logits, const SamplingParams& p, const SamplerState& st,
                      const std::vector<uint64_t>* allowed) {
  const int64_t n = static_cast<int64_t>(logits.size());
  std::vector<float> w(logits);
  auto ok = [&](int64_t t) { return allowed == nullptr || (((*allowed)[t >> 6] >> (t & 63)) & 1); };
  float max = -INFINITY;
  for (int64_t i = 0; i < n; ++i) {
    if (!ok(i)) w[i] = -INFINITY;
    w[i] *= 1.0f / p.temperature;
    max = std::max(max, w[i]);
  }
  const float floor = p.min_p > 0 ? max + std::log(p.min_p) : -INFINITY;
  std::vector<int32_t> order;
  for (int32_t i = 0; i < n; ++i) {
    if (w[i] >= floor && ok(i)) order.push_back(i);
  }
  auto better = [&](int32_t a, int32_t b) { return w[a] != w[b] ? w[a] > w[b] : a < b; };
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < order.size()) {
    std::sort(order.begin(), order.end(), better);
    order.resize(p.top_k);
  }
  double total = 0;
  for (int32_t i : order) total += std::exp(static_cast<double>(w[i]) - max);
  if (p.top_p < 1.0f) {
    std::sort(order.begin(), order.end(), better);
    double cum = 0;
    size_t cut = order.size();
    for (size_t j = 0; j < order.size(); ++j) {
      cum += std::exp(static_cast<double>(w[order[j]]) - max);
      if (cum >= p.top_p * total) {
        cut = j + 1;
        break;
      }
    }
    order.resize(std::max<size_t>(cut, 1));
  }
  double kept = 0;
  for (int32_t i : order) kept += std::exp(static_cast<double>(w[i]) - max);
  const double target = CounterUniform(st.seed, st.num_generated) * kept;
  double cum = 0;
  for (int32_t i : order) {
    cum += std::exp(static_cast<double>(w[i]) - max);
    if (cum > target) return i;
  }
  return order.back();
}

TEST(SamplerTest, DrawEqualsAPlainFullSortOfTheCandidates) {
  std::mt19937 rng(17);
  Sampler sampler;
  int checked = 0;
  for (int64_t n : {7, 300, 5000, 70000}) {
    for (float spread : {0.3f, 3.0f, 12.0f}) {  // Flat to peaky.
      std::normal_distribution<float> normal(0, spread);
      std::vector<float> logits(static_cast<size_t>(n));
      for (float& l : logits) l = std::round(normal(rng) * 8) / 8;  // Ties too.
      std::vector<uint64_t> mask(static_cast<size_t>((n + 63) / 64), 0);
      for (int64_t t = 0; t < n; ++t) {
        if (rng() % 3 != 0) mask[static_cast<size_t>(t >> 6)] |= uint64_t{1} << (t & 63);
      }
      for (int config = 0; config < 6; ++config) {
        SamplingParams p;
        p.temperature = config % 2 == 0 ? 1.0f : 0.7f;
        p.top_p = std::vector<float>{0.9f, 0.5f, 0.99f, 0.1f, 0.95f, 0.999f}[static_cast<size_t>(config)];
        if (config == 2) p.top_k = 50;
        if (config == 3) p.min_p = 0.01f;
        const std::vector<uint64_t>* allowed = config >= 4 ? &mask : nullptr;
        SamplerState st;
        st.seed = static_cast<uint64_t>(config * 1000 + n);
        for (int draw = 0; draw < (n > 10000 ? 8 : 40); ++draw) {
          st.num_generated = draw;
          const int32_t got = sampler.Sample(logits.data(), n, p, st, allowed ? allowed->data() : nullptr).token;
          ASSERT_EQ(got, ReferenceDraw(logits, p, st, allowed))
              << "n " << n << " spread " << spread << " config " << config << " draw " << draw;
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 1000);
}

}  // namespace
}  // namespace pdserve
