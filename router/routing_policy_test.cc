#include "router/routing_policy.h"

#include <map>

#include "gtest/gtest.h"

namespace pdserve {
namespace {

TEST(RoutingPolicyTest, KvAwarePrefersTheWorkerHoldingThePrefix) {
  RoutingOptions o;
  std::vector<WorkerCandidate> c = {{10, 0, 0}, {10, 0, 6}, {10, 0, 2}};
  // 8 prompt blocks: to prefill 8, 2, 6.
  EXPECT_EQ(ChooseWorker(o, c, 8, 0, 0.5).index, 1u);
  // Enough extra load on worker 1 outweighs its 4-block advantage over worker 2.
  c[1].active_blocks = 16;
  EXPECT_EQ(ChooseWorker(o, c, 8, 0, 0.5).index, 2u);
}

// Blocks a worker would load from its KV cache tiers cost w_tier of computing them: such a
// worker beats one that would compute them and loses to one whose pool holds them; with
// w_tier = 1 the tiers make no difference, and they never count beyond the prompt.
TEST(RoutingPolicyTest, BlocksInTheTiersCostLessThanComputingMoreThanThePool) {
  RoutingOptions o;
  o.w_recent = 0;
  WorkerCandidate pool, tier, none;
  pool.cached_prefix_blocks = 8;
  tier.tier_prefix_blocks = 8;
  none.active_blocks = 0;
  // 10 prompt blocks. The tier's worker, busier by 3 blocks, scores 3 + 2 + 0.1 * 8 = 5.8 against
  // the idle one's 10; the pool's, as busy, 3 + 2 = 5.
  tier.active_blocks = 3;
  pool.active_blocks = 3;
  EXPECT_EQ(ChooseWorker(o, {none, tier}, 10, 0, 0).index, 1u);
  EXPECT_EQ(ChooseWorker(o, {tier, pool}, 10, 0, 0).index, 1u);
  const RoutingDecision d = ChooseWorker(o, {tier}, 10, 0, 0);
  EXPECT_DOUBLE_EQ(d.score, 3 + 2 + 0.1 * 8);
  o.w_tier = 1;
  EXPECT_EQ(ChooseWorker(o, {none, tier}, 10, 0, 0).index, 0u);
  // Pool and tier together cover at most the prompt.
  o.w_tier = 0.5;
  WorkerCandidate both;
  both.cached_prefix_blocks = 6;
  both.tier_prefix_blocks = 9;
  EXPECT_DOUBLE_EQ(ChooseWorker(o, {both}, 10, 0, 0).score, 0.5 * 4);
}

// A LoRA adapter's request: a worker holding the adapter wins over one that must read it (w_lora
// blocks) and more so over one that must drop another adapter for it (2 w_lora), unless the
// holder is busier by more than that; outside kv_aware, and under the guard, it does not count.
TEST(RoutingPolicyTest, LoraAffinityWeighsTheAdapterLoadsAgainstLoad) {
  RoutingOptions o;
  o.w_recent = 0;
  WorkerCandidate holds, room, full;
  room.lora_load = 1;
  full.lora_load = 2;
  EXPECT_EQ(ChooseWorker(o, {room, holds}, 4, 0, 0).index, 1u);
  EXPECT_EQ(ChooseWorker(o, {full, room}, 4, 0, 0).index, 1u);
  EXPECT_DOUBLE_EQ(ChooseWorker(o, {full}, 4, 0, 0).score, 4 + 2 * o.w_lora);
  holds.active_blocks = 31;  // Busier by less than one load: still preferred.
  EXPECT_EQ(ChooseWorker(o, {room, holds}, 4, 0, 0).index, 1u);
  holds.active_blocks = 33;
  EXPECT_EQ(ChooseWorker(o, {room, holds}, 4, 0, 0).index, 0u);
  holds.active_blocks = 300;  // Skewed: the guard routes least-loaded, affinity aside.
  const RoutingDecision d = ChooseWorker(o, {room, holds}, 4, 0, 0);
  EXPECT_TRUE(d.fell_back);
  EXPECT_EQ(d.index, 0u);
  o.w_lora = 0;
  holds.active_blocks = 1;
  EXPECT_EQ(ChooseWorker(o, {room, holds}, 4, 0, 0).index, 0u);
  o.w_lora = 32;
  o.policy = RoutingPolicy::kLeastLoaded;
  EXPECT_EQ(ChooseWorker(o, {room, holds}, 4, 0, 0).index, 0u);
}

TEST(RoutingPolicyTest, QueueLengthCounts) {
  RoutingOptions o;
  std::vector<WorkerCandidate> c = {{10, 3, 4}, {12, 0, 4}};
  EXPECT_EQ(ChooseWorker(o, c, 4, 0, 0.5).index, 1u);  // 10 + 4*3 > 12.
}

TEST(RoutingPolicyTest, ImbalanceGuardFallsBackToLeastLoaded) {
  RoutingOptions o;
  o.imbalance_ratio = 3.0;
  o.imbalance_min_blocks = 32;
  // Worker 0 holds the whole prompt but carries 5x the load of worker 1, 40 blocks more.
  std::vector<WorkerCandidate> c = {{49, 0, 100}, {9, 0, 0}};
  const RoutingDecision d = ChooseWorker(o, c, 100, 0, 0.5);
  EXPECT_TRUE(d.fell_back);
  EXPECT_EQ(d.index, 1u);
  c[0].active_blocks = 20;  // 21/10 < 3: the guard stays off and the prefix wins.
  EXPECT_FALSE(ChooseWorker(o, c, 100, 0, 0.5).fell_back);
  EXPECT_EQ(ChooseWorker(o, c, 100, 0, 0.5).index, 0u);
  // A large ratio over a small difference (one request on an idle tier) is not skew.
  // Loads 3 and 0: 4/1 > 3, but 3 blocks apart; the score keeps the prefix (1 + 3 < 6 + 0).
  std::vector<WorkerCandidate> idle = {{3, 0, 5}, {0, 0, 0}};
  EXPECT_FALSE(ChooseWorker(o, idle, 6, 0, 0.5).fell_back);
  EXPECT_EQ(ChooseWorker(o, idle, 6, 0, 0.5).index, 0u);
}

TEST(RoutingPolicyTest, RecentShareIsBoundedWhateverTheRate) {
  RoutingOptions o;
  // Worker 0 holds 4 of the prompt's 5 blocks and took a little more of the recent traffic.
  // Whatever the request rate (recent totals x1, x10, x100), the prefix keeps it: the share term
  // is 5 * (120/110 - 1) = 0.45 against 5 * (100/110 - 1) = -0.45, far below the 4 blocks saved.
  for (double scale : {1.0, 10.0, 100.0}) {
    std::vector<WorkerCandidate> c = {{0, 0, 4, 120 * scale}, {0, 0, 0, 100 * scale},
                                      {0, 0, 0, 110 * scale}};
    EXPECT_EQ(ChooseWorker(o, c, 5, 1, 0.5).index, 0u) << scale;
  }
  // A worker far over its share gives way: twice the others' traffic costs 5 * (1.5 - 1) = 2.5
  // against 5 * (0.75 - 1) = -1.25, more than the 3 blocks its prefix saves here.
  std::vector<WorkerCandidate> c = {{0, 0, 2, 200}, {0, 0, 0, 100}, {0, 0, 0, 100}};
  EXPECT_EQ(ChooseWorker(o, c, 5, 0, 0.5).index, 1u);
}

TEST(RoutingPolicyTest, OnePopularPrefixIsSpreadEvenlyAtLowConcurrency) {
  RoutingOptions o;
  // Every worker holds the prompt and nothing runs (requests end before the next arrives): only
  // the share of recent traffic separates them, so 30 requests go 10/10/10.
  std::vector<WorkerCandidate> c(3, WorkerCandidate{0, 0, 8, 0});
  std::map<size_t, int> picks;
  for (uint64_t i = 0; i < 30; ++i) {
    const size_t w = ChooseWorker(o, c, 9, i, 0.5).index;
    ++picks[w];
    c[w].recent_blocks += 9;
  }
  EXPECT_EQ(picks, (std::map<size_t, int>{{0, 10}, {1, 10}, {2, 10}}));
}

TEST(RoutingPolicyTest, RoundRobinAndLeastLoaded) {
  RoutingOptions rr;
  rr.policy = RoutingPolicy::kRoundRobin;
  std::vector<WorkerCandidate> c = {{0, 0, 9}, {5, 0, 0}, {1, 0, 0}};
  EXPECT_EQ(ChooseWorker(rr, c, 9, 4, 0.5).index, 1u);
  RoutingOptions ll;
  ll.policy = RoutingPolicy::kLeastLoaded;
  EXPECT_EQ(ChooseWorker(ll, c, 9, 0, 0.5).index, 0u);
  c[0].waiting = 2;
  EXPECT_EQ(ChooseWorker(ll, c, 9, 0, 0.5).index, 2u);
}

TEST(RoutingPolicyTest, SoftmaxSpreadsTiesAndStillFavoursTheBest) {
  RoutingOptions o;
  o.temperature = 0.5;
  std::vector<WorkerCandidate> ties = {{4, 0, 0}, {4, 0, 0}, {4, 0, 0}};
  std::map<size_t, int> picks;
  for (int i = 0; i < 300; ++i) ++picks[ChooseWorker(o, ties, 4, 0, (i + 0.5) / 300).index];
  EXPECT_EQ(picks.size(), 3u);
  for (auto& [w, n] : picks) EXPECT_NEAR(n, 100, 2);
  std::vector<WorkerCandidate> skew = {{0, 0, 8}, {30, 0, 0}, {30, 0, 0}};
  picks.clear();
  for (int i = 0; i < 300; ++i) ++picks[ChooseWorker(o, skew, 8, 0, (i + 0.5) / 300).index];
  // Scores 0, 30, 30; scale = 0.5 * 30: p(best) = 1 / (1 + 2 e^-2) = 0.787.
  EXPECT_NEAR(picks[0], 0.787 * 300, 3);
}

TEST(RoutingPolicyTest, ParsesNames) {
  EXPECT_EQ(*ParseRoutingPolicy("kv_aware"), RoutingPolicy::kKvAware);
  EXPECT_FALSE(ParseRoutingPolicy("random").ok());
}

}  // namespace
}  // namespace pdserve
