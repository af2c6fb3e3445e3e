#include "planner/simulator.h"

#include <cstdio>
#include <fstream>
#include <string>

#include "common/base/rng.h"
#include "gtest/gtest.h"

namespace pdserve {
namespace {

// Round numbers: a step costs 10 ms + 0.1 ms per token; pages move at 1 GB/s after 1 ms.
SimProfile Profile() {
  SimProfile p;
  p.step = StepTimeModel{0.010, 0.0001, 0, 0, 0};
  p.transfer_latency_seconds = 0.001;
  p.transfer_bytes_per_second = 1e9;
  p.kv_bytes_per_token = 1000;
  p.vocab_size = 1000;
  return p;
}

ClusterOptions Options(int64_t prefill, int64_t decode) {
  ClusterOptions o;
  o.prefill_workers = prefill;
  o.decode_workers = decode;
  o.worker.num_blocks = 4096;
  o.worker.block_size = 16;
  o.worker.max_model_len = 8192;
  o.worker.next_token = nullptr;
  o.keep_requests = true;
  return o;
}

std::vector<int32_t> Tokens(int64_t n, uint64_t seed) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  SplitMix64 rng(seed);
  for (int32_t& x : t) x = static_cast<int32_t>(rng.Next() % 1000);
  return t;
}

TEST(SimulatorTest, OneLocalRequestTakesItsStepsCosts) {
  // 100 prompt tokens in one step (10 + 10 ms), then 4 decode steps of 10.1 ms.
  std::vector<SimRequest> reqs = {{0.5, Tokens(100, 1), 5}};
  auto source = ListSource(reqs);
  auto r = SimulateCluster(Profile(), Options(0, 1), *source);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->requests.size(), 1u);
  const SimRequestResult& q = r->requests[0];
  EXPECT_TRUE(q.ok);
  EXPECT_NEAR(q.ttft_seconds, 0.020, 1e-12);
  EXPECT_NEAR(q.e2e_seconds, 0.020 + 4 * 0.0101, 1e-12);
  ASSERT_EQ(q.itl_seconds.size(), 4u);
  EXPECT_NEAR(q.itl_seconds[2], 0.0101, 1e-12);
  EXPECT_EQ(q.completion_tokens, 5);
  EXPECT_EQ(r->local_prefills, 1);
  EXPECT_EQ(r->steps, 5);
  EXPECT_NEAR(r->end_seconds, 0.5 + 0.0604, 1e-12);
}

TEST(SimulatorTest, RemotePrefillAddsTheTransferToTheFirstToken) {
  // Prefill 100 tokens (20 ms) on the prefill worker, 100 KB of pages (1 ms + 0.1 ms), then the
  // decode worker's steps.
  std::vector<SimRequest> reqs = {{0, Tokens(100, 2), 3}};
  auto source = ListSource(reqs);
  auto r = SimulateCluster(Profile(), Options(1, 1), *source);
  ASSERT_TRUE(r.ok()) << r.status();
  const SimRequestResult& q = r->requests[0];
  EXPECT_TRUE(q.remote_prefill);
  EXPECT_NEAR(q.ttft_seconds, 0.020 + 0.0011, 1e-12);
  EXPECT_NEAR(q.e2e_seconds, 0.0211 + 2 * 0.0101, 1e-12);
  EXPECT_EQ(r->remote_prefills, 1);
  EXPECT_EQ(r->workers[0].tier, "prefill");
  EXPECT_EQ(r->workers[0].steps, 1);
  EXPECT_EQ(r->workers[1].steps, 2);
}

// Each layer's share of the pages, sent one after another once its layer is computed: the
// transfer as PrefillWorker::OnLayer streams it, walked share by share.
double StreamedBruteForce(double link_free, double start, double seconds, double bytes, int64_t layers,
                          double bandwidth) {
  double t = link_free;
  for (int64_t l = 0; l < layers; ++l) {
    t = std::max(t, start + static_cast<double>(l + 1) * seconds / static_cast<double>(layers)) +
        bytes / static_cast<double>(layers) / bandwidth;
  }
  return t;
}

