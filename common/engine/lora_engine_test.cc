// LoRA adapters in the engine: a request's output (ids and logits) is the same bits alone, in a
// batch with requests of 8 other adapters and of the base model, chunked, preempted and
// disaggregated, in every numeric mode; an adapter's KV blocks never serve the base model or
// another adapter; bad names are refused and leave nothing behind. (Parity with an independent
// float64 reference: tests/reference/test_parity.py.)
#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <thread>

#include "common/base/file_util.h"
#include "common/base/strings.h"
#include "common/engine/engine_test_util.h"
#include "common/engine/llm_engine.h"
#include "common/model/lora_registry.h"
#include "common/model/random_lora.h"
#include "gtest/gtest.h"

namespace pdserve {
namespace {

using namespace enginetest;  // NOLINT

constexpr int kAdapters = 9;

// Adapters a0..a8 of mixed ranks and targets for the model at `dir`, served by one registry.
std::shared_ptr<LoraRegistry> Adapters(const std::string& dir) {
  auto config = ModelConfig::FromFile(JoinPath(dir, "config.json"));
  EXPECT_TRUE(config.ok());
  auto reg = std::make_shared<LoraRegistry>(*config, LoraRegistryOptions{.max_rank = 64});
  for (int i = 0; i < kAdapters; ++i) {
    const std::string name = Str("a", i);
    const std::string path = JoinPath(dir, Str("lora_", name));
    RandomLoraSpec spec;
    spec.rank = i % 3 == 0 ? 8 : i % 3 == 1 ? 16 : 64;
    spec.rslora = i % 2 == 1;
    spec.seed = 100 + i;
    if (i == 4) spec.targets = {LoraTarget::kQ, LoraTarget::kV};
    if (i == 5) spec.targets = {LoraTarget::kGate, LoraTarget::kUp, LoraTarget::kDown};
    if (i == 6) spec.dtype = DType::kBF16;
    if (!FileExists(JoinPath(path, "adapter_config.json"))) {
      EXPECT_TRUE(WriteRandomLora(spec, *config, path).ok());
    }
    EXPECT_TRUE(reg->Add(name, path).ok());
  }
  return reg;
}

Request WithAdapter(std::string id, std::vector<int32_t> prompt, const std::string& adapter,
                    int max_tokens = 10) {
  Request r{std::move(id), std::move(prompt), Greedy(max_tokens)};
  r.params.temperature = 0.8f;
  r.params.seed = 4242;
  r.params.lora_name = adapter;
  return r;
}

class LoraModeTest : public ::testing::TestWithParam<Mode> {
 protected:
  std::string Dir() const { return ModelDir("qwen2", DType::kF32, GetParam().wide()); }
  EngineOptions Opts() const {
    EngineOptions o = ModeOptions(GetParam());
    o.lora = Adapters(Dir());
    return o;
  }
};

TEST_P(LoraModeTest, ARequestIsTheSameBitsAloneBatchedChunkedAndPreempted) {
  const EngineOptions opts = Opts();
  std::vector<Request> requests;
  for (int i = 0; i < kAdapters; ++i) {
    requests.push_back(WithAdapter(Str("r", i), Prompt(13 + 3 * i, 50 + i), Str("a", i)));
  }
  requests.push_back(WithAdapter("base", Prompt(17, 90), ""));
  // The same prompt for an adapter and the base model: different outputs.
  requests.push_back(WithAdapter("same_a0", requests[9].prompt, "a0"));

  std::map<std::string, Result> alone;
  for (const Request& r : requests) alone[r.id] = RunEngine(Dir(), opts, {r}).at(r.id);
  EXPECT_NE(alone.at("base").logits[0], alone.at("same_a0").logits[0]);

  std::vector<int> arrivals;
  for (size_t i = 0; i < requests.size(); ++i) arrivals.push_back(static_cast<int>(i % 4));
  const auto batched = RunEngine(Dir(), opts, requests, arrivals);
  EngineOptions chunked = opts;
  chunked.max_num_batched_tokens = 9;
  const auto chunks = RunEngine(Dir(), chunked, requests, arrivals);
  EngineOptions tight = opts;
  tight.num_kv_blocks = 24;  // Block size 4: the batch does not fit and preempts.
  EngineStats stats;
  const auto preempted = RunEngine(Dir(), tight, requests, arrivals, &stats);
  EXPECT_GT(stats.preemptions, 0);
  for (const Request& r : requests) {
    ExpectBitwiseEqual(batched.at(r.id), alone.at(r.id), r.id + ": batched with other adapters");
    ExpectBitwiseEqual(chunks.at(r.id), alone.at(r.id), r.id + ": chunked");
    ExpectBitwiseEqual(preempted.at(r.id), alone.at(r.id), r.id + ": preempted");
  }
}

TEST_P(LoraModeTest, PrefilledOnOneEngineDecodedOnAnotherEqualsLocal) {
  const EngineOptions opts = Opts();
  const Request r = WithAdapter("r", Prompt(29, 7), "a2", 8);
  const auto local = RunEngine(Dir(), opts, {r});
  auto prefill = *LLMEngine::Create(Dir(), opts);
  auto decode = *LLMEngine::Create(Dir(), opts);
  std::vector<std::vector<float>> logits;
  auto observe = [&logits](const std::string&, const float* l, int64_t v) { logits.emplace_back(l, l + v); };
  prefill->SetLogitsObserver(observe);
  decode->SetLogitsObserver(observe);
  auto plan = decode->ReserveForRemotePrefill("r", r.prompt, r.params);
  ASSERT_TRUE(plan.ok()) << plan.status();
  SamplingParams first_only = r.params;
  first_only.max_tokens = 1;
  ASSERT_TRUE(prefill->AddRequest("r", r.prompt, first_only, RequestOptions{true}).ok());
  std::vector<RequestOutput> pouts, outs;
  while (prefill->HasUnfinished()) ASSERT_TRUE(prefill->Step(&pouts).ok());
  CopyPages(*prefill, prefill->BlockTable("r"), *decode, plan->blocks, 0);
  prefill->ReleaseHeld("r");
  const SampledToken first{pouts[0].tokens[0].token, pouts[0].tokens[0].logprob, {}};
  ASSERT_TRUE(decode->CompleteRemotePrefill("r", first, 0, &outs).ok());
  Result d;
  d.tokens = {first.token};
  while (decode->HasUnfinished()) {
    outs.clear();
    ASSERT_TRUE(decode->Step(&outs).ok());
    for (const auto& o : outs) {
      for (const auto& t : o.tokens) d.tokens.push_back(t.token);
    }
  }
  d.logits = logits;
  ExpectBitwiseEqual(d, local.at("r"), "prefill on one engine, decode on another, with an adapter");
  EXPECT_EQ(decode->Stats().kv.used_blocks, 0);
}

const Mode kLoraModes[] = {kModes[0], kModes[1], kModes[2], kModes[5], kModes[6]};
INSTANTIATE_TEST_SUITE_P(Modes, LoraModeTest, ::testing::ValuesIn(kLoraModes),
                         [](const auto& info) { return ModeName(info.param); });

TEST(LoraEngineTest, AdaptersAndTheBaseModelNeverShareKvBlocks) {
  const std::string dir = ModelDir("llama");
  EngineOptions opts = SmallOptions();
  opts.lora = Adapters(dir);
  const std::vector<int32_t> prompt = Prompt(21, 5);  // 5 full blocks of 4.
  // One engine, one request at a time (each finishes long before the next arrives).
  const std::vector<Request> requests = {
      WithAdapter("base1", prompt, "", 3), WithAdapter("a0_1", prompt, "a0", 3),
      WithAdapter("a1_1", prompt, "a1", 3), WithAdapter("a0_2", prompt, "a0", 3),
      WithAdapter("base2", prompt, "", 3)};
  const auto out = RunEngine(dir, opts, requests, {0, 30, 60, 90, 120});
  EXPECT_EQ(out.at("base1").cached_tokens, 0);
  EXPECT_EQ(out.at("a0_1").cached_tokens, 0) << "an adapter took the base model's KV";
  EXPECT_EQ(out.at("a1_1").cached_tokens, 0) << "an adapter took another adapter's KV";
  EXPECT_EQ(out.at("a0_2").cached_tokens, 20);
  EXPECT_EQ(out.at("base2").cached_tokens, 20);
  // Each equals its own run from the cache.
  ExpectBitwiseEqual(out.at("a0_2"), out.at("a0_1"), "a0 from its cached prefix");
  ExpectBitwiseEqual(out.at("base2"), out.at("base1"), "base from its cached prefix");
  // The probe the decode worker makes agrees.
  auto engine = *LLMEngine::Create(dir, opts);
  ASSERT_TRUE(engine->AddRequest("w", prompt, WithAdapter("w", prompt, "a3", 1).params).ok());
  std::vector<RequestOutput> outs;
  while (engine->HasUnfinished()) ASSERT_TRUE(engine->Step(&outs).ok());
  EXPECT_EQ(engine->CachedPrefixTokens(prompt, "a3"), 20);
  EXPECT_EQ(engine->CachedPrefixTokens(prompt, "a4"), 0);
  EXPECT_EQ(engine->CachedPrefixTokens(prompt), 0);
}

TEST(LoraEngineTest, UnknownAdaptersAreRefusedNamingTheFieldAndLeaveNothing) {
  const std::string dir = ModelDir("llama");
  auto plain = *LLMEngine::Create(dir, SmallOptions());
  absl::Status s = plain->AddRequest("x", Prompt(9, 1), WithAdapter("x", {}, "a0").params);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_NE(s.message().find("lora_name"), std::string_view::npos) << s;
  EngineOptions opts = SmallOptions();
  opts.lora = Adapters(dir);
  auto engine = *LLMEngine::Create(dir, opts);
  s = engine->AddRequest("x", Prompt(9, 1), WithAdapter("x", {}, "nope").params);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_NE(s.message().find("lora_name: no LoRA adapter named 'nope'"), std::string_view::npos) << s;
  EXPECT_EQ(engine->ReserveForRemotePrefill("y", Prompt(9, 1), WithAdapter("y", {}, "nope").params)
                .status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_FALSE(engine->HasUnfinished());
  EXPECT_EQ(engine->Stats().kv.used_blocks, 0);
  // The id is free again.
  EXPECT_TRUE(engine->AddRequest("x", Prompt(9, 1), WithAdapter("x", {}, "a1").params).ok());
}

// A LoRA request's blocks reach the KV cache tiers with their adapter's name on the tiers' events
// as on the pool's (vLLM's lora_name); a base request's carry none.
TEST(LoraEngineTest, TierEventsCarryTheAdaptersName) {
  const std::string dir = ModelDir("llama");
  std::string tier_dir;
  EngineOptions opts = WithDiskTier(SmallOptions(), "lora_tier_events", &tier_dir);
  opts.lora = Adapters(dir);
  opts.enable_kv_events = true;
  auto engine = *LLMEngine::Create(dir, opts);
  const std::vector<int32_t> adapted = Prompt(13, 7), base = Prompt(13, 8);  // 3 whole blocks of 4.
  ASSERT_TRUE(engine->AddRequest("a", adapted, WithAdapter("a", adapted, "a2", 2).params).ok());
  ASSERT_TRUE(engine->AddRequest("b", base, Greedy(2)).ok());
  std::vector<RequestOutput> outs;
  while (engine->HasUnfinished()) ASSERT_TRUE(engine->Step(&outs).ok());
  std::vector<KvEvent> events;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  do {
    engine->DrainKvEvents(&events);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  } while (engine->TierEventsPending() && std::chrono::steady_clock::now() < deadline);
  engine->DrainKvEvents(&events);
  // Per medium ("pool" or the tier's), the adapter named by each stored block's events.
  std::map<std::string, std::map<std::string, int>> names;
  std::map<BlockHash, std::string, bool (*)(const BlockHash&, const BlockHash&)> pool_name(
      [](const BlockHash& x, const BlockHash& y) { return x.lo != y.lo ? x.lo < y.lo : x.hi < y.hi; });
  for (const KvEvent& e : events) {
    if (e.type != KvEvent::Type::kStored) continue;
    ++names[e.medium == nullptr ? "pool" : e.medium][e.lora_name];
    if (e.medium == nullptr) pool_name[e.hash] = e.lora_name;
  }
  const std::map<std::string, int> want = {{"", 3}, {"a2", 3}};
  EXPECT_EQ(names["pool"], want);
  EXPECT_EQ(names["DISK"], want);
  for (const KvEvent& e : events) {
    if (e.type == KvEvent::Type::kStored && e.medium != nullptr) EXPECT_EQ(e.lora_name, pool_name[e.hash]);
  }
  std::filesystem::remove_all(tier_dir);
}

TEST(LoraEngineTest, AnAdapterRemovedWhileItsRequestRunsLetsItFinish) {
  const std::string dir = ModelDir("llama");
  EngineOptions opts = SmallOptions();
  opts.lora = Adapters(dir);
  const Request r = WithAdapter("r", Prompt(11, 3), "a7", 12);
  const auto alone = RunEngine(dir, opts, {r});
  auto engine = *LLMEngine::Create(dir, opts);
  Result got;
  engine->SetLogitsObserver([&](const std::string&, const float* l, int64_t v) { got.logits.emplace_back(l, l + v); });
  ASSERT_TRUE(engine->AddRequest("r", r.prompt, r.params).ok());
  std::vector<RequestOutput> outs;
  for (int step = 0; engine->HasUnfinished(); ++step) {
    if (step == 3) {
      ASSERT_TRUE(opts.lora->Remove("a7").ok());
      EXPECT_EQ(engine->AddRequest("late", r.prompt, r.params).code(), absl::StatusCode::kNotFound);
    }
    ASSERT_TRUE(engine->Step(&outs).ok());
  }
  for (const auto& o : outs) {
    for (const auto& t : o.tokens) got.tokens.push_back(t.token);
  }
  ExpectBitwiseEqual(got, alone.at("r"), "the adapter removed at step 3");
  EXPECT_EQ(engine->Stats().kv.used_blocks, 0);
}

TEST(LoraEngineTest, MaxLorasBoundsTheAdaptersOfAStepAndChangesNoOutput) {
  const std::string dir = ModelDir("llama");
  EngineOptions opts = SmallOptions();
  opts.lora = Adapters(dir);
  std::vector<Request> requests;
  for (int i = 0; i < 9; ++i) {
    requests.push_back(WithAdapter(Str("r", i), Prompt(9 + i, 200 + i), Str("a", i % 3), 6 + i % 4));
  }
  const auto unbounded = RunEngine(dir, opts, requests);
  opts.max_loras = 2;
  auto engine = *LLMEngine::Create(dir, opts);
  size_t most = 0;
  engine->SetLayerObserver([&](int64_t layer, const SchedulerOutput& schedule) {
    if (layer != 0) return;
    std::vector<const LoraAdapter*> seen;
    for (const ScheduledChunk& c : schedule.chunks) {
      if (std::find(seen.begin(), seen.end(), c.seq->lora.get()) == seen.end()) seen.push_back(c.seq->lora.get());
    }
    most = std::max(most, seen.size());
  });
  std::map<std::string, Result> bounded;
  engine->SetLogitsObserver([&](const std::string& id, const float* l, int64_t v) {
    bounded[id].logits.emplace_back(l, l + v);
  });
  for (const Request& r : requests) ASSERT_TRUE(engine->AddRequest(r.id, r.prompt, r.params).ok());
  std::vector<RequestOutput> outs;
  while (engine->HasUnfinished()) ASSERT_TRUE(engine->Step(&outs).ok());
  for (const auto& o : outs) {
    for (const auto& t : o.tokens) bounded[o.request_id].tokens.push_back(t.token);
  }
  EXPECT_EQ(most, 2u) << "at most --max-loras adapters a step, and the bound was reached";
  for (const Request& r : requests) ExpectBitwiseEqual(bounded.at(r.id), unbounded.at(r.id), r.id);
  EXPECT_EQ(engine->Stats().kv.used_blocks, 0);
}

TEST(LoraEngineTest, TheRunningAndWaitingAdaptersAreReported) {
  const std::string dir = ModelDir("llama");
  EngineOptions opts = SmallOptions();
  opts.lora = Adapters(dir);
  opts.max_loras = 1;
  auto engine = *LLMEngine::Create(dir, opts);
  std::vector<std::string> running, waiting;
  engine->LoraRequestNames(&running, &waiting);
  EXPECT_TRUE(running.empty() && waiting.empty());
  int i = 0;
  for (const char* a : {"a2", "a0", "a2"}) {
    const Request r = WithAdapter(Str("r", i++), Prompt(9, 7), a, 4);
    ASSERT_TRUE(engine->AddRequest(r.id, r.prompt, r.params).ok());
  }
  ASSERT_TRUE(engine->AddRequest("base", Prompt(9, 8), Greedy(4)).ok());
  std::vector<RequestOutput> outs;
  ASSERT_TRUE(engine->Step(&outs).ok());
  // --max-loras 1: the first a2 runs; a0 waits, and the second a2 behind it (first come, first
  // served); the base request waits behind them too.
  engine->LoraRequestNames(&running, &waiting);
  EXPECT_EQ(running, std::vector<std::string>{"a2"});
  EXPECT_EQ(waiting, (std::vector<std::string>{"a0", "a2"}));
  while (engine->HasUnfinished()) ASSERT_TRUE(engine->Step(&outs).ok());
  engine->LoraRequestNames(&running, &waiting);
  EXPECT_TRUE(running.empty() && waiting.empty());
}

TEST(LoraEngineTest, DeviceBackendsRefuseAdapters) {
  EngineOptions opts = SmallOptions();
  opts.backend = "cuda";
  opts.lora = Adapters(ModelDir("llama"));
  auto engine = LLMEngine::Create(ModelDir("llama"), opts);
  ASSERT_FALSE(engine.ok());
  EXPECT_NE(engine.status().message().find("LoRA adapters run on --device cpu"), std::string_view::npos)
      << engine.status();
}

}  // namespace
}  // namespace pdserve
