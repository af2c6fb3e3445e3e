#include "common/engine/scheduler.h"

#include "gtest/gtest.h"

namespace pdserve {
namespace {

Sequence MakeSeq(SeqId id, int n) {
  Sequence s;
  s.id = id;
  s.request_id = std::to_string(id);
  s.tokens.assign(n, static_cast<int32_t>(id));
  s.num_prompt_tokens = n;
  return s;
}

TEST(SchedulerTest, ChunksPrefillUnderTheTokenBudgetAndDecodesFirst) {
  BlockManager bm(100, 4, true);
  Scheduler sched({8, 10}, &bm);
  Sequence a = MakeSeq(1, 25), b = MakeSeq(2, 3);
  sched.AddWaiting(&a);
  sched.AddWaiting(&b);
  SchedulerOutput out;
  sched.Schedule(&out);
  ASSERT_EQ(out.chunks.size(), 1u);  // a takes the whole budget.
  EXPECT_EQ(out.chunks[0].num_tokens, 10);
  a.num_computed += 10;
  sched.Schedule(&out);
  EXPECT_EQ(out.chunks[0].num_tokens, 10);
  a.num_computed += 10;
  sched.Schedule(&out);
  ASSERT_EQ(out.chunks.size(), 2u);  // a's last 5, then b's 3.
  EXPECT_EQ(out.chunks[0].num_tokens, 5);
  EXPECT_EQ(out.chunks[1].seq, &b);
  EXPECT_EQ(out.num_tokens, 8);
}

TEST(SchedulerTest, PreemptsNewestAndNeverDrops) {
  BlockManager bm(4, 4, false);
  Scheduler sched({8, 64}, &bm);
  Sequence a = MakeSeq(1, 8), b = MakeSeq(2, 8);
  sched.AddWaiting(&a);
  sched.AddWaiting(&b);
  SchedulerOutput out;
  sched.Schedule(&out);
  ASSERT_EQ(out.chunks.size(), 2u);  // All 4 blocks used.
  a.num_computed = b.num_computed = 8;
  a.tokens.push_back(0);
  b.tokens.push_back(0);
  sched.Schedule(&out);  // a needs a 3rd block: b (newest) is preempted.
  ASSERT_EQ(out.preempted.size(), 1u);
  EXPECT_EQ(out.preempted[0], &b);
  EXPECT_EQ(b.num_computed, 0);
  ASSERT_EQ(out.chunks.size(), 1u);
  EXPECT_EQ(out.chunks[0].seq, &a);
  EXPECT_EQ(sched.num_waiting(), 1);
  sched.Remove(&a);
  sched.Schedule(&out);  // b comes back and recomputes all 9 tokens.
  ASSERT_EQ(out.chunks.size(), 1u);
  EXPECT_EQ(out.chunks[0].seq, &b);
  EXPECT_EQ(out.chunks[0].num_tokens, 9);
  EXPECT_EQ(sched.num_preemptions(), 1);
}

TEST(SchedulerTest, RespectsMaxNumSeqs) {
  BlockManager bm(100, 4, true);
  Scheduler sched({2, 100}, &bm);
  Sequence a = MakeSeq(1, 2), b = MakeSeq(2, 2), c = MakeSeq(3, 2);
  sched.AddWaiting(&a);
  sched.AddWaiting(&b);
  sched.AddWaiting(&c);
  SchedulerOutput out;
  sched.Schedule(&out);
  EXPECT_EQ(out.chunks.size(), 2u);
  EXPECT_EQ(sched.num_waiting(), 1);
}

}  // namespace
}  // namespace pdserve