TEST(SimulatorTest, PagesStreamPerLayerBehindTheCompute) {
  SplitMix64 rng(5);
  auto uniform = [&](double lo, double hi) { return lo + (hi - lo) * static_cast<double>(rng.Next() % 1000000) / 1e6; };
  for (int i = 0; i < 1000; ++i) {
    const double link_free = uniform(0, 0.2), start = uniform(0, 0.2), seconds = uniform(0.001, 0.1);
    const double bytes = uniform(1e3, 1e8), bandwidth = uniform(1e8, 1e10);
    const int64_t layers = 1 + static_cast<int64_t>(rng.Next() % 80);
    EXPECT_NEAR(LayerStreamDone(link_free, start, seconds, bytes, layers, bandwidth),
                StreamedBruteForce(link_free, start, seconds, bytes, layers, bandwidth), 1e-12);
  }
  // In the cluster: 100 tokens' pages (100 KB at 1 GB/s: 0.1 ms) of a 4-layer model leave with
  // the last layer (the last quarter, 25 us after the 20 ms step), then the 1 ms latency.
  SimProfile p = Profile();
  p.num_layers = 4;
  auto run = [&](const SimProfile& profile, ClusterOptions o, int64_t prompt) {
    std::vector<SimRequest> reqs = {{0, Tokens(prompt, 2), 2}};
    auto source = ListSource(reqs);
    auto r = SimulateCluster(profile, o, *source);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->requests[0].ttft_seconds : -1.0;
  };
  EXPECT_NEAR(run(p, Options(1, 1), 100), 0.020 + 0.000025 + 0.001, 1e-12);
  // A link slower than the compute (10 MB/s: 10 ms for 100 KB) is the bound: first share at 5 ms.
  p.transfer_bytes_per_second = 1e7;
  EXPECT_NEAR(run(p, Options(1, 1), 100), std::max(0.005 + 0.010, 0.020 + 0.0025) + 0.001, 1e-12);
  // Three chunks of 40, 40 and 20 tokens (14, 14 and 12 ms): each step's pages queue behind the
  // last's on the slow link.
  ClusterOptions chunked = Options(1, 1);
  chunked.worker.max_num_batched_tokens = 40;
  double t = 0, start = 0;
  for (int64_t n : {40, 40, 20}) {
    const double step = 0.010 + 0.0001 * static_cast<double>(n);
    t = StreamedBruteForce(t, start, step, 1000.0 * static_cast<double>(n), 4, 1e7);
    start += step;
  }
  EXPECT_NEAR(run(p, chunked, 100), std::max(t, start) + 0.001, 1e-12);
}

TEST(SimulatorTest, ShortPromptsStayLocalAndPrefixesHitTheCache) {
  // A 20-token prompt is under local_prefill_tokens (32): prefilled on the decode worker. The
  // same long prompt twice, far apart: the second finds its blocks cached on the worker the
  // router sends it to (kv_aware follows the prefix).
  const std::vector<int32_t> shared = Tokens(400, 3);
  std::vector<SimRequest> reqs = {{0, Tokens(20, 4), 2}, {1, shared, 2}, {5, shared, 2}};
  auto source = ListSource(reqs);
  // One decode worker, so the third request lands where the second's blocks are (with two,
  // kv_aware's share term sends it to the other one at this low load, as the router would).
  auto r = SimulateCluster(Profile(), Options(2, 1), *source);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->requests[0].remote_prefill);
  EXPECT_TRUE(r->requests[1].remote_prefill);
  EXPECT_EQ(r->requests[1].cached_tokens, 0);
  // On the decode worker that holds it, all but the last block's tokens are cached: local.
  EXPECT_FALSE(r->requests[2].remote_prefill);
  EXPECT_EQ(r->requests[2].cached_tokens, 384);
  EXPECT_EQ(r->local_prefills, 2);
  for (const SimWorkerStats& w : r->workers) EXPECT_EQ(w.kv_usage_max <= 1.0, true);
}

// KV cache tiers: a prompt whose blocks the pool evicted but the store (or the worker's disk or
// host memory) holds is loaded, then only its last block's tokens computed: TTFT is the load (a round trip and
// the bytes at the tier's bandwidth) plus one 16-token step, and its loaded tokens count as cached.
// A prompt, another that evicts (nearly) every block of the first from a pool of 26 blocks of 16,
// and the first again; the options of that one-worker cluster without tiers.
std::vector<SimRequest> EvictedPrefixRequests() {
  const std::vector<int32_t> p = Tokens(400, 30);
  return {{0, p, 1}, {1, Tokens(400, 31), 1}, {2, p, 1}};
}
ClusterOptions EvictingPool() {
  ClusterOptions o = Options(0, 1);
  o.worker.num_blocks = 26;
  o.worker.max_model_len = 416;
  return o;
}

