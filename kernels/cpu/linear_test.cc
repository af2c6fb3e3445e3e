#include "kernels/cpu/linear.h"

#include <cmath>
#include <vector>

#include "common/base/rng.h"
#include "common/base/thread_pool.h"
#include "gtest/gtest.h"
#include "kernels/cpu/linear_avx512.h"

namespace pdserve::kernels {
namespace {

struct Weights {
  std::vector<float> f32;
  std::vector<uint16_t> half;
  MatrixRef ref;
};

Weights MakeWeights(DType dtype, int64_t n, int64_t k, uint64_t seed) {
  Weights w;
  SplitMix64 rng(seed);
  w.f32.resize(n * k);
  for (float& v : w.f32) v = static_cast<float>(rng.Normal());
  if (dtype == DType::kF32) {
    w.ref = {dtype, w.f32.data(), n, k};
  } else {
    w.half.resize(n * k);
    for (size_t i = 0; i < w.half.size(); ++i) {
      w.half[i] = dtype == DType::kBF16 ? F32ToBf16(w.f32[i]) : F32ToF16(w.f32[i]);
    }
    w.ref = {dtype, w.half.data(), n, k};
  }
  return w;
}

std::vector<float> RandomRows(int64_t m, int64_t k, uint64_t seed) {
  SplitMix64 rng(seed);
  std::vector<float> x(m * k);
  for (float& v : x) v = static_cast<float>(rng.Normal());
  return x;
}

class LinearTest : public ::testing::TestWithParam<DType> {};

TEST_P(LinearTest, MatchesDoubleReference) {
  ThreadPool pool(2);
  for (int64_t k : {8, 13, 64, 576}) {
    for (int64_t m : {1, 2, 3, 4, 5, 9}) {
      const int64_t n = 37;
      Weights w = MakeWeights(GetParam(), n, k, 1);
      std::vector<float> x = RandomRows(m, k, 2);
      std::vector<float> y(m * n);
      Linear(x.data(), m, k, w.ref, y.data(), n, &pool);
      std::vector<double> ref(m * n);
      LinearReference(x.data(), m, k, w.ref, ref.data());
      for (int64_t i = 0; i < m * n; ++i) {
        // f32 accumulation error bound ~ k * eps * sum|x w|; sum|x w| ~ k for unit normals.
        EXPECT_NEAR(y[i], ref[i], 2e-6 * k + 1e-5) << "m=" << m << " k=" << k << " i=" << i;
      }
    }
  }
}

// A row's result is bitwise identical whatever the batch size, its position in the batch, the
// other rows, the thread count, and how outputs are grouped into one parallel region.
TEST_P(LinearTest, BitwiseBatchAndThreadInvariant) {
  const int64_t n = 100, k = 200, m = 45;  // Covers the packed AVX-512 path (m >= 32) too.
  Weights w = MakeWeights(GetParam(), n, k, 3);
  std::vector<float> x = RandomRows(m, k, 4);
  ThreadPool one(1), three(3);
  std::vector<float> batched(m * n);
  Linear(x.data(), m, k, w.ref, batched.data(), n, &three);
  for (int64_t t = 0; t < m; ++t) {
    std::vector<float> alone(n);
    Linear(x.data() + t * k, 1, k, w.ref, alone.data(), n, &one);
    for (int64_t j = 0; j < n; ++j) ASSERT_EQ(alone[j], batched[t * n + j]) << t << "," << j;
  }
  // The same rows in a different batch (a suffix, with other rows after them).
  std::vector<float> suffix((m - 5) * n);
  Linear(x.data() + 5 * k, m - 5, k, w.ref, suffix.data(), n, &one);
  for (int64_t i = 0; i < (m - 5) * n; ++i) ASSERT_EQ(suffix[i], batched[5 * n + i]);
  // Split into two outputs of one region.
  MatrixRef top = w.ref, bottom = w.ref;
  top.rows = 40;
  bottom.rows = 60;
  bottom.data = w.ref.row(40);
  std::vector<float> y_top(m * 40), y_bottom(m * 60);
  LinearOutput outs[2] = {{&top, y_top.data(), 40}, {&bottom, y_bottom.data(), 60}};
  LinearMulti(x.data(), m, k, outs, 2, &three);
  for (int64_t t = 0; t < m; ++t) {
    for (int64_t j = 0; j < 40; ++j) ASSERT_EQ(y_top[t * 40 + j], batched[t * n + j]);
    for (int64_t j = 0; j < 60; ++j) ASSERT_EQ(y_bottom[t * 60 + j], batched[t * n + 40 + j]);
  }
}

// The AVX-512 path packs two outputs per register but performs each output's operations in the
// AVX2 path's order: every element bitwise equal, for every tile shape and remainder.
TEST_P(LinearTest, Avx512PathIsBitwiseTheAvx2Path) {
  SetAvx512Enabled(true);
  if (!Avx512Enabled()) GTEST_SKIP() << "needs avx512: this CPU has no AVX-512 (F, BW, DQ, VL)";
  ThreadPool pool(2);
  for (int64_t k : {8, 13, 64, 576, 1000}) {
    for (int64_t n : {1, 2, 7, 9, 37, 100}) {
      for (int64_t m : {1, 2, 3, 4, 5, 8, 9, 10, 11, 23, 32, 33, 45}) {
        Weights w = MakeWeights(GetParam(), n, k, 5 + k + n);
        std::vector<float> x = RandomRows(m, k, 6 + m);
        std::vector<float> wide(m * n), narrow(m * n);
        SetAvx512Enabled(true);
        Linear(x.data(), m, k, w.ref, wide.data(), n, &pool);
        SetAvx512Enabled(false);
        Linear(x.data(), m, k, w.ref, narrow.data(), n, &pool);
        SetAvx512Enabled(true);
        for (int64_t i = 0; i < m * n; ++i) {
          ASSERT_EQ(wide[i], narrow[i]) << "m=" << m << " n=" << n << " k=" << k << " i=" << i;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllWeightTypes, LinearTest,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

}  // namespace
}  // namespace pdserve::kernels
