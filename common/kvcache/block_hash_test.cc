#include "common/kvcache/block_hash.h"

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include <cstring>

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

// HashBlock hashes small blocks in one call over a copy and large ones with the streaming API: both
// equal XXH3-128 streamed over the scheme's bytes (the parent's lo then hi, then the ids), here
// computed independently, for every block size either side of the switch.
TEST(BlockHashTest, EqualsXxh3OverTheSchemesBytesAtEverySize) {
  const BlockHash parent{0x0123456789abcdefull, 0xfedcba9876543210ull};
  std::vector<int32_t> tokens;
  for (int n = 0; n <= 130; ++n) {
    XXH3_state_t state;
    XXH3_128bits_reset(&state);
    XXH3_128bits_update(&state, &parent.lo, 8);
    XXH3_128bits_update(&state, &parent.hi, 8);
    for (int32_t t : tokens) XXH3_128bits_update(&state, &t, 4);
    const XXH128_hash_t want = XXH3_128bits_digest(&state);
    EXPECT_EQ(HashBlock(parent, tokens), (BlockHash{want.low64, want.high64})) << n << " tokens";
    tokens.push_back(n * 2654435761u % 151936 - (n % 5 == 0 ? 200000 : 0));  // Negative ids too.
  }
}

}  // namespace
}  // namespace pdserve