TEST(SimulatorTest, APrefixEvictedFromThePoolIsLoadedFromTheTiers) {
  const std::vector<SimRequest> reqs = EvictedPrefixRequests();
  const ClusterOptions none = EvictingPool();
  auto plain_source = ListSource(reqs);
  auto plain = SimulateCluster(Profile(), none, *plain_source);
  ASSERT_TRUE(plain.ok()) << plain.status();
  // Without a tier the third prompt computes what the pool lost.
  const int64_t pool = plain->requests[2].cached_tokens;
  EXPECT_LT(pool, 128);
  EXPECT_NEAR(plain->requests[2].ttft_seconds, 0.010 + static_cast<double>(400 - pool) * 0.0001, 1e-12);
  for (const int tier : {0, 1, 2}) {  // The store, the disk, host memory.
    ClusterOptions o = none;
    (tier == 0 ? o.tiers.store_blocks : tier == 1 ? o.tiers.disk_blocks : o.tiers.host_blocks) = 1000;
    (tier == 0 ? o.tiers.store : tier == 1 ? o.tiers.disk : o.tiers.host) = SimTierCost{0.0005, 1.25e9};
    const bool disk = tier == 1;
    auto source = ListSource(reqs);
    auto r = SimulateCluster(Profile(), o, *source);
    ASSERT_TRUE(r.ok()) << r.status();
    const SimRequestResult& again = r->requests[2];
    // Up to (400 - 1) / 16 = 24 blocks: the rest after the pool's, 1,000 bytes a token.
    const int64_t loaded = 384 - pool;
    const double load = 0.0005 + static_cast<double>(loaded) * 1000 / 1.25e9;
    EXPECT_NEAR(again.ttft_seconds, load + 0.010 + 16 * 0.0001, 1e-12) << disk;
    EXPECT_EQ(again.cached_tokens, 384) << disk;
    EXPECT_EQ(tier == 0 ? r->store_loaded_tokens : tier == 1 ? r->disk_loaded_tokens : r->host_loaded_tokens, loaded);
    EXPECT_EQ(r->tier_loads, 1);
    EXPECT_NEAR(r->requests[0].ttft_seconds, 0.010 + 400 * 0.0001, 1e-12);
    for (const SimWorkerStats& w : r->workers) EXPECT_EQ(w.used_blocks_at_end, 0);
  }
}

// --kv-tier-load faster: a store slower than computing is not loaded from (the request computes,
// its TTFT that of no tier); a fast one is. Always: the slow store is loaded from, TTFT worse.
TEST(SimulatorTest, FasterLoadsOnlyWhatReadsSoonerThanItComputes) {
  const std::vector<SimRequest> reqs = EvictedPrefixRequests();
  const ClusterOptions base = EvictingPool();
  auto plain_source = ListSource(reqs);
  auto plain = SimulateCluster(Profile(), base, *plain_source);
  ASSERT_TRUE(plain.ok());
  for (const bool faster : {true, false}) {
    for (const double bandwidth : {1e6, 1e12}) {  // 1 MB/s: ~0.4 s for the run; 1 TB/s: ~0.
      ClusterOptions o = base;
      o.tiers.store_blocks = 1000;
      o.tiers.store = SimTierCost{0.0001, bandwidth};
      o.tiers.load_faster = faster;
      auto source = ListSource(reqs);
      auto r = SimulateCluster(Profile(), o, *source);
      ASSERT_TRUE(r.ok()) << r.status();
      const bool slow = bandwidth < 1e9;
      const bool loads = !(faster && slow);
      EXPECT_EQ(r->tier_loads, loads ? 1 : 0) << faster << " " << bandwidth;
      EXPECT_EQ(r->declined_loads, loads ? 0 : 1) << faster << " " << bandwidth;
      if (loads && slow) {
        EXPECT_GT(r->requests[2].ttft_seconds, plain->requests[2].ttft_seconds) << "always: the slow store costs";
      } else if (!loads) {
        EXPECT_NEAR(r->requests[2].ttft_seconds, plain->requests[2].ttft_seconds, 1e-12);
      } else {
        EXPECT_LT(r->requests[2].ttft_seconds, plain->requests[2].ttft_seconds);
      }
    }
  }
}

