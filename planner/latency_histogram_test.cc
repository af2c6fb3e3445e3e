#include "planner/latency_histogram.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace pdserve {
namespace {

// Nearest rank over the sorted values: the reference the histogram approximates.
double ExactPercentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  const double rank = std::clamp(std::ceil(p / 100.0 * static_cast<double>(v.size())), 1.0,
                                 static_cast<double>(v.size()));
  return v[static_cast<size_t>(rank) - 1];
}

// Values as a simulation gives them: runs of one value (a step's gap for every running request)
// between scattered ones, so that both the run counting and the buckets are exercised.
TEST(LatencyHistogramTest, PercentilesWithinABucketOfNearestRank) {
  std::mt19937_64 rng(7);
  std::lognormal_distribution<double> gap(std::log(0.012), 0.8);
  std::uniform_int_distribution<int> run(1, 300);
  LatencyHistogram h;
  std::vector<double> all;
  double sum = 0;
  for (int i = 0; i < 400; ++i) {
    const double v = gap(rng);
    for (int r = run(rng); r > 0; --r) {
      h.Add(v);
      all.push_back(v);
      sum += v;
    }
  }
  ASSERT_EQ(h.count(), static_cast<int64_t>(all.size()));
  EXPECT_NEAR(h.mean(), sum / static_cast<double>(all.size()), 1e-12);
  for (double p : {1.0, 10.0, 50.0, 90.0, 99.0, 100.0}) {
    const double want = ExactPercentile(all, p);
    EXPECT_NEAR(h.Percentile(p), want, want * 0.002) << "p" << p;
  }
}

// Every value in one run (never flushed into the buckets): still counted, and read back clamped
// to what was seen.
TEST(LatencyHistogramTest, ASingleRunIsCounted) {
  LatencyHistogram h;
  EXPECT_EQ(h.Percentile(50), 0);
  for (int i = 0; i < 1000; ++i) h.Add(0.0105);
  EXPECT_EQ(h.count(), 1000);
  EXPECT_DOUBLE_EQ(h.Percentile(50), 0.0105);
  EXPECT_DOUBLE_EQ(h.Percentile(100), 0.0105);
  h.Add(0.5);
  EXPECT_NEAR(h.Percentile(99.9), 0.0105, 0.0105 * 0.002);  // The bucket's middle now.
  EXPECT_DOUBLE_EQ(h.Percentile(100), 0.5);
}

}  // namespace
}  // namespace pdserve
