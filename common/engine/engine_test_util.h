// The engine tests' fixture (TEST INFRASTRUCTURE): random models in a directory of the test
// process, small engine options, requests run through one engine step by step with every
// sampled row's logits kept, and the numeric modes the equivalences are checked in.
#ifndef PDSERVE_COMMON_ENGINE_ENGINE_TEST_UTIL_H_
#define PDSERVE_COMMON_ENGINE_ENGINE_TEST_UTIL_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/base/dtype.h"
#include "common/engine/llm_engine.h"

namespace pdserve::enginetest {

struct Result {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;  // One row per sampled step.
  std::string finish_reason;
  int64_t cached_tokens = 0;
};

struct Request {
  std::string id;
  std::vector<int32_t> prompt;
  SamplingParams params;
};

// A directory of this process, removed at exit, so a model written by another build of the
// fixture can never be picked up.
const std::string& TempRootPath();

// wide: rows of whole 256-element blocks (hidden 256, MLP 512), so the K-quants apply.
std::string ModelDir(const std::string& arch, DType dtype = DType::kF32, bool wide = false);
EngineOptions SmallOptions();
// `base` with a disk tier in a fresh directory TempRoot/`name` (its path in *dir, to remove).
EngineOptions WithDiskTier(EngineOptions base, const std::string& name, std::string* dir);
std::vector<int32_t> Prompt(int n, uint64_t seed);
SamplingParams Greedy(int max_tokens);

// Runs requests through one engine; `arrivals[i]` is the step at which request i is added.
// Expects every block freed at the end.
std::map<std::string, Result> RunEngine(const std::string& dir, const EngineOptions& options,
                                        const std::vector<Request>& requests,
                                        std::vector<int> arrivals = {},
                                        EngineStats* stats = nullptr);

void ExpectBitwiseEqual(const Result& a, const Result& b, const std::string& what);

// A transport's work done by hand: every layer's pages of blocks[first..] of `from` (table
// `src`) copied into the blocks `dst` of `to`.
void CopyPages(LLMEngine& from, absl::Span<const BlockId> src, LLMEngine& to,
               const std::vector<BlockId>& dst, int64_t first);

// A numeric mode: the linear layers' dtype, the KV pool's, and the weights' (as stored, or
// quantized on load and read by the integer kernels: Q8_0, and Q4_K_M's mix of Q4_K and Q6_K on
// the wide model).
struct Mode {
  ComputeDType compute;
  KvDType kv;
  WeightFormat weights = WeightFormat::kAsStored;
  bool wide() const { return weights == WeightFormat::kQ4_K_M; }
};
inline constexpr int kNumModes = 7;
extern const Mode kModes[kNumModes];
std::string ModeName(const Mode& m);
EngineOptions ModeOptions(const Mode& m);

}  // namespace pdserve::enginetest

#endif  // PDSERVE_COMMON_ENGINE_ENGINE_TEST_UTIL_H_
