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

// Two sequences whose prompts were prefilled elsewhere hold every block while waiting, and each
// needs one more block for its next token. Nothing runs, so nothing would ever free a block: the
// scheduler must release the newer holder's blocks (it recomputes later) and run the older one.
TEST(SchedulerTest, WaitingBlockHoldersCannotDeadlock) {
  BlockManager bm(4, 4, false);
  Scheduler sched({8, 64}, &bm);
  Sequence a = MakeSeq(1, 8), b = MakeSeq(2, 8);
  for (Sequence* s : {&a, &b}) {
    bm.CommitAdmit(s->id, *bm.PlanAdmit({}, 0, 8, 8));  // As ReserveForRemotePrefill does.
    s->num_computed = 8;
    s->admitted_before = true;
    s->tokens.push_back(0);  // The first token, sampled by the prefill worker.
    sched.AddWaiting(s);
  }
  SchedulerOutput out;
  sched.Schedule(&out);
  ASSERT_EQ(out.chunks.size(), 1u);
  EXPECT_EQ(out.chunks[0].seq, &a);
  EXPECT_EQ(out.chunks[0].num_tokens, 1);
  ASSERT_EQ(out.preempted.size(), 1u);
  EXPECT_EQ(out.preempted[0], &b);
  EXPECT_EQ(b.num_computed, 0);
  EXPECT_FALSE(bm.Has(b.id));
  EXPECT_TRUE(bm.CheckInvariants().ok());
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

// What the scheduler and a step's bookkeeping read for every running sequence every step sits in
// the Sequence's first two cache lines (at batch 256 the step's cost is mostly misses on them).
TEST(SchedulerTest, PerStepFieldsInTheFirstTwoCacheLines) {
  Sequence s;
  const auto* base = reinterpret_cast<const char*>(&s);
  auto end_of = [&](const auto& field) {
    return reinterpret_cast<const char*>(&field) - base + static_cast<std::ptrdiff_t>(sizeof(field));
  };
  EXPECT_LE(end_of(s.id), 64);
  EXPECT_LE(end_of(s.tokens), 64);
  EXPECT_LE(end_of(s.num_prompt_tokens), 64);
  EXPECT_LE(end_of(s.num_computed), 64);
  EXPECT_LE(end_of(s.kv_slot), 64);
  EXPECT_LE(end_of(s.num_cached_prompt_tokens), 64);
  EXPECT_LE(end_of(s.draft), 128);
  EXPECT_LE(end_of(s.params.max_tokens), 128);
}

}  // namespace
}  // namespace pdserve
