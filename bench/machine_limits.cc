#include "bench/machine_limits.h"

#include <chrono>
#include <cstring>
#include <fstream>
#include <vector>

#include "common/base/thread_pool.h"
#include "kernels/cpu/blas_gemm.h"
#include "kernels/cpu/linear_avx512.h"
#include "kernels/cpu/linear_bf16.h"
#include "kernels/cpu/linear_bf16_amx.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace pdserve::bench {
namespace {

using Clock = std::chrono::steady_clock;

// As far ahead as the linear kernel prefetches its weights (kernels/cpu/linear.cc).
constexpr size_t kPrefetchBytes = 8192;

// The read of ReadRegions and ReadProbe: any bytes, so integer lanes (floats could be denormals
// or NaNs).
uint64_t XorRange(const std::byte* p, size_t n, bool prefetch) {
  size_t i = 0;
  uint64_t x = 0;
#if defined(__AVX2__)
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (; i + 128 <= n; i += 128) {
    if (prefetch) {  // Two 64-byte lines per iteration (past the end is harmless: a hint).
      _mm_prefetch(reinterpret_cast<const char*>(p + i + kPrefetchBytes), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(p + i + kPrefetchBytes + 64), _MM_HINT_T0);
    }
    const auto* v = reinterpret_cast<const __m256i*>(p + i);
    a0 = _mm256_xor_si256(a0, _mm256_loadu_si256(v));
    a1 = _mm256_xor_si256(a1, _mm256_loadu_si256(v + 1));
    a2 = _mm256_xor_si256(a2, _mm256_loadu_si256(v + 2));
    a3 = _mm256_xor_si256(a3, _mm256_loadu_si256(v + 3));
  }
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes),
                     _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3)));
  for (uint64_t l : lanes) x ^= l;
#else
  (void)prefetch;
#endif
  for (; i < n; ++i) x ^= static_cast<uint64_t>(p[i]);
  return x;
}

constexpr int64_t kPeakIterations = 1 << 20;

// Each returns a sum of its accumulators so the work cannot be optimised away.
#if defined(__AVX2__)
float FmaAvx2Loop(int64_t iterations) {
  __m256 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(static_cast<float>(i));
  const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(1e-4f);
  for (int64_t it = 0; it < iterations; ++it) {
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  }
  __m256 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm256_add_ps(s, acc[i]);
  return _mm256_cvtss_f32(s);
}

__attribute__((target("avx512f"))) float FmaAvx512Loop(int64_t iterations) {
  __m512 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(1e-4f);
  for (int64_t it = 0; it < iterations; ++it) {
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  }
  __m512 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_ps(s, acc[i]);
  return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx512f,avx512bf16"))) float DpBf16Loop(int64_t iterations) {
  __m512 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  const __m512i a = _mm512_set1_epi16(0x3f80), b = _mm512_set1_epi16(0x3a83);  // 1.0, ~1e-3
  for (int64_t it = 0; it < iterations; ++it) {
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], (__m512bh)a, (__m512bh)b);
  }
  __m512 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_ps(s, acc[i]);
  return _mm512_reduce_add_ps(s);
}

// Four independent 16 x 16 C tiles fed by one A and one B tile (16 x 32 bf16 each).
__attribute__((target("amx-tile,amx-bf16"))) float AmxBf16Loop(int64_t iterations) {
  alignas(64) uint16_t a[16 * 32], b[16 * 32];
  alignas(64) float c[16 * 16];
  for (int i = 0; i < 16 * 32; ++i) {
    a[i] = 0x3f80;  // 1.0
    b[i] = 0x3a83;  // ~1e-3
  }
  kernels::amx::TileConfig cfg;
  for (int t = 0; t < 6; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  __asm__ volatile("" ::: "memory");
  _tile_loadconfig(&cfg);
  _tile_loadd(4, a, 64);
  _tile_loadd(5, b, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t it = 0; it < iterations; ++it) {
    _tile_dpbf16ps(0, 4, 5);
    _tile_dpbf16ps(1, 4, 5);
    _tile_dpbf16ps(2, 4, 5);
    _tile_dpbf16ps(3, 4, 5);
  }
  _tile_stored(0, c, 64);
  _tile_release();
  return c[0];
}
#endif

}  // namespace

const char* DotInstructionName(DotInstruction i) {
  switch (i) {
    case DotInstruction::kFmaF32Avx2: return "fma_f32_avx2";
    case DotInstruction::kFmaF32Avx512: return "fma_f32_avx512";
    case DotInstruction::kDpBf16: return "vdpbf16ps";
    case DotInstruction::kAmxBf16: return "tdpbf16ps";
  }
  return "?";
}