// A store smaller than what the trace reuses: least recently used blocks go; every request still
// ends, no block leaks, on both tiers with remote prefills.
TEST(SimulatorTest, TiersUnderLoadLeakNothing) {
  std::vector<SimRequest> reqs;
  SplitMix64 rng(77);
  std::vector<std::vector<int32_t>> prefixes;
  for (int i = 0; i < 8; ++i) prefixes.push_back(Tokens(256, 100 + i));
  for (int i = 0; i < 300; ++i) {
    std::vector<int32_t> prompt = prefixes[rng.Next() % prefixes.size()];
    const std::vector<int32_t> own = Tokens(static_cast<int64_t>(16 + rng.Next() % 64), 1000 + i);
    prompt.insert(prompt.end(), own.begin(), own.end());
    reqs.push_back({0.05 * i, prompt, static_cast<int64_t>(1 + rng.Next() % 16)});
  }
  ClusterOptions o = Options(1, 2);
  o.worker.num_blocks = 64;
  o.worker.max_model_len = 1024;
  o.tiers.disk_blocks = 40;
  o.tiers.store_blocks = 100;
  auto source = ListSource(reqs);
  auto r = SimulateCluster(Profile(), o, *source);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->summary.ok, 300);
  EXPECT_GT(r->tier_loads, 0);
  EXPECT_GT(r->store_evictions, 0);
  for (const SimWorkerStats& w : r->workers) EXPECT_EQ(w.used_blocks_at_end, 0);
}

TEST(SimulatorTest, EveryBlockIsFreeAndEveryRequestEndsUnderLoad) {
  // Many requests at once on small pools: preemptions, reservation refusals, chunked prefill.
  std::vector<SimRequest> reqs;
  SplitMix64 rng(9);
  for (int i = 0; i < 300; ++i) {
    reqs.push_back({0.001 * i, Tokens(50 + static_cast<int64_t>(rng.Next() % 400), 100 + i),
                    1 + static_cast<int64_t>(rng.Next() % 60)});
  }
  ClusterOptions o = Options(1, 2);
  o.worker.num_blocks = 80;
  o.worker.max_model_len = 1024;
  o.worker.max_num_batched_tokens = 256;
  auto source = ListSource(reqs);
  auto r = SimulateCluster(Profile(), o, *source);
  ASSERT_TRUE(r.ok()) << r.status();
  int64_t preemptions = 0;
  for (const SimWorkerStats& w : r->workers) preemptions += w.preemptions;
  EXPECT_GT(preemptions, 0) << "small pools must preempt, or this proves less";
  for (size_t i = 0; i < reqs.size(); ++i) {
    const SimRequestResult& q = r->requests[i];
    ASSERT_TRUE(q.ok) << i;
    EXPECT_EQ(q.completion_tokens, reqs[i].output_tokens) << i;
    EXPECT_GE(q.ttft_seconds, 0.010) << i;
    EXPECT_EQ(static_cast<int64_t>(q.itl_seconds.size()), reqs[i].output_tokens - 1) << i;
  }
  EXPECT_EQ(r->local_prefills + r->remote_prefills, 300);
  EXPECT_GT(r->remote_prefills, 0);
  for (const SimWorkerStats& w : r->workers) EXPECT_EQ(w.used_blocks_at_end, 0) << w.tier;
}

TEST(SimulatorTest, TheSummaryIsLoadClientsOverTheRequests) {
  // The constant-memory summary against bench's Summarize over the kept per-request records.
  std::vector<SimRequest> reqs;
  SplitMix64 rng(5);
  for (int i = 0; i < 400; ++i) {
    reqs.push_back({0.004 * i, Tokens(20 + static_cast<int64_t>(rng.Next() % 300), i % 7),
                    1 + static_cast<int64_t>(rng.Next() % 50)});
  }
  ClusterOptions o = Options(1, 2);
  o.slo.ttft_ms = 60;
  o.slo.tpot_ms = 15;
  auto source = ListSource(reqs);
  auto r = SimulateCluster(Profile(), o, *source);
  ASSERT_TRUE(r.ok()) << r.status();
  LoadRun run;
  run.wall_seconds = r->end_seconds - r->first_arrival_seconds;
  for (const SimRequestResult& q : r->requests) {
    RequestResult x;
    x.ttft_seconds = q.ttft_seconds;
    x.e2e_seconds = q.e2e_seconds;
    x.itl_seconds = q.itl_seconds;
    x.prompt_tokens = q.prompt_tokens;
    x.cached_tokens = q.cached_tokens;
    x.completion_tokens = q.completion_tokens;
    run.results.push_back(x);
  }
  const LoadSummary want = Summarize(run, o.slo);
  const LoadSummary& got = r->summary;
  EXPECT_EQ(got.ok, want.ok);
  EXPECT_EQ(got.good, want.good);
  EXPECT_GT(want.good, 0);
  EXPECT_LT(want.good, want.ok) << "the SLO should split the requests, or goodput proves less";
  EXPECT_EQ(got.prompt_tokens, want.prompt_tokens);
  EXPECT_EQ(got.completion_tokens, want.completion_tokens);
  EXPECT_DOUBLE_EQ(got.hit_rate, want.hit_rate);
  EXPECT_DOUBLE_EQ(got.requests_per_second, want.requests_per_second);
  const std::pair<const Distribution*, const Distribution*> d[] = {
      {&got.ttft, &want.ttft}, {&got.tpot, &want.tpot}, {&got.itl, &want.itl}, {&got.e2e, &want.e2e}};
  for (const auto& [g, w] : d) {
    EXPECT_NEAR(g->mean, w->mean, 1e-9 + 1e-9 * w->mean);
    EXPECT_NEAR(g->p50, w->p50, 1.5e-3 * w->p50);
    EXPECT_NEAR(g->p90, w->p90, 1.5e-3 * w->p90);
    EXPECT_NEAR(g->p99, w->p99, 1.5e-3 * w->p99);
  }
}

