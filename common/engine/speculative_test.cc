#include "common/engine/speculative.h"

#include "common/engine/scheduler.h"
#include "common/engine/suffix_trie.h"
#include "gtest/gtest.h"

namespace pdserve {
namespace {

std::vector<int32_t> Propose(const std::vector<int32_t>& context, int32_t min_n, int32_t max_n,
                             int32_t k) {
  std::vector<int32_t> out = {99};  // Cleared by the call.
  const int32_t n = NgramPropose(context, min_n, max_n, k, &out);
  EXPECT_EQ(n, static_cast<int32_t>(out.size()));
  return out;
}

TEST(NgramProposeTest, LongestSuffixFirstThenLatestOccurrence) {
  // Suffix [2 3]: at 1 (then 4 5) and at 6 (then 9); the 3-gram [1 2 3] only at 0 (then 4 5 6).
  const std::vector<int32_t> c = {1, 2, 3, 4, 5, 6, 2, 3, 9, 1, 2, 3};
  EXPECT_EQ(Propose(c, 1, 3, 3), (std::vector<int32_t>{4, 5, 6}));
  EXPECT_EQ(Propose(c, 1, 2, 3), (std::vector<int32_t>{9, 1, 2}));  // Latest [2 3].
  EXPECT_EQ(Propose(c, 1, 2, 1), (std::vector<int32_t>{9}));
  EXPECT_EQ(Propose(c, 4, 4, 3), std::vector<int32_t>{});  // [9 1 2 3] occurs once.
  EXPECT_EQ(Propose(c, 1, 3, 0), std::vector<int32_t>{});
}

TEST(NgramProposeTest, ProposalsStopAtTheContextEndAndNeverMatchTheSuffixItself) {
  EXPECT_EQ(Propose({5, 5, 5}, 1, 2, 4), (std::vector<int32_t>{5}));  // [5 5] at 0, then 5.
  EXPECT_EQ(Propose({7}, 1, 3, 4), std::vector<int32_t>{});
  EXPECT_EQ(Propose({}, 1, 3, 4), std::vector<int32_t>{});
  EXPECT_EQ(Propose({1, 2, 3}, 1, 3, 4), std::vector<int32_t>{});
}

std::vector<int32_t> SuffixDraft(const SuffixTrie& trie, const std::vector<int32_t>& context,
                                 int32_t k, double min_prob, SuffixTrie::Draft* d = nullptr) {
  std::vector<int32_t> out = {99};
  const SuffixTrie::Draft got = trie.Propose(context, k, min_prob, &out);
  if (d != nullptr) *d = got;
  EXPECT_EQ(got.match_length == 0, out.empty());
  return out;
}

TEST(SuffixTrieTest, LongestMatchThenMostFrequentContinuation) {
  SuffixTrie t(8);
  // "1 2 3" is followed by 4 twice and by 5 once; "9 2 3" only by 5.
  t.Append({1, 2, 3, 4, 7, 1, 2, 3, 4, 8, 1, 2, 3, 5, 6, 9, 2, 3, 5, 6});
  SuffixTrie::Draft d;
  EXPECT_EQ(SuffixDraft(t, {0, 1, 2, 3}, 1, 0.1, &d), (std::vector<int32_t>{4}));
  EXPECT_EQ(d.match_length, 3);
  EXPECT_DOUBLE_EQ(d.score, 2.0 / 3);
  // After [2 3] alone: 4 twice, 5 twice; the first to reach the top count wins the tie.
  EXPECT_EQ(SuffixDraft(t, {7, 2, 3}, 1, 0.1), (std::vector<int32_t>{4}));
  EXPECT_EQ(SuffixDraft(t, {9, 2, 3}, 3, 0.1), (std::vector<int32_t>{5, 6}));  // Ends: no more.
  // No longer than the match: three matched tokens draft three (after [1 2 3 4], 7 and 8 tie).
  EXPECT_EQ(SuffixDraft(t, {0, 1, 2, 3}, 5, 0.1), (std::vector<int32_t>{4, 7, 1}));
  EXPECT_EQ(SuffixDraft(t, {6, 9, 2, 3}, 5, 0.1), (std::vector<int32_t>{5, 6}));
  // A continuation less likely than min_prob is not drafted: after [1 2 3 4], 7 and 8 half each.
  EXPECT_EQ(SuffixDraft(t, {1, 2, 3}, 3, 0.6), (std::vector<int32_t>{4}));
  EXPECT_EQ(SuffixDraft(t, {1, 2, 3}, 3, 0.7), std::vector<int32_t>{});
  EXPECT_EQ(SuffixDraft(t, {42}, 3, 0.1), std::vector<int32_t>{});
  EXPECT_EQ(SuffixDraft(t, {}, 3, 0.1), std::vector<int32_t>{});
}

// The current sequence's own suffixes (what a request drafts from) give what an explicit context
// of the same tokens gives.
TEST(SuffixTrieTest, ProposeForCurrentEqualsProposeOnTheSequence) {
  SuffixTrie t(6);
  std::vector<int32_t> seq;
  uint64_t x = 1;
  for (int i = 0; i < 400; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    seq.push_back(static_cast<int32_t>((x >> 33) % 7));  // Few symbols: many repeats.
    t.Append(seq.back());
    for (int32_t k : {1, 3, 5}) {
      std::vector<int32_t> a, b;
      const SuffixTrie::Draft da = t.ProposeForCurrent(k, 0.2, &a);
      const SuffixTrie::Draft db = t.Propose(seq, k, 0.2, &b);
      ASSERT_EQ(a, b) << i << " " << k;
      ASSERT_EQ(da.match_length, db.match_length);
    }
  }
}

// A cursor kept on a growing context drafts what a fresh search does while the index does not
// change (here: an index of earlier sequences, the context growing by 1-3 tokens a call, k
// varying), and after a Clear it searches again rather than follow stale nodes.
TEST(SuffixTrieTest, ProposeFromACursorEqualsProposeOnAFixedIndex) {
  SuffixTrie t(8);
  uint64_t x = 3;
  const auto next = [&x](uint64_t n) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<int32_t>((x >> 33) % n);
  };
  for (int s = 0; s < 20; ++s) {
    for (int i = 0; i < 60; ++i) t.Append(next(5));
    t.EndSequence();
  }
  t.Reserve(1000);  // Room changes nothing drafted.
  std::vector<int32_t> context;
  SuffixTrie::Cursor cursor;
  int extended = 0;
  for (int step = 0; step < 500; ++step) {
    const int64_t grow = 1 + next(3);
    for (int64_t i = 0; i < grow; ++i) context.push_back(next(5));
    const int32_t k = 1 + next(5);
    const int32_t before = cursor.node;
    std::vector<int32_t> a, b;
    const SuffixTrie::Draft da = t.ProposeFrom(context, k, 0.2, &cursor, &a);
    const SuffixTrie::Draft db = t.Propose(context, k, 0.2, &b);
    ASSERT_EQ(a, b) << step;
    ASSERT_EQ(da.match_length, db.match_length) << step;
    ASSERT_EQ(cursor.context_size, static_cast<int64_t>(context.size()));
    extended += before >= 0 && cursor.node >= 0;
  }
  EXPECT_GT(extended, 100);  // The cursor was followed, not only searched again.
  t.Clear();
  t.Append({1, 2, 3, 4});
  std::vector<int32_t> out;
  context = {9, 1, 2};
  EXPECT_EQ(t.ProposeFrom(context, 1, 0.0, &cursor, &out).match_length, 2);
  EXPECT_EQ(out, (std::vector<int32_t>{3}));
}

// An index cleared for reuse (the engine hands a finished request's to the next) keeps its
// memory and forgets everything: it then drafts exactly what a fresh index of the same tokens
// does, however full it was before.
TEST(SuffixTrieTest, AClearedIndexDraftsAsAFreshOne) {
  uint64_t x = 11;
  const auto next = [&x](uint64_t n) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<int32_t>((x >> 33) % n);
  };
  SuffixTrie reused(8);
  for (int i = 0; i < 3000; ++i) reused.Append(next(9));  // Thousands of nodes, then cleared.
  reused.Clear();
  EXPECT_EQ(reused.num_nodes(), 1);
  SuffixTrie fresh(8);
  std::vector<int32_t> seq;
  for (int i = 0; i < 300; ++i) {
    seq.push_back(next(6));
    reused.Append(seq.back());
    fresh.Append(seq.back());
    std::vector<int32_t> a, b;
    const SuffixTrie::Draft da = reused.ProposeForCurrent(4, 0.2, &a);
    const SuffixTrie::Draft db = fresh.ProposeForCurrent(4, 0.2, &b);
    ASSERT_EQ(a, b) << i;
    ASSERT_EQ(da.match_length, db.match_length) << i;
    ASSERT_EQ(reused.num_nodes(), fresh.num_nodes()) << i;
  }
}