double DotInstructionPeak(ThreadPool* pool, DotInstruction instruction, int repeats) {
#if defined(__AVX2__)
  double flops_per_iteration = 0;  // Per thread: 12 instructions.
  float (*loop)(int64_t) = nullptr;
  switch (instruction) {
    case DotInstruction::kFmaF32Avx2:
      loop = FmaAvx2Loop;
      flops_per_iteration = 12 * 8 * 2;
      break;
    case DotInstruction::kFmaF32Avx512:
      if (!kernels::Avx512Enabled()) return 0;
      loop = FmaAvx512Loop;
      flops_per_iteration = 12 * 16 * 2;
      break;
    case DotInstruction::kDpBf16:
      if (!kernels::Bf16DotEnabled()) return 0;
      loop = DpBf16Loop;
      flops_per_iteration = 12 * 32 * 2;
      break;
    case DotInstruction::kAmxBf16:
      if (!kernels::AmxEnabled()) return 0;
      loop = AmxBf16Loop;
      flops_per_iteration = 4 * 16 * 16 * 32 * 2;
      break;
  }
  std::vector<float> sink(pool->num_threads());
  pool->Run([&](int t) { sink[t] += loop(kPeakIterations / 16); });  // Warm up (clocks, caches).
  double best = 0;
  for (int r = 0; r < repeats; ++r) {
    const auto start = Clock::now();
    pool->Run([&](int t) { sink[t] += loop(kPeakIterations); });
    const double secs = std::chrono::duration<double>(Clock::now() - start).count();
    best = std::max(best, flops_per_iteration * kPeakIterations * pool->num_threads() / secs);
  }
  volatile float keep = sink[0];
  (void)keep;
  return best;
#else
  (void)pool;
  (void)instruction;
  (void)repeats;
  return 0;
#endif
}

ReadProbe::ReadProbe(ThreadPool* pool, size_t bytes)
    : pool_(pool), bytes_(bytes & ~size_t{4095}),
      buf_(static_cast<std::byte*>(std::aligned_alloc(64, bytes_))) {
  // First touch by the threads that will read, so pages sit near them.
  pool_->ParallelFor(static_cast<int64_t>(bytes_ / 4096), 1, [&](int64_t b, int64_t e) {
    std::memset(buf_ + b * 4096, 1, static_cast<size_t>(e - b) * 4096);
  });
}

ReadProbe::~ReadProbe() { std::free(buf_); }

double ReadProbe::Pass(bool prefetch) {
  return ReadRegions(pool_, {absl::Span<const std::byte>(buf_, bytes_)}, prefetch);
}

double ReadBandwidth(ThreadPool* pool, size_t bytes, int repeats, bool prefetch) {
  ReadProbe probe(pool, bytes);
  double best = 0;
  for (int r = 0; r < repeats; ++r) best = std::max(best, probe.Pass(prefetch));
  return best;
}

double ReadRegions(ThreadPool* pool, absl::Span<const absl::Span<const std::byte>> regions,
                   bool prefetch) {
  const int threads = pool->num_threads();
  std::vector<uint64_t> sums(threads);
  size_t bytes = 0;
  for (const auto& r : regions) bytes += r.size();
  const auto start = Clock::now();
  pool->Run([&](int t) {
    for (const auto& r : regions) {
      const size_t per = r.size() / threads & ~size_t{63};
      const size_t b = per * t;
      const size_t e = t == threads - 1 ? r.size() : b + per;
      sums[t] ^= XorRange(r.data() + b, e - b, prefetch);
    }
  });
  const double secs = std::chrono::duration<double>(Clock::now() - start).count();
  volatile uint64_t sink = sums[0];
  (void)sink;
  return static_cast<double>(bytes) / secs;
}

double SgemmFlops(int threads, int64_t n, int repeats) {
  kernels::SetBlasThreads(threads);
  std::vector<float> a(n * n, 1.0f), b(n * n, 0.5f), c(n * n);
  kernels::Sgemm(a.data(), b.data(), c.data(), n, n, n);  // Warm up.
  double best = 0;
  for (int r = 0; r < repeats; ++r) {
    const auto start = Clock::now();
    kernels::Sgemm(a.data(), b.data(), c.data(), n, n, n);
    const double secs = std::chrono::duration<double>(Clock::now() - start).count();
    best = std::max(best, 2.0 * n * n * n / secs);
  }
  return best;
}

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(colon + 2);
    }
  }
  return "unknown";
}

}  // namespace pdserve::bench
