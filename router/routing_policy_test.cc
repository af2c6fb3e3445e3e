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

TEST(RoutingPolicyTest, QueueLengthCounts) {
  RoutingOptions o;
  std::vector<WorkerCandidate> c = {{10, 3, 4}, {12, 0, 4}};
  EXPECT_EQ(ChooseWorker(o, c, 4, 0, 0.5).index, 1u);  // 10 + 4*3 > 12.
}

TEST(RoutingPolicyTest, ImbalanceGuardFallsBackToLeastLoaded) {
  RoutingOptions o;
  o.imbalance_ratio = 3.0;
  // Worker 0 holds the whole prompt but carries 5x the load of worker 1.
  std::vector<WorkerCandidate> c = {{49, 0, 100}, {9, 0, 0}};
  const RoutingDecision d = ChooseWorker(o, c, 100, 0, 0.5);
  EXPECT_TRUE(d.fell_back);
  EXPECT_EQ(d.index, 1u);
  c[0].active_blocks = 20;  // 21/10 < 3: the guard stays off and the prefix wins.
  EXPECT_FALSE(ChooseWorker(o, c, 100, 0, 0.5).fell_back);
  EXPECT_EQ(ChooseWorker(o, c, 100, 0, 0.5).index, 0u);
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
