// Microbenchmarks of the CPU hot paths on SmolLM-135M shapes. Run: build/bench/kernels_bench
// Bytes/s for the GEMV cases is weights streamed per second (decode is bound by it); items/s
// for GEMM is flops.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "bench/machine_limits.h"
#include "common/base/huge_page_arena.h"
#include "common/base/rng.h"
#include "common/base/thread_pool.h"
#include "common/kvcache/kv_cache_spec.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_bf16.h"
#include "kernels/cpu/blas_gemm.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/linear_bf16.h"
#include "kernels/cpu/linear_quant.h"
#include "kernels/cpu/linear_quant_panels.h"
#include "kernels/cpu/quant_blocks.h"

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

// Quantized weights through the linear layers' entry (x quantized per call, as in the engine):
// eight TinyLlama-1.1B MLP matrices (45056 x 2048), larger than a core's L3, so m = 1 streams them
// much as a decode step does (on a VM whose two cores have an L3 each, two threads' halves are
// still partly cached: BM_ReadRegions). Bytes/s counts the quantized bytes; compare with BM_Linear's bf16 GEMV in the same run.
// Types: 0 Q8_0, 1 Q4_0, 2 Q4_K, 3 Q5_K, 4 Q6_K, 5 Q5_0.
// From memory (`from_memory`) at m = 1, a decode step's case, each call is followed, untimed, by
// a loads-only read of the same bytes (bench::ReadRegions, plain and prefetching in turn):
// `of_read` is the kernel's rate over that read's, both on the same pages (two allocations can
// read up to 30% apart on a VM: bench/RESULTS.md, "The weights' own memory").
void LinearQuantized(benchmark::State& state, int64_t n, bool panels = false, int64_t k = 2048,
                     bool from_memory = false) {
  const GgmlType types[] = {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_K, GgmlType::kQ5_K,
                            GgmlType::kQ6_K, GgmlType::kQ5_0};
  const GgmlType type = types[state.range(0)];
  const int64_t m = state.range(1);
  SplitMix64 rng(1);
  std::vector<float> row(k);
  std::vector<uint8_t> data(static_cast<size_t>(n * GgmlRowBytes(type, k)));
  for (int64_t j = 0; j < n; ++j) {
    for (float& v : row) v = static_cast<float>(rng.Normal()) * 0.05f;
    // Q8_0, Q5_0 and Q4_K by the quantizers; the others as random bytes with sane f16 scales.
    uint8_t* out = data.data() + j * GgmlRowBytes(type, k);
    if (type == GgmlType::kQ8_0) {
      QuantizeRowQ8_0(row.data(), out, k);
    } else if (type == GgmlType::kQ5_0) {
      QuantizeRowQ5_0(row.data(), out, k);
    } else if (type == GgmlType::kQ4_K) {
      QuantizeRowQ4_K(row.data(), out, k);
    } else {
      for (int64_t i = 0; i < GgmlRowBytes(type, k); ++i) out[i] = static_cast<uint8_t>(rng.Next() >> 40);
      const int64_t bytes = GgmlBlockBytes(type);
      const uint16_t h = F32ToF16(0.001f);
      for (int64_t b = 0; b < GgmlRowBytes(type, k); b += bytes) {
        std::memcpy(out + b + (type == GgmlType::kQ6_K ? 208 : 0), &h, 2);
        if (type == GgmlType::kQ5_K) std::memcpy(out + b + 2, &h, 2);
      }
    }
  }
  // The matrix the kernels read lives on huge pages, as the runner's copies do (CpuMatrices):
  // on 4 KiB pages Q8_0 and Q4_K streamed from memory at rates the engine did not show.
  if (panels && !QuantPanelsSupported(type)) {
    state.SkipWithError("no panel kernels for this type on this CPU");
    return;
  }
  const size_t bytes = panels ? static_cast<size_t>(QuantPanelsBytes(type, n, k)) : data.size();
  HugePageArena arena;
  if (!arena.Reserve(bytes).ok()) {
    state.SkipWithError("cannot map the matrix");
    return;
  }
  void* copy = arena.Take(bytes);
  MatrixRef w{DType::kF32, copy, n, k};
  w.quant_type = type;
  if (panels) {  // As CpuMatrices packs at load (linear_quant_panels.h).
    PackQuantPanels(QuantMatrixRef{type, data.data(), n, k}, copy);
    w.layout = MatrixLayout::kQuantPanels;
  } else {
    std::memcpy(copy, data.data(), data.size());
  }
  std::vector<float> x(m * k), y(m * n);
  for (float& v : x) v = static_cast<float>(rng.Normal());
  ThreadPool pool(static_cast<int>(state.range(2)));
  const bool beside_read = from_memory && m == 1;
  const absl::Span<const std::byte> memory(static_cast<const std::byte*>(copy), bytes);
  double kernel_s = 0, read_s = 0;
  int64_t reads = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    Linear(x.data(), m, k, w, y.data(), n, &pool);
    benchmark::DoNotOptimize(y.data());
    if (!beside_read) continue;
    kernel_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    state.PauseTiming();
    const double rate = bench::ReadRegions(&pool, {memory}, /*prefetch=*/reads++ % 2 == 1);
    read_s += static_cast<double>(bytes) / rate;
    state.ResumeTiming();
  }
  if (beside_read && reads > 0) {
    const double read_rate = static_cast<double>(bytes) * reads / read_s;
    state.counters["read_GB/s"] = read_rate / 1e9;
    state.counters["of_read"] = static_cast<double>(bytes) * reads / kernel_s / read_rate;
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(data.size()));
  state.counters["GMAC/s"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * m * n * k / 1e9, benchmark::Counter::kIsRate);
}
void BM_LinearQuantized(benchmark::State& state) {
  LinearQuantized(state, 5632 * 8, false, 2048, true);
}
BENCHMARK(BM_LinearQuantized)
    ->ArgsProduct({{0, 1, 2, 3, 4, 5}, {1, 16, 128}, {1, 2}})
    ->ArgNames({"type", "m", "threads"})
    ->UseRealTime();
