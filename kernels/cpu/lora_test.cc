#include "kernels/cpu/lora.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "common/base/rng.h"
#include "common/base/thread_pool.h"
#include "gtest/gtest.h"

namespace pdserve::kernels {
namespace {

std::vector<float> Normal(int64_t n, uint64_t seed, double scale = 1.0) {
  SplitMix64 rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(rng.Normal() * scale);
  return v;
}

struct Adapter {
  std::vector<float> a, b;
  MatrixRef ra, rb;
  Adapter(int64_t rank, int64_t k, int64_t n, uint64_t seed)
      : a(Normal(rank * k, seed)), b(Normal(n * rank, seed + 1, 0.1)) {
    ra = {DType::kF32, a.data(), rank, k};
    rb = {DType::kF32, b.data(), n, rank};
  }
};

// y0 + B (A x) in double, the way PEFT defines it.
double Reference(const Adapter& ad, const float* x, float y0, int64_t j) {
  double out = y0;
  for (int64_t i = 0; i < ad.ra.rows; ++i) {
    double t = 0;
    for (int64_t c = 0; c < ad.ra.cols; ++c) t += static_cast<double>(ad.a[i * ad.ra.cols + c]) * x[c];
    out += t * ad.b[j * ad.ra.rows + i];
  }
  return out;
}

TEST(Lora, MatchesDoubleReferenceForMixedAdaptersAndRanks) {
  const int64_t k = 72, n = 150, rows = 37;
  ThreadPool pool(2);
  const std::vector<float> x = Normal(rows * k, 1);
  const std::vector<float> y0 = Normal(rows * n, 2);
  Adapter a8(8, k, n, 10), a64(64, k, n, 20), a3(3, k, n, 30);
  // Runs: [0, 5) a8, [5, 9) none, [9, 30) a64, [30, 31) a8, [31, 37) a3.
  std::vector<float> y = y0;
  LoraDelta deltas[] = {{&a8.ra, &a8.rb, 0, 5, y.data(), n},
                        {&a64.ra, &a64.rb, 9, 30, y.data(), n},
                        {&a8.ra, &a8.rb, 30, 31, y.data(), n},
                        {&a3.ra, &a3.rb, 31, 37, y.data(), n}};
  std::vector<float> t(LoraPlanScratch(deltas, 4));
  LoraAddMulti(x.data(), k, deltas, 4, t.data(), &pool);
  for (int64_t r = 0; r < rows; ++r) {
    const Adapter* ad = r < 5 ? &a8 : r < 9 ? nullptr : r < 30 ? &a64 : r < 31 ? &a8 : &a3;
    for (int64_t j = 0; j < n; ++j) {
      if (ad == nullptr) {
        EXPECT_EQ(y[r * n + j], y0[r * n + j]) << "row " << r << " has no adapter";
        continue;
      }
      const double want = Reference(*ad, &x[r * k], y0[r * n + j], j);
      EXPECT_NEAR(y[r * n + j], want, 1e-4 * (1 + std::abs(want))) << "row " << r << " col " << j;
    }
  }
}

TEST(Lora, ARowsResultIsTheSameBitsWhateverSharesItsBatch) {
  const int64_t k = 96, n = 200;
  Adapter mine(16, k, n, 40), other(16, k, n, 50);
  const std::vector<float> row = Normal(k, 3);
  const std::vector<float> y_row = Normal(n, 4);
  // Alone, on one thread.
  ThreadPool one(1);
  std::vector<float> alone = y_row;
  {
    LoraDelta d{&mine.ra, &mine.rb, 0, 1, alone.data(), n};
    std::vector<float> t(LoraPlanScratch(&d, 1));
    LoraAddMulti(row.data(), k, &d, 1, t.data(), &one);
  }
  // Row 21 of a 40-row batch, its adapter's run [17, 36), another adapter's rows around it.
  ThreadPool two(2);
  const int64_t rows = 40;
  std::vector<float> x = Normal(rows * k, 5);
  std::vector<float> y = Normal(rows * n, 6);
  std::memcpy(&x[21 * k], row.data(), k * sizeof(float));
  std::memcpy(&y[21 * n], y_row.data(), n * sizeof(float));
  LoraDelta deltas[] = {{&other.ra, &other.rb, 0, 17, y.data(), n},
                        {&mine.ra, &mine.rb, 17, 36, y.data(), n},
                        {&other.ra, &other.rb, 36, 40, y.data(), n}};
  std::vector<float> t(LoraPlanScratch(deltas, 3));
  LoraAddMulti(x.data(), k, deltas, 3, t.data(), &two);
  EXPECT_EQ(std::memcmp(&y[21 * n], alone.data(), n * sizeof(float)), 0);
}

}  // namespace
}  // namespace pdserve::kernels