TEST(SuffixTrieTest, SequencesDoNotJoinAndDepthBoundsTheIndex) {
  SuffixTrie t(3);
  t.Append({1, 2});
  t.EndSequence();
  t.Append({3, 4});
  // [2 3] never occurred: the boundary is not a substring.
  EXPECT_EQ(SuffixDraft(t, {2}, 2, 0.0), std::vector<int32_t>{});
  EXPECT_EQ(SuffixDraft(t, {1}, 4, 0.0), (std::vector<int32_t>{2}));
  // Depth 3: at most 3 tokens per path, so the match is cut short to leave room for the draft.
  t.Clear();
  t.Append({1, 2, 3, 4, 5, 1, 2});
  SuffixTrie::Draft d;
  EXPECT_EQ(SuffixDraft(t, {1, 2}, 1, 0.0, &d), (std::vector<int32_t>{3}));
  EXPECT_EQ(d.match_length, 2);
  // Four asked: the match is cut to [2], and one matched token drafts one.
  EXPECT_EQ(SuffixDraft(t, {1, 2}, 4, 0.0, &d), (std::vector<int32_t>{3}));
  EXPECT_EQ(d.match_length, 1);
  // Nodes: one per new substring of up to 3 tokens.
  SuffixTrie u(3);
  u.Append({1, 2, 3});
  EXPECT_EQ(u.num_nodes(), 1 + 6);  // Root; 1, 2, 3; 1 2, 2 3; 1 2 3.
  u.Append(1);
  EXPECT_EQ(u.num_nodes(), 1 + 6 + 2);  // 3 1 and 2 3 1 are new; 1 is not.
}