// The same matrices repacked in panels (VNNI kernels, or their AVX2 twins): Q8_0, Q4_K, Q5_K, Q6_K.
void BM_LinearQuantizedPanels(benchmark::State& state) {
  LinearQuantized(state, 5632 * 8, true, 2048, true);
}
BENCHMARK(BM_LinearQuantizedPanels)
    ->ArgsProduct({{0, 2, 3, 4}, {1, 16, 128}, {1, 2}})
    ->ArgNames({"type", "m", "threads"})
    ->UseRealTime();
// The down projection's shape (k = 5632, 2048 outputs; eight of them, past L3): longer rows, and
// the only place a Q4_K_M file's Q6_K matrices other than the output are.
void BM_LinearQuantizedPanelsDown(benchmark::State& state) {
  LinearQuantized(state, 2048 * 8, true, 5632, true);
}
BENCHMARK(BM_LinearQuantizedPanelsDown)
    ->ArgsProduct({{2, 4}, {1}, {1, 2}})
    ->ArgNames({"type", "m", "threads"})
    ->UseRealTime();
void BM_LinearQuantizedPanelsInCache(benchmark::State& state) { LinearQuantized(state, 2048, true); }
BENCHMARK(BM_LinearQuantizedPanelsInCache)
    ->ArgsProduct({{0, 2, 4}, {1}, {1}})
    ->ArgNames({"type", "m", "threads"})
    ->UseRealTime();
// 256 rows (Q4_K 295 KB, Q6_K 430 KB): in L2, so one row of x measures the kernel's own rate,
// what it has to spare over the memory's when it streams.
void BM_LinearQuantizedPanelsInL2(benchmark::State& state) { LinearQuantized(state, 256, true); }
BENCHMARK(BM_LinearQuantizedPanelsInL2)
    ->ArgsProduct({{0, 2, 3, 4}, {1, 4}, {1}})
    ->ArgNames({"type", "m", "threads"})
    ->UseRealTime();
