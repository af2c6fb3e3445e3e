// Engine-level equivalences: chunked = one-shot prefill, prefix reuse = fresh, batched = alone,
// preempted = uninterrupted, any thread count, run twice = same bits. With the default
// (batch-invariant) kernels these hold bitwise, and the tests assert exactly that.
#include "common/engine/llm_engine.h"
#include "common/engine/engine_test_util.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <cstring>
#include <map>
#include <thread>
#include <tuple>

#include "common/base/check.h"
#include "common/base/file_util.h"
#include "common/base/rng.h"
#include "common/base/strings.h"
#include "common/engine/shared_weights.h"
#include "common/kvcache/disk_tier.h"
#include "common/kvcache/host_tier.h"
#include "common/model/random_model.h"
#include "common/structured/grammar_matcher.h"
#include "common/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "kernels/cpu/linear_bf16.h"
#include "kernels/cpu/linear_quant_panels.h"
#include "kernels/cpu/linear_quant_vnni.h"

namespace pdserve {
namespace {

using namespace enginetest;  // NOLINT: the fixture's helpers, as they were here.

// Every family in both compute dtypes and with quantized KV pools: the bf16 path (VDPBF16PS, or
// its AVX2 twin on a CPU without it) and int8/int4 pages must keep each equivalence bitwise, as
// the f32 path does.
class EngineFamilyTest : public ::testing::TestWithParam<std::tuple<std::string, Mode>> {
 protected:
  std::string Dir() const {
    return ModelDir(std::get<0>(GetParam()), DType::kF32, std::get<1>(GetParam()).wide());
  }
  EngineOptions Opts() const { return ModeOptions(std::get<1>(GetParam())); }
};

TEST_P(EngineFamilyTest, ChunkedPrefillEqualsOneShotBitwise) {
  const std::string dir = Dir();
  const Request r{"r", Prompt(150, 1), Greedy(8)};
  const auto one_shot = RunEngine(dir, Opts(), {r});
  EXPECT_EQ(one_shot.at("r").tokens.size(), 8u);
  for (int chunk : {1, 7, 64}) {
    EngineOptions o = Opts();
    o.max_num_batched_tokens = chunk;
    ExpectBitwiseEqual(RunEngine(dir, o, {r}).at("r"), one_shot.at("r"),
                       "chunk " + std::to_string(chunk));
  }
}

TEST_P(EngineFamilyTest, BatchedEqualsAloneBitwise) {
  const std::string dir = Dir();
  std::vector<Request> requests;
  for (int i = 0; i < 8; ++i) {
    SamplingParams p = Greedy(6 + i);
    if (i % 2 == 1) {  // Seeded sampling too: the draw must not depend on the batch.
      p.temperature = 0.8f;
      p.top_p = 0.9f;
      p.seed = 100 + i;
    }
    requests.push_back({"req" + std::to_string(i), Prompt(5 + 13 * i, 20 + i), p});
  }
  std::map<std::string, Result> alone;
  for (const Request& r : requests) alone[r.id] = RunEngine(dir, Opts(), {r}).at(r.id);
  // Staggered arrivals so prefill chunks and decode tokens share steps.
  EngineOptions o = Opts();
  o.max_num_batched_tokens = 40;
  const auto batched = RunEngine(dir, o, requests, {0, 0, 1, 2, 3, 5, 8, 13});
  for (const Request& r : requests) ExpectBitwiseEqual(batched.at(r.id), alone.at(r.id), r.id);
}

TEST_P(EngineFamilyTest, PrefixReuseEqualsFreshBitwise) {
  const std::string dir = Dir();
  std::vector<int32_t> shared = Prompt(37, 5);
  std::vector<int32_t> b = shared;
  b.push_back(7);
  b.push_back(9);
  const Request first{"a", shared, Greedy(5)};
  const Request second{"b", b, Greedy(5)};
  const auto fresh = RunEngine(dir, Opts(), {second});
  EXPECT_EQ(fresh.at("b").cached_tokens, 0);
  const auto reused = RunEngine(dir, Opts(), {first, second}, {0, 20});
  EXPECT_EQ(reused.at("b").cached_tokens, 36);  // 9 full blocks of 4.
  ExpectBitwiseEqual(reused.at("b"), fresh.at("b"), "after prefix reuse");
}

TEST_P(EngineFamilyTest, PreemptionRecomputesToTheSameTokens) {
  const std::string dir = Dir();
  std::vector<Request> requests;
  for (int i = 0; i < 6; ++i) {
    SamplingParams p = Greedy(30);
    if (i % 2) {
      p.temperature = 1.0f;
      p.seed = i;
    }
    requests.push_back({std::string("p").append(std::to_string(i)), Prompt(20, 40 + i), p});
  }
  EngineStats roomy_stats, tight_stats;
  const auto roomy = RunEngine(dir, Opts(), requests, {}, &roomy_stats);
  EngineOptions tight = Opts();
  tight.num_kv_blocks = 26;  // 6 sequences of up to 50 tokens need 78 blocks: preemption.
  tight.max_model_len = 100;
  const auto squeezed = RunEngine(dir, tight, requests, {}, &tight_stats);
  EXPECT_EQ(roomy_stats.preemptions, 0);
  EXPECT_GT(tight_stats.preemptions, 0) << "the squeezed run must preempt, or it proves nothing";
  for (const Request& r : requests) {
    EXPECT_EQ(squeezed.at(r.id).tokens, roomy.at(r.id).tokens) << r.id;
    ExpectBitwiseEqual(squeezed.at(r.id), roomy.at(r.id), r.id);
  }
}

TEST_P(EngineFamilyTest, ThreadCountAndRepeatAreBitwiseIdentical) {
  const std::string dir = Dir();
  const Request r{"r", Prompt(33, 9), Greedy(10)};
  EngineOptions one = Opts();
  one.threads = 1;
  EngineOptions three = Opts();
  three.threads = 3;
  const auto a = RunEngine(dir, one, {r});
  ExpectBitwiseEqual(RunEngine(dir, three, {r}).at("r"), a.at("r"), "1 vs 3 threads");
  ExpectBitwiseEqual(RunEngine(dir, one, {r}).at("r"), a.at("r"), "run twice");
}

// A prompt that repeats itself with small edits (what a rewrite or an edit asks for), so n-gram
// drafts are proposed, some kept and some rejected.
std::vector<int32_t> RepeatingPrompt(uint64_t seed) {
  const std::vector<int32_t> phrase = Prompt(9, seed);
  std::vector<int32_t> p;
  for (int copy = 0; copy < 3; ++copy) {
    p.insert(p.end(), phrase.begin(), phrase.end());
    p[p.size() - 1 - static_cast<size_t>(copy)] = static_cast<int32_t>(seed % 200 + copy);
  }
  p.insert(p.end(), phrase.begin(), phrase.begin() + 4);
  return p;
}

// Speculative decoding's promise: whatever is drafted, the output equals plain decoding, ids and
// logits bitwise, greedy and seeded (top-p, top-k, penalties), batched with arrivals staggered.
TEST_P(EngineFamilyTest, SpeculativeEqualsPlainBitwise) {
  const std::string dir = Dir();
  std::vector<Request> requests;
  for (int i = 0; i < 6; ++i) {
    SamplingParams p = Greedy(24);
    if (i % 3 == 1) {
      p.temperature = 0.7f;
      p.top_k = 20;
      p.seed = 300 + i;
    } else if (i % 3 == 2) {
      p.temperature = 1.0f;
      p.top_p = 0.9f;
      p.frequency_penalty = 0.4f;
      p.repetition_penalty = 1.1f;
      p.seed = 300 + i;
    }
    requests.push_back({"s" + std::to_string(i), RepeatingPrompt(60 + i), p});
  }
  const std::vector<int> arrivals = {0, 0, 2, 3, 5, 9};
  EngineStats plain_stats, spec_stats;
  const auto plain = RunEngine(dir, Opts(), requests, arrivals, &plain_stats);
  EngineOptions o = Opts();
  o.speculative.method = SpeculativeMethod::kNgram;
  o.speculative.num_tokens = 4;
  o.speculative.ngram_min = 1;
  o.speculative.ngram_max = 3;
  // Every draft the adaptation allows: the step budget prices drafts by this machine's step
  // times (a sanitizer build's are other), and the counts below must not hang on them.
  o.speculative.step_budget = false;
  EXPECT_EQ(plain_stats.spec_drafts, 0);
  for (SpeculativeMethod method : {SpeculativeMethod::kNgram, SpeculativeMethod::kSuffix}) {
    o.speculative.method = method;
    const std::string name(SpeculativeMethodName(method));
    const auto spec = RunEngine(dir, o, requests, arrivals, &spec_stats);
    for (const Request& r : requests) ExpectBitwiseEqual(spec.at(r.id), plain.at(r.id), name + " " + r.id);
    // Both outcomes were exercised, or the equality proves little.
    EXPECT_GT(spec_stats.spec_accepted_tokens, 0) << name;
    EXPECT_GT(spec_stats.spec_draft_tokens, spec_stats.spec_accepted_tokens) << name;
    EXPECT_EQ(spec_stats.generated_tokens, plain_stats.generated_tokens) << name;
    int64_t by_position = 0;
    for (int64_t n : spec_stats.spec_accepted_by_position) by_position += n;
    EXPECT_EQ(by_position, spec_stats.spec_accepted_tokens) << name;
  }
  // With the step budget and the ledger on, as served by default: what is drafted then hangs on
  // this machine's step times, the output does not.
  o.speculative.step_budget = true;
  for (SpeculativeMethod method : {SpeculativeMethod::kNgram, SpeculativeMethod::kSuffix}) {
    o.speculative.method = method;
    const std::string name = Str(SpeculativeMethodName(method), " budgeted");
    const auto spec = RunEngine(dir, o, requests, arrivals, &spec_stats);
    for (const Request& r : requests) ExpectBitwiseEqual(spec.at(r.id), plain.at(r.id), name + " " + r.id);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Families, EngineFamilyTest,
    ::testing::Combine(::testing::Values("llama", "mistral", "qwen2", "qwen3"),
                       ::testing::ValuesIn(kModes)),
    [](const auto& info) { return std::get<0>(info.param) + "_" + ModeName(std::get<1>(info.param)); });

// bf16 compute moves logits by about bf16's precision and no more; on a CPU with AVX512-BF16
// the engine's output equals the AVX2 twin's bitwise, so any machine computes the same bits.
TEST(EngineTest, Bf16ComputeAgreesWithF32AndWithItsTwin) {
  for (DType weights : {DType::kBF16, DType::kF32}) {
    const std::string dir = ModelDir("qwen2", weights);
    const Request r{"r", Prompt(60, 4), Greedy(6)};
    EngineOptions f32 = SmallOptions();
    f32.compute_dtype = ComputeDType::kF32;
    EngineOptions bf16 = SmallOptions();
    bf16.compute_dtype = ComputeDType::kBF16;
    const auto a = RunEngine(dir, f32, {r}).at("r");
    const auto b = RunEngine(dir, bf16, {r}).at("r");
    ASSERT_FALSE(a.logits.empty());
    double max_abs = 0, max_diff = 0;
    for (size_t i = 0; i < a.logits[0].size(); ++i) {
      max_abs = std::max(max_abs, std::abs(double(a.logits[0][i])));
      max_diff = std::max(max_diff, std::abs(double(a.logits[0][i]) - b.logits[0][i]));
    }
    EXPECT_GT(max_diff, 0.0) << "bf16 compute must really round the activations";
    EXPECT_LT(max_diff / max_abs, 5e-2) << DTypeName(weights);
    kernels::SetBf16DotEnabled(false);
    const auto twin = RunEngine(dir, bf16, {r}).at("r");
    kernels::SetBf16DotEnabled(true);
    ExpectBitwiseEqual(twin, b, "AVX2 twin vs VDPBF16PS");
  }
}

// Engines given one SharedWeights (serve's prefill and decode workers) load the model once and
// share the cpu runner's matrix copies per compute dtype; their outputs are an unshared engine's
// bits; a second model directory is refused by name.
TEST(EngineTest, SharedWeightsLoadOnceAndGiveTheSameBits) {
  const std::string dir = ModelDir("qwen2", DType::kBF16);
  const Request r{"r", Prompt(40, 5), Greedy(5)};
  for (ComputeDType dtype : {ComputeDType::kF32, ComputeDType::kBF16}) {
    EngineOptions plain = SmallOptions();
    plain.compute_dtype = dtype;
    EngineOptions shared = plain;
    shared.shared_weights = std::make_shared<SharedWeights>();
    auto a = LLMEngine::Create(dir, shared);
    auto b = LLMEngine::Create(dir, shared);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(&(*a)->weights(), &(*b)->weights());
    EXPECT_EQ(shared.shared_weights->matrices_made(), 1);
    EngineOptions other_pages = shared;
    other_pages.weight_huge_pages = false;
    ASSERT_TRUE(LLMEngine::Create(dir, other_pages).ok());
    EXPECT_EQ(shared.shared_weights->matrices_made(), 2);  // Another kind of copy: its own.
    const auto alone = RunEngine(dir, plain, {r}).at("r");
    ExpectBitwiseEqual(RunEngine(dir, shared, {r}).at("r"), alone, "shared weights");
    auto elsewhere = LLMEngine::Create(ModelDir("llama"), shared);
    ASSERT_FALSE(elsewhere.ok());
    EXPECT_EQ(elsewhere.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(elsewhere.status().message().find(dir), std::string::npos) << elsewhere.status();
  }
}

// What bench-engine reads as the weights' own memory (decode_weight_memory) is the memory the
// forward pass reads: one region per matrix, layer by layer, then the LM head; zeroing any one
// changes the logits, zeroing the LM head's makes every logit 0, and restoring it gives the
// first bits back. In each form the runner reads: f32 in place, bf16 panels, Q8_0 quantized on
// load.
TEST(EngineTest, DecodeWeightMemoryIsWhatTheForwardPassReads) {
  const Mode modes[] = {{ComputeDType::kF32, KvDType::kF32},
                        {ComputeDType::kBF16, KvDType::kF32},
                        {ComputeDType::kF32, KvDType::kF32, WeightFormat::kQ8_0}};
  for (const Mode& mode : modes) {
    for (bool huge_pages : {true, false}) {
      EngineOptions o = ModeOptions(mode);
      o.weight_huge_pages = huge_pages;
      o.enable_prefix_caching = false;  // Every run computes its prompt's KV with the weights now.
      auto created = LLMEngine::Create(ModelDir("llama"), o);
      ASSERT_TRUE(created.ok()) << created.status();
      auto engine = std::move(*created);
      const std::string what = Str(ModeName(mode), huge_pages ? " huge pages" : " 4 KiB pages");
      const auto memory = engine->decode_weight_memory();
      const ModelConfig& c = engine->config();
      ASSERT_EQ(static_cast<int64_t>(memory.size()), 7 * c.num_layers + 1) << what;
      std::vector<float> logits;
      engine->SetLogitsObserver(
          [&](const std::string&, const float* l, int64_t v) { logits.assign(l, l + v); });
      int runs = 0;
      auto run = [&] {
        EXPECT_TRUE(engine->AddRequest(Str("r", runs++), Prompt(9, 3), Greedy(1)).ok());
        std::vector<RequestOutput> outs;
        while (engine->HasUnfinished()) EXPECT_TRUE(engine->Step(&outs).ok());
        return logits;
      };
      const std::vector<float> first = run();
      const bool writable = huge_pages || mode.compute == ComputeDType::kBF16 ||
                            mode.weights != WeightFormat::kAsStored;
      if (!writable) continue;  // Read in place from the checkpoint's read-only mapping.
      for (size_t i = 0; i < memory.size(); ++i) {
        auto* bytes = const_cast<std::byte*>(memory[i].data());
        const std::vector<std::byte> kept(bytes, bytes + memory[i].size());
        std::memset(bytes, 0, memory[i].size());
        const std::vector<float> zeroed = run();
        EXPECT_NE(zeroed, first) << what << ": region " << i;
        if (i + 1 == memory.size()) {
          EXPECT_EQ(zeroed, std::vector<float>(first.size(), 0.0f)) << what << ": the LM head";
        }
        std::memcpy(bytes, kept.data(), kept.size());
      }
      EXPECT_EQ(run(), first) << what;
    }
  }
}

// Quantized weights are read from panels packed at load wherever the build has the AVX2 panel
// kernels (each decode region is the packed copy: its size and bytes are the panels', not the
// row-major blocks'), and through the VNNI kernels where the CPU has AVX512-VNNI. Either decision
// could fall back to a slower path and every bitwise test would still pass.
TEST(EngineTest, QuantizedWeightsAreReadAsPanelsWithTheCpusKernels) {
  const char* panels = std::getenv("PDSERVE_QUANT_PANELS");
  const char* isa = std::getenv("PDSERVE_KERNEL_ISA");
  if (!__builtin_cpu_supports("avx2") || (panels != nullptr && std::strcmp(panels, "0") == 0)) {
    GTEST_SKIP() << "needs avx2: the quantized panel kernels";
  }
  const bool vnni = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                    __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
                    __builtin_cpu_supports("avx512vnni");
  EXPECT_EQ(kernels::QuantVnniEnabled(), vnni && !(isa != nullptr && std::strcmp(isa, "avx2") == 0));
  for (const Mode& mode : {Mode{ComputeDType::kF32, KvDType::kF32, WeightFormat::kQ8_0},
                           Mode{ComputeDType::kF32, KvDType::kF32, WeightFormat::kQ4_K_M}}) {
    EngineOptions o = ModeOptions(mode);
    o.weight_huge_pages = false;
    auto engine = LLMEngine::Create(ModelDir("llama", DType::kF32, mode.wide()), o);
    ASSERT_TRUE(engine.ok()) << engine.status();
    const auto memory = (*engine)->decode_weight_memory();
    const ModelWeights& w = (*engine)->weights();
    std::vector<const MatrixRef*> matrices;
    for (int64_t l = 0; l < (*engine)->config().num_layers; ++l) {
      const LayerWeights& lw = w.layer(l);
      for (const MatrixRef* m : {&lw.q_proj, &lw.k_proj, &lw.v_proj, &lw.o_proj, &lw.gate_proj, &lw.up_proj,
                                 &lw.down_proj}) {
        matrices.push_back(m);
      }
    }
    matrices.push_back(&w.lm_head());
    ASSERT_EQ(memory.size(), matrices.size());
    for (size_t i = 0; i < matrices.size(); ++i) {
      const MatrixRef& m = *matrices[i];
      ASSERT_TRUE(m.quantized()) << ModeName(mode) << " matrix " << i;
      EXPECT_EQ(static_cast<int64_t>(memory[i].size()), kernels::QuantPanelsBytes(m.quant_type, m.rows, m.cols))
          << ModeName(mode) << " matrix " << i;
      EXPECT_NE(std::memcmp(memory[i].data(), m.data, std::min(memory[i].size(), m.bytes())), 0)
          << ModeName(mode) << " matrix " << i << " is read row-major";
    }
  }
}

TEST(EngineTest, ComputeDTypeAutoAndConflicts) {
  const std::string bf16_dir = ModelDir("llama", DType::kBF16);
  EngineOptions o = SmallOptions();
  o.compute_dtype = ComputeDType::kAuto;
  auto e = LLMEngine::Create(bf16_dir, o);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ((*e)->compute_dtype(),
            kernels::Bf16DotEnabled() ? ComputeDType::kBF16 : ComputeDType::kF32);
  auto f32_model = LLMEngine::Create(ModelDir("llama"), o);
  ASSERT_TRUE(f32_model.ok());
  EXPECT_EQ((*f32_model)->compute_dtype(), ComputeDType::kF32);  // f32 weights: f32.
  o.prefill_gemm = PrefillGemm::kOpenBlas;
  auto blas = LLMEngine::Create(bf16_dir, o);
  ASSERT_TRUE(blas.ok());
  EXPECT_EQ((*blas)->compute_dtype(), ComputeDType::kF32);  // auto with OpenBLAS: f32.
  o.compute_dtype = ComputeDType::kBF16;
  auto conflict = LLMEngine::Create(bf16_dir, o);
  ASSERT_FALSE(conflict.ok());
  EXPECT_NE(conflict.status().message().find("OpenBLAS"), std::string::npos) << conflict.status();
}

TEST(EngineTest, Bf16WeightsAndBf16KvPool) {
  const std::string dir = ModelDir("llama", DType::kBF16);
  const Request r{"r", Prompt(40, 3), Greedy(6)};
  // Computing in bf16, attention rounds K and V to bf16 as it reads them: a bf16 pool changes
  // nothing, bit for bit.
  EngineOptions bf16_compute = SmallOptions();
  bf16_compute.compute_dtype = ComputeDType::kBF16;
  const auto bf16_compute_f32_pool = RunEngine(dir, bf16_compute, {r});
  bf16_compute.kv_dtype = KvDType::kBF16;
  const auto bf16_compute_bf16_pool = RunEngine(dir, bf16_compute, {r});
  ASSERT_EQ(bf16_compute_f32_pool.at("r").tokens, bf16_compute_bf16_pool.at("r").tokens);
  ASSERT_EQ(bf16_compute_f32_pool.at("r").logits, bf16_compute_bf16_pool.at("r").logits);
  // Computing in f32, the pool's rounding shows.
  EngineOptions f32_compute = SmallOptions();
  f32_compute.compute_dtype = ComputeDType::kF32;
  const auto f32_pool = RunEngine(dir, f32_compute, {r});
  EngineOptions o = f32_compute;
  o.kv_dtype = KvDType::kBF16;
  const auto bf16_pool = RunEngine(dir, o, {r});
  // Rounding K and V to bf16 moves logits by about 2^-8 relative; the first step must agree.
  ASSERT_FALSE(bf16_pool.at("r").logits.empty());
  const auto& a = f32_pool.at("r").logits[0];
  const auto& b = bf16_pool.at("r").logits[0];
  double max_abs = 0, max_diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    max_abs = std::max(max_abs, std::abs(double(a[i])));
    max_diff = std::max(max_diff, std::abs(double(a[i]) - b[i]));
  }
  EXPECT_LT(max_diff / max_abs, 3e-2);
  EXPECT_GT(max_diff, 0.0);  // The pool really is bf16.
}

// Quantized pools: logits move by the format's error and no more (int4 more than int8), the pool
// really is quantized, and the same memory holds proportionally more blocks.
TEST(EngineTest, QuantizedKvPoolsAgreeWithF32WithinTheirError) {
  const std::string dir = ModelDir("qwen2");
  const Request r{"r", Prompt(40, 3), Greedy(6)};
  const auto f32_pool = RunEngine(dir, SmallOptions(), {r});
  double rel[2] = {0, 0};
  int i = 0;
  for (KvDType kv : {KvDType::kInt8, KvDType::kInt4}) {
    EngineOptions o = SmallOptions();
    o.kv_dtype = kv;
    const auto q = RunEngine(dir, o, {r});
    ASSERT_FALSE(q.at("r").logits.empty());
    const auto& a = f32_pool.at("r").logits[0];
    const auto& b = q.at("r").logits[0];
    double max_abs = 0, max_diff = 0;
    for (size_t j = 0; j < a.size(); ++j) {
      max_abs = std::max(max_abs, std::abs(double(a[j])));
      max_diff = std::max(max_diff, std::abs(double(a[j]) - b[j]));
    }
    rel[i++] = max_diff / max_abs;
    EXPECT_GT(max_diff, 0.0) << KvDTypeName(kv);  // The pool really is quantized.
  }
  EXPECT_LT(rel[0], 2e-2);
  EXPECT_LT(rel[1], 2e-1);
  EXPECT_LT(rel[0], rel[1]);

  EngineOptions o = SmallOptions();
  o.num_kv_blocks = 0;
  o.kv_cache_gib = 1.0 / 64;
  int64_t blocks[4];
  for (KvDType kv : {KvDType::kF32, KvDType::kBF16, KvDType::kInt8, KvDType::kInt4}) {
    o.kv_dtype = kv;
    auto e = LLMEngine::Create(dir, o);
    ASSERT_TRUE(e.ok()) << e.status();
    const KvCacheSpec& spec = (*e)->kv_spec();
    blocks[static_cast<int>(kv)] = (*e)->Stats().kv.total_blocks;
    EXPECT_EQ(blocks[static_cast<int>(kv)],
              static_cast<int64_t>((size_t{1} << 30) / 64 / spec.BlockBytes()));
  }
  // head_dim 16: a row is 64 / 32 / 16 + 4 / 8 + 4 bytes.
  EXPECT_EQ(blocks[1], 2 * blocks[0]);
  EXPECT_EQ(blocks[2], blocks[0] * 64 / 20);
  EXPECT_EQ(blocks[3], blocks[0] * 64 / 12);
}

TEST(EngineTest, OpenBlasPrefillAgreesWithinTolerance) {
  const std::string dir = ModelDir("qwen2");
  const Request r{"r", Prompt(120, 8), Greedy(4)};
  const auto invariant = RunEngine(dir, SmallOptions(), {r});
  EngineOptions o = SmallOptions();
  o.prefill_gemm = PrefillGemm::kOpenBlas;
  const auto blas = RunEngine(dir, o, {r});
  const auto& a = invariant.at("r").logits[0];
  const auto& b = blas.at("r").logits[0];
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-4 * (1 + std::abs(a[i])));
  EXPECT_EQ(invariant.at("r").tokens, blas.at("r").tokens);
}

TEST(EngineTest, StopConditions) {
  const std::string dir = ModelDir("llama");
  auto engine = LLMEngine::Create(dir, SmallOptions());
  ASSERT_TRUE(engine.ok());
  const Request probe{"probe", Prompt(10, 2), Greedy(5)};
  const auto base = RunEngine(dir, SmallOptions(), {probe});
  const std::vector<int32_t> toks = base.at("probe").tokens;
  ASSERT_EQ(toks.size(), 5u);
  EXPECT_EQ(base.at("probe").finish_reason, "length");
  // A stop token id ends generation at its first occurrence, inclusive.
  SamplingParams p = Greedy(5);
  p.stop_token_ids = {toks[2]};
  const auto stopped = RunEngine(dir, SmallOptions(), {{"s", probe.prompt, p}});
  const size_t first = std::find(toks.begin(), toks.end(), toks[2]) - toks.begin();
  EXPECT_EQ(stopped.at("s").tokens, std::vector<int32_t>(toks.begin(), toks.begin() + first + 1));
  EXPECT_EQ(stopped.at("s").finish_reason, "stop");
}

TEST(EngineTest, EosStopsUnlessIgnored) {
  const std::string dir = ModelDir("llama");
  const std::vector<int32_t> prompt = Prompt(12, 4);
  const auto base = RunEngine(dir, SmallOptions(), {{"b", prompt, Greedy(6)}});
  const std::vector<int32_t> toks = base.at("b").tokens;
  // The same weights, with the third generated token declared EOS in generation_config.json.
  const std::string eos_dir = dir + "_eos";
  std::filesystem::remove_all(eos_dir);
  std::filesystem::create_directories(eos_dir);
  for (const auto& f : std::filesystem::directory_iterator(dir)) {
    std::filesystem::copy(f.path(), eos_dir + "/" + f.path().filename().string());
  }
  ASSERT_TRUE(WriteStringToFile(JoinPath(eos_dir, "generation_config.json"),
                                "{\"eos_token_id\": [" + std::to_string(toks[2]) + "]}").ok());
  SamplingParams p = Greedy(6);
  p.ignore_eos = false;
  const auto stopped = RunEngine(eos_dir, SmallOptions(), {{"s", prompt, p}});
  const size_t first = std::find(toks.begin(), toks.end(), toks[2]) - toks.begin();
  EXPECT_EQ(stopped.at("s").tokens, std::vector<int32_t>(toks.begin(), toks.begin() + first + 1));
  EXPECT_EQ(stopped.at("s").finish_reason, "stop");
  p.ignore_eos = true;
  const auto ignored = RunEngine(eos_dir, SmallOptions(), {{"i", prompt, p}});
  EXPECT_EQ(ignored.at("i").tokens, toks);
  EXPECT_EQ(ignored.at("i").finish_reason, "length");
}

TEST(EngineTest, BadRequestsAreRejectedWithTheField) {
  const std::string dir = ModelDir("llama");
  EngineOptions o = SmallOptions();
  o.max_model_len = 64;
  auto engine = LLMEngine::Create(dir, o);
  ASSERT_TRUE(engine.ok());
  LLMEngine& e = **engine;
  EXPECT_NE(e.AddRequest("a", {}, Greedy(1)).message().find("prompt"), absl::string_view::npos);
  auto bad_id = e.AddRequest("a", {1, 300, 2}, Greedy(1));
  EXPECT_EQ(bad_id.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad_id.message().find("300"), absl::string_view::npos);
  EXPECT_NE(e.AddRequest("a", Prompt(64, 1), Greedy(1)).message().find("max_model_len"),
            absl::string_view::npos);
  SamplingParams bad = Greedy(1);
  bad.top_p = 2;
  EXPECT_NE(e.AddRequest("a", {1}, bad).message().find("top_p"), absl::string_view::npos);
  ASSERT_TRUE(e.AddRequest("a", {1, 2}, Greedy(3)).ok());
  EXPECT_EQ(e.AddRequest("a", {1, 2}, Greedy(3)).code(), absl::StatusCode::kAlreadyExists);
  // Abort frees everything.
  std::vector<RequestOutput> outs;
  ASSERT_TRUE(e.Step(&outs).ok());
  EXPECT_TRUE(e.Abort("a", &outs));
  EXPECT_EQ(outs.back().finish_reason, "abort");
  EXPECT_FALSE(e.HasUnfinished());
  EXPECT_EQ(e.Stats().kv.used_blocks, 0);
}

// The disaggregated flow at engine level: a "prefill" engine computes the prompt (holding its
// blocks), its pages are copied into the blocks a "decode" engine reserved, and the decode engine
// continues. The tokens and logits must be bitwise those of one engine doing everything.
// In every mode: pages computed by one engine and decoded by another (int8/int4 pages with their
// scales) equal a colocated run bitwise.
class RemotePrefillTest : public ::testing::TestWithParam<Mode> {
 protected:
  EngineOptions Opts() const { return ModeOptions(GetParam()); }
};

TEST_P(RemotePrefillTest, ThroughCopiedPagesEqualsLocalBitwise) {
  const std::string dir = ModelDir("qwen3", DType::kF32, GetParam().wide());
  SamplingParams params = Greedy(12);
  params.temperature = 0.7f;
  params.seed = 1234;
  const std::vector<int32_t> prompt = Prompt(45, 77);
  const auto local = RunEngine(dir, Opts(), {{"r", prompt, params}});

  auto prefill = *LLMEngine::Create(dir, Opts());
  auto decode = *LLMEngine::Create(dir, Opts());
  // The logits that chose each token: the first on the prefill engine, the rest on the decode one.
  std::vector<std::vector<float>> logits;
  auto observe = [&logits](const std::string& id, const float* l, int64_t v) {
    if (id == "r") logits.emplace_back(l, l + v);
  };
  prefill->SetLogitsObserver(observe);
  decode->SetLogitsObserver(observe);
  // Warm the decode engine's prefix cache with the first 2 blocks so only the rest is sent.
  std::vector<int32_t> head(prompt.begin(), prompt.begin() + 9);
  ASSERT_TRUE(decode->AddRequest("warm", head, Greedy(1)).ok());
  std::vector<RequestOutput> outs;
  while (decode->HasUnfinished()) ASSERT_TRUE(decode->Step(&outs).ok());

  // Block size 4: the 9-token head left two full blocks cached.
  EXPECT_EQ(decode->CachedPrefixTokens(prompt), 8);
  EXPECT_EQ(decode->CachedPrefixTokens(Prompt(45, 78)), 0);
  EXPECT_EQ(decode->Stats().kv.used_blocks, 0);  // The probe took nothing.
  // The prefill engine has a cached prefix of its own (3 blocks): usage reports that reuse.
  std::vector<int32_t> phead(prompt.begin(), prompt.begin() + 13);
  ASSERT_TRUE(prefill->AddRequest("pwarm", phead, Greedy(1)).ok());
  std::vector<RequestOutput> pwarm;
  while (prefill->HasUnfinished()) ASSERT_TRUE(prefill->Step(&pwarm).ok());

  auto plan = decode->ReserveForRemotePrefill("r", prompt, params);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->cached_tokens, 8);
  SamplingParams first_only = params;
  first_only.max_tokens = 1;
  ASSERT_TRUE(prefill->AddRequest("r", prompt, first_only, RequestOptions{true}).ok());
  std::vector<RequestOutput> pouts;
  while (prefill->HasUnfinished()) ASSERT_TRUE(prefill->Step(&pouts).ok());
  ASSERT_EQ(pouts.size(), 1u);
  const auto src = prefill->BlockTable("r");
  ASSERT_EQ(src.size(), plan->blocks.size());
  CopyPages(*prefill, src, *decode, plan->blocks, plan->cached_tokens / prefill->kv_spec().block_size);
  prefill->ReleaseHeld("r");
  EXPECT_EQ(prefill->Stats().kv.used_blocks, 0);
  SampledToken first{pouts[0].tokens[0].token, pouts[0].tokens[0].logprob, {}};
  outs.clear();
  EXPECT_EQ(pouts[0].cached_tokens, 12);
  ASSERT_TRUE(decode->CompleteRemotePrefill("r", first, pouts[0].cached_tokens, &outs).ok());
  EXPECT_EQ(outs[0].cached_tokens, 12);
  std::vector<int32_t> tokens = {outs[0].tokens[0].token};
  while (decode->HasUnfinished()) {
    outs.clear();
    ASSERT_TRUE(decode->Step(&outs).ok());
    for (const auto& o : outs) {
      for (const auto& t : o.tokens) tokens.push_back(t.token);
    }
  }
  EXPECT_EQ(tokens, local.at("r").tokens);
  Result disaggregated;
  disaggregated.tokens = tokens;
  disaggregated.logits = logits;
  ExpectBitwiseEqual(disaggregated, local.at("r"), "prefill on one engine, decode on another");
  EXPECT_EQ(decode->Stats().kv.used_blocks, 0);
}

INSTANTIATE_TEST_SUITE_P(Modes, RemotePrefillTest, ::testing::ValuesIn(kModes),
                         [](const auto& info) { return ModeName(info.param); });

TEST(EngineTest, RemoteReservationAbortFreesBlocks) {
  auto engine = *LLMEngine::Create(ModelDir("llama"), SmallOptions());
  auto plan = engine->ReserveForRemotePrefill("x", Prompt(30, 1), Greedy(4));
  ASSERT_TRUE(plan.ok());
  EXPECT_GT(engine->Stats().kv.used_blocks, 0);
  EXPECT_TRUE(engine->Abort("x", nullptr));
  EXPECT_EQ(engine->Stats().kv.used_blocks, 0);
  EXPECT_FALSE(engine->HasUnfinished());
}

TEST(EngineTest, ReservationKeptAfterAbortUntilReleased) {
  // A one-sided transport may still write into an abandoned reservation: its blocks stay taken
  // under another name while the request id is free again at once.
  auto engine = *LLMEngine::Create(ModelDir("llama"), SmallOptions());
  auto plan = engine->ReserveForRemotePrefill("x", Prompt(30, 1), Greedy(4));
  ASSERT_TRUE(plan.ok());
  const std::vector<BlockId> reserved(plan->blocks.begin(), plan->blocks.end());
  const int64_t used = engine->Stats().kv.used_blocks;
  std::vector<RequestOutput> outs;
  const std::string kept = engine->AbortKeepingBlocks("x", &outs);
  ASSERT_FALSE(kept.empty());
  ASSERT_EQ(outs.size(), 1u);
  EXPECT_EQ(outs[0].finish_reason, "abort");
  EXPECT_EQ(engine->Stats().kv.used_blocks, used);
  EXPECT_FALSE(engine->HasUnfinished());
  // The same id runs again, locally, on other blocks.
  ASSERT_TRUE(engine->AddRequest("x", Prompt(30, 1), Greedy(4)).ok());
  std::vector<RequestOutput> run;
  while (engine->HasUnfinished()) ASSERT_TRUE(engine->Step(&run).ok());
  EXPECT_EQ(run.back().finish_reason, "length");
  ASSERT_EQ(engine->BlockTable(kept).size(), reserved.size());
  for (BlockId b : engine->BlockTable(kept)) {
    EXPECT_NE(std::find(reserved.begin(), reserved.end(), b), reserved.end());
  }
  EXPECT_EQ(engine->Stats().kv.used_blocks, used);  // Only the kept reservation.
  engine->ReleaseHeld(kept);
  EXPECT_EQ(engine->Stats().kv.used_blocks, 0);
  EXPECT_EQ(engine->AbortKeepingBlocks("unknown"), "");
}

TEST(EngineTest, OutputsCarryTokenGapsAndPhaseTimes) {
  auto engine = *LLMEngine::Create(ModelDir("llama"), SmallOptions());
  ASSERT_TRUE(engine->AddRequest("t", Prompt(20, 3), Greedy(4)).ok());
  std::vector<RequestOutput> all;
  while (engine->HasUnfinished()) ASSERT_TRUE(engine->Step(&all).ok());
  ASSERT_EQ(all.size(), 4u);
  EXPECT_EQ(all[0].itl_seconds, 0.0);  // The first token has no predecessor.
  double gaps = 0;
  for (size_t i = 1; i < all.size(); ++i) {
    EXPECT_GT(all[i].itl_seconds, 0.0);
    gaps += all[i].itl_seconds;
  }
  const RequestOutput& last = all.back();
  ASSERT_TRUE(last.finished);
  EXPECT_GE(last.queue_seconds, 0.0);
  EXPECT_GT(last.prefill_seconds, 0.0);
  // The decode phase is exactly the sum of the gaps; the phases tile the request.
  EXPECT_NEAR(last.decode_seconds, gaps, 1e-9);
  EXPECT_NEAR(last.queue_seconds + last.prefill_seconds, last.ttft_seconds, 1e-9);
  EXPECT_LE(last.ttft_seconds + last.decode_seconds, last.e2e_seconds + 1e-9);
  // An abort before the first token is finished with reason "abort" and a prefill phase only.
  ASSERT_TRUE(engine->AddRequest("a", Prompt(20, 4), Greedy(4)).ok());
  std::vector<RequestOutput> aborted;
  ASSERT_TRUE(engine->Abort("a", &aborted));
  ASSERT_EQ(aborted.size(), 1u);
  EXPECT_EQ(aborted[0].finish_reason, "abort");
  EXPECT_EQ(aborted[0].decode_seconds, 0.0);
}

// The cpu runner's phases tile its forward passes: each is timed between two consecutive marks,
// so they add up to no more than the forward time the engine measured around them, and every
// phase a plain step runs took time (the layer callback is unset here, so it stays zero).
TEST(EngineTest, ForwardPhasesTileTheForwardPasses) {
  auto engine = *LLMEngine::Create(ModelDir("llama"), SmallOptions());
  EXPECT_EQ(engine->Stats().forward_phase_seconds, ForwardPhaseSeconds{});
  ASSERT_TRUE(engine->AddRequest("t", Prompt(20, 3), Greedy(4)).ok());
  std::vector<RequestOutput> all;
  while (engine->HasUnfinished()) ASSERT_TRUE(engine->Step(&all).ok());
  const EngineStats stats = engine->Stats();
  double sum = 0;
  for (int i = 0; i < kNumForwardPhases; ++i) {
    const auto phase = static_cast<ForwardPhase>(i);
    if (phase == ForwardPhase::kLayerCallback) {
      EXPECT_EQ(stats.forward_phase_seconds[i], 0.0);
    } else {
      EXPECT_GT(stats.forward_phase_seconds[i], 0.0) << ForwardPhaseName(phase);
    }
    sum += stats.forward_phase_seconds[i];
  }
  EXPECT_LE(sum, stats.forward_seconds + 1e-9);
  EXPECT_EQ(ForwardPhaseName(ForwardPhase::kAttention), "attention");
  EXPECT_EQ(ForwardPhaseName(ForwardPhase::kLogits), "logits");
}

TEST(EngineTest, ResumedRequestContinuesLikeAnUninterruptedRun) {
  const std::string dir = ModelDir("llama");
  SamplingParams seeded = Greedy(14);
  seeded.temperature = 0.9f;
  seeded.seed = 1234;
  seeded.frequency_penalty = 0.5f;  // Output counts must include the resumed tokens.
  seeded.repetition_penalty = 1.2f;
  for (const SamplingParams& params : {Greedy(14), seeded}) {
    const std::vector<int32_t> prompt = Prompt(21, 8);
    const auto whole = RunEngine(dir, SmallOptions(), {{"w", prompt, params}}).at("w");
    ASSERT_EQ(whole.tokens.size(), 14u);
    for (size_t cut : {1u, 6u, 13u}) {
      auto engine = *LLMEngine::Create(dir, SmallOptions());
      RequestOptions resume;
      resume.resume_output.assign(whole.tokens.begin(), whole.tokens.begin() + cut);
      ASSERT_TRUE(engine->AddRequest("r", prompt, params, resume).ok());
      std::vector<int32_t> rest;
      std::vector<RequestOutput> outs;
      while (engine->HasUnfinished()) ASSERT_TRUE(engine->Step(&outs).ok());
      for (const RequestOutput& o : outs) {
        for (const TokenOutput& t : o.tokens) rest.push_back(t.token);
      }
      EXPECT_EQ(rest, std::vector<int32_t>(whole.tokens.begin() + cut, whole.tokens.end())) << cut;
      EXPECT_TRUE(outs.front().first_token);
      EXPECT_EQ(outs.back().finish_reason, "length");
      EXPECT_EQ(outs.back().completion_tokens, 14);
      EXPECT_EQ(engine->Stats().kv.used_blocks, 0);
    }
  }
  // Nothing left to generate, or a bad id: named errors.
  auto engine = *LLMEngine::Create(dir, SmallOptions());
  RequestOptions full;
  full.resume_output.assign(4, 7);
  absl::Status s = engine->AddRequest("f", Prompt(5, 1), Greedy(4), full);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("resume_output_ids"), absl::string_view::npos) << s;
  RequestOptions bad;
  bad.resume_output = {1, 100000};
  s = engine->AddRequest("b", Prompt(5, 1), Greedy(4), bad);
  EXPECT_NE(s.message().find("resume_output_ids: token id 100000 at position 1"), absl::string_view::npos) << s;
}