TEST(SimulatorTest, SameInputSameResult) {
  std::vector<SimRequest> reqs;
  for (int i = 0; i < 50; ++i) reqs.push_back({0.01 * i, Tokens(200, i % 5), 10});
  ClusterOptions o = Options(2, 3);
  o.routing.temperature = 0.5;  // The softmax draw, seeded.
  auto a_src = ListSource(reqs), b_src = ListSource(reqs);
  auto a = SimulateCluster(Profile(), o, *a_src);
  auto b = SimulateCluster(Profile(), o, *b_src);
  ASSERT_TRUE(a.ok() && b.ok());
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(a->requests[i].ttft_seconds, b->requests[i].ttft_seconds);
    EXPECT_EQ(a->requests[i].e2e_seconds, b->requests[i].e2e_seconds);
  }
  // The seed drives those draws: at a temperature that makes them nearly uniform, another seed
  // routes the 50 requests otherwise.
  auto routed = [&](uint64_t seed) {
    ClusterOptions hot = o;
    hot.routing.temperature = 100;
    hot.seed = seed;
    auto src = ListSource(reqs);
    auto r = SimulateCluster(Profile(), hot, *src);
    EXPECT_TRUE(r.ok());
    std::vector<int64_t> per_worker;
    for (const SimWorkerStats& w : r->workers) per_worker.push_back(w.requests);
    return per_worker;
  };
  EXPECT_EQ(routed(1), routed(1));
  EXPECT_NE(routed(1), routed(2));
}

TEST(SimulatorTest, BadInputIsRefusedByName) {
  std::vector<SimRequest> reqs = {{1, Tokens(10, 1), 2}, {0.5, Tokens(10, 2), 2}};
  auto source = ListSource(reqs);
  auto r = SimulateCluster(Profile(), Options(0, 1), *source);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("before the one before it"), std::string::npos) << r.status();

  std::vector<SimRequest> long_one = {{0, Tokens(9000, 1), 2}, {0, Tokens(10, 1), 2}};
  auto s2 = ListSource(long_one);
  auto r2 = SimulateCluster(Profile(), Options(0, 1), *s2);
  ASSERT_TRUE(r2.ok());
  EXPECT_FALSE(r2->requests[0].ok);
  EXPECT_NE(r2->requests[0].error.find("max_model_len"), std::string::npos);
  EXPECT_TRUE(r2->requests[1].ok);

  ClusterOptions tiny = Options(0, 1);
  tiny.worker.num_blocks = 4;
  auto s3 = ListSource({});
  EXPECT_FALSE(SimulateCluster(Profile(), tiny, *s3).ok());
  ClusterOptions none = Options(1, 0);
  EXPECT_FALSE(SimulateCluster(Profile(), none, *s3).ok());
}