// The loads-only read of_read compares with (bench::ReadRegions), over `MiB` of huge pages each
// thread first wrote its half of: where it levels off is the memory's rate, and the sizes where
// it is faster say how much of a matrix a thread's caches hold (on a VM whose two cores have an
// L3 each, two threads read 48 MB several times faster than 512: bench/RESULTS.md).
void BM_ReadRegions(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0)) << 20;
  ThreadPool pool(static_cast<int>(state.range(1)));
  HugePageArena arena;
  if (!arena.Reserve(bytes).ok()) {
    state.SkipWithError("cannot map the buffer");
    return;
  }
  auto* p = static_cast<std::byte*>(arena.Take(bytes));
  pool.Run([&](int t) {
    const size_t per = bytes / pool.num_threads();
    std::memset(p + per * t, 1, t == pool.num_threads() - 1 ? bytes - per * t : per);
  });
  const absl::Span<const std::byte> memory(p, bytes);
  for (auto _ : state) benchmark::DoNotOptimize(bench::ReadRegions(&pool, {memory}, false));
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(bytes));
}
BENCHMARK(BM_ReadRegions)
    ->ArgsProduct({{16, 48, 96, 512}, {1, 2}})
    ->ArgNames({"MiB", "threads"})
    ->UseRealTime();
// What every parallel region pays to hand a job to the pool's threads and wait for them: Run
// with an empty job (two threads: the cache lines crossing between two cores).
void BM_ThreadPoolRun(benchmark::State& state) {
  ThreadPool pool(2);
  struct alignas(64) Count {
    int64_t n = 0;
  } ran[2];
  for (auto _ : state) pool.Run([&](int t) { ++ran[t].n; });
  benchmark::DoNotOptimize(ran);
}
BENCHMARK(BM_ThreadPoolRun)->UseRealTime();
// The same kernels on 2048 rows (2.3 MB of Q4_K: in L3): their own rate, beside the one above
// from memory (bench/RESULTS.md, "Where batch-1 Q4_K decode stands").
void BM_LinearQuantizedInCache(benchmark::State& state) { LinearQuantized(state, 2048); }
BENCHMARK(BM_LinearQuantizedInCache)
    ->ArgsProduct({{0, 2, 4}, {1}, {1}})
    ->ArgNames({"type", "m", "threads"})
    ->UseRealTime();

