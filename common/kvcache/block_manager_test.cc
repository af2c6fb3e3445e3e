#include "common/kvcache/block_manager.h"

#include <map>
#include <random>

#include "absl/container/flat_hash_set.h"

#include "gtest/gtest.h"

namespace pdserve {
namespace {

std::vector<BlockHash> Hashes(const std::vector<int32_t>& tokens, int64_t bs) {
  std::vector<BlockHash> h;
  ExtendBlockHashes(tokens, bs, &h);
  return h;
}

std::vector<int32_t> Tokens(int n, int32_t first) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = first + i;
  return t;
}

TEST(BlockManagerTest, AdmitReserveFree) {
  BlockManager bm(10, 4, true);
  auto plan = bm.PlanAdmit({}, 0, 9, 9);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->num_new_blocks, 3);
  bm.CommitAdmit(1, *plan);
  EXPECT_EQ(bm.BlockTable(1).size(), 3u);
  ASSERT_TRUE(bm.Reserve(1, 13).ok());
  EXPECT_EQ(bm.BlockTable(1).size(), 4u);
  EXPECT_EQ(bm.Stats().used_blocks, 4);
  bm.Free(1);
  EXPECT_EQ(bm.Stats().free_blocks, 10);
  EXPECT_TRUE(bm.CheckInvariants().ok());
}

// The scheduler's slot hint: learned on the first call, used after, and a hint gone stale (its
// slot freed, then taken by another sequence; out of range; garbage) is never trusted: the call
// grows the named sequence's table and nothing else's.
TEST(BlockManagerTest, ReserveSlotHintSurvivesSlotReuse) {
  BlockManager bm(32, 4, true);
  bm.CommitAdmit(1, *bm.PlanAdmit({}, 0, 4, 4));
  bm.CommitAdmit(2, *bm.PlanAdmit({}, 0, 4, 4));
  int32_t hint1 = -1, hint2 = -1;
  ASSERT_TRUE(bm.Reserve(1, 5, &hint1).ok());
  ASSERT_TRUE(bm.Reserve(2, 5, &hint2).ok());
  EXPECT_GE(hint1, 0);
  EXPECT_NE(hint1, hint2);
  ASSERT_TRUE(bm.Reserve(1, 9, &hint1).ok());
  EXPECT_EQ(bm.BlockTable(1).size(), 3u);
  // Sequence 1 leaves; 3 takes its slot. Reserving for 1's old hint on behalf of 3 and of 2
  // must grow 3's and 2's tables, not each other's.
  bm.Free(1);
  bm.CommitAdmit(3, *bm.PlanAdmit({}, 0, 4, 4));
  int32_t stale = hint1;
  ASSERT_TRUE(bm.Reserve(3, 13, &stale).ok());
  EXPECT_EQ(bm.BlockTable(3).size(), 4u);
  int32_t wrong = stale;  // Names 3's slot.
  ASSERT_TRUE(bm.Reserve(2, 13, &wrong).ok());
  EXPECT_EQ(bm.BlockTable(2).size(), 4u);
  EXPECT_EQ(bm.BlockTable(3).size(), 4u);
  EXPECT_EQ(wrong, hint2);
  for (int32_t garbage : {-7, 1000, 1 << 30}) {
    int32_t h = garbage;
    ASSERT_TRUE(bm.Reserve(2, 17, &h).ok());
    EXPECT_EQ(h, hint2);
  }
  EXPECT_EQ(bm.BlockTable(2).size(), 5u);
  EXPECT_TRUE(bm.CheckInvariants().ok()) << bm.CheckInvariants();
  bm.Free(2);
  bm.Free(3);
  EXPECT_EQ(bm.Stats().free_blocks, 32);
  EXPECT_TRUE(bm.CheckInvariants().ok());
}

TEST(BlockManagerTest, PrefixReuseSharesBlocksAndCountsHits) {
  BlockManager bm(10, 4, true);
  const auto prompt = Tokens(10, 100);  // 2 full blocks + 2 tokens.
  const auto h = Hashes(prompt, 4);
  ASSERT_EQ(h.size(), 2u);
  auto p1 = bm.PlanAdmit(h, 2, 10, 10);
  bm.CommitAdmit(1, *p1);
  EXPECT_EQ(p1->num_cached_tokens, 0);
  bm.Publish(1, h);
  // A second request with the same prompt reuses both full blocks while the first still runs.
  auto p2 = bm.PlanAdmit(h, 2, 10, 10);
  ASSERT_TRUE(p2.ok());
  EXPECT_EQ(p2->num_cached_tokens, 8);
  EXPECT_EQ(p2->num_new_blocks, 1);
  bm.CommitAdmit(2, *p2);
  EXPECT_EQ(bm.BlockTable(2)[0], bm.BlockTable(1)[0]);
  EXPECT_EQ(bm.BlockTable(2)[1], bm.BlockTable(1)[1]);
  EXPECT_NE(bm.BlockTable(2)[2], bm.BlockTable(1)[2]);
  EXPECT_EQ(bm.Stats().used_blocks, 4);
  bm.Free(1);
  bm.Free(2);
  auto s = bm.Stats();
  EXPECT_EQ(s.cached_blocks, 2);
  EXPECT_EQ(s.free_blocks, 8);
  EXPECT_DOUBLE_EQ(s.hit_rate(), 8.0 / 20.0);
  // After both finish, the prefix is still reusable from the cache.
  auto p3 = bm.PlanAdmit(h, 2, 10, 10);
  EXPECT_EQ(p3->num_cached_tokens, 8);
  EXPECT_TRUE(bm.CheckInvariants().ok());
}

