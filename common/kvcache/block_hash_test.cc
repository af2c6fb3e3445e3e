#include "common/kvcache/block_hash.h"

#include "gtest/gtest.h"

namespace pdserve {
namespace {

TEST(BlockHashTest, ChainedOverWholePrefix) {
  std::vector<int32_t> a = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  std::vector<int32_t> b = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<int32_t> c = {9, 2, 3, 4, 5, 6, 7, 8};
  std::vector<BlockHash> ha, hb, hc;
  ExtendBlockHashes(a, 4, &ha);
  ExtendBlockHashes(b, 4, &hb);
  ExtendBlockHashes(c, 4, &hc);
  ASSERT_EQ(ha.size(), 2u);  // The partial third block is not hashed.
  EXPECT_EQ(ha, hb);
  // Same second block, different first block: the second hashes differ too (chained).
  EXPECT_NE(ha[1], hc[1]);
  EXPECT_EQ(HashBlock(ha[0], {5, 6, 7, 8}), ha[1]);
}

TEST(BlockHashTest, IncrementalEqualsOneShot) {
  std::vector<int32_t> t;
  std::vector<BlockHash> inc;
  for (int i = 0; i < 50; ++i) {
    t.push_back(i * 7 % 13);
    ExtendBlockHashes(t, 3, &inc);
  }
  std::vector<BlockHash> once;
  ExtendBlockHashes(t, 3, &once);
  EXPECT_EQ(inc, once);
}

}  // namespace
}  // namespace pdserve
