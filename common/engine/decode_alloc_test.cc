// The decode loop must not allocate: a counting global allocator (this test binary replaces
// operator new) watches steady-state decode steps of a batch, on every thread of the engine.
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <new>
#include <unistd.h>

#include "common/base/file_util.h"
#include "common/base/strings.h"
#include "common/engine/llm_engine.h"
#include "common/model/random_model.h"
#include "gtest/gtest.h"

namespace {
std::atomic<bool> g_counting{false};
std::atomic<int64_t> g_allocations{0};
}  // namespace

void* operator new(std::size_t n) {
  if (g_counting.load(std::memory_order_relaxed)) g_allocations.fetch_add(1);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void* operator new(std::size_t n, std::align_val_t a) {
  if (g_counting.load(std::memory_order_relaxed)) g_allocations.fetch_add(1);
  const size_t align = static_cast<size_t>(a);
  if (void* p = std::aligned_alloc(align, (n + align - 1) / align * align)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n, std::align_val_t a) { return operator new(n, a); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

namespace pdserve {
namespace {

// The most allocations any of `steps` steady decode steps made (after a prefill and warm-up).
int64_t MaxAllocationsPerStep(const std::string& id_prefix, int batch, int steps) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = JoinPath(tmp ? tmp : "/tmp", Str("pdserve_decode_alloc_test_", getpid()));
  RandomModelSpec spec;
  spec.arch = "llama";
  spec.layers = 2;
  spec.hidden = 64;
  spec.heads = 4;
  spec.kv_heads = 2;
  spec.intermediate = 96;
  spec.vocab = 300;
  EXPECT_TRUE(WriteRandomModel(spec, dir).ok());
  EngineOptions o;
  o.threads = 2;
  o.num_kv_blocks = 256;
  auto engine = LLMEngine::Create(dir, o);
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return -1;
  for (int b = 0; b < batch; ++b) {
    SamplingParams p;
    p.temperature = b % 2 == 0 ? 0.0f : 0.8f;  // Greedy and sampled rows,
    p.frequency_penalty = b % 4 == 1 ? 0.5f : 0.0f;  // some with penalties (counted tokens).
    p.seed = b;
    p.ignore_eos = true;
    p.max_tokens = 200;
    std::vector<int32_t> prompt(20 + b);
    for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 7 + b) % 300);
    EXPECT_TRUE((*engine)->AddRequest(Str(id_prefix, b), std::move(prompt), p).ok());
  }
  std::vector<RequestOutput> outs;
  outs.reserve(batch);
  for (int i = 0; i < 20; ++i) {  // Prefill, then a few tokens.
    outs.clear();
    EXPECT_TRUE((*engine)->Step(&outs).ok());
  }
  int64_t most = 0;
  for (int i = 0; i < steps; ++i) {  // Crosses several 16-token block boundaries.
    outs.clear();
    g_allocations = 0;
    g_counting = true;
    const absl::Status s = (*engine)->Step(&outs);
    g_counting = false;
    EXPECT_TRUE(s.ok()) << s;
    EXPECT_EQ(outs.size(), static_cast<size_t>(batch));
    most = std::max<int64_t>(most, g_allocations.load());
  }
  std::filesystem::remove_all(dir);
  return most;
}

TEST(DecodeAllocTest, TheCounterCounts) {
  g_allocations = 0;
  g_counting = true;
  auto* v = new std::vector<int>(10);
  g_counting = false;
  delete v;
  EXPECT_EQ(g_allocations.load(), 2);
}

// Scheduling, the forward pass on the thread pool, sampling (with penalties), KV block growth
// and prefix-cache publishing: nothing allocates in a steady decode step.
TEST(DecodeAllocTest, SteadyDecodeStepsAllocateNothing) {
  EXPECT_EQ(MaxAllocationsPerStep("r", 8, 60), 0);
}

// What remains: each output hands its caller a copy of its request id, and an id longer than
// std::string's inline buffer (15 characters) is one allocation per output.
TEST(DecodeAllocTest, LongRequestIdsCostOneAllocationPerOutput) {
  EXPECT_EQ(MaxAllocationsPerStep("0f8e9c4e-6a55-4a57-9d3b-5d0a7e3f1c2", 8, 30), 8);
}

}  // namespace
}  // namespace pdserve
