#include "planner/plan.h"

#include "common/base/rng.h"
#include "gtest/gtest.h"

namespace pdserve {
namespace {

// A step costs 5 ms + 0.2 ms per token + 20 us per decode row's 1,000 keys.
SimProfile Profile() {
  SimProfile p;
  p.step = StepTimeModel{0.005, 0.0002, 0, 0, 2e-8};
  p.transfer_latency_seconds = 0.0005;
  p.transfer_bytes_per_second = 1e10;
  p.kv_bytes_per_token = 1000;
  p.vocab_size = 1000;
  return p;
}

ClusterOptions Base() {
  ClusterOptions o;
  o.worker.num_blocks = 4096;
  o.worker.block_size = 16;
  o.worker.max_model_len = 8192;
  o.worker.max_num_batched_tokens = 1024;
  return o;
}

// n requests with Poisson arrivals at `rate`, prompts and outputs of the given lengths.
WorkloadAtRate Workload(int64_t n, int64_t input, int64_t output) {
  return [=](double rate) -> absl::StatusOr<std::unique_ptr<RequestSource>> {
    SplitMix64 rng(17);
    std::vector<SimRequest> reqs;
    double t = 0;
    for (int64_t i = 0; i < n; ++i) {
      t += -std::log(1 - rng.Uniform()) / rate;
      std::vector<int32_t> prompt(static_cast<size_t>(input));
      for (int32_t& x : prompt) x = static_cast<int32_t>(rng.Next() % 1000);
      reqs.push_back({t, std::move(prompt), output});
    }
    return ListSource(std::move(reqs));
  };
}

PlanOptions Targets(int64_t workers, double input, double output) {
  PlanOptions o;
  o.workers = workers;
  o.slo_ttft_ms = 400;
  o.slo_tpot_ms = 40;
  o.mean_input_tokens = input;
  o.mean_output_tokens = output;
  o.bisect_steps = 8;
  return o;
}

TEST(PlanTest, GoodputIsTheEdgeOfTheTargets) {
  const WorkloadAtRate w = Workload(150, 300, 40);
  auto plan = Plan(Profile(), Base(), Targets(3, 300, 40), w);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->splits.size(), 3u);
  for (const SplitGoodput& g : plan->splits) {
    ASSERT_GT(g.goodput_rate, 0) << g.prefill << "P" << g.decode << "D";
    // At the rate found, 90% meet both targets; a little faster, fewer do.
    ClusterOptions c = Base();
    c.prefill_workers = g.prefill;
    c.decode_workers = g.decode;
    c.slo.ttft_ms = 400;
    c.slo.tpot_ms = 40;
    for (double factor : {1.0, 1.05}) {
      auto src = w(g.goodput_rate * factor);
      auto r = SimulateCluster(Profile(), c, **src);
      ASSERT_TRUE(r.ok());
      const double att = static_cast<double>(r->summary.good) / static_cast<double>(r->summary.ok);
      if (factor == 1.0) {
        EXPECT_GE(att, 0.9) << g.prefill << "P" << g.decode << "D";
        EXPECT_DOUBLE_EQ(att, g.attainment);
      } else {
        EXPECT_LT(att, 0.9) << g.prefill << "P" << g.decode << "D at " << g.goodput_rate * factor;
      }
    }
  }
  EXPECT_EQ(plan->splits[plan->best].goodput_rate,
            std::max({plan->splits[0].goodput_rate, plan->splits[1].goodput_rate, plan->splits[2].goodput_rate}));
}

// Among disaggregated splits, long prompts with short outputs (RAG) are served best with more
// prefill workers than short prompts with long outputs (chat). (Colocation, p = 0, wins both on
// this cost model: kv_aware sends a prompt to an idle worker, so a prefill chunk rarely lands in
// another request's decode steps; the planner reports it as it finds it.)
TEST(PlanTest, LongPromptsWantMorePrefillWorkersThanLongOutputs) {
  auto best_disaggregated = [](const PlanResult& r) {
    const SplitGoodput* best = nullptr;
    for (const SplitGoodput& g : r.splits) {
      EXPECT_FALSE(g.unbounded) << "the workloads must load every split";
      if (g.prefill > 0 && (best == nullptr || g.goodput_rate > best->goodput_rate)) best = &g;
    }
    return *best;
  };
  auto rag = Plan(Profile(), Base(), Targets(6, 1500, 16), Workload(400, 1500, 16));
  auto chat = Plan(Profile(), Base(), Targets(6, 64, 200), Workload(400, 64, 200));
  ASSERT_TRUE(rag.ok() && chat.ok());
  const SplitGoodput a = best_disaggregated(*rag), b = best_disaggregated(*chat);
  EXPECT_GT(a.prefill, b.prefill) << "rag " << a.prefill << "P" << a.decode << "D, chat " << b.prefill
                                  << "P" << b.decode << "D";
  // The formula leans the same way.
  EXPECT_GT(rag->formula.prefill, chat->formula.prefill);
  // The best is the highest goodput.
  for (const PlanResult* r : {&*rag, &*chat}) {
    for (const SplitGoodput& g : r->splits) EXPECT_LE(g.goodput_rate, r->splits[r->best].goodput_rate);
  }
}

TEST(PlanTest, TheFormulaByHand) {
  // Prompts of 512 in a 1,024-token budget: 2 a step, 5 + 0.2 x 1024 = 209.8 ms for 1,024 tokens.
  // Decode at context 512 + 50: a row costs 0.2 ms + 563 keys x 20 ns = 0.21126 ms; a 40 ms step
  // fits (40 - 5) / 0.21126 = 165 rows.
  const FormulaChoice f = DynamoFormula(Profile(), Base().worker, 8, 40, 512, 100);
  EXPECT_NEAR(f.prefill_tokens_per_second, 1024 / 0.2098, 1e-6);
  EXPECT_EQ(f.decode_batch, 64) << "max_num_seqs caps it";
  const double step = 0.005 + 64 * (0.0002 + 563 * 2e-8);
  EXPECT_NEAR(f.decode_tokens_per_second, 64 / step, 1e-6);
  const double p = 512 / f.prefill_tokens_per_second, d = 100 / f.decode_tokens_per_second;
  EXPECT_EQ(f.prefill, std::llround(8 * p / (p + d)));
  EXPECT_EQ(f.prefill + f.decode, 8);
}

TEST(PlanTest, ImpossibleTargetsAreRefused) {
  PlanOptions o = Targets(2, 100, 10);
  o.slo_tpot_ms = 0;
  EXPECT_FALSE(Plan(Profile(), Base(), o, Workload(5, 100, 10)).ok());
  o = Targets(0, 100, 10);
  EXPECT_FALSE(Plan(Profile(), Base(), o, Workload(5, 100, 10)).ok());
  o = Targets(2, 100, 10);
  o.attainment = 1.5;
  EXPECT_FALSE(Plan(Profile(), Base(), o, Workload(5, 100, 10)).ok());
  // Targets no configuration meets: goodput 0, not an error or a hang.
  o = Targets(2, 100, 10);
  o.slo_ttft_ms = 1;
  auto none = Plan(Profile(), Base(), o, Workload(20, 100, 10));
  ASSERT_TRUE(none.ok());
  for (const SplitGoodput& g : none->splits) EXPECT_EQ(g.goodput_rate, 0);
  // A workload too small to load a split: the search stops and says so.
  auto loose = Plan(Profile(), Base(), Targets(2, 100, 10), Workload(3, 100, 10));
  ASSERT_TRUE(loose.ok());
  EXPECT_TRUE(loose->splits[0].unbounded);
}

}  // namespace
}  // namespace pdserve
