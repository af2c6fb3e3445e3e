#include "common/kvcache/kv_pool.h"

#include "gtest/gtest.h"

namespace pdserve {
namespace {

TEST(KvPoolTest, LayoutMakesEachPageContiguous) {
  KvCacheSpec spec{3, 2, 8, 4, DType::kBF16};
  EXPECT_EQ(spec.PageBytes(), 2u * 2 * 4 * 8 * 2);
  EXPECT_EQ(spec.BytesPerToken(), 2u * 3 * 2 * 8 * 2);
  auto pool = KvPool::Create(spec, 5);
  ASSERT_TRUE(pool.ok());
  EXPECT_EQ((*pool)->size_bytes(), spec.PageBytes() * 15);
  EXPECT_EQ((*pool)->PageOffset(1, 2), spec.PageBytes() * 7);
  EXPECT_EQ((*pool)->LayerBase(2) - (*pool)->data(), static_cast<ptrdiff_t>(spec.PageBytes() * 10));
  EXPECT_EQ(KvPool::BlocksForBytes(spec, spec.BlockBytes() * 7 + 1), 7);
}

TEST(KvPoolTest, RejectsBadConfigurations) {
  EXPECT_EQ(KvPool::Create(KvCacheSpec{1, 1, 8, 4, DType::kF16}, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KvPool::Create(KvCacheSpec{1, 1, 8, 4, DType::kF32}, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pdserve
