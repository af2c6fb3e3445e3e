// What a constrained step's token mask costs (issue 37): the trie walk from a matcher's state
// over a vocabulary, at a few states of a JSON grammar (in a string, where nearly every token
// is allowed; after a value, where few are), and one byte of matcher advance.
//
// Then what a constrained request pays per token as served (ConstraintCache: the mask looked up
// by matcher state, computed on a miss; the matcher advanced by the token), cold (a new cache:
// every mask computed) and warm (a second request of the constraint), and the sampler with and
// without a mask.
//
//   build/bench/structured_bench
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "common/structured/grammar_matcher.h"
#include "common/structured/grammar_parser.h"
#include "common/sampling/sampler.h"
#include "common/structured/test_grammars.h"
#include "common/structured/token_constraint.h"
#include "common/structured/token_trie.h"
#include "common/tokenizer/tokenizer.h"

namespace pdserve::structured {
namespace {

using test_grammars::kCompactJson;

// A vocabulary shaped like a byte-level BPE one: every byte, then words of 2-10 bytes, some with
// a leading space or punctuation.
std::vector<std::string> Vocabulary(size_t n) {
  std::vector<std::string> v;
  for (int b = 0; b < 256; ++b) v.push_back(std::string(1, static_cast<char>(b)));
  std::mt19937 rng(1);
  const std::string letters = "etaoinshrdlucmfwypvbgkqjxz";
  const std::string punct = " \",:{}[].0123456789";
  while (v.size() < n) {
    std::string t;
    if (rng() % 2) t += ' ';
    if (rng() % 6 == 0) t += punct[rng() % punct.size()];
    const size_t len = 2 + rng() % 9;
    while (t.size() < len) t += letters[rng() % letters.size()];
    v.push_back(t);
  }
  return v;
}

// A real vocabulary's token bytes (PDSERVE_BENCH_TOKENIZER: a tokenizer.json, e.g. Qwen 3's from
// scripts/oracle_setup.sh's packages), or empty.
const std::vector<std::string>& RealVocabulary() {
  static const auto* vocab = [] {
    auto* v = new std::vector<std::string>;
    const char* path = std::getenv("PDSERVE_BENCH_TOKENIZER");
    if (path == nullptr) return v;
    auto tok = Tokenizer::Load(path);
    if (!tok.ok()) return v;
    for (int32_t id = 0; id < (*tok)->vocab_size(); ++id) v->push_back((*tok)->TokenBytes(id).value_or(""));
    return v;
  }();
  return *vocab;
}

// vocab 0: RealVocabulary().
void BM_TokenMask(benchmark::State& state) {
  const auto grammar = *ParseGrammar(kCompactJson);
  if (state.range(0) == 0 && RealVocabulary().empty()) {
    state.SkipWithError("set PDSERVE_BENCH_TOKENIZER to a tokenizer.json");
    return;
  }
  const TokenTrie trie(state.range(0) == 0 ? RealVocabulary() : Vocabulary(static_cast<size_t>(state.range(0))));
  GrammarMatcher m(grammar);
  // (The grammar is compact: no whitespace between tokens.)
  const char* prefixes[] = {"{\"key\":\"some te", "{\"key\":[1,2", "{\"a\":{\"b\":true}"};
  if (!m.Advance(std::string_view(prefixes[state.range(1)]))) state.SkipWithError("the prefix does not match");
  std::vector<uint8_t> mask;
  for (auto _ : state) {
    trie.FillMask(m, &mask);
    benchmark::DoNotOptimize(mask.data());
  }
  int64_t allowed = 0;
  for (uint8_t a : mask) allowed += a;
  state.counters["allowed"] = static_cast<double>(allowed);
}
BENCHMARK(BM_TokenMask)
    ->ArgsProduct({{4096, 151936, 0}, {0, 1, 2}})
    ->ArgNames({"vocab", "state"})
    ->Unit(benchmark::kMicrosecond);

void BM_MatcherAdvance(benchmark::State& state) {
  const auto grammar = *ParseGrammar(kCompactJson);
  const std::string text = R"({"name":"pdserve","tiers":[1,2.5,{"x":null}],"ok":true})";
  for (auto _ : state) {
    GrammarMatcher m(grammar);
    if (!m.Advance(std::string_view(text))) state.SkipWithError("the text does not match");
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(text.size()));
}
BENCHMARK(BM_MatcherAdvance);

constexpr char kSchema[] =
    R"({"type":"object","properties":{"name":{"type":"string"},"tags":{"type":"array",)"
    R"("items":{"enum":["alpha","beta","gamma"]}},"score":{"type":"number"},"ok":{"type":"boolean"}},)"
    R"("required":["name","tags","score","ok"]})";

// A walk of a schema's language: from each state a random allowed token (seeded), up to 256
// tokens, so that strings run long as a model's would.
std::vector<int32_t> Walk(ConstraintCache* cache, const OutputConstraint& c, int64_t eos) {
  auto tc = *cache->Start(c);
  std::mt19937 rng(7);
  std::vector<int32_t> walk;
  while (walk.size() < 256) {
    const TokenMask& mask = tc->Mask();
    std::vector<int32_t> allowed;
    for (int32_t t = 0; t < cache->vocab_size(); ++t) {
      if (t != eos && mask.Test(t)) allowed.push_back(t);
    }
    if (allowed.empty()) break;
    // Inside a string most tokens are allowed: prefer the few that close it now and then.
    const int32_t t = allowed[rng() % allowed.size()];
    if (!tc->Accept(t)) break;
    walk.push_back(t);
  }
  return walk;
}

// keys 1: the schema as a JSON constraint (its mask less the tokens that would repeat a key,
// json_keys.h); 0: the same grammar as a grammar constraint (the same masks here, no tracker):
// the difference is the key tracker's cost per token.
void BM_ConstrainedStep(benchmark::State& state) {
  const int64_t vocab = state.range(0);
  const bool warm = state.range(1) != 0;
  const bool keys = state.range(2) != 0;
  const std::vector<std::string> tokens = Vocabulary(static_cast<size_t>(vocab - 1));
  const int32_t eos = static_cast<int32_t>(vocab - 1);
  const OutputConstraint schema{OutputConstraint::Kind::kJsonSchema, kSchema, {}};
  const OutputConstraint c =
      keys ? schema : OutputConstraint{OutputConstraint::Kind::kGrammar, *ConstraintGrammarText(schema), {}};
  auto cache = std::make_unique<ConstraintCache>(tokens, vocab, std::vector<int32_t>{eos});
  const std::vector<int32_t> walk = Walk(cache.get(), c, eos);
  int64_t steps = 0;
  for (auto _ : state) {
    if (!warm) {
      state.PauseTiming();
      cache = std::make_unique<ConstraintCache>(tokens, vocab, std::vector<int32_t>{eos});
      state.ResumeTiming();
    }
    auto tc = *cache->Start(c);
    for (int32_t t : walk) {
      benchmark::DoNotOptimize(tc->Mask().allowed);
      tc->Accept(t);
    }
    steps += static_cast<int64_t>(walk.size());
  }
  state.counters["per_token"] = benchmark::Counter(  // Seconds.
      static_cast<double>(steps), benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["tokens"] = static_cast<double>(walk.size());
}
BENCHMARK(BM_ConstrainedStep)
    ->ArgsProduct({{4096, 151936}, {0, 1}, {1, 0}})
    ->ArgNames({"vocab", "warm", "keys"})
    ->Unit(benchmark::kMillisecond);

// The sampler over a 152k vocabulary at temperature 1, top_p 0.9, with no mask and with the mask
// of a state inside a JSON string (nearly all allowed) or after a value (few).
void BM_SampleMasked(benchmark::State& state) {
  constexpr int64_t kVocab = 151936;
  std::vector<float> logits(kVocab);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0, 3);
  for (float& l : logits) l = normal(rng);
  std::vector<uint64_t> mask((kVocab + 63) / 64, 0);
  const int kind = static_cast<int>(state.range(0));
  for (int64_t t = 0; t < kVocab; ++t) {
    if (kind == 1 || (kind == 2 && t % 997 == 0)) mask[t >> 6] |= uint64_t{1} << (t & 63);
  }
  SamplingParams params;
  params.temperature = 1.0f;
  params.top_p = 0.9f;
  SamplerState st;
  st.seed = 1;
  Sampler sampler;
  for (auto _ : state) {
    benchmark::DoNotOptimize(sampler.Sample(logits.data(), kVocab, params, st, kind == 0 ? nullptr : mask.data()));
    ++st.num_generated;
  }
}
BENCHMARK(BM_SampleMasked)->Arg(0)->Arg(1)->Arg(2)->ArgName("mask")->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace pdserve::structured

BENCHMARK_MAIN();