TEST(BlockManagerTest, CapKeepsATokenToCompute) {
  BlockManager bm(10, 4, true);
  const auto prompt = Tokens(8, 1);  // Exactly 2 blocks: reuse at most 1, compute the last 4.
  const auto h = Hashes(prompt, 4);
  auto p1 = bm.PlanAdmit(h, 1, 8, 8);
  bm.CommitAdmit(1, *p1);
  bm.Publish(1, h);
  bm.Free(1);
  auto p2 = bm.PlanAdmit(h, (8 - 1) / 4, 8, 8);
  EXPECT_EQ(p2->num_cached_tokens, 4);
}

TEST(BlockManagerTest, EvictsLeastRecentlyReleasedAndPlanFailsCleanly) {
  BlockManager bm(4, 2, true);
  const auto a = Tokens(4, 1), b = Tokens(4, 50);
  auto pa = bm.PlanAdmit(Hashes(a, 2), 2, 4, 4);
  bm.CommitAdmit(1, *pa);
  bm.Publish(1, Hashes(a, 2));
  bm.Free(1);  // a's 2 blocks cached (tail first, so a's second block is the older).
  auto pb = bm.PlanAdmit(Hashes(b, 2), 2, 4, 4);
  bm.CommitAdmit(2, *pb);  // Takes the 2 free blocks.
  bm.Publish(2, Hashes(b, 2));
  // 3 blocks for a new sequence: only 2 evictable -> fails, nothing changed.
  auto before = bm.Stats();
  auto fail = bm.PlanAdmit({}, 0, 6, 6);
  EXPECT_EQ(fail.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(bm.Stats().cached_blocks, before.cached_blocks);
  EXPECT_EQ(bm.Reserve(2, 10).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(bm.BlockTable(2).size(), 2u);
  // One block: evicts a's *second* block (released first), keeping a's first block reusable.
  auto p3 = bm.PlanAdmit({}, 0, 1, 1);
  bm.CommitAdmit(3, *p3);
  EXPECT_EQ(bm.Stats().evictions, 1);
  // The pool is full now; a's first block is still found (its second was evicted).
  auto again = bm.PlanAdmit(Hashes(a, 2), 2, 2, 2);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->num_cached_tokens, 2);
  EXPECT_TRUE(bm.CheckInvariants().ok());
}

TEST(BlockManagerTest, PlanReusingEvictableBlocksDoesNotCountThemAsFree) {
  BlockManager bm(3, 2, true);
  const auto a = Tokens(4, 1);
  auto pa = bm.PlanAdmit(Hashes(a, 2), 2, 4, 4);
  bm.CommitAdmit(1, *pa);
  bm.Publish(1, Hashes(a, 2));
  bm.Free(1);  // 2 cached + 1 free.
  // Reuse both cached blocks and need 2 more: only 1 is really available.
  auto p = bm.PlanAdmit(Hashes(a, 2), 2, 8, 8);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted);
  auto ok = bm.PlanAdmit(Hashes(a, 2), 2, 6, 6);
  ASSERT_TRUE(ok.ok());
  bm.CommitAdmit(2, *ok);
  EXPECT_TRUE(bm.CheckInvariants().ok());
}

