#include "common/model/weight_format.h"

#include "gtest/gtest.h"

namespace pdserve {
namespace {

// llama-quantize's Q4_K_M choices, on a 32-layer model (use_more_bits: layers 0-3, 28-31 and
// every third from 6), and the fallbacks for rows that are not whole blocks.
TEST(WeightFormat, Q4_K_MPicksLlamaQuantizesTypes) {
  const WeightFormat f = WeightFormat::kQ4_K_M;
  EXPECT_EQ(MatrixType(f, MatrixRole::kHead, 0, 32, 4096), GgmlType::kQ6_K);
  EXPECT_EQ(MatrixType(f, MatrixRole::kEmbedding, 0, 32, 4096), GgmlType::kQ4_K);
  EXPECT_EQ(MatrixType(f, MatrixRole::kEmbedding, 0, 32, 4096, /*tied=*/true), GgmlType::kQ6_K);
  int more = 0;
  for (int layer = 0; layer < 32; ++layer) {
    const bool expect = layer < 4 || layer >= 28 || (layer - 4) % 3 == 2;
    more += expect;
    for (MatrixRole role : {MatrixRole::kAttnV, MatrixRole::kFfnDown}) {
      EXPECT_EQ(MatrixType(f, role, layer, 32, 4096), expect ? GgmlType::kQ6_K : GgmlType::kQ4_K)
          << layer;
    }
    for (MatrixRole role : {MatrixRole::kAttnQ, MatrixRole::kAttnK, MatrixRole::kAttnOutput,
                            MatrixRole::kFfnGate, MatrixRole::kFfnUp}) {
      EXPECT_EQ(MatrixType(f, role, layer, 32, 4096), GgmlType::kQ4_K) << layer;
    }
  }
  EXPECT_EQ(more, 16);
  EXPECT_EQ(MatrixType(f, MatrixRole::kFfnGate, 0, 32, 4000), GgmlType::kQ5_0);
  EXPECT_EQ(MatrixType(f, MatrixRole::kFfnGate, 0, 32, 4001), GgmlType::kF16);
  EXPECT_EQ(MatrixType(f, MatrixRole::kHead, 0, 32, 4000), GgmlType::kQ8_0);
  EXPECT_EQ(MatrixType(f, MatrixRole::kHead, 0, 32, 4001), GgmlType::kF16);
  EXPECT_EQ(MatrixType(WeightFormat::kQ4_K, MatrixRole::kHead, 0, 32, 4096), GgmlType::kQ4_K);
  EXPECT_EQ(MatrixType(WeightFormat::kQ8_0, MatrixRole::kFfnDown, 3, 32, 4096), GgmlType::kQ8_0);
  EXPECT_EQ(MatrixType(WeightFormat::kBF16, MatrixRole::kFfnDown, 3, 32, 4096), GgmlType::kBF16);
}

TEST(WeightFormat, NamesRoundTripAndUnknownIsAnError) {
  for (const char* name : {"auto", "f32", "f16", "bf16", "q8_0", "q4_k", "q4_k_m"}) {
    auto f = ParseWeightFormat(name);
    ASSERT_TRUE(f.ok()) << name;
    EXPECT_STREQ(WeightFormatName(*f), name);
  }
  EXPECT_EQ(WeightFormatFileType(WeightFormat::kQ4_K_M), 15u);
  auto bad = ParseWeightFormat("q4_k_s");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("q4_k_s"), std::string::npos);
}

}  // namespace
}  // namespace pdserve
