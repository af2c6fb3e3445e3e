// What a constrained step's token mask costs (issue 37): the trie walk from a matcher's state
// over a vocabulary, at a few states of a JSON grammar (in a string, where nearly every token
// is allowed; after a value, where few are), and one byte of matcher advance.
//
//   build/bench/structured_bench
#include <random>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "common/structured/grammar_matcher.h"
#include "common/structured/grammar_parser.h"
#include "common/structured/test_grammars.h"
#include "common/structured/token_trie.h"

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

void BM_TokenMask(benchmark::State& state) {
  const auto grammar = *ParseGrammar(kCompactJson);
  const TokenTrie trie(Vocabulary(static_cast<size_t>(state.range(0))));
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
    ->ArgsProduct({{4096, 151936}, {0, 1, 2}})
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

}  // namespace
}  // namespace pdserve::structured

BENCHMARK_MAIN();
