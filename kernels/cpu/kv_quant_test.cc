#include "kernels/cpu/kv_quant.h"

#include <cmath>
#include <limits>
#include <vector>

#include "common/base/rng.h"
#include "gtest/gtest.h"

namespace pdserve::kernels {
namespace {

// Round trip through int8 and int4 rows; checks every element against the format's bound and
// the codes against an independent double-precision formula.
void CheckRoundTrip(const std::vector<float>& x, const char* what) {
  const int64_t n = static_cast<int64_t>(x.size());
  float amax = 0;
  for (float v : x) amax = std::max(amax, std::fabs(v));
  std::vector<int8_t> c8(n);
  std::vector<uint8_t> c4(n / 2);
  std::vector<float> back8(n), back4(n);
  float s8 = -1, s4 = -1;
  ASSERT_TRUE(QuantizeRowInt8(x.data(), n, c8.data(), &s8)) << what;
  ASSERT_TRUE(QuantizeRowInt4(x.data(), n, c4.data(), &s4)) << what;
  DequantizeRowInt8(c8.data(), n, s8, back8.data());
  DequantizeRowInt4(c4.data(), n, s4, back4.data());
  const double b8 = QuantErrorBound(amax, kInt8Levels), b4 = QuantErrorBound(amax, kInt4Levels);
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_LE(std::fabs(double(x[i]) - back8[i]), b8) << what << " int8 i=" << i << " x=" << x[i];
    EXPECT_LE(std::fabs(double(x[i]) - back4[i]), b4) << what << " int4 i=" << i << " x=" << x[i];
    EXPECT_GE(c8[i], -127);
    EXPECT_GE(Int4Code(c4.data(), i), -7);
    EXPECT_LE(Int4Code(c4.data(), i), 7);
    if (amax > 0) {
      EXPECT_EQ(c8[i], std::nearbyint(double(x[i]) * 127.0 / amax)) << what << " i=" << i;
      EXPECT_EQ(Int4Code(c4.data(), i), std::nearbyint(double(x[i]) * 7.0 / amax)) << what;
    }
  }
  EXPECT_EQ(s8, static_cast<float>(double(amax) / 127)) << what;
  EXPECT_EQ(s4, static_cast<float>(double(amax) / 7)) << what;
}

TEST(KvQuantTest, RandomRowsWithinBound) {
  SplitMix64 rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> x(64 + 2 * (trial % 40));
    const double spread = std::ldexp(1.0, trial % 30 - 15);
    for (float& v : x) v = static_cast<float>(rng.Normal() * spread);
    CheckRoundTrip(x, "random");
  }
}

TEST(KvQuantTest, AdversarialRows) {
  CheckRoundTrip(std::vector<float>(64, 0.0f), "zeros");
  std::vector<float> outlier(64, 1e-3f);
  outlier[17] = -3e4f;  // One outlier: the rest round to zero, within the bound.
  CheckRoundTrip(outlier, "outlier");
  std::vector<float> denormal(64);
  for (int i = 0; i < 64; ++i) denormal[i] = std::numeric_limits<float>::denorm_min() * (i - 30);
  CheckRoundTrip(denormal, "denormals");
  std::vector<float> huge(64, std::numeric_limits<float>::max());
  huge[3] = -std::numeric_limits<float>::max();
  CheckRoundTrip(huge, "float max");
  std::vector<float> ties(64);
  for (int i = 0; i < 64; ++i) ties[i] = (i - 32) * 0.5f;  // Many exact halves of a step.
  ties[0] = 127.0f;
  CheckRoundTrip(ties, "ties");
}

TEST(KvQuantTest, NonFiniteRowsAreRefused) {
  for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
    std::vector<float> x(16, 1.0f);
    x[5] = bad;
    std::vector<int8_t> c8(16, 9);
    std::vector<uint8_t> c4(8, 9);
    float s8 = 0, s4 = 0;
    EXPECT_FALSE(QuantizeRowInt8(x.data(), 16, c8.data(), &s8));
    EXPECT_FALSE(QuantizeRowInt4(x.data(), 16, c4.data(), &s4));
    EXPECT_TRUE(std::isnan(s8));
    EXPECT_TRUE(std::isnan(s4));
    for (int8_t c : c8) EXPECT_EQ(c, 0);
    for (uint8_t c : c4) EXPECT_EQ(c, 0);
  }
}

TEST(KvQuantTest, Int4PacksLowNibbleFirst) {
  const std::vector<float> x = {7, -7, 1, -1, 0, 3, -4, 2};
  std::vector<uint8_t> packed(4);
  float scale = 0;
  ASSERT_TRUE(QuantizeRowInt4(x.data(), 8, packed.data(), &scale));
  EXPECT_EQ(scale, 1.0f);
  EXPECT_EQ(packed[0], 0x97);  // 7 | (-7 & 0xf) << 4
  EXPECT_EQ(packed[1], 0xf1);
  EXPECT_EQ(packed[2], 0x30);
  EXPECT_EQ(packed[3], 0x2c);
}

}  // namespace
}  // namespace pdserve::kernels
