// What suffix decoding's drafting costs the scheduler thread: indexing a request's prompt, the
// per-step update of its index, and a draft from the worker's recent outputs (issue 38).
//
//   build/bench/speculative_bench --benchmark_filter=Suffix
#include <cstdint>
#include <vector>

#include "benchmark/benchmark.h"
#include "common/engine/suffix_trie.h"

namespace pdserve {
namespace {

constexpr int32_t kDepth = 24;  // SpeculativeOptions::suffix_depth's default.

std::vector<int32_t> Tokens(int64_t n, uint64_t seed, int32_t vocab = 32000) {
  std::vector<int32_t> out(static_cast<size_t>(n));
  for (int32_t& t : out) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    t = static_cast<int32_t>((seed >> 33) % static_cast<uint64_t>(vocab));
  }
  return out;
}

// A request's first draft: its prompt indexed.
void BM_SuffixIndexPrompt(benchmark::State& state) {
  const std::vector<int32_t> prompt = Tokens(state.range(0), 1);
  for (auto _ : state) {
    SuffixTrie t(kDepth);
    if (state.range(1) != 0) t.Reserve(state.range(0));
    t.Append(prompt);
    benchmark::DoNotOptimize(t.num_nodes());
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_SuffixIndexPrompt)->ArgsProduct({{256, 4096}, {0, 1}})->ArgNames({"tokens", "reserve"});

// A decode step of one request: its new token indexed, then its draft from its own index and,
// as the engine does when that is short, from the recent outputs.
void BM_SuffixStep(benchmark::State& state) {
  SuffixTrie own(kDepth), recent(kDepth);
  for (int i = 0; i < 64; ++i) {  // 64 earlier outputs of 128 tokens over a small vocabulary.
    recent.Append(Tokens(128, 100 + i, 2000));
    recent.EndSequence();
  }
  const std::vector<int32_t> stream = Tokens(1 << 16, 7, 2000);
  std::vector<int32_t> context = Tokens(256, 1, 2000);
  own.Append(context);
  std::vector<int32_t> draft, scratch;
  SuffixTrie::Cursor cursor;
  size_t i = 0;
  for (auto _ : state) {
    const int32_t token = stream[i++ % stream.size()];
    context.push_back(token);
    own.Append(token);
    own.ProposeForCurrent(5, 0.1, &draft);
    if (state.range(0) != 0) {
      recent.ProposeFrom(context, 5, 0.1, &cursor, &scratch);
    } else {
      recent.Propose(context, 5, 0.1, &scratch);
    }
    benchmark::DoNotOptimize(scratch.data());
  }
}
BENCHMARK(BM_SuffixStep)->Arg(0)->Arg(1)->ArgName("cursor");

}  // namespace
}  // namespace pdserve

BENCHMARK_MAIN();