TEST(DraftLedgerTest, PausesDraftingThatCostsMoreThanItSavesThenProbesAgain) {
  DraftLedger paying;
  for (int i = 0; i < 100; ++i) {
    ASSERT_FALSE(paying.Paused());
    paying.Record(2e-3, 1e-3);
  }
  DraftLedger losing;
  for (int i = 0; i < DraftLedger::kEvidence - 1; ++i) losing.Record(1e-3, 2e-3);
  EXPECT_FALSE(losing.Paused());  // Not yet enough evidence.
  losing.Record(1e-3, 2e-3);
  // Paused kMinPause steps, then probes kEvidence steps; a loss again doubles the pause.
  for (int32_t pause : {DraftLedger::kMinPause, 2 * DraftLedger::kMinPause, 4 * DraftLedger::kMinPause}) {
    for (int32_t i = 0; i < pause; ++i) ASSERT_TRUE(losing.Paused()) << pause << " " << i;
    ASSERT_FALSE(losing.Paused());
    for (int i = 0; i < DraftLedger::kEvidence; ++i) losing.Record(1e-3, 2e-3);
  }
  // Drafting that pays again after a pause resets the doubling.
  while (losing.Paused()) {
  }
  for (int i = 0; i < DraftLedger::kEvidence + 10; ++i) losing.Record(3e-3, 1e-3);
  EXPECT_FALSE(losing.Paused());
  for (int i = 0; i < 30 && losing.pause() == 0; ++i) losing.Record(1e-3, 3e-3);
  EXPECT_EQ(losing.pause(), DraftLedger::kMinPause);
}

TEST(SpeculationStateTest, DraftsShrinkAndPauseOnMissesAndRecover) {
  SpeculationState s;
  EXPECT_EQ(s.NextLength(5), 5);
  s.Record(5, 5);
  EXPECT_EQ(s.NextLength(5), 5);
  s.Record(5, 2);  // 2 of 3 tried: 0.5 x 1 + 0.5 x 2/3; run 5 -> all 5.
  EXPECT_NEAR(s.acceptance, 5.0 / 6, 1e-12);
  EXPECT_EQ(s.NextLength(5), 5);
  s.Record(5, 0);  // 0.417: a run of 0.71 expected, + 1.
  EXPECT_EQ(s.NextLength(5), 2);
  s.Record(2, 0);  // Two misses in a row: pause one step.
  EXPECT_EQ(s.NextLength(5), 0);
  EXPECT_EQ(s.NextLength(5), 1);  // 0.208: a run of 0.26, + 1.
  for (int i = 0; i < 10; ++i) {
    s.Record(1, 0);
    while (s.pause > 0) s.NextLength(5);
  }
  s.Record(1, 0);
  EXPECT_EQ(s.pause, SpeculationState::kMaxPause);
  while (s.pause > 0) EXPECT_EQ(s.NextLength(5), 0);
  EXPECT_EQ(s.NextLength(5), 1);
  s.Record(1, 1);  // A hit ends the run of misses.
  EXPECT_EQ(s.misses, 0);
  EXPECT_GE(s.NextLength(5), 1);
  // Steps without a verified draft bring a low estimate back towards the prior.
  s.acceptance = 0;
  for (int i = 0; i < 200; ++i) s.Idle();
  EXPECT_NEAR(s.acceptance, SpeculationState::kPrior, 1e-3);
  EXPECT_EQ(s.NextLength(5), 2);
}

