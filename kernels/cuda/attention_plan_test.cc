// Host-side launch planning (attention_plan.h) and the shape checks (kernel_checks.h).
#include "kernels/cuda/attention_plan.h"

#include "gtest/gtest.h"
#include "kernels/cuda/attention_kernels.h"
#include "kernels/cuda/kernel_checks.h"

namespace pdserve::cuda {
namespace {

static_assert(kMaxKernelHeadDim == kMaxHeadDim && kMaxKernelGroup == kMaxGroup);

TEST(AttentionPlanTest, DecodeSplitsDependOnTheShapeOnlyAndFitSharedMemory) {
  // 256 keys per split whatever the context (the grid's z covers the longest).
  DecodeSplit s = PlanDecodeSplits(4, 128, 4096);
  EXPECT_EQ(s.split_tokens, 256);
  EXPECT_EQ(s.max_splits, 16);
  EXPECT_EQ(PlanDecodeSplits(4, 128, 300).split_tokens, 256);
  EXPECT_EQ(PlanDecodeSplits(4, 128, 300).max_splits, 2);
  // A one-token context.
  s = PlanDecodeSplits(2, 64, 1);
  EXPECT_EQ(s.max_splits, 1);
  // Every shape the kernels take fits shared memory, in whole warps of keys.
  for (int group : {1, 2, 4, 8, 16}) {
    for (int d : {64, 80, 128, 256}) {
      s = PlanDecodeSplits(group, d, 100000);
      EXPECT_LE(sizeof(float) * DecodeSharedFloats(group, d, s.split_tokens), size_t{kDecodeSharedBytes})
          << group << " " << d;
      EXPECT_EQ(s.split_tokens % kWarpSize, 0);
      EXPECT_GE(s.split_tokens, kWarpSize);
      EXPECT_EQ(s.max_splits, (100000 + s.split_tokens - 1) / s.split_tokens);
    }
  }
}

TEST(AttentionPlanTest, PrefillTilesNeverMixSequencesOrExceedTheTile) {
  std::vector<int32_t> first, n;
  MakePrefillTiles({0, 0, 0, 1, 2, 2, 2, 2, 2}, 4, &first, &n);
  EXPECT_EQ(first, (std::vector<int32_t>{0, 3, 4, 8}));
  EXPECT_EQ(n, (std::vector<int32_t>{3, 1, 4, 1}));
  MakePrefillTiles({}, 4, &first, &n);
  EXPECT_TRUE(first.empty());
}

TEST(KernelChecksTest, RefusesShapesTheKernelsCannotRunNamingWhy) {
  EXPECT_TRUE(CheckAttentionShape(32, 8, 128, KvFormat::kBF16).ok());
  EXPECT_TRUE(CheckAttentionShape(14, 2, 64, KvFormat::kInt4).ok());
  const absl::Status group = CheckAttentionShape(64, 2, 128, KvFormat::kBF16);
  EXPECT_EQ(group.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(group.message().find("at most 16 query heads per KV head"), std::string::npos) << group;
  EXPECT_FALSE(CheckAttentionShape(12, 5, 64, KvFormat::kF32).ok());
  EXPECT_FALSE(CheckAttentionShape(8, 8, 512, KvFormat::kF32).ok());
  EXPECT_FALSE(CheckAttentionShape(8, 8, 63, KvFormat::kF32).ok());
  const absl::Status int4 = CheckAttentionShape(8, 8, 70, KvFormat::kInt4);
  EXPECT_NE(int4.message().find("int4"), std::string::npos) << int4;
}

}  // namespace
}  // namespace pdserve::cuda
