#include "common/engine/engine_test_util.h"

#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "common/base/file_util.h"
#include "common/base/rng.h"
#include "common/base/strings.h"
#include "common/kvcache/disk_tier.h"
#include "common/model/random_model.h"
#include "gtest/gtest.h"

namespace pdserve::enginetest {
namespace {

class TempRoot : public ::testing::Environment {
 public:
  static std::string& Path() {
    static std::string path;
    return path;
  }
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    std::string templ = JoinPath(tmp ? tmp : "/tmp", "pdserve_engine_test_XXXXXX");
    Path() = mkdtemp(templ.data());
  }
  void TearDown() override { std::filesystem::remove_all(Path()); }
};
const auto* const kTempRoot = ::testing::AddGlobalTestEnvironment(new TempRoot);

}  // namespace

const std::string& TempRootPath() { return TempRoot::Path(); }


// wide: rows of whole 256-element blocks (hidden 256, MLP 512), so the K-quants apply.
std::string ModelDir(const std::string& arch, DType dtype, bool wide) {
  const std::string dir =
      JoinPath(TempRootPath(), arch + std::string(DTypeName(dtype)) + (wide ? "_wide" : ""));
  if (!FileExists(JoinPath(dir, "config.json"))) {
    RandomModelSpec spec;
    spec.arch = arch;
    spec.dtype = dtype;
    spec.layers = 2;
    spec.hidden = wide ? 256 : 64;
    spec.heads = 4;
    spec.kv_heads = 2;
    spec.intermediate = wide ? 512 : 96;
    spec.vocab = 300;
    spec.seed = 11;
    if (arch == "mistral") spec.sliding_window = 24;
    EXPECT_TRUE(WriteRandomModel(spec, dir).ok());
  }
  return dir;
}

EngineOptions SmallOptions() {
  EngineOptions o;
  o.threads = 2;
  o.block_size = 4;
  o.num_kv_blocks = 256;
  o.max_num_batched_tokens = 512;
  o.max_num_seqs = 16;
  return o;
}

std::vector<int32_t> Prompt(int n, uint64_t seed) {
  SplitMix64 rng(seed);
  std::vector<int32_t> p(n);
  for (int32_t& t : p) t = static_cast<int32_t>(rng.Next() % 256);
  return p;
}

SamplingParams Greedy(int max_tokens) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

// Runs requests through one engine; `arrivals[i]` is the step at which request i is added.
std::map<std::string, Result> RunEngine(const std::string& dir, const EngineOptions& options,
                                        const std::vector<Request>& requests,
                                        std::vector<int> arrivals, EngineStats* stats) {
  auto engine = LLMEngine::Create(dir, options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  std::map<std::string, Result> results;
  (*engine)->SetLogitsObserver([&](const std::string& id, const float* l, int64_t v) {
    results[id].logits.emplace_back(l, l + v);
  });
  if (arrivals.empty()) arrivals.assign(requests.size(), 0);
  size_t added = 0;
  for (int step = 0; added < requests.size() || (*engine)->HasUnfinished(); ++step) {
    for (size_t i = 0; i < requests.size(); ++i) {
      if (arrivals[i] == step) {
        EXPECT_TRUE((*engine)->AddRequest(requests[i].id, requests[i].prompt, requests[i].params).ok());
        ++added;
      }
    }
    std::vector<RequestOutput> outs;
    EXPECT_TRUE((*engine)->Step(&outs).ok());
    for (const RequestOutput& o : outs) {
      Result& r = results[o.request_id];
      for (const TokenOutput& t : o.tokens) r.tokens.push_back(t.token);
      if (o.finished) {
        r.finish_reason = o.finish_reason;
        r.cached_tokens = o.cached_tokens;
      }
    }
    if (step > 10000) {
      ADD_FAILURE() << "engine did not finish";
      break;
    }
  }
  (*engine)->FlushKvOffload();  // With a KV tier: what it published is stored before it goes.
  const EngineStats s = (*engine)->Stats();
  EXPECT_EQ(s.kv.used_blocks, 0) << "blocks leaked";
  if (stats != nullptr) *stats = s;
  return results;
}

void ExpectBitwiseEqual(const Result& a, const Result& b, const std::string& what) {
  ASSERT_EQ(a.tokens, b.tokens) << what;
  ASSERT_EQ(a.logits.size(), b.logits.size()) << what;
  for (size_t s = 0; s < a.logits.size(); ++s) {
    for (size_t i = 0; i < a.logits[s].size(); ++i) {
      ASSERT_EQ(a.logits[s][i], b.logits[s][i]) << what << ": step " << s << " logit " << i;
    }
  }
}

const Mode kModes[kNumModes] = {{ComputeDType::kF32, KvDType::kF32},
                       {ComputeDType::kBF16, KvDType::kF32},
                       {ComputeDType::kF32, KvDType::kInt8},
                       {ComputeDType::kF32, KvDType::kInt4},
                       {ComputeDType::kBF16, KvDType::kInt8},
                       {ComputeDType::kF32, KvDType::kF32, WeightFormat::kQ8_0},
                       {ComputeDType::kF32, KvDType::kF32, WeightFormat::kQ4_K_M}};
std::string ModeName(const Mode& m) {
  return Str(ComputeDTypeName(m.compute), "_kv", KvDTypeName(m.kv),
             m.weights != WeightFormat::kAsStored ? Str("_w", WeightFormatName(m.weights)) : "");
}
EngineOptions ModeOptions(const Mode& m) {
  EngineOptions o = SmallOptions();
  o.compute_dtype = m.compute;
  o.kv_dtype = m.kv;
  o.weight_dtype = m.weights;
  return o;
}

// A transport's work done by hand: every layer's pages of blocks[first..] of `from` (table
// `src`) copied into the blocks `dst` of `to`.
void CopyPages(LLMEngine& from, absl::Span<const BlockId> src, LLMEngine& to,
               const std::vector<BlockId>& dst, int64_t first) {
  const KvCacheSpec& spec = from.kv_spec();
  for (int64_t layer = 0; layer < spec.num_layers; ++layer) {
    for (size_t b = static_cast<size_t>(first); b < src.size(); ++b) {
      std::memcpy(to.kv_pool().data() + to.kv_pool().PageOffset(layer, dst[b]),
                  from.kv_pool().data() + from.kv_pool().PageOffset(layer, src[b]), spec.PageBytes());
    }
  }
}

EngineOptions WithDiskTier(EngineOptions base, const std::string& name, std::string* dir) {
  *dir = JoinPath(TempRootPath(), name);
  std::filesystem::remove_all(*dir);
  auto tier = DiskTier::Open({*dir, int64_t{1} << 30});
  EXPECT_TRUE(tier.ok()) << tier.status();
  if (!tier.ok()) return base;
  base.kv_tiers = {std::shared_ptr<KvTier>(std::move(*tier))};
  return base;
}

}  // namespace pdserve::enginetest
