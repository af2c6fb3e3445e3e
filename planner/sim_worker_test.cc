// Fidelity by construction (issue 40): the simulated worker's scheduling decisions equal those of
// the real engine on a real (small, random) model: every step's batch (which requests, how many
// tokens each), every preemption, every request's prefix-cache hits, and the step at which each
// request ends. The engine runs first; the simulation then appends the tokens the engine sampled
// (they only matter through the prefix cache) and must make the same decisions.
#include "planner/sim_worker.h"

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "common/base/rng.h"
#include "common/engine/llm_engine.h"
#include "gtest/gtest.h"

namespace pdserve {
namespace {

struct StepLog {
  std::vector<std::pair<int64_t, int64_t>> chunks;  // (request, tokens)
  std::vector<int64_t> preempted;
  std::vector<int64_t> finished;
  bool operator==(const StepLog& o) const {
    return chunks == o.chunks && preempted == o.preempted && finished == o.finished;
  }
};

std::string Describe(const StepLog& s) {
  std::string out = "chunks";
  for (auto [r, n] : s.chunks) out += " " + std::to_string(r) + ":" + std::to_string(n);
  out += " preempted";
  for (int64_t r : s.preempted) out += " " + std::to_string(r);
  out += " finished";
  for (int64_t r : s.finished) out += " " + std::to_string(r);
  return out;
}

struct Req {
  std::vector<int32_t> prompt;
  int64_t output = 0;
  int64_t arrival_step = 0;  // Added before this step.
};

ModelConfig TinyConfig() {
  ModelConfig c;
  c.architecture = "LlamaForCausalLM";
  c.vocab_size = 300;
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.max_position_embeddings = 512;
  c.eos_token_ids = {299};
  return c;
}

// Requests sharing prefixes (four system prompts), staggered, with lengths that force chunked
// prefill (a budget of 48 tokens) and, with few blocks, preemption.
std::vector<Req> Workload(uint64_t seed) {
  SplitMix64 rng(seed);
  std::vector<std::vector<int32_t>> systems(4);
  for (auto& s : systems) {
    s.resize(8 + rng.Next() % 40);
    for (int32_t& t : s) t = static_cast<int32_t>(rng.Next() % 290);
  }
  std::vector<Req> out;
  for (int i = 0; i < 24; ++i) {
    Req r;
    r.prompt = systems[rng.Next() % systems.size()];
    const int64_t own = 1 + static_cast<int64_t>(rng.Next() % 60);
    for (int64_t k = 0; k < own; ++k) r.prompt.push_back(static_cast<int32_t>(rng.Next() % 290));
    r.output = 1 + static_cast<int64_t>(rng.Next() % 40);
    r.arrival_step = static_cast<int64_t>(i / 3) * 2;
    out.push_back(std::move(r));
  }
  return out;
}

struct Trace {
  std::vector<StepLog> steps;
  std::map<int64_t, int64_t> cached;                     // request -> cached prompt tokens
  std::map<int64_t, std::vector<int32_t>> tokens;        // request -> generated tokens
  int64_t preemptions = 0;
};

Trace RunEngine(const std::vector<Req>& reqs, int64_t blocks) {
  EngineOptions o;
  o.threads = 1;
  o.block_size = 4;
  o.num_kv_blocks = blocks;
  o.max_num_batched_tokens = 48;
  o.max_num_seqs = 6;
  auto engine = LLMEngine::CreateSynthetic(TinyConfig(), o, 3);
  EXPECT_TRUE(engine.ok()) << engine.status();
  Trace run;
  StepLog current;
  (*engine)->SetLayerObserver([&](int64_t layer, const SchedulerOutput& s) {
    if (layer != 0) return;
    for (const ScheduledChunk& c : s.chunks) current.chunks.push_back({std::stoll(c.seq->request_id), c.num_tokens});
    for (const Sequence* p : s.preempted) current.preempted.push_back(std::stoll(p->request_id));
  });
  size_t next = 0;
  for (int64_t step = 0; next < reqs.size() || (*engine)->HasUnfinished(); ++step) {
    while (next < reqs.size() && reqs[next].arrival_step <= step) {
      SamplingParams p;
      p.temperature = 0;
      p.ignore_eos = true;
      p.max_tokens = static_cast<int32_t>(reqs[next].output);
      EXPECT_TRUE((*engine)->AddRequest(std::to_string(next), reqs[next].prompt, p).ok());
      ++next;
    }
    current = StepLog{};
    std::vector<RequestOutput> outs;
    EXPECT_TRUE((*engine)->Step(&outs).ok());
    for (const RequestOutput& out : outs) {
      const int64_t r = std::stoll(out.request_id);
      for (const TokenOutput& t : out.tokens) run.tokens[r].push_back(t.token);
      if (out.first_token) run.cached[r] = out.cached_tokens;
      if (out.finished) current.finished.push_back(r);
    }
    run.steps.push_back(current);
  }
  run.preemptions = (*engine)->Stats().preemptions;
  return run;
}

Trace RunSim(const std::vector<Req>& reqs, int64_t blocks, const Trace& engine) {
  SimWorker::Options o;
  o.num_blocks = blocks;
  o.block_size = 4;
  o.max_num_batched_tokens = 48;
  o.max_num_seqs = 6;
  o.max_model_len = std::min<int64_t>(512, blocks * 4);  // As the engine caps it to its pool.
  o.next_token = [&](int64_t request, int64_t position) {
    return engine.tokens.at(request).at(static_cast<size_t>(position));
  };
  SimWorker w(o);
  Trace run;
  size_t next = 0;
  for (int64_t step = 0; next < reqs.size() || w.sequences() > 0; ++step) {
    while (next < reqs.size() && reqs[next].arrival_step <= step) {
      w.Add(static_cast<int64_t>(next), reqs[next].prompt, reqs[next].output);
      ++next;
    }
    StepLog log;
    StepShape shape;
    if (w.BeginStep(&shape)) {
      for (const ScheduledChunk& c : w.schedule().chunks) log.chunks.push_back({c.seq->id, c.num_tokens});
      for (const Sequence* p : w.schedule().preempted) log.preempted.push_back(p->id);
      std::vector<SimWorker::Emitted> out;
      w.EndStep(&out);
      for (const SimWorker::Emitted& e : out) {
        run.tokens[e.request].push_back(e.token);
        if (e.first) run.cached[e.request] = e.cached_prompt_tokens;
        if (e.finished) log.finished.push_back(e.request);
      }
    }
    run.steps.push_back(log);
  }
  run.preemptions = w.num_preemptions();
  EXPECT_EQ(w.kv().used_blocks, 0) << "a finished simulation holds no blocks";
  return run;
}

class SimWorkerFidelity : public ::testing::TestWithParam<int64_t> {};

TEST_P(SimWorkerFidelity, DecisionsEqualTheEngines) {
  const int64_t blocks = GetParam();
  for (uint64_t seed : {1, 2, 3}) {
    const std::vector<Req> reqs = Workload(seed);
    const Trace engine = RunEngine(reqs, blocks);
    const Trace sim = RunSim(reqs, blocks, engine);
    ASSERT_EQ(sim.steps.size(), engine.steps.size()) << "seed " << seed;
    for (size_t i = 0; i < sim.steps.size(); ++i) {
      ASSERT_TRUE(sim.steps[i] == engine.steps[i])
          << "seed " << seed << " step " << i << "\n sim:    " << Describe(sim.steps[i])
          << "\n engine: " << Describe(engine.steps[i]);
    }
    EXPECT_EQ(sim.cached, engine.cached) << "seed " << seed;
    EXPECT_EQ(sim.tokens, engine.tokens) << "seed " << seed;
    EXPECT_EQ(sim.preemptions, engine.preemptions) << "seed " << seed;
    if (blocks < 100) EXPECT_GT(engine.preemptions, 0) << "a tight pool must preempt, or it proves less";
    int64_t hits = 0;
    for (auto [r, c] : engine.cached) hits += c;
    EXPECT_GT(hits, 0) << "the shared prefixes must hit the cache, or it proves less";
  }
}

// A roomy pool (prefix reuse, chunking, no preemption) and a tight one (preemption, recompute).
INSTANTIATE_TEST_SUITE_P(Pools, SimWorkerFidelity, ::testing::Values(int64_t{400}, int64_t{48}));

TEST(SimWorkerTest, RemotePrefillReservesThenJoinsWithItsFirstToken) {
  SimWorker::Options o;
  o.num_blocks = 16;
  o.block_size = 4;
  o.next_token = [](int64_t, int64_t position) { return static_cast<int32_t>(position); };
  SimWorker w(o);
  std::vector<int32_t> prompt(10, 7);
  int64_t cached = -1;
  ASSERT_TRUE(w.Reserve(5, prompt, 3, &cached));
  EXPECT_EQ(cached, 0);
  EXPECT_EQ(w.kv().used_blocks, 3);
  StepShape shape;
  EXPECT_FALSE(w.BeginStep(&shape)) << "a reservation waits for its pages";
  const SimWorker::Emitted first = w.CompleteRemote(5, 42, 4);
  EXPECT_TRUE(first.first);
  EXPECT_FALSE(first.finished);
  EXPECT_EQ(first.cached_prompt_tokens, 4);
  std::vector<SimWorker::Emitted> out;
  ASSERT_TRUE(w.BeginStep(&shape));
  EXPECT_EQ(shape.tokens, 1);
  EXPECT_EQ(shape.decode_context, 11);
  w.EndStep(&out);
  ASSERT_TRUE(w.BeginStep(&shape));
  w.EndStep(&out);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_TRUE(out[1].finished);
  EXPECT_EQ(w.kv().used_blocks, 0);
  // The published prompt is found again by a second reservation of the same prompt.
  ASSERT_TRUE(w.Reserve(6, prompt, 3, &cached));
  EXPECT_EQ(cached, 8);
  // A pool too busy to hold another prompt refuses, changing nothing.
  std::vector<int32_t> big(60, 9);
  EXPECT_FALSE(w.Reserve(7, big, 3, &cached));
  EXPECT_EQ(w.sequences(), 1);
}

TEST(SimWorkerTest, HeldBlocksStayUntilReleased) {
  SimWorker::Options o;
  o.num_blocks = 16;
  o.block_size = 4;
  o.next_token = [](int64_t, int64_t) { return 1; };
  SimWorker w(o);
  w.Add(1, std::vector<int32_t>(9, 3), 1, /*hold_after_finish=*/true);
  StepShape shape;
  ASSERT_TRUE(w.BeginStep(&shape));
  EXPECT_EQ(shape.tokens, 9);
  std::vector<SimWorker::Emitted> out;
  w.EndStep(&out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(out[0].finished);
  EXPECT_EQ(w.kv().used_blocks, 3);
  EXPECT_FALSE(w.HasWork());
  w.ReleaseHeld(1);
  EXPECT_EQ(w.kv().used_blocks, 0);
  EXPECT_EQ(w.sequences(), 0);
}

}  // namespace
}  // namespace pdserve
