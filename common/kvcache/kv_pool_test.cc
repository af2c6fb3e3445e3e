#include "common/kvcache/kv_pool.h"

#include "gtest/gtest.h"

namespace pdserve {
namespace {

TEST(KvPoolTest, LayoutMakesEachPageContiguous) {
  KvCacheSpec spec{3, 2, 8, 4, KvDType::kBF16};
  EXPECT_EQ(spec.PageBytes(), 2u * 2 * 4 * 8 * 2);
  EXPECT_EQ(spec.BytesPerToken(), 2u * 3 * 2 * 8 * 2);
  auto pool = KvPool::Create(spec, 5);
  ASSERT_TRUE(pool.ok());
  EXPECT_EQ((*pool)->size_bytes(), spec.PageBytes() * 15);
  EXPECT_EQ((*pool)->PageOffset(1, 2), spec.PageBytes() * 7);
  EXPECT_EQ((*pool)->LayerBase(2) - (*pool)->data(), static_cast<ptrdiff_t>(spec.PageBytes() * 10));
  EXPECT_EQ(KvPool::BlocksForBytes(spec, spec.BlockBytes() * 7 + 1), 7);
}

// Quantized pages: codes, then one f32 scale per (K|V, kv_head, slot) row.
TEST(KvPoolTest, QuantizedPagesCarryTheirScales) {
  const KvCacheSpec bf16{3, 2, 64, 16, KvDType::kBF16};
  KvCacheSpec int8 = bf16, int4 = bf16;
  int8.dtype = KvDType::kInt8;
  int4.dtype = KvDType::kInt4;
  EXPECT_EQ(int8.RowBytes(), 64u);
  EXPECT_EQ(int4.RowBytes(), 32u);
  EXPECT_EQ(int8.PageScalesOffset(), 2u * 2 * 16 * 64);
  EXPECT_EQ(int8.PageBytes(), 2u * 2 * 16 * (64 + 4));
  EXPECT_EQ(int4.PageBytes(), 2u * 2 * 16 * (32 + 4));
  EXPECT_EQ(int8.BytesPerToken() * 16, int8.PageBytes() * 3);
  EXPECT_EQ(int4.BytesPerToken() * 16, int4.BlockBytes());
  // Codes are exactly half / a quarter of bf16; the scales come on top.
  EXPECT_EQ(int8.PageScalesOffset() * 2, bf16.PageBytes());
  EXPECT_EQ(int4.PageScalesOffset() * 4, bf16.PageBytes());
  EXPECT_TRUE(KvPool::Create(int4, 2).ok());
}

// The host pool is a huge-page arena's (2 MiB-aligned, zero until written); a pool kept in a
// device's memory is only address space of its own.
TEST(KvPoolTest, HostPoolsStartOnAHugePageAndReadZero) {
  const KvCacheSpec spec{2, 2, 64, 16, KvDType::kF32};
  for (bool reserve : {true, false}) {
    auto pool = KvPool::Create(spec, 300, reserve);
    ASSERT_TRUE(pool.ok());
    if (reserve) EXPECT_EQ(reinterpret_cast<uintptr_t>((*pool)->data()) % (2u << 20), 0u);
    uint8_t* last = (*pool)->data() + (*pool)->size_bytes() - 1;
    EXPECT_EQ(*last, 0);
    *last = 7;
    EXPECT_EQ(*last, 7);
  }
}

TEST(KvPoolTest, RejectsBadConfigurations) {
  EXPECT_EQ(KvPool::Create(KvCacheSpec{1, 1, 8, 4, KvDType::kF32}, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  const auto odd = KvPool::Create(KvCacheSpec{1, 1, 7, 4, KvDType::kInt4}, 1);
  EXPECT_EQ(odd.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(odd.status().message().find("head_dim 7"), std::string::npos);
}

}  // namespace
}  // namespace pdserve