EngineOptions SpeculativeOptionsForTest(int32_t k = 4) {
  EngineOptions o = SmallOptions();
  o.speculative.method = SpeculativeMethod::kNgram;
  o.speculative.num_tokens = k;
  o.speculative.ngram_min = 1;
  o.speculative.ngram_max = 3;
  o.speculative.step_budget = false;  // Counts independent of this machine's step times.
  return o;
}

// A draft's rejected positions give their blocks back in the step that rejects them: after every
// step a running request holds exactly the blocks its computed tokens need (as plain decoding
// does), never those of a draft.
TEST(EngineTest, RejectedDraftsGiveTheirBlocksBack) {
  const std::string dir = ModelDir("llama");
  EngineOptions o = SpeculativeOptionsForTest(4);
  auto engine = LLMEngine::Create(dir, o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::map<std::string, int64_t> tokens;
  for (int i = 0; i < 4; ++i) {
    SamplingParams p = Greedy(40);
    if (i % 2 == 1) {
      p.temperature = 0.8f;
      p.seed = 40 + i;
    }
    const std::string id = Str("r", i);
    const std::vector<int32_t> prompt = RepeatingPrompt(80 + i);
    tokens[id] = static_cast<int64_t>(prompt.size());
    ASSERT_TRUE((*engine)->AddRequest(id, prompt, p).ok());
  }
  int64_t checked_after_rejection = 0, last_rejected = 0;
  for (int step = 0; (*engine)->HasUnfinished() && step < 1000; ++step) {
    std::vector<RequestOutput> outs;
    ASSERT_TRUE((*engine)->Step(&outs).ok());
    const EngineStats s = (*engine)->Stats();
    const int64_t rejected = s.spec_draft_tokens - s.spec_accepted_tokens;
    for (const RequestOutput& out : outs) {
      tokens[out.request_id] += static_cast<int64_t>(out.tokens.size());
      if (out.finished) continue;
      // The KV of every token but the last sampled one (computed by the next step), and after a
      // draft's step perhaps the slot of that last one (Truncate keeps the tokens'), no more.
      const int64_t t = tokens[out.request_id];
      const int64_t held = static_cast<int64_t>((*engine)->BlockTable(out.request_id).size());
      EXPECT_GE(held, (t - 1 + o.block_size - 1) / o.block_size) << out.request_id << " at step " << step;
      EXPECT_LE(held, (t + o.block_size - 1) / o.block_size)
          << out.request_id << " at step " << step << " with " << t << " tokens";
      if (rejected > last_rejected) ++checked_after_rejection;
    }
    last_rejected = rejected;
  }
  EXPECT_FALSE((*engine)->HasUnfinished());
  EXPECT_GT(checked_after_rejection, 5) << "too few steps rejected a draft to prove anything";
}

// Drafts are accepted in every temperature class on its own (a pooled count would hide a class
// that never accepts), and a request built to accept (a loop at low temperature) keeps most.
TEST(EngineTest, DraftsAreAcceptedInEveryTemperatureClass) {
  const std::string dir = ModelDir("llama");
  struct Class {
    const char* name;
    float temperature;
  };
  for (const Class& c : {Class{"greedy", 0.0f}, Class{"low", 0.3f}, Class{"warm", 0.8f}, Class{"hot", 1.2f}}) {
    std::vector<Request> requests;
    for (int i = 0; i < 4; ++i) {
      SamplingParams p = Greedy(32);
      p.temperature = c.temperature;
      p.seed = 500 + i;
      requests.push_back({Str(c.name, i), RepeatingPrompt(200 + i), p});
    }
    for (SpeculativeMethod method : {SpeculativeMethod::kNgram, SpeculativeMethod::kSuffix}) {
      EngineOptions o = SpeculativeOptionsForTest(4);
      o.speculative.method = method;
      EngineStats stats;
      RunEngine(dir, o, requests, {}, &stats);
      EXPECT_GT(stats.spec_accepted_tokens, 0) << c.name << " " << SpeculativeMethodName(method);
      EXPECT_GT(stats.spec_draft_tokens, stats.spec_accepted_tokens) << c.name;
    }
  }
  // A loop: the random model's greedy continuation of this prompt repeats a short cycle, which
  // the drafts then predict; at temperature 0.05 the seeded draws still follow it.
  std::vector<int32_t> loop;
  {
    const auto first = RunEngine(dir, SmallOptions(), {{"probe", Prompt(6, 77), Greedy(160)}});
    loop = Prompt(6, 77);
    const auto& t = first.at("probe").tokens;
    loop.insert(loop.end(), t.begin(), t.end());
  }
  SamplingParams p = Greedy(48);
  p.temperature = 0.05f;
  p.seed = 9;
  EngineStats stats;
  RunEngine(dir, SpeculativeOptionsForTest(4), {{"loop", loop, p}}, {}, &stats);
  ASSERT_GT(stats.spec_draft_tokens, 0);
  EXPECT_GT(static_cast<double>(stats.spec_accepted_tokens) / static_cast<double>(stats.spec_draft_tokens), 0.5)
      << stats.spec_accepted_tokens << " of " << stats.spec_draft_tokens;
}

// Preempted while speculating (drafted slots and all), recomputed, the same bits as a roomy plain
// run; stop tokens, max_tokens and max_model_len end a request inside an accepted draft as plain
// decoding ends it; nothing leaks (RunEngine checks every block is free at the end).
TEST(EngineTest, SpeculativeUnderPreemptionAndStopsEqualsPlain) {
  const std::string dir = ModelDir("llama");
  std::vector<Request> requests;
  for (int i = 0; i < 6; ++i) {
    SamplingParams p = Greedy(30);
    if (i % 2) {
      p.temperature = 1.0f;
      p.seed = 70 + i;
    }
    requests.push_back({"p" + std::to_string(i), RepeatingPrompt(80 + i), p});
  }
  const auto roomy = RunEngine(dir, SmallOptions(), requests);
  // A stop token and a max_tokens taken from the plain output, so they fall mid-draft.
  const std::vector<int32_t>& t0 = roomy.at("p0").tokens;
  requests[0].params.stop_token_ids = {t0[17]};
  requests[2].params.max_tokens = 11;
  const auto plain_cut = RunEngine(dir, SmallOptions(), requests);
  for (SpeculativeMethod method : {SpeculativeMethod::kNgram, SpeculativeMethod::kSuffix}) {
    EngineOptions tight = SpeculativeOptionsForTest();
    tight.speculative.method = method;
    tight.num_kv_blocks = 26;  // 6 sequences of up to 61 tokens need 96 blocks of 4: preemption.
    tight.max_model_len = 100;
    EngineStats stats;
    const auto squeezed = RunEngine(dir, tight, requests, {}, &stats);
    const std::string name(SpeculativeMethodName(method));
    EXPECT_GT(stats.preemptions, 0) << "the squeezed run must preempt, or it proves nothing";
    EXPECT_GT(stats.spec_accepted_tokens, 0) << name;
    for (const Request& r : requests) {
      ExpectBitwiseEqual(squeezed.at(r.id), plain_cut.at(r.id), name + " " + r.id);
      EXPECT_EQ(squeezed.at(r.id).finish_reason, plain_cut.at(r.id).finish_reason) << r.id;
    }
  }
  EXPECT_EQ(plain_cut.at("p0").finish_reason, "stop");
  EXPECT_EQ(plain_cut.at("p2").tokens.size(), 11u);
  // The context's end: a draft never runs past max_model_len.
  EngineOptions short_context = SpeculativeOptionsForTest();
  short_context.max_model_len = 40;
  const Request near_end{"e", RepeatingPrompt(7), Greedy(30)};
  EngineOptions plain_short = SmallOptions();
  plain_short.max_model_len = 40;
  const auto plain_end = RunEngine(dir, plain_short, {near_end});
  ExpectBitwiseEqual(RunEngine(dir, short_context, {near_end}).at("e"), plain_end.at("e"), "end");
  EXPECT_EQ(plain_end.at("e").finish_reason, "length");
}

// Requests aborted at every stage of a speculating batch leave no block behind; a request's
// num_speculative_tokens bounds its drafts (0: none) without changing its output.
TEST(EngineTest, SpeculativeAbortsFreeEverythingAndRequestsChooseTheirDraftLength) {
  const std::string dir = ModelDir("llama");
  auto engine = *LLMEngine::Create(dir, SpeculativeOptionsForTest());
  std::vector<RequestOutput> outs;
  for (int i = 0; i < 12; ++i) {
    ASSERT_TRUE(engine->AddRequest("c" + std::to_string(i), RepeatingPrompt(90 + i), Greedy(40)).ok());
  }
  for (int step = 0; engine->HasUnfinished(); ++step) {
    ASSERT_TRUE(engine->Step(&outs).ok());
    engine->Abort("c" + std::to_string(step % 12), &outs);  // Prefilling, drafting, or gone.
  }
  EXPECT_GT(engine->Stats().spec_drafts, 0);
  EXPECT_EQ(engine->Stats().kv.used_blocks, 0);

  const Request r{"r", RepeatingPrompt(5), Greedy(24)};
  const auto plain = RunEngine(dir, SmallOptions(), {r});
  for (int32_t k : {0, 1, 2}) {
    Request asked = r;
    asked.params.num_speculative_tokens = k;
    EngineStats stats;
    const auto out = RunEngine(dir, SpeculativeOptionsForTest(4), {asked}, {}, &stats);
    ExpectBitwiseEqual(out.at("r"), plain.at("r"), Str("k=", k));
    EXPECT_LE(stats.spec_draft_tokens, stats.spec_drafts * k) << k;
    if (k == 0) EXPECT_EQ(stats.spec_drafts, 0);
    for (size_t pos = static_cast<size_t>(std::max(k, 0)); pos < 4; ++pos) {
      EXPECT_EQ(stats.spec_accepted_by_position[pos], 0) << k;
    }
  }
}

TEST(EngineTest, SpeculativeOptionsAreChecked) {
  const std::string dir = ModelDir("llama");
  EngineOptions o = SpeculativeOptionsForTest();
  o.speculative.num_tokens = 17;
  auto bad = LLMEngine::Create(dir, o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--num-speculative-tokens"), absl::string_view::npos);
  o = SpeculativeOptionsForTest();
  o.speculative.ngram_max = 0;
  bad = LLMEngine::Create(dir, o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--spec-ngram-max"), absl::string_view::npos);
  o = SpeculativeOptionsForTest();
  o.backend = "cuda";
  bad = LLMEngine::Create(dir, o);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kUnimplemented) << bad.status();
  auto engine = *LLMEngine::Create(dir, SpeculativeOptionsForTest());
  SamplingParams p = Greedy(4);
  p.num_speculative_tokens = 17;
  absl::Status s = engine->AddRequest("x", {1, 2}, p);
  EXPECT_NE(s.message().find("num_speculative_tokens"), absl::string_view::npos) << s;
}

TEST(EngineTest, MaxModelLenThatDoesNotFitThePoolIsAClearError) {
  EngineOptions o = SmallOptions();
  o.num_kv_blocks = 4;
  o.max_model_len = 100;
  auto engine = LLMEngine::Create(ModelDir("llama"), o);
  ASSERT_FALSE(engine.ok());
  EXPECT_NE(engine.status().message().find("max_model_len"), absl::string_view::npos);
}


// Prefix blocks loaded from the disk tier give the bits computing them gives: a second engine (a
// restarted worker: a new pool, the same directory) loads the prefixes the first published, and
// one engine whose pool is too small to keep them loads them back after their eviction; outputs
// (ids and logits) equal an engine without tiers in f32, bf16 compute, int8 KV and Q4_K_M
// weights, and the loaded blocks are counted, not computed.
TEST(EngineTest, PrefixBlocksFromTheDiskTierGiveTheBitsOfComputingThem) {
  const Mode modes[] = {{ComputeDType::kF32, KvDType::kF32},
                        {ComputeDType::kBF16, KvDType::kF32},
                        {ComputeDType::kF32, KvDType::kInt8},
                        {ComputeDType::kF32, KvDType::kF32, WeightFormat::kQ4_K_M}};
  for (const Mode& mode : modes) {
    const std::string name = ModeName(mode);
    const std::string dir = ModelDir("llama", DType::kF32, mode.wide());
    std::vector<Request> requests;
    for (int i = 0; i < 6; ++i) {
      std::vector<int32_t> prompt = Prompt(37, 900 + i % 3);  // Three prefixes, each twice.
      const std::vector<int32_t> own = Prompt(3 + i, 50 + i);
      prompt.insert(prompt.end(), own.begin(), own.end());
      SamplingParams p = Greedy(6);
      if (i % 2 == 1) {
        p.temperature = 0.8f;
        p.seed = 70 + i;
      }
      requests.push_back({Str("t", i), prompt, p});
    }
    std::vector<int> arrivals;  // One at a time: each finds what the ones before published.
    for (int i = 0; i < 6; ++i) arrivals.push_back(12 * i);
    EngineStats plain_stats;
    const auto plain = RunEngine(dir, ModeOptions(mode), requests, arrivals, &plain_stats);

    std::string tier_dir;
    const EngineOptions o = WithDiskTier(ModeOptions(mode), Str("tier_", name), &tier_dir);
    {  // The first engine computes the prefixes and stores them.
      auto engine = LLMEngine::Create(dir, o);
      ASSERT_TRUE(engine.ok()) << engine.status();
      for (const Request& r : requests) ASSERT_TRUE((*engine)->AddRequest(r.id, r.prompt, r.params).ok());
      std::vector<RequestOutput> outs;
      while ((*engine)->HasUnfinished()) ASSERT_TRUE((*engine)->Step(&outs).ok());
      (*engine)->FlushKvOffload();
      EXPECT_GT((*engine)->Stats().tiers.at(0).second.stores, 0) << name;
    }
    // A restarted worker: a new engine over the same tier.
    EngineStats restarted;
    const auto again = RunEngine(dir, o, requests, arrivals, &restarted);
    for (const Request& r : requests) ExpectBitwiseEqual(again.at(r.id), plain.at(r.id), name + " restarted " + r.id);
    EXPECT_GT(restarted.offload.loaded_blocks, 0) << name;
    EXPECT_EQ(restarted.offload.failed_blocks, 0) << name;
    EXPECT_LT(restarted.prompt_tokens_computed, plain_stats.prompt_tokens_computed) << name;
    // A pool of 14 blocks of 4 (one request at a time): each prefix is evicted by the next and
    // comes back from the tier.
    EngineOptions small = o;
    small.num_kv_blocks = 14;
    EngineStats squeezed;
    const auto evicted = RunEngine(dir, small, requests, arrivals, &squeezed);
    for (const Request& r : requests) ExpectBitwiseEqual(evicted.at(r.id), plain.at(r.id), name + " evicted " + r.id);
    EXPECT_GT(squeezed.offload.loaded_blocks, 0) << name;
    EXPECT_GT(squeezed.kv.evictions, 0) << name;
    std::filesystem::remove_all(tier_dir);
  }
}

// A block that fails its checks on load is recomputed, never used; a request aborted while its
// prefix loads frees its blocks once the load ends; nothing leaks.
TEST(EngineTest, TierLoadsThatFailOrAreAbortedLeaveNothingBehind) {
  const std::string dir = ModelDir("llama");
  std::string tier_dir;
  const EngineOptions o = WithDiskTier(SmallOptions(), "tier_faults", &tier_dir);
  const Request r{"r", Prompt(41, 5), Greedy(5)};
  const auto plain = RunEngine(dir, SmallOptions(), {r});
  {
    auto engine = LLMEngine::Create(dir, o);
    ASSERT_TRUE(engine.ok());
    ASSERT_TRUE((*engine)->AddRequest(r.id, r.prompt, r.params).ok());
    std::vector<RequestOutput> outs;
    while ((*engine)->HasUnfinished()) ASSERT_TRUE((*engine)->Step(&outs).ok());
    (*engine)->FlushKvOffload();
  }
  // Every block's file corrupted: each load fails its checksum; the prompt is computed instead.
  for (const auto& e : std::filesystem::directory_iterator(tier_dir)) {
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(DiskTier::kHeaderBytes + 3);
    f.put('\x5a');
  }
  EngineStats stats;
  const auto corrupted = RunEngine(dir, o, {r}, {}, &stats);
  ExpectBitwiseEqual(corrupted.at("r"), plain.at("r"), "corrupted tier");
  EXPECT_GT(stats.offload.failed_blocks, 0);
  EXPECT_EQ(stats.offload.loaded_blocks, 0);
  EXPECT_GT(stats.tiers.at(0).second.corrupt, 0);
  // The blocks are stored again (by that run); a request aborted at once while they load.
  auto engine = LLMEngine::Create(dir, o);
  ASSERT_TRUE(engine.ok());
  ASSERT_TRUE((*engine)->AddRequest("gone", r.prompt, r.params).ok());
  std::vector<RequestOutput> outs;
  EXPECT_EQ((*engine)->Stats().offload.load_requests, 1) << "the abort must find its prefix loading";
  EXPECT_TRUE((*engine)->Abort("gone", &outs));
  ASSERT_EQ(outs.size(), 1u);
  EXPECT_EQ(outs[0].finish_reason, "abort");
  for (int i = 0; i < 1000 && (*engine)->HasScheduledWork(); ++i) ASSERT_TRUE((*engine)->Step(&outs).ok());
  EXPECT_FALSE((*engine)->HasUnfinished());
  EXPECT_EQ((*engine)->Stats().kv.used_blocks, 0);
  std::filesystem::remove_all(tier_dir);
}

// A decode engine's reservation for a remote prefill loads the prefix blocks the tiers hold
// first (the decode worker then asks its prefill worker only for the pages after them): the
// reservation reports its end with the cached tokens, the prefill engine's pages after those are
// copied in, and the request's tokens and logits equal a colocated run's bitwise. Aborted while
// loading, the reservation frees its blocks once the load ends and is never reported.
TEST(EngineTest, RemoteReservationLoadsTheTiersPrefixFirst) {
  const std::string dir = ModelDir("llama");
  std::string tier_dir;
  const EngineOptions o = WithDiskTier(SmallOptions(), "tier_reservation", &tier_dir);
  SamplingParams params = Greedy(8);
  params.temperature = 0.7f;
  params.seed = 99;
  const std::vector<int32_t> prompt = Prompt(42, 314);  // 10 full blocks of 4, then 2 tokens.
  const auto local = RunEngine(dir, SmallOptions(), {{"r", prompt, params}});
  {  // An earlier worker computed the prompt's first 7 blocks and stored them.
    auto writer = *LLMEngine::Create(dir, o);
    ASSERT_TRUE(writer->AddRequest("w", std::vector<int32_t>(prompt.begin(), prompt.begin() + 29), Greedy(1)).ok());
    std::vector<RequestOutput> outs;
    while (writer->HasUnfinished()) ASSERT_TRUE(writer->Step(&outs).ok());
    writer->FlushKvOffload();
  }
  auto decode = *LLMEngine::Create(dir, o);
  auto prefill = *LLMEngine::Create(dir, SmallOptions());
  std::vector<std::vector<float>> logits;
  auto observe = [&logits](const std::string& id, const float* l, int64_t v) {
    if (id == "r") logits.emplace_back(l, l + v);
  };
  prefill->SetLogitsObserver(observe);
  decode->SetLogitsObserver(observe);

  auto plan = decode->ReserveForRemotePrefill("r", prompt, params);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->cached_tokens, 0);
  ASSERT_TRUE(plan->tier_loading);
  std::vector<RequestOutput> outs;
  std::vector<TierReservation> loaded;
  for (int i = 0; i < 5000 && loaded.empty(); ++i) {
    ASSERT_TRUE(decode->Step(&outs).ok());
    decode->TakeTierReservations(&loaded);
  }
  ASSERT_EQ(loaded.size(), 1u);
  EXPECT_EQ(loaded[0].request_id, "r");
  EXPECT_EQ(loaded[0].cached_tokens, 28);  // The 7 stored blocks.
  EXPECT_TRUE(outs.empty());
  EXPECT_EQ(decode->Stats().offload.loaded_blocks, 7);
  EXPECT_EQ(decode->CachedPrefixTokens(prompt), 28) << "loaded blocks are published in the pool";

  SamplingParams first_only = params;
  first_only.max_tokens = 1;
  ASSERT_TRUE(prefill->AddRequest("r", prompt, first_only, RequestOptions{true}).ok());
  std::vector<RequestOutput> pouts;
  while (prefill->HasUnfinished()) ASSERT_TRUE(prefill->Step(&pouts).ok());
  ASSERT_EQ(pouts.size(), 1u);
  const auto src = prefill->BlockTable("r");
  ASSERT_EQ(src.size(), plan->blocks.size());
  CopyPages(*prefill, src, *decode, plan->blocks, loaded[0].cached_tokens / prefill->kv_spec().block_size);
  prefill->ReleaseHeld("r");
  SampledToken first{pouts[0].tokens[0].token, pouts[0].tokens[0].logprob, {}};
  ASSERT_TRUE(decode->CompleteRemotePrefill("r", first, pouts[0].cached_tokens, &outs).ok());
  std::vector<int32_t> tokens = {outs[0].tokens[0].token};
  while (decode->HasUnfinished()) {
    outs.clear();
    ASSERT_TRUE(decode->Step(&outs).ok());
    for (const auto& out : outs) {
      for (const auto& t : out.tokens) tokens.push_back(t.token);
    }
  }
  Result disaggregated;
  disaggregated.tokens = tokens;
  disaggregated.logits = logits;
  ExpectBitwiseEqual(disaggregated, local.at("r"), "decode's prefix from the tier, the rest from prefill");

  // Aborted while loading (a fresh engine: nothing in its pool).
  auto other = *LLMEngine::Create(dir, o);
  auto again = other->ReserveForRemotePrefill("gone", prompt, params);
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE(again->tier_loading);
  EXPECT_FALSE(other->CompleteRemotePrefill("gone", first, 0, &outs).ok()) << "pages cannot complete a load";
  EXPECT_TRUE(other->Abort("gone", nullptr));
  for (int i = 0; i < 5000 && other->HasScheduledWork(); ++i) ASSERT_TRUE(other->Step(&outs).ok());
  loaded.clear();
  other->TakeTierReservations(&loaded);
  EXPECT_TRUE(loaded.empty()) << "an aborted reservation is not reported";
  EXPECT_FALSE(other->HasUnfinished());
  EXPECT_EQ(other->Stats().kv.used_blocks, 0);
  std::filesystem::remove_all(tier_dir);
}

// A request resumed on another worker (its output so far given back, as the router does after a
// decode worker dies) loads the blocks of its prompt and of that output from the tier that the
// first worker wrote, and continues with the tokens and logits of an uninterrupted run.
TEST(EngineTest, AResumedRequestLoadsItsPromptAndOutputFromTheTier) {
  const std::string dir = ModelDir("llama");
  std::string tier_dir;
  const EngineOptions o = WithDiskTier(SmallOptions(), "tier_resumed", &tier_dir);
  SamplingParams params = Greedy(20);
  params.temperature = 0.9f;
  params.seed = 4242;
  const Request r{"r", Prompt(30, 2718), params};
  const auto plain = RunEngine(dir, SmallOptions(), {r});
  const auto first = RunEngine(dir, o, {r});  // The first worker: it stores what it computed.
  ExpectBitwiseEqual(first.at("r"), plain.at("r"), "with the tier");
  const std::vector<int32_t>& all = plain.at("r").tokens;
  constexpr size_t kSent = 10;  // Tokens the client had when the first worker died.

  auto engine = *LLMEngine::Create(dir, o);
  Result resumed;
  engine->SetLogitsObserver([&](const std::string&, const float* l, int64_t v) { resumed.logits.emplace_back(l, l + v); });
  RequestOptions resume;
  resume.resume_output.assign(all.begin(), all.begin() + kSent);
  ASSERT_TRUE(engine->AddRequest("r", r.prompt, r.params, resume).ok());
  std::vector<RequestOutput> outs;
  while (engine->HasUnfinished()) ASSERT_TRUE(engine->Step(&outs).ok());
  for (const RequestOutput& out : outs) {
    for (const TokenOutput& t : out.tokens) resumed.tokens.push_back(t.token);
  }
  Result want;
  want.tokens.assign(all.begin() + kSent, all.end());
  want.logits.assign(plain.at("r").logits.begin() + kSent, plain.at("r").logits.end());
  ExpectBitwiseEqual(resumed, want, "resumed from the tier");
  // (30 + 10 - 1) / 4 = 9 blocks: the prompt's 7 and two of the first worker's output.
  EXPECT_EQ(engine->Stats().offload.loaded_blocks, 9);
  EXPECT_EQ(engine->Stats().kv.used_blocks, 0);
  std::filesystem::remove_all(tier_dir);
}

TEST(EngineTest, TierLoadPaysWhenReadingIsSoonerThanComputing) {
  // 8 blocks of 16 tokens: 128 tokens at 10 us = 1.28 ms of compute.
  EXPECT_TRUE(TierLoadPays(8, 0, 100e-6, 16, 10e-6));    // 0.8 ms of reading.
  EXPECT_FALSE(TierLoadPays(8, 0, 200e-6, 16, 10e-6));   // 1.6 ms.
  EXPECT_FALSE(TierLoadPays(8, 8, 100e-6, 16, 10e-6));   // 1.6 ms behind a queued load of 8.
  EXPECT_TRUE(TierLoadPays(8, 8, 100e-6, 16, 100e-6));   // A CPU's compute: 12.8 ms.
  EXPECT_TRUE(TierLoadPays(8, 0, 0, 16, 10e-6)) << "the tier not measured yet: load";
  EXPECT_TRUE(TierLoadPays(8, 0, 1.0, 16, 0)) << "the engine's compute not measured yet: load";
}

// Runs `requests` on `engine` one after another, each to its end and its blocks stored in the
// tiers before the next arrives (so what a request finds in a tier does not hang on the I/O
// thread's timing).
std::map<std::string, Result> RunOneByOne(LLMEngine* engine, const std::vector<Request>& requests) {
  std::map<std::string, Result> got;
  engine->SetLogitsObserver([&](const std::string& id, const float* l, int64_t v) { got[id].logits.emplace_back(l, l + v); });
  for (const Request& r : requests) {
    EXPECT_TRUE(engine->AddRequest(r.id, r.prompt, r.params).ok());
    std::vector<RequestOutput> outs;
    while (engine->HasUnfinished()) EXPECT_TRUE(engine->Step(&outs).ok());
    for (const RequestOutput& out : outs) {
      for (const TokenOutput& t : out.tokens) got[out.request_id].tokens.push_back(t.token);
    }
    engine->FlushKvOffload();
  }
  return got;
}

// A tier that takes `delay` a block to load (fault injection: a slow store standing in for a
// tier slower than the compute, as a 10 GbE store is for a GPU); everything else is `inner`'s.
class SlowTier : public KvTier {
 public:
  SlowTier(std::shared_ptr<KvTier> inner, std::chrono::milliseconds delay) : inner_(std::move(inner)), delay_(delay) {}
  std::string_view name() const override { return inner_->name(); }
  const char* event_medium() const override { return inner_->event_medium(); }
  bool Contains(const KvTierKey& k) const override { return inner_->Contains(k); }
  absl::Status Store(const KvTierKey& k, absl::Span<const uint8_t> b) override { return inner_->Store(k, b); }
  absl::Status Load(const KvTierKey& k, absl::Span<uint8_t> out) override {
    std::this_thread::sleep_for(delay_);
    return inner_->Load(k, out);
  }
  KvTierStats Stats() const override { return inner_->Stats(); }

 private:
  std::shared_ptr<KvTier> inner_;
  std::chrono::milliseconds delay_;
};

// With kv_tier_load kFaster a prefix the tier holds is computed when the tier (measured) reads
// it slower than the engine (measured) computes it; kAlways loads it. Outputs equal computing.
TEST(EngineTest, AnEngineComputesWhatItsTierWouldLoadSlowerThanItComputes) {
  const std::string dir = ModelDir("llama");
  HostTierOptions host;
  host.budget_bytes = int64_t{64} << 20;
  std::shared_ptr<KvTier> tier = std::shared_ptr<KvTier>(*HostTier::Create(host));
  const Request warm{"warm", Prompt(200, 31), Greedy(2)};  // >= 128 tokens a step: measures compute.
  const Request p1{"p1", Prompt(61, 32), Greedy(4)}, p2{"p2", Prompt(61, 33), Greedy(4)};
  const auto plain = RunEngine(dir, SmallOptions(), {warm, p1, p2});
  EngineOptions o = SmallOptions();
  o.kv_tiers = {tier};
  RunEngine(dir, o, {p1, p2});  // Stores both prefixes (15 blocks each).
  ASSERT_GE(tier->Stats().blocks, 30);
  for (KvTierLoad policy : {KvTierLoad::kFaster, KvTierLoad::kAlways}) {
    EngineOptions slow = SmallOptions();
    slow.kv_tiers = {std::make_shared<SlowTier>(tier, std::chrono::milliseconds(10))};
    slow.kv_tier_load = policy;
    auto engine = LLMEngine::Create(dir, slow);
    ASSERT_TRUE(engine.ok()) << engine.status();
    // One at a time: warm (computed: the engine's figure), p1 (loaded: the tier's figure), p2.
    const auto got = RunOneByOne(engine->get(), {warm, p1, p2});
    const EngineStats s = (*engine)->Stats();
    const bool faster = policy == KvTierLoad::kFaster;
    for (const Request& r : {warm, p1, p2}) ExpectBitwiseEqual(got.at(r.id), plain.at(r.id), r.id + (faster ? " faster" : " always"));
    // kFaster: p1's 15 blocks (the tier unmeasured before); kAlways (after kFaster stored warm's
    // blocks too): warm's (200 - 1) / 4 = 49, p1's and p2's.
    EXPECT_EQ(s.offload.loaded_blocks, faster ? 15 : 49 + 30);
    EXPECT_EQ(s.offload.declined_loads, faster ? 1 : 0) << "p2: 15 blocks at ~10 ms against ~us a token";
    EXPECT_EQ((*engine)->TierLoadsDeclined(), faster) << "what its load reports tell routers";
  }
}

// The host tier between a pool and computing: a pool too small to keep three prefixes loads
// each back from host memory after its eviction; outputs equal an engine without tiers.
TEST(EngineTest, PrefixBlocksFromTheHostTierGiveTheBitsOfComputingThem) {
  const std::string dir = ModelDir("llama");
  std::vector<Request> requests;
  for (int i = 0; i < 6; ++i) {
    std::vector<int32_t> prompt = Prompt(37, 700 + i % 3);
    const std::vector<int32_t> own = Prompt(2 + i, 60 + i);
    prompt.insert(prompt.end(), own.begin(), own.end());
    requests.push_back({Str("h", i), prompt, Greedy(5)});
  }
  const auto plain = RunEngine(dir, SmallOptions(), requests);
  EngineOptions o = SmallOptions();
  o.num_kv_blocks = 14;
  HostTierOptions host;
  host.budget_bytes = int64_t{16} << 20;
  o.kv_tiers = {std::shared_ptr<KvTier>(*HostTier::Create(host))};
  auto engine = LLMEngine::Create(dir, o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const auto got = RunOneByOne(engine->get(), requests);
  for (const Request& r : requests) ExpectBitwiseEqual(got.at(r.id), plain.at(r.id), "host tier " + r.id);
  const EngineStats stats = (*engine)->Stats();
  // h3..h5 find their prefix (9 blocks of 4) evicted from the pool and load it back.
  EXPECT_EQ(stats.offload.loaded_blocks, 27);
  EXPECT_GT(stats.kv.evictions, 0);
  EXPECT_EQ(stats.kv.used_blocks, 0);
  ASSERT_EQ(stats.tiers.size(), 1u);
  EXPECT_EQ(stats.tiers[0].first, "host");
  EXPECT_EQ(stats.tiers[0].second.corrupt, 0);
}

// A request that arrives while the pool has no room for it is queued; once it heads the queue
// and fits, it still loads its prefix from the tiers instead of computing it.
TEST(EngineTest, ARequestQueuedForRoomStillLoadsItsPrefixFromTheTiers) {
  const std::string dir = ModelDir("llama");
  HostTierOptions host;
  host.budget_bytes = int64_t{16} << 20;
  std::shared_ptr<KvTier> tier = std::shared_ptr<KvTier>(*HostTier::Create(host));
  const Request a{"a", Prompt(40, 81), Greedy(30)}, b{"b", Prompt(41, 82), Greedy(4)};
  const auto plain = RunEngine(dir, SmallOptions(), {a, b});
  EngineOptions o = SmallOptions();
  o.kv_tiers = {tier};
  RunEngine(dir, o, {b});  // b's prefix: 10 blocks in the tier.
  o.num_kv_blocks = 20;    // a holds 11 blocks at admission (18 by its end): b's 11 do not fit.
  auto engine = LLMEngine::Create(dir, o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::map<std::string, Result> got;
  (*engine)->SetLogitsObserver([&](const std::string& id, const float* l, int64_t v) { got[id].logits.emplace_back(l, l + v); });
  ASSERT_TRUE((*engine)->AddRequest(a.id, a.prompt, a.params).ok());
  std::vector<RequestOutput> outs;
  ASSERT_TRUE((*engine)->Step(&outs).ok());
  ASSERT_TRUE((*engine)->AddRequest(b.id, b.prompt, b.params).ok());
  EXPECT_EQ((*engine)->Stats().offload.load_requests, 0) << "no room for b yet: queued";
  EXPECT_EQ((*engine)->Stats().waiting, 1);
  while ((*engine)->HasUnfinished()) ASSERT_TRUE((*engine)->Step(&outs).ok());
  for (const RequestOutput& out : outs) {
    for (const TokenOutput& t : out.tokens) got[out.request_id].tokens.push_back(t.token);
  }
  for (const Request& r : {a, b}) ExpectBitwiseEqual(got.at(r.id), plain.at(r.id), r.id);
  const EngineStats s = (*engine)->Stats();
  EXPECT_EQ(s.offload.load_requests, 1);
  EXPECT_EQ(s.offload.loaded_blocks, 10) << "b's prefix came from the tier once a finished";
  EXPECT_EQ(s.kv.used_blocks, 0);
}

// A constraint that no token of the vocabulary can continue, and that cannot end, finishes with
// its own reason (kFinishConstraintDeadEnd) at once, not with "length" before max_tokens: here
// the vocabulary has no token for '~' (its byte token made a special token, which writes
// nothing), and the regex needs one.
TEST(EngineTest, AConstraintThatNoTokenContinuesEndsAsADeadEnd) {
  const std::string dir = JoinPath(TempRootPath(), "no_tilde");
  std::filesystem::remove_all(dir);
  std::filesystem::copy(ModelDir("llama"), dir);
  auto text = ReadFileToString(JoinPath(dir, "tokenizer.json"));
  ASSERT_TRUE(text.ok());
  auto tok = nlohmann::json::parse(*text);
  auto& vocab = tok["model"]["vocab"];
  ASSERT_TRUE(vocab.contains("~"));
  const int id = vocab["~"].get<int>();
  vocab.erase("~");
  nlohmann::json merges = nlohmann::json::array();
  for (const auto& m : tok["model"]["merges"]) {
    const std::string joined = m.is_array() ? m[0].get<std::string>() + m[1].get<std::string>() : m.get<std::string>();
    if (joined.find('~') == std::string::npos) merges.push_back(m);
  }
  tok["model"]["merges"] = merges;
  tok["added_tokens"].push_back({{"id", id}, {"content", "<|no_tilde|>"}, {"single_word", false}, {"lstrip", false},
                                 {"rstrip", false}, {"normalized", false}, {"special", true}});
  ASSERT_TRUE(WriteStringToFile(JoinPath(dir, "tokenizer.json"), tok.dump()).ok());
  using structured::OutputConstraint;
  std::vector<Request> requests;
  for (const char* regex : {"~+", "ab?~"}) {
    SamplingParams p;
    p.temperature = 1.0f;
    p.max_tokens = 20;
    p.seed = 3;
    p.constraint = std::make_shared<OutputConstraint>(OutputConstraint{OutputConstraint::Kind::kRegex, regex, {}, ""});
    requests.push_back({regex, Prompt(9, 12), p});
  }
  const auto got = RunEngine(dir, SmallOptions(), requests);
  EXPECT_EQ(got.at("~+").finish_reason, kFinishConstraintDeadEnd);
  EXPECT_TRUE(got.at("~+").tokens.empty());
  EXPECT_EQ(got.at("ab?~").finish_reason, kFinishConstraintDeadEnd);
  EXPECT_LT(got.at("ab?~").tokens.size(), 3u);  // "a" or "ab", then nothing continues.
}

// Structured outputs on a random model at temperature 1 (the worst case: it knows nothing of
// JSON): every output that ends with `stop` is a whole string of its constraint's language (and
// one that ends with `length` a prefix of one), and constraints keep every equivalence bitwise:
// batched = alone, speculative = plain, resumed = uninterrupted. Python's jsonschema and re check
// real outputs independently in tests/e2e/test_structured_outputs.py.
TEST(EngineTest, ConstrainedOutputsStayInTheirLanguageUnderEveryInvariance) {
  using structured::OutputConstraint;
  using Kind = OutputConstraint::Kind;
  const std::string dir = ModelDir("llama");
  auto tokenizer = Tokenizer::Load(dir);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const std::vector<std::shared_ptr<const OutputConstraint>> constraints = {
      std::make_shared<OutputConstraint>(OutputConstraint{
          Kind::kJsonSchema,
          R"({"type":"object","properties":{"id":{"type":"integer"},"name":{"type":"string","maxLength":5},)"
          R"("color":{"enum":["red","green"]},"ok":{"type":"array","items":{"type":"boolean"},"maxItems":2}},)"
          R"("required":["id","name","color"]})",
          {}}),
      std::make_shared<OutputConstraint>(OutputConstraint{Kind::kRegex, R"((\d{1,3}\.){3}\d{1,3})", {}}),
      std::make_shared<OutputConstraint>(OutputConstraint{Kind::kChoice, "", {"alpha", "beta", "al"}}),
      std::make_shared<OutputConstraint>(OutputConstraint{Kind::kGrammar, R"g(root ::= "(" root ")" | "x")g", {}}),
  };
  std::vector<Request> requests;
  for (size_t c = 0; c < constraints.size(); ++c) {
    for (int seed = 0; seed < 4; ++seed) {
      SamplingParams p;
      p.temperature = 1.0f;
      p.max_tokens = 60;
      p.seed = 1000 * c + seed;
      if (seed == 3) p.top_p = 0.8f;
      p.constraint = constraints[c];
      requests.push_back({Str("c", c, "s", seed), Prompt(7 + seed, 40 + c), p});
    }
  }
  std::map<std::string, Result> alone;
  for (const Request& r : requests) alone[r.id] = RunEngine(dir, SmallOptions(), {r}).at(r.id);
  int stops = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const Result& r = alone.at(requests[i].id);
    auto grammar = structured::CompileConstraint(*requests[i].params.constraint);
    ASSERT_TRUE(grammar.ok()) << grammar.status();
    structured::GrammarMatcher m(*grammar);
    std::string text;
    for (size_t t = 0; t < r.tokens.size(); ++t) {
      auto bytes = (*tokenizer)->TokenBytes(r.tokens[t]);
      if (!bytes) {  // Only EOS, and only last.
        EXPECT_EQ(t + 1, r.tokens.size()) << requests[i].id;
        EXPECT_EQ(r.finish_reason, "stop") << requests[i].id;
        continue;
      }
      text += *bytes;
    }
    EXPECT_TRUE(m.Advance(text)) << requests[i].id << ": " << text;
    if (r.finish_reason == "stop") {
      ++stops;
      EXPECT_TRUE(m.CanEnd()) << requests[i].id << ": " << text;
    } else {
      EXPECT_EQ(r.finish_reason, "length") << requests[i].id;
    }
  }
  EXPECT_GE(stops, 12) << "too few outputs completed to prove much";
  EngineOptions o = SmallOptions();
  o.max_num_batched_tokens = 40;
  std::vector<int> arrivals;
  for (size_t i = 0; i < requests.size(); ++i) arrivals.push_back(static_cast<int>(i % 5));
  EngineStats stats;
  const auto batched = RunEngine(dir, o, requests, arrivals, &stats);
  for (const Request& r : requests) ExpectBitwiseEqual(batched.at(r.id), alone.at(r.id), "batched " + r.id);
  EXPECT_EQ(stats.structured_compiled, static_cast<int64_t>(constraints.size()));
  EXPECT_GT(stats.structured_mask_lookups, 2 * stats.structured_masks_computed);  // Masks reused.
  const auto spec = RunEngine(dir, SpeculativeOptionsForTest(), requests, arrivals);
  for (const Request& r : requests) ExpectBitwiseEqual(spec.at(r.id), alone.at(r.id), "speculative " + r.id);
  // Masks computed on a second thread during the forward passes (as a GPU backend does): the same.
  o.overlap_masks = 1;
  EngineStats overlapped;
  const auto overlap = RunEngine(dir, o, requests, arrivals, &overlapped);
  for (const Request& r : requests) ExpectBitwiseEqual(overlap.at(r.id), alone.at(r.id), "overlapped " + r.id);
  EXPECT_GT(overlapped.structured_masks_overlapped, 0);
  EXPECT_EQ(overlapped.structured_mask_lookups, stats.structured_mask_lookups);  // Not counted twice.
  EXPECT_EQ(stats.structured_masks_overlapped, 0);  // Off on the cpu backend by default.

  // Resumed after 3 tokens elsewhere: the matcher replays them and the rest is the same.
  const Request& r0 = requests[0];
  const Result& whole = alone.at(r0.id);
  ASSERT_GT(whole.tokens.size(), 4u);
  auto engine = *LLMEngine::Create(dir, SmallOptions());
  RequestOptions resume;
  resume.resume_output.assign(whole.tokens.begin(), whole.tokens.begin() + 3);
  ASSERT_TRUE(engine->AddRequest("r", r0.prompt, r0.params, resume).ok());
  std::vector<RequestOutput> outs;
  while (engine->HasUnfinished()) ASSERT_TRUE(engine->Step(&outs).ok());
  std::vector<int32_t> rest;
  for (const RequestOutput& out : outs) {
    for (const TokenOutput& t : out.tokens) rest.push_back(t.token);
  }
  EXPECT_EQ(rest, std::vector<int32_t>(whole.tokens.begin() + 3, whole.tokens.end()));

  // Output the constraint refuses, a constraint that does not compile, a worker without a
  // tokenizer: named errors, nothing held.
  RequestOptions off;
  off.resume_output = {*(*tokenizer)->TokenToId("x")};  // A JSON object starts with '{'.
  absl::Status s = engine->AddRequest("bad", r0.prompt, r0.params, off);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("resume_output_ids: token"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("is not allowed by the json_schema constraint"), absl::string_view::npos) << s;
  SamplingParams bad = r0.params;
  bad.constraint = std::make_shared<OutputConstraint>(OutputConstraint{Kind::kJsonSchema, R"({"type":"integer","minimum":1})", {}});
  s = engine->AddRequest("bad", r0.prompt, bad);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("keyword 'minimum' is not supported"), absl::string_view::npos) << s;
  EXPECT_FALSE(engine->ReserveForRemotePrefill("bad", r0.prompt, bad).ok());
  EXPECT_FALSE(engine->HasUnfinished());
  EXPECT_EQ(engine->Stats().kv.used_blocks, 0);
  // The remote prefill's first token must be one the constraint allows.
  ASSERT_TRUE(engine->ReserveForRemotePrefill("rp", r0.prompt, r0.params).ok());
  outs.clear();
  s = engine->CompleteRemotePrefill("rp", SampledToken{*(*tokenizer)->TokenToId("x"), 0, {}}, 0, &outs);
  EXPECT_NE(s.message().find("is not allowed by its json_schema constraint"), absl::string_view::npos) << s;
  engine->Abort("rp", nullptr);
  EXPECT_EQ(engine->Stats().kv.used_blocks, 0);
  auto synthetic = *LLMEngine::CreateSynthetic(engine->config(), SmallOptions(), 1);
  s = synthetic->AddRequest("r", r0.prompt, r0.params);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
}

}  // namespace
}  // namespace pdserve
