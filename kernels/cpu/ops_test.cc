#include "kernels/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/base/rng.h"
#include "gtest/gtest.h"
#include "kernels/cpu/simd.h"

namespace pdserve::kernels {
namespace {

TEST(OpsTest, ExpIsAccurateAndVectorEqualsScalar) {
  SplitMix64 rng(5);
  for (int i = 0; i < 200000; ++i) {
    const float x = static_cast<float>(rng.Uniform() * 170.0 - 87.0);
    const float e = ExpScalar(x);
    const double ref = std::exp(static_cast<double>(x));
    ASSERT_NEAR(e / ref, 1.0, 3e-7) << x;
  }
#if PDSERVE_AVX2
  alignas(32) float in[8], out[8];
  for (int i = 0; i < 20000; ++i) {
    for (float& v : in) v = static_cast<float>(rng.Uniform() * 200.0 - 100.0);
    _mm256_store_ps(out, Exp8(_mm256_load_ps(in)));
    for (int l = 0; l < 8; ++l) ASSERT_EQ(out[l], ExpScalar(in[l])) << in[l];
  }
#endif
  EXPECT_EQ(ExpScalar(0.0f), 1.0f);
  EXPECT_LT(ExpScalar(-1000.0f), 1e-37f);
}

#if PDSERVE_AVX2
// The transposed reduction must give each lane exactly HorizontalSum's bits, or attention scores
// would depend on whether a key fell in a group of 8 or in the tail.
TEST(OpsTest, HorizontalSum8x8IsBitIdenticalToHorizontalSum) {
  SplitMix64 rng(12);
  alignas(32) float lanes[8][8], out[8];
  for (int trial = 0; trial < 20000; ++trial) {
    __m256 v[8];
    for (int i = 0; i < 8; ++i) {
      for (int l = 0; l < 8; ++l) {
        // Wide magnitude range so that association order matters.
        lanes[i][l] = static_cast<float>(rng.Normal() * std::pow(10.0, rng.Uniform() * 12 - 6));
      }
      v[i] = _mm256_load_ps(lanes[i]);
    }
    _mm256_store_ps(out, HorizontalSum8x8(v));
    for (int i = 0; i < 8; ++i) ASSERT_EQ(out[i], HorizontalSum(v[i])) << trial << " " << i;
  }
}
#endif

TEST(OpsTest, RmsNormMatchesDouble) {
  SplitMix64 rng(6);
  const int64_t n = 77;
  std::vector<float> x(n), w(n), out(n);
  for (int64_t i = 0; i < n; ++i) {
    x[i] = static_cast<float>(rng.Normal() * 3);
    w[i] = static_cast<float>(1 + 0.1 * rng.Normal());
  }
  RmsNorm(x.data(), w.data(), n, 1e-5f, out.data());
  double ms = 0;
  for (float v : x) ms += double(v) * v;
  ms /= n;
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_NEAR(out[i], w[i] * x[i] / std::sqrt(ms + 1e-5), 1e-5);
  }
}

TEST(OpsTest, RopeRotatesHalves) {
  const int64_t d = 8;
  RopeParams p;
  p.theta = 10000;
  std::vector<float> cs(d), x = {1, 2, 3, 4, 5, 6, 7, 8};
  RopeCosSin(p, d, 3, cs.data());
  std::vector<float> y = x;
  ApplyRope(y.data(), d, cs.data());
  for (int64_t i = 0; i < d / 2; ++i) {
    const double f = 3.0 / std::pow(10000.0, 2.0 * i / d);
    EXPECT_NEAR(y[i], x[i] * std::cos(f) - x[i + 4] * std::sin(f), 1e-5);
    EXPECT_NEAR(y[i + 4], x[i + 4] * std::cos(f) + x[i] * std::sin(f), 1e-5);
  }
}

TEST(OpsTest, Llama3ScalingKeepsHighAndSlowsLowFrequencies) {
  RopeParams p;
  p.theta = 500000;
  p.type = 2;
  p.factor = 8;
  p.low_freq_factor = 1;
  p.high_freq_factor = 4;
  p.original_max_position = 8192;
  const int64_t d = 64;
  std::vector<float> scaled(d), plain(d);
  RopeParams none = p;
  none.type = 0;
  RopeCosSin(p, d, 1000, scaled.data());
  RopeCosSin(none, d, 1000, plain.data());
  EXPECT_EQ(scaled[0], plain[0]);  // Highest frequency: wavelength 2*pi < 2048, unchanged.
  // Lowest frequency: wavelength > 8192, angle divided by 8.
  const double inv = 1.0 / std::pow(500000.0, 62.0 / 64);
  EXPECT_NEAR(scaled[31], std::cos(1000 * inv / 8), 1e-6);
}

TEST(OpsTest, SiluMul) {
  std::vector<float> g(19), u(19), out(19);
  for (int i = 0; i < 19; ++i) {
    g[i] = -9.0f + i;
    u[i] = 0.5f * i;
  }
  SiluMul(g.data(), u.data(), 19, out.data());
  for (int i = 0; i < 19; ++i) {
    EXPECT_NEAR(out[i], g[i] / (1 + std::exp(-double(g[i]))) * u[i], 1e-5 * (1 + std::abs(out[i])));
  }
}

// Against a double-precision log-sum-exp, over a vocabulary-sized row with a wide spread (the
// largest logit dominates, tiny ones underflow), and short rows that are all tail.
TEST(OpsTest, LogSumExpMatchesDouble) {
  for (int64_t n : {1, 7, 8, 9, 49152}) {
    std::vector<float> x(n);
    uint64_t state = 12345;
    for (float& v : x) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      v = static_cast<float>(static_cast<int64_t>(state >> 40) % 4000) / 100.0f - 20.0f;
    }
    double max = -1e300;
    for (float v : x) max = std::max(max, static_cast<double>(v));
    double sum = 0;
    for (float v : x) sum += std::exp(static_cast<double>(v) - max);
    const double want = max + std::log(sum);
    EXPECT_NEAR(LogSumExp(x.data(), n), want, 2e-7 * std::abs(want) + 1e-7) << n;
  }
}

}  // namespace
}  // namespace pdserve::kernels
