#include "common/kvcache/block_hash_index.h"

#include <map>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace pdserve {
namespace {

// Random inserts, lookups and erasures against std::map, on a table small enough that runs wrap
// around its end and erasures shift entries back across it; `lo` values drawn from few, so that
// many blocks share one and only the caller's check (here: the block's own full key) tells them
// apart.
TEST(BlockHashIndexTest, AgreesWithAMapThroughChurn) {
  for (int64_t max_entries : {1, 5, 8, 40}) {
    BlockHashIndex index(max_entries);
    std::mt19937_64 rng(static_cast<uint64_t>(max_entries));
    std::map<std::pair<uint64_t, uint64_t>, int32_t> want;  // (lo, hi) -> block
    std::vector<std::pair<uint64_t, uint64_t>> key_of(1000);  // block -> (lo, hi)
    int32_t next_block = 0;
    auto find = [&](uint64_t lo, uint64_t hi) {
      return index.Find(lo, [&](int32_t b) { return key_of[static_cast<size_t>(b)].second == hi; });
    };
    for (int op = 0; op < 20000; ++op) {
      const uint64_t lo = rng() % 7 * 0x1000000000000001ull + (rng() % 3 == 0 ? 0 : rng() % 5);
      const uint64_t hi = rng() % 3;
      auto it = want.find({lo, hi});
      ASSERT_EQ(find(lo, hi), it == want.end() ? -1 : it->second) << "op " << op;
      if (it == want.end() && static_cast<int64_t>(want.size()) < max_entries && rng() % 2 == 0) {
        const int32_t b = next_block++ % 1000;
        key_of[static_cast<size_t>(b)] = {lo, hi};
        index.Insert(lo, b);
        want[{lo, hi}] = b;
      } else if (!want.empty() && rng() % 2 == 0) {
        auto victim = want.begin();
        std::advance(victim, static_cast<long>(rng() % want.size()));
        index.Erase(victim->first.first, victim->second);
        want.erase(victim);
      }
      ASSERT_EQ(index.size(), static_cast<int64_t>(want.size()));
    }
    for (const auto& [key, b] : want) EXPECT_EQ(find(key.first, key.second), b);
    int64_t seen = 0;
    index.ForEach([&](uint64_t lo, int32_t b) {
      ++seen;
      EXPECT_EQ(key_of[static_cast<size_t>(b)].first, lo);
      EXPECT_EQ(want.at(key_of[static_cast<size_t>(b)]), b);
    });
    EXPECT_EQ(seen, static_cast<int64_t>(want.size()));
  }
}

TEST(BlockHashIndexTest, FullTableRefusesMore) {
  BlockHashIndex index(2);
  index.Insert(1, 0);
  index.Insert(1, 1);
  EXPECT_DEATH(index.Insert(2, 2), "more entries than it was sized for");
  EXPECT_DEATH(index.Erase(3, 7), "not there");
}

}  // namespace
}  // namespace pdserve