TEST(StepCostModelTest, FitsTheSlopeOnceRowsVary) {
  StepCostModel m;
  for (int i = 0; i < 40; ++i) m.Observe(16, 0.010);  // Rows never vary: no slope.
  EXPECT_FALSE(m.ready());
  for (int i = 0; i < 40; ++i) {
    const int rows = 1 + i % 20;
    m.Observe(rows, 0.002 + 0.0005 * rows);
  }
  ASSERT_TRUE(m.ready());
  EXPECT_NEAR(m.b(), 0.0005, 1e-4);  // The old constant steps still weigh a little.
  EXPECT_NEAR(m.a() + m.b() * 16, 0.010, 1e-3);
}

StepCostModel CostOf(double a, double b) {
  StepCostModel m;
  for (int i = 0; i < 64; ++i) m.Observe(1 + i % 8, a + b * (1 + i % 8));
  return m;
}

TEST(BudgetDraftsTest, KeepsWhatPaysBelowTheRidgeAndLittlePastIt) {
  // Memory-bound (a step costs 10 rows' worth before its first row): sure drafts all stay; an
  // unlikely one stays only while it beats the step's own rate.
  const StepCostModel memory = CostOf(0.010, 0.001);
  std::vector<int32_t> lengths = {5, 5};
  BudgetDrafts(memory, 2, 2, std::vector<double>{1.0, 0.1}, absl::MakeSpan(lengths));
  EXPECT_EQ(lengths, (std::vector<int32_t>{5, 0}));  // 0.1 x 0.017 s < 0.001 x 7 tokens.
  lengths = {5};
  BudgetDrafts(memory, 1, 1, std::vector<double>{0.3}, absl::MakeSpan(lengths));
  // 0.3 x 0.011 s >= 0.001 x 1 token; then 0.09 x 0.012 < 0.001 x 1.3.
  EXPECT_EQ(lengths, (std::vector<int32_t>{1}));
  // Compute-bound (rows are most of the step's cost): only drafts about as sure as a plain token
  // pay.
  const StepCostModel compute = CostOf(0.002, 0.001);
  lengths = {4, 4, 4};
  BudgetDrafts(compute, 16, 16, std::vector<double>{1.0, 0.9, 0.5}, absl::MakeSpan(lengths));
  EXPECT_EQ(lengths, (std::vector<int32_t>{4, 0, 0}));
  // No slope yet: nothing trimmed.
  lengths = {3};
  BudgetDrafts(StepCostModel{}, 1, 1, std::vector<double>{0.0}, absl::MakeSpan(lengths));
  EXPECT_EQ(lengths, (std::vector<int32_t>{3}));
}

TEST(SpeculativeOptionsTest, ParseAndValidate) {
  EXPECT_EQ(*ParseSpeculativeMethod("ngram"), SpeculativeMethod::kNgram);
  EXPECT_EQ(*ParseSpeculativeMethod("none"), SpeculativeMethod::kNone);
  const absl::Status bad = ParseSpeculativeMethod("eagle").status();
  EXPECT_NE(bad.message().find("--speculative: 'eagle'"), absl::string_view::npos) << bad;
  SpeculativeOptions o;
  EXPECT_TRUE(o.Validate().ok());
  EXPECT_FALSE(o.enabled());
  o.method = SpeculativeMethod::kNgram;
  EXPECT_TRUE(o.enabled());
  o.ngram_min = 5;
  EXPECT_NE(o.Validate().message().find("--spec-ngram-max"), absl::string_view::npos);
  o.ngram_min = 0;
  EXPECT_NE(o.Validate().message().find("--spec-ngram-min"), absl::string_view::npos);
  o = SpeculativeOptions{};
  EXPECT_EQ(*ParseSpeculativeMethod("suffix"), SpeculativeMethod::kSuffix);
  o.suffix_depth = 1;
  EXPECT_NE(o.Validate().message().find("--spec-suffix-depth"), absl::string_view::npos);
  o.suffix_depth = 24;
  o.suffix_min_prob = 1.5;
  EXPECT_NE(o.Validate().message().find("--spec-suffix-min-prob"), absl::string_view::npos);
}