TEST(BlockManagerTest, EventsTrackTheReusableSet) {
  BlockManager bm(3, 2, true);
  bm.EnableEvents(true);
  const auto a = Tokens(4, 1), b = Tokens(4, 50);
  auto pa = bm.PlanAdmit(Hashes(a, 2), 2, 4, 4);
  bm.CommitAdmit(1, *pa);
  bm.Publish(1, Hashes(a, 2));
  bm.Free(1);
  auto pb = bm.PlanAdmit(Hashes(b, 2), 2, 4, 4);  // Needs 2: 1 free + evicts 1 of a's.
  bm.CommitAdmit(2, *pb);
  std::vector<KvEvent> events;
  bm.DrainEvents(&events);
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].type, KvEvent::Type::kStored);
  EXPECT_EQ(events[1].type, KvEvent::Type::kStored);
  EXPECT_EQ(events[2].type, KvEvent::Type::kRemoved);
  // Replaying the events gives the index.
  absl::flat_hash_set<BlockHash> replay;
  for (const KvEvent& e : events) {
    if (e.type == KvEvent::Type::kStored) replay.insert(e.hash); else replay.erase(e.hash);
  }
  const auto indexed = bm.IndexedHashes();
  EXPECT_EQ(replay, absl::flat_hash_set<BlockHash>(indexed.begin(), indexed.end()));
  bm.DrainEvents(&events);
  EXPECT_EQ(events.size(), 3u);  // Drained: nothing new.
}

TEST(BlockManagerTest, StoredEventsNameTheirParentAndTokens) {
  BlockManager bm(8, 2, true);
  bm.EnableEvents(true);
  const auto a = Tokens(5, 1);  // Two full blocks and one token.
  const auto h = Hashes(a, 2);
  auto p = bm.PlanAdmit(h, 2, 5, 5);
  bm.CommitAdmit(1, *p);
  bm.Publish(1, h, a);
  std::vector<KvEvent> events;
  bm.DrainEvents(&events);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].parent, BlockHash{});
  EXPECT_EQ(events[0].tokens, std::vector<int32_t>(a.begin(), a.begin() + 2));
  EXPECT_EQ(events[1].parent, h[0]);
  EXPECT_EQ(events[1].tokens, std::vector<int32_t>(a.begin() + 2, a.begin() + 4));
  // Without tokens (a caller that has none to give) the events carry none.
  const auto b = Tokens(2, 40);
  auto q = bm.PlanAdmit(Hashes(b, 2), 2, 2, 2);
  bm.CommitAdmit(2, *q);
  bm.Publish(2, Hashes(b, 2));
  bm.DrainEvents(&events);
  ASSERT_EQ(events.size(), 3u);
  EXPECT_TRUE(events[2].tokens.empty());
  EXPECT_EQ(events[2].hash, Hashes(b, 2)[0]);
}

// Random admit / share / grow / publish / free sequences: the invariants hold after every
// operation, and when every sequence has ended every block is free or cached again.
TEST(BlockManagerTest, PropertyNeverLeaksNeverDoubleFrees) {
  for (uint32_t seed = 0; seed < 40; ++seed) {
    std::mt19937 rng(seed);
    const int64_t bs = 1 + rng() % 4;
    BlockManager bm(8 + rng() % 40, bs, rng() % 5 != 0);
    std::map<SeqId, std::vector<int32_t>> live;  // seq -> tokens held
    SeqId next = 0;
    for (int step = 0; step < 400; ++step) {
      const int op = rng() % 10;
      if (op < 4) {
        // Prompts from a few shared prefixes so reuse happens.
        std::vector<int32_t> t = Tokens(static_cast<int>(rng() % 3) * 5, 1000 * (rng() % 3));
        const int extra = 1 + rng() % 9;
        for (int i = 0; i < extra; ++i) t.push_back(rng() % 4);
        const auto h = Hashes(t, bs);
        auto plan = bm.PlanAdmit(h, (t.size() - 1) / bs, t.size(), t.size());
        if (plan.ok()) {
          bm.CommitAdmit(next, *plan);
          if (rng() % 2) bm.Publish(next, h);
          live[next++] = t;
        }
      } else if (op < 7 && !live.empty()) {
        auto it = std::next(live.begin(), rng() % live.size());
        const int grow = 1 + rng() % 6;
        if (bm.Reserve(it->first, it->second.size() + grow).ok()) {
          for (int i = 0; i < grow; ++i) it->second.push_back(rng() % 4);
          bm.Publish(it->first, Hashes(it->second, bs));
        }
      } else if (!live.empty()) {
        auto it = std::next(live.begin(), rng() % live.size());
        bm.Free(it->first);
        live.erase(it);
      }
      ASSERT_TRUE(bm.CheckInvariants().ok()) << "seed " << seed << " step " << step << ": "
                                             << bm.CheckInvariants();
      const KvCacheStats s = bm.Stats();
      ASSERT_EQ(s.free_blocks + s.cached_blocks + s.used_blocks, s.total_blocks);
    }
    for (auto& [seq, t] : live) bm.Free(seq);
    const KvCacheStats s = bm.Stats();
    EXPECT_EQ(s.used_blocks, 0) << seed;
    EXPECT_EQ(s.free_blocks + s.cached_blocks, s.total_blocks);
    EXPECT_TRUE(bm.CheckInvariants().ok());
  }
}

}  // namespace
}  // namespace pdserve