// Packing a 4096 x 4096 bf16 matrix into panels at load (arg 1), against memcpy of the same bytes
// (arg 0), one thread.
void BM_PackBf16Panels(benchmark::State& state) {
  const int64_t n = 4096, k = 4096;
  std::vector<uint16_t> w(n * k, 0x3f80), out(Bf16PanelsBytes(n, k) / 2);
  const MatrixRef m{DType::kBF16, w.data(), n, k};
  for (auto _ : state) {
    if (state.range(0) == 1) {
      PackBf16Panels(m, out.data(), MatrixLayout::kBf16Panels);
    } else {
      std::memcpy(out.data(), w.data(), w.size() * 2);
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(state.iterations() * n * k * 2);
}
BENCHMARK(BM_PackBf16Panels)->Arg(0)->Arg(1)->ArgName("pack")->UseRealTime();

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
  const Bf16PanelMatrix packed(f.w);
  const LinearOutput out{&packed.ref(), y.data(), n};
  for (auto _ : state) {
    RoundRowsToBf16(x.data(), m, k, k, xb.data(), k);
    LinearBf16Multi(xb.data(), m, k, &out, 1, &pool);
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * 2.0 * m * n * k / 1e9, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Bf16Gemm)->ArgsProduct({{1, 16, 128, 512}, {1, 2}})->ArgNames({"m", "threads"})->UseRealTime();

// The bf16 GEMV of batch-1 decode on lm_head's shape (56 MB, streamed from memory as in a decode
// step), for comparison with BM_Linear's f32-compute GEMV and the machine's read bandwidth.
void BM_Bf16Gemv(benchmark::State& state) {
  const int64_t n = 49152, k = 576;
  Fixture f(DType::kBF16, n, k);
  std::vector<uint16_t> xb(k, 0x3f00);
  std::vector<float> y(n);
  ThreadPool pool(static_cast<int>(state.range(0)));
  const Bf16PanelMatrix packed(f.w);
  const LinearOutput out{&packed.ref(), y.data(), n};
  for (auto _ : state) {
    LinearBf16Multi(xb.data(), 1, k, &out, 1, &pool);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(f.w.bytes()));
}
BENCHMARK(BM_Bf16Gemv)->Arg(1)->Arg(2)->ArgName("threads")->UseRealTime();

// Where batch-1 decode loses bandwidth: the GEMVs of one SmolLM-135M decode step (30 layers of
// q/k/v, o, gate/up, down, then lm_head; 270 MB of bf16 on huge pages, laid out as the runner
// lays them out) run back to back in the runner's parallel regions (arg 0), against the same
// bytes as one matrix (arg 1). No attention, norms or sampling: the difference is what the
// matrix and region structure costs (barriers, stream starts).
void BM_Bf16DecodeStepGemvs(benchmark::State& state) {
  constexpr int64_t kLayers = 30, kHidden = 576, kKv = 192, kInter = 1536, kVocab = 49152;
  const int64_t shapes[7][2] = {{kHidden, kHidden}, {kKv, kHidden}, {kKv, kHidden},
                                {kHidden, kHidden}, {kInter, kHidden}, {kInter, kHidden},
                                {kHidden, kInter}};
  size_t total = HugePageArena::Aligned(size_t(kVocab) * kHidden * 2);
  for (const auto& sh : shapes) total += kLayers * HugePageArena::Aligned(size_t(sh[0]) * sh[1] * 2);
  HugePageArena arena;
  if (absl::Status s = arena.Reserve(total); !s.ok()) {
    state.SkipWithError(std::string(s.message()).c_str());
    return;
  }
  auto make = [&](int64_t rows, int64_t cols) {
    auto* p = static_cast<uint16_t*>(arena.Take(size_t(rows) * cols * 2));
    for (int64_t i = 0; i < rows * cols; ++i) p[i] = static_cast<uint16_t>(0x3c00 + (i * 2654435761u >> 20) % 512);
    // Packed as the runner packs them (every shape here is whole panels: the bytes are equal).
    return MatrixRef{DType::kBF16, p, rows, cols, MatrixLayout::kBf16Panels};
  };
  std::vector<std::vector<MatrixRef>> layers(kLayers);
  for (auto& l : layers)
    for (const auto& sh : shapes) l.push_back(make(sh[0], sh[1]));
  const MatrixRef head = make(kVocab, kHidden);
  std::vector<uint16_t> xb(kInter, 0x3f00);
  std::vector<float> y(kVocab);
  std::vector<float> q(kHidden), k(kKv), v(kKv), o(kHidden), g(kInter), u(kInter), d(kHidden);
  ThreadPool pool(static_cast<int>(state.range(1)));
  const bool one_matrix = state.range(0) == 1;
  // The same bytes as one matrix of k = 576 (the rows of every matrix end to end).
  const MatrixRef all{DType::kBF16, layers[0][0].data, int64_t(total / 2 / kHidden) / 16 * 16, kHidden,
                      MatrixLayout::kBf16Panels};
  std::vector<float> y_all(all.rows);
  for (auto _ : state) {
    if (one_matrix) {
      const LinearOutput out{&all, y_all.data(), all.rows};
      LinearBf16Multi(xb.data(), 1, kHidden, &out, 1, &pool);
      continue;
    }
    for (const auto& l : layers) {
      const LinearOutput qkv[3] = {{&l[0], q.data(), kHidden}, {&l[1], k.data(), kKv}, {&l[2], v.data(), kKv}};
      LinearBf16Multi(xb.data(), 1, kHidden, qkv, 3, &pool);
      const LinearOutput out_o{&l[3], o.data(), kHidden};
      LinearBf16Multi(xb.data(), 1, kHidden, &out_o, 1, &pool);
      const LinearOutput gu[2] = {{&l[4], g.data(), kInter}, {&l[5], u.data(), kInter}};
      LinearBf16Multi(xb.data(), 1, kHidden, gu, 2, &pool);
      const LinearOutput down{&l[6], d.data(), kHidden};
      LinearBf16Multi(xb.data(), 1, kInter, &down, 1, &pool);
    }
    const LinearOutput lm{&head, y.data(), kVocab};
    LinearBf16Multi(xb.data(), 1, kHidden, &lm, 1, &pool);
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(total));
}
BENCHMARK(BM_Bf16DecodeStepGemvs)
    ->ArgsProduct({{0, 1}, {2}})
    ->ArgNames({"one_matrix", "threads"})
    ->UseRealTime();

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

// One layer's decode attention for 16 sequences of 2,048 tokens (SmolLM: 3 KV heads of 64, 9
// query heads; out of cache): per KV dtype (0 f32, 1 bf16, 2 int8, 3 int4), the grouped f32
// kernel (bf16:0) or the bf16 kernel's decode rows (bf16:1, f32 and bf16 pools), as the runner
// calls them at batch 16. One thread; bytes/s counts K and V read (scales included).
void BM_DecodeAttention(benchmark::State& state) {
  const auto dtype = static_cast<KvDType>(state.range(0));
  const bool bf16 = state.range(1) == 1;
  const int64_t seqs = 16, ctx = 2048, kvh = 3, heads = 9, d = 64, bs = 16;
  const KvCacheSpec spec{1, kvh, d, bs, dtype};
  const int64_t blocks_per_seq = ctx / bs;
  std::vector<uint8_t> pool(spec.PageBytes() * seqs * blocks_per_seq);
  KvPagesView view{pool.data(), spec.PageBytes(), bs, kvh, d, dtype};
  std::vector<std::vector<int32_t>> tables(seqs);
  SplitMix64 rng(3);
  std::vector<float> k(kvh * d), v(kvh * d);
  for (int64_t s = 0; s < seqs; ++s) {
    for (int64_t b = 0; b < blocks_per_seq; ++b) tables[s].push_back(static_cast<int32_t>(b * seqs + s));
    for (int64_t p = 0; p < ctx; ++p) {
      for (float& x : k) x = static_cast<float>(rng.Normal());
      for (float& x : v) x = static_cast<float>(rng.Normal());
      StoreKv(view, tables[s].data(), p, k.data(), v.data());
    }
  }
  std::vector<float> q(heads * d, 0.1f), out(heads * d), scratch(heads * ctx);
  const size_t bf16_bytes = PagedAttentionBf16ScratchBytes(ctx, heads / kvh, d, false);
  std::vector<uint8_t> bf16_scratch(bf16 ? bf16_bytes : 0);
  for (auto _ : state) {
    for (int64_t s = 0; s < seqs; ++s) {
      for (int64_t h = 0; h < kvh; ++h) {
        if (bf16) {
          const int64_t group = heads / kvh;
          PagedAttentionBf16(view, tables[s].data(), ctx - 1, 1, 0, 1, 0, q.data(), heads * d,
                             heads, 0.125f, h * group, (h + 1) * group, out.data(), heads * d,
                             bf16_scratch.data(), bf16_bytes, Bf16PanelLayout());
        } else {
          PagedAttentionKvGroup(view, tables[s].data(), ctx - 1, 0, q.data(), heads, 0.125f, h,
                                out.data(), scratch.data());
        }
      }
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * seqs * ctx *
                          static_cast<int64_t>(spec.BytesPerToken()));
}
BENCHMARK(BM_DecodeAttention)
    ->ArgsProduct({{0, 1, 2, 3}, {0}})
    ->Args({0, 1})
    ->Args({1, 1})
    ->ArgNames({"kv_dtype", "bf16"})
    ->UseRealTime();

// One layer's attention of a 512-token prefill chunk (SmolLM: 3 KV heads of 64, 9 query heads,
// pool in f32 (pool 0) or bf16 (pool 1)) on one thread, as the runner calls it. path 0: the f32
// kernel, a row and a KV head at a time; 1: the bf16 kernel (attention_bf16.h), the whole chunk per
// KV head in tiles of 8 rows; 2: the bf16 kernel a row at a time (as decode calls it). GFLOP/s
// counts Q.K and P.V.
void BM_PrefillAttention(benchmark::State& state) {
  const int64_t path = state.range(0);
  const KvDType dtype = state.range(1) == 0 ? KvDType::kF32 : KvDType::kBF16;
  const int64_t ctx = 512, kvh = 3, heads = 9, d = 64, bs = 16;
  const KvCacheSpec spec{1, kvh, d, bs, dtype};
  std::vector<uint8_t> pool(spec.PageBytes() * (ctx / bs));
  KvPagesView view{pool.data(), spec.PageBytes(), bs, kvh, d, dtype};
  std::vector<int32_t> table(ctx / bs);
  std::iota(table.begin(), table.end(), 0);
  SplitMix64 rng(4);
  std::vector<float> k(kvh * d), v(kvh * d), q(ctx * heads * d), out(ctx * heads * d);
  for (int64_t p = 0; p < ctx; ++p) {
    for (float& x : k) x = static_cast<float>(rng.Normal());
    for (float& x : v) x = static_cast<float>(rng.Normal());
    StoreKv(view, table.data(), p, k.data(), v.data());
  }
  for (float& x : q) x = static_cast<float>(rng.Normal());
  std::vector<float> scratch(3 * ctx);
  std::vector<uint8_t> scratch_bf16(PagedAttentionBf16ScratchBytes(ctx, heads / kvh, d, false));
  const int64_t ld = heads * d, group = heads / kvh;
  for (auto _ : state) {
    if (path == 0) {
      for (int64_t r = 0; r < ctx; ++r) {
        for (int64_t h = 0; h < kvh; ++h) {
          PagedAttentionKvGroup(view, table.data(), r, 0, &q[r * ld], heads, 0.125f, h,
                                &out[r * ld], scratch.data());
        }
      }
    } else {
      const int64_t calls = path == 1 ? 1 : ctx, rows = path == 1 ? ctx : 1;
      for (int64_t c = 0; c < calls; ++c) {
        for (int64_t h = 0; h < kvh; ++h) {
          PagedAttentionBf16(view, table.data(), c, rows, 0, 1, 0, &q[c * ld], ld, heads, 0.125f,
                             h * group, (h + 1) * group, &out[c * ld], ld, scratch_bf16.data(),
                             scratch_bf16.size(), Bf16PanelLayout());
        }
      }
    }
    benchmark::DoNotOptimize(out.data());
  }
  const double flops = 4.0 * d * heads * (ctx * (ctx + 1) / 2);
  state.counters["GFLOP/s"] = benchmark::Counter(static_cast<double>(state.iterations()) * flops / 1e9,
                                                 benchmark::Counter::kIsRate);
}
BENCHMARK(BM_PrefillAttention)
    ->ArgsProduct({{0, 1, 2}, {0, 1}})
    ->ArgNames({"path", "pool"})
    ->UseRealTime();

}  // namespace
}  // namespace pdserve::kernels

BENCHMARK_MAIN();
