#include "common/base/dtype.h"

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include <cmath>
#include <limits>

#include "common/base/rng.h"
#include "gtest/gtest.h"

namespace pdserve {
namespace {

TEST(DTypeTest, ParseAcceptsAllSpellings) {
  EXPECT_EQ(*ParseDType("F32"), DType::kF32);
  EXPECT_EQ(*ParseDType("bfloat16"), DType::kBF16);
  EXPECT_EQ(*ParseDType("f16"), DType::kF16);
  const auto bad = ParseDType("I64");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("I64"), std::string::npos);
}

TEST(DTypeTest, Bf16RoundsToNearestEven) {
  EXPECT_EQ(F32ToBf16(1.0f), 0x3f80);
  // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1.0078125: ties to even (1.0).
  EXPECT_EQ(F32ToBf16(1.0f + 0x1.0p-8f), 0x3f80);
  // 1 + 3*2^-8 is halfway between 1.0078125 (odd) and 1.015625 (even): rounds up.
  EXPECT_EQ(F32ToBf16(1.0f + 3 * 0x1.0p-8f), 0x3f82);
  EXPECT_TRUE(std::isnan(Bf16ToF32(F32ToBf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(Bf16ToF32(F32ToBf16(-2.5f)), -2.5f);
}

#if defined(__F16C__)
// Every half value converts exactly as the F16C instruction does.
TEST(DTypeTest, F16ToF32MatchesHardwareExhaustively) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float hw = _cvtsh_ss(static_cast<uint16_t>(h));
    const float sw = F16ToF32(static_cast<uint16_t>(h));
    if (std::isnan(hw)) {
      EXPECT_TRUE(std::isnan(sw)) << h;
    } else {
      EXPECT_EQ(hw, sw) << h;
    }
  }
}

TEST(DTypeTest, F32ToF16MatchesHardware) {
  SplitMix64 rng(7);
  auto check = [](float f) {
    const uint16_t hw = _cvtss_sh(f, 0);
    const uint16_t sw = F32ToF16(f);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(F16ToF32(sw)));
    } else {
      EXPECT_EQ(hw, sw) << f;
    }
  };
  for (int i = 0; i < 2000000; ++i) {
    uint32_t bits = static_cast<uint32_t>(rng.Next());
    // Concentrate on the half range (exponents around 2^-25 .. 2^16).
    if (i % 2 == 0) bits = (bits & 0x807fffffu) | ((100u + (bits >> 24) % 45u) << 23);
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    check(f);
  }
  for (float f : {0.0f, -0.0f, 65504.0f, 65519.0f, 65520.0f, 1e-8f, 5.96e-8f, 2.98e-8f,
                  6.1e-5f, std::numeric_limits<float>::infinity()}) {
    check(f);
    check(-f);
  }
}

#endif  // __F16C__

}  // namespace
}  // namespace pdserve
