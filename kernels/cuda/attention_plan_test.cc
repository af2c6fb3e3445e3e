// Host-side launch planning (attention_plan.h) and the shape checks (kernel_checks.h).
#include "kernels/cuda/attention_plan.h"

#include "gtest/gtest.h"
#include "kernels/cuda/attention_kernels.h"
#include "kernels/cuda/kernel_checks.h"

namespace pdserve::cuda {
namespace {

static_assert(kMaxKernelHeadDim == kMaxHeadDim && kMaxKernelGroup == kMaxGroup);

TEST(AttentionPlanTest, DecodeSplitsFillTheDeviceAndFitSharedMemory) {
  // Batch 1, one KV head, 4k context on 132 SMs: many splits, none shorter than 64 keys.
  DecodeSplit s = PlanDecodeSplits(1, 1, 4, 128, 4096, 132);
  EXPECT_EQ(s.split_tokens, 64);
  EXPECT_EQ(s.max_splits, 64);
  // Batch 64 x 8 KV heads already fills it: one split as long as shared memory allows.
  s = PlanDecodeSplits(64, 8, 4, 128, 4096, 132);
  EXPECT_EQ(s.max_splits * s.split_tokens >= 4096, true);
  EXPECT_LE(sizeof(float) * DecodeSharedFloats(4, 128, s.split_tokens), size_t{kDecodeSharedBytes});
  EXPECT_GT(s.split_tokens, 2000);
  EXPECT_EQ(s.split_tokens % kWarpSize, 0);
  // A wide group leaves less room per split.
  s = PlanDecodeSplits(64, 1, 16, 256, 100000, 132);
  EXPECT_LE(sizeof(float) * DecodeSharedFloats(16, 256, s.split_tokens), size_t{kDecodeSharedBytes});
  EXPECT_EQ(s.max_splits, (100000 + s.split_tokens - 1) / s.split_tokens);
  // A one-token context.
  s = PlanDecodeSplits(3, 2, 2, 64, 1, 132);
  EXPECT_EQ(s.max_splits, 1);
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
