#include "bench/machine_limits.h"

#include <chrono>
#include <fstream>
#include <vector>

#include "common/base/thread_pool.h"
#include "kernels/cpu/blas_gemm.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace pdserve::bench {
namespace {

using Clock = std::chrono::steady_clock;

// As far ahead as the linear kernel prefetches its weights (kernels/cpu/linear.cc).
constexpr int64_t kPrefetchFloats = 8192 / sizeof(float);

float SumRange(const float* p, int64_t n, bool prefetch) {
#if defined(__AVX2__)
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    if (prefetch) {  // Two 64-byte lines per iteration (past the end is harmless: a hint).
      _mm_prefetch(reinterpret_cast<const char*>(p + i + kPrefetchFloats), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(p + i + kPrefetchFloats + 16), _MM_HINT_T0);
    }
    a0 = _mm256_add_ps(a0, _mm256_load_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_load_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_load_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_load_ps(p + i + 24));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  float s = 0;
  for (float l : lanes) s += l;
  for (; i < n; ++i) s += p[i];
  return s;
#else
  (void)prefetch;
  float s = 0;
  for (int64_t i = 0; i < n; ++i) s += p[i];
  return s;
#endif
}

}  // namespace

double ReadBandwidth(ThreadPool* pool, size_t bytes, int repeats, bool prefetch) {
  const int64_t n = static_cast<int64_t>(bytes / sizeof(float)) & ~int64_t{1023};
  float* buf = static_cast<float*>(std::aligned_alloc(64, n * sizeof(float)));
  // First touch by the threads that will read, so pages sit near them.
  pool->ParallelFor(n, 1024, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) buf[i] = 1.0f;
  });
  std::vector<float> sums(pool->num_threads());
  double best = 0;
  for (int r = 0; r < repeats; ++r) {
    const auto start = Clock::now();
    pool->Run([&](int t) {
      const int64_t per = n / pool->num_threads() & ~int64_t{31};
      const int64_t b = per * t;
      const int64_t e = t == pool->num_threads() - 1 ? n : b + per;
      sums[t] += SumRange(buf + b, e - b, prefetch);
    });
    const double secs = std::chrono::duration<double>(Clock::now() - start).count();
    best = std::max(best, static_cast<double>(n * sizeof(float)) / secs);
  }
  volatile float sink = sums[0];
  (void)sink;
  std::free(buf);
  return best;
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
