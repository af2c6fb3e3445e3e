// Microbenchmarks of the CPU hot paths on SmolLM-135M shapes. Run: build/bench/kernels_bench
// Bytes/s for the GEMV cases is weights streamed per second (decode is bound by it); items/s
// for GEMM is flops.
#include <benchmark/benchmark.h>

#include <vector>

#include "common/base/rng.h"
#include "common/base/thread_pool.h"
#include "kernels/cpu/blas_gemm.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/linear_bf16.h"

namespace pdserve::kernels {
namespace {

struct Fixture {
  std::vector<float> wf;
  std::vector<uint16_t> wh;
  MatrixRef w;
  Fixture(DType dtype, int64_t n, int64_t k) {
    SplitMix64 rng(1);
    wf.resize(n * k);
    for (float& v : wf) v = static_cast<float>(rng.Normal());
    if (dtype == DType::kF32) {
      w = {dtype, wf.data(), n, k};
    } else {
      wh.resize(n * k);
      for (size_t i = 0; i < wh.size(); ++i) wh[i] = F32ToBf16(wf[i]);
      w = {dtype, wh.data(), n, k};
    }
  }
};

// A matrix larger than the L2 cache, so GEMV streams from L3/memory as in a real decode step
// (the whole model's weights do not fit in cache).
void BM_Linear(benchmark::State& state) {
  const DType dtype = state.range(0) == 0 ? DType::kF32 : DType::kBF16;
  const int64_t m = state.range(1);
  const int64_t n = 49152, k = 576;  // lm_head of SmolLM-135M.
  Fixture f(dtype, n, k);
  std::vector<float> x(m * k, 0.5f), y(m * n);
  ThreadPool pool(static_cast<int>(state.range(2)));
  for (auto _ : state) {
    Linear(x.data(), m, k, f.w, y.data(), n, &pool);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(f.w.bytes()));
  state.counters["GFLOP/s"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * 2.0 * m * n * k / 1e9, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Linear)
    ->ArgsProduct({{0, 1}, {1, 16, 128}, {1, 2}})
    ->ArgNames({"bf16", "m", "threads"})
    ->UseRealTime();

void BM_BlasLinear(benchmark::State& state) {
  const int64_t m = state.range(0), n = 1536, k = 576;
  Fixture f(DType::kF32, n, k);
  std::vector<float> x(m * k, 0.5f), y(m * n), scratch;
  ThreadPool pool(static_cast<int>(state.range(1)));
  SetBlasThreads(static_cast<int>(state.range(1)));
  for (auto _ : state) {
    BlasLinear(x.data(), m, k, f.w, y.data(), n, &scratch, &pool);
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * 2.0 * m * n * k / 1e9, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_BlasLinear)->ArgsProduct({{128, 512}, {1, 2}})->ArgNames({"m", "threads"})->UseRealTime();

// The bf16 compute path (--compute-dtype bf16) on the MLP shape: x rounded to bf16 once, as the
// runner does per projection, then VDPBF16PS (or the AVX2 twin with PDSERVE_KERNEL_ISA=avx2).
void BM_Bf16Gemm(benchmark::State& state) {
  const int64_t m = state.range(0), n = 1536, k = 576;
  Fixture f(DType::kBF16, n, k);
  std::vector<float> x(m * k, 0.5f), y(m * n);
  std::vector<uint16_t> xb(m * k);
  ThreadPool pool(static_cast<int>(state.range(1)));
  const LinearOutput out{&f.w, y.data(), n};
  for (auto _ : state) {
    RoundRowsToBf16(x.data(), m, k, k, xb.data(), k);
    LinearBf16Multi(xb.data(), m, k, &out, 1, &pool);
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * 2.0 * m * n * k / 1e9, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Bf16Gemm)->ArgsProduct({{1, 16, 128, 512}, {1, 2}})->ArgNames({"m", "threads"})->UseRealTime();

void BM_InvariantGemm(benchmark::State& state) {
  const int64_t m = state.range(0), n = 1536, k = 576;
  Fixture f(DType::kF32, n, k);
  std::vector<float> x(m * k, 0.5f), y(m * n);
  ThreadPool pool(static_cast<int>(state.range(1)));
  for (auto _ : state) {
    Linear(x.data(), m, k, f.w, y.data(), n, &pool);
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * 2.0 * m * n * k / 1e9, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_InvariantGemm)->ArgsProduct({{128, 512}, {1, 2}})->ArgNames({"m", "threads"})->UseRealTime();

}  // namespace
}  // namespace pdserve::kernels

BENCHMARK_MAIN();