Sequence Decoding(SeqId id, int len) {
  Sequence s;
  s.id = id;
  s.tokens.assign(static_cast<size_t>(len), 1);
  s.num_prompt_tokens = len;
  return s;
}

// Drafts ride on decode steps after every running sequence has its token: trimmed to the budget,
// dropped when blocks are short, never a cause of preemption.
TEST(SchedulerDraftTest, DraftsTakeWhatIsLeftAndNeverPreempt) {
  BlockManager bm(6, 4, false);
  Scheduler sched({8, 64}, &bm);
  Sequence a = Decoding(1, 4), b = Decoding(2, 4);
  sched.AddWaiting(&a);
  sched.AddWaiting(&b);
  SchedulerOutput out;
  sched.Schedule(&out);  // Prefill both: 1 block each.
  a.num_computed = b.num_computed = 4;
  a.tokens.push_back(2);
  b.tokens.push_back(2);
  // Both decode (position 4: a second block each, 2 left); a's 3 drafts fit in its second
  // block, b's 8 need the last two.
  a.draft = {5, 6, 7};
  b.draft = {1, 2, 3, 4, 5, 6, 7, 8};
  sched.Schedule(&out);
  ASSERT_EQ(out.chunks.size(), 2u);
  EXPECT_TRUE(out.preempted.empty());
  EXPECT_EQ(out.chunks[0].num_tokens, 4);
  EXPECT_EQ(a.draft.size(), 3u);
  EXPECT_EQ(out.chunks[1].num_tokens, 9);
  EXPECT_EQ(bm.NumAvailableBlocks(), 0);
  // Rolled back: b kept 2 of its drafts (7 tokens: 2 blocks), a none (5 tokens: 2 blocks).
  bm.Truncate(b.id, 7);
  EXPECT_EQ(bm.NumAvailableBlocks(), 2);
  EXPECT_EQ(bm.BlockTable(b.id).size(), 2u);
  bm.Truncate(a.id, 5);
  EXPECT_EQ(bm.NumAvailableBlocks(), 2);
  // With no block left, a draft is dropped rather than preempting anyone.
  Sequence c = Decoding(3, 7);
  sched.AddWaiting(&c);
  a.draft.clear();
  b.draft.clear();
  sched.Schedule(&out);  // c's prefill takes the last 2 blocks.
  ASSERT_EQ(out.chunks.size(), 3u);
  EXPECT_EQ(bm.NumAvailableBlocks(), 0);
  c.num_computed = 7;
  c.tokens.push_back(2);
  a.draft = {5, 6, 7, 8, 9};  // Needs a third block.
  sched.Schedule(&out);
  EXPECT_TRUE(out.preempted.empty());
  EXPECT_TRUE(a.draft.empty());
  EXPECT_EQ(out.chunks[0].num_tokens, 1);
}

TEST(SchedulerDraftTest, DraftsAreTrimmedToTheBudgetAndDroppedForPrefills) {
  BlockManager bm(64, 4, false);
  Scheduler sched({8, 6}, &bm);
  Sequence a = Decoding(1, 4), b = Decoding(2, 4);
  sched.AddWaiting(&a);
  SchedulerOutput out;
  sched.Schedule(&out);
  a.num_computed = 4;
  a.tokens.push_back(2);
  a.draft = {1, 2, 3, 4, 5, 6, 7, 8};
  sched.AddWaiting(&b);
  b.draft = {1, 2};  // Not running: dropped on admission.
  sched.Schedule(&out);
  ASSERT_EQ(out.chunks.size(), 1u);  // a: 1 + 5 drafts fill the budget; b waits.
  EXPECT_EQ(out.chunks[0].num_tokens, 6);
  EXPECT_EQ(a.draft.size(), 5u);
  EXPECT_EQ(out.num_tokens, 6);
  a.draft.clear();
  sched.Schedule(&out);
  ASSERT_EQ(out.chunks.size(), 2u);
  EXPECT_TRUE(b.draft.empty());
}

}  // namespace
}  // namespace pdserve