TEST(SimulatorTest, ProfilesParseAndBadOnesNameTheKey) {
  const std::string good = R"({"format": "pdserve-profile-v1", "modelled": true,
    "model": {"name": "m", "vocab_size": 500, "num_layers": 2, "num_kv_heads": 2, "head_dim": 8},
    "step_cost": {"a_seconds": 0.01, "b_per_token": 1e-4, "c_per_prefill_pair": 0,
                  "d_per_sequence": 0, "e_per_decode_key": 1e-8},
    "transport": {"latency_seconds": 2e-5, "bytes_per_second": 2.5e10}})";
  auto p = ParseSimProfile(good, "p.json", 2);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->modelled);
  EXPECT_EQ(p->kv_bytes_per_token, 2 * 2 * 2 * 8 * 2);
  EXPECT_EQ(p->vocab_size, 500);
  EXPECT_DOUBLE_EQ(p->step.e, 1e-8);
  std::string no_b = good;
  no_b.replace(no_b.find("\"b_per_token\": 1e-4"), 19, "\"b_per_token\": \"x\"");
  auto bad = ParseSimProfile(no_b, "p.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("b_per_token"), std::string::npos) << bad.status();
  EXPECT_FALSE(ParseSimProfile("{}", "p.json").ok());
  // A profile of another model is refused by the field that differs.
  ModelConfig c;
  c.vocab_size = 500;
  c.num_layers = 2;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.hidden_size = 64;  // The profile does not say: not compared.
  EXPECT_TRUE(CheckProfileModel(*p, c).ok());
  c.num_layers = 3;
  const absl::Status other = CheckProfileModel(*p, c);
  EXPECT_EQ(other.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(other.message().find("num_layers is 2, this model's 3"), std::string::npos) << other;
  EXPECT_FALSE(ParseSimProfile("not json", "p.json").ok());
}

TEST(SimulatorTest, TraceLinesBecomeSharedPrefixes) {
  const std::string path = ::testing::TempDir() + "/trace.jsonl";
  {
    std::ofstream f(path);
    f << R"({"timestamp": 0, "input_length": 1100, "output_length": 7, "hash_ids": [1, 2, 3]})" << "\n";
    f << R"({"timestamp": 250, "input_length": 700, "output_length": 3, "hash_ids": [1, 4]})" << "\n";
  }
  TraceOptions o;
  o.vocab_size = 1000;
  auto src = OpenTrace(path, o);
  ASSERT_TRUE(src.ok()) << src.status();
  SimRequest a, b, c;
  ASSERT_TRUE(*(*src)->Next(&a));
  ASSERT_TRUE(*(*src)->Next(&b));
  EXPECT_FALSE(*(*src)->Next(&c));
  EXPECT_EQ(a.prompt.size(), 1100u);
  EXPECT_EQ(b.prompt.size(), 700u);
  EXPECT_DOUBLE_EQ(b.arrival_seconds, 0.25);
  EXPECT_EQ(a.output_tokens, 7);
  // Block id 1 at position 0 in both: the same 512 tokens; then they differ.
  EXPECT_TRUE(std::equal(a.prompt.begin(), a.prompt.begin() + 512, b.prompt.begin()));
  EXPECT_FALSE(std::equal(a.prompt.begin() + 512, a.prompt.begin() + 700, b.prompt.begin() + 512));

  // Scaled by 1/32: 16-token blocks, lengths 34 and 22.
  o.length_scale = 1.0 / 32;
  o.time_scale = 0.1;
  auto scaled = OpenTrace(path, o);
  ASSERT_TRUE(scaled.ok());
  ASSERT_TRUE(*(*scaled)->Next(&a));
  ASSERT_TRUE(*(*scaled)->Next(&b));
  EXPECT_EQ(a.prompt.size(), 34u);
  EXPECT_EQ(b.prompt.size(), 22u);
  EXPECT_DOUBLE_EQ(b.arrival_seconds, 0.025);
  EXPECT_TRUE(std::equal(a.prompt.begin(), a.prompt.begin() + 16, b.prompt.begin()));

  {
    std::ofstream f(path);
    f << R"({"timestamp": 0, "input_length": 10, "output_length": 7, "hash_ids": [1]})" << "\n";
    f << R"({"timestamp": 5, "input_length": -3, "output_length": 7, "hash_ids": [1]})" << "\n";
  }
  auto broken = OpenTrace(path, TraceOptions{});
  ASSERT_TRUE(broken.ok());
  ASSERT_TRUE(*(*broken)->Next(&a));
  auto err = (*broken)->Next(&b);
  ASSERT_FALSE(err.ok());
  EXPECT_NE(err.status().message().find("line 2"), std::string::npos) << err.status();
  EXPECT_NE(err.status().message().find("input_length"), std::string::npos) << err.status();
  EXPECT_FALSE(OpenTrace(path + ".missing", TraceOptions{}).ok());
  std::remove(path.c_str());
}

}  // namespace
}  // namespace pdserve
