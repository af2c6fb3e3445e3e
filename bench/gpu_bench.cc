// The GPU figures of scripts/gpu_check.sh, each as a ratio to a limit measured in the same run on
// the same device:
//   1. decode paged attention (batch 64, 4k context, Llama-3-8B heads, bf16 KV): bytes of K and V
//      read per second over device-to-device cudaMemcpy bandwidth (bytes read + written);
//   2. a full decode step of an 8B-shaped model with random weights (batch 64, 1k context): bytes
//      of weights and KV read per second over the same copy bandwidth (the roofline);
//   3. prefill of 4,096 tokens on that model: TFLOP/s over the measured cuBLASLt bf16 peak;
//   4. KV transfer GB/s over cudaMemcpy device-to-device (cuda_ipc: not built yet, reported so).
// Prints a Markdown table; with $OUT set, writes it to $OUT/gpu_check.md and the figures to
// $OUT/gpu_check.json.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "common/base/rng.h"
#include "common/engine/device_model_runner.h"
#include "common/kvcache/kv_pool.h"
#include "common/model/model_config.h"
#include "common/model/model_shapes.h"
#include "common/model/model_weights.h"
#include "kernels/cuda/attention_ops.h"
#include "kernels/cuda/attention_plan.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/cuda_device_ops.h"
#include "nlohmann/json.hpp"

namespace pdserve {
namespace {

#define CHECK_CUDA(call)                                                                    \
  do {                                                                                      \
    cudaError_t e = (call);                                                                 \
    if (e != cudaSuccess) {                                                                 \
      std::fprintf(stderr, "gpu_bench: %s: %s\n", #call, cudaGetErrorString(e));            \
      std::exit(1);                                                                         \
    }                                                                                       \
  } while (0)

#define CHECK_OK(expr)                                                                      \
  do {                                                                                      \
    absl::Status s = (expr);                                                                \
    if (!s.ok()) {                                                                          \
      std::fprintf(stderr, "gpu_bench: %s: %s\n", #expr, std::string(s.message()).c_str()); \
      std::exit(1);                                                                         \
    }                                                                                       \
  } while (0)

// Median seconds of `reps` runs of fn on the default stream, timed by events.
template <typename Fn>
double TimeEvents(int reps, Fn fn) {
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  fn();  // Warm-up.
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    CHECK_CUDA(cudaEventRecord(a));
    fn();
    CHECK_CUDA(cudaEventRecord(b));
    CHECK_CUDA(cudaEventSynchronize(b));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms / 1e3);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Median wall seconds of fn (which synchronizes itself).
template <typename Fn>
double TimeWall(int reps, Fn fn) {
  fn();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Bytes read + written per second by cudaMemcpy device to device of 2 GiB.
double CopyBandwidth() {
  const size_t bytes = size_t{2} << 30;
  void *a, *b;
  CHECK_CUDA(cudaMalloc(&a, bytes));
  CHECK_CUDA(cudaMalloc(&b, bytes));
  CHECK_CUDA(cudaMemset(a, 1, bytes));
  const double s = TimeEvents(10, [&] { CHECK_CUDA(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice)); });
  cudaFree(a);
  cudaFree(b);
  return 2.0 * bytes / s;
}

ModelConfig Llama8B() {
  auto c = ModelShape("llama3-8b");
  CHECK_OK(c.status());
  return *c;
}

int64_t LinearParams(const ModelConfig& c) {
  const int64_t per_layer = c.hidden_size * (c.q_size() + 2 * c.kv_size()) + c.q_size() * c.hidden_size +
                            3 * c.hidden_size * c.intermediate_size;
  return per_layer * c.num_layers;
}

// 1. Decode attention alone, one layer.
double DecodeAttentionBytesPerSecond(double* seconds) {
  const int batch = 64, context = 4096, heads = 32, kv_heads = 8, d = 128, bs = 16;
  const int blocks_per_seq = context / bs, blocks = batch * blocks_per_seq;
  const int64_t page = 2LL * kv_heads * bs * d * 2;  // bf16
  uint8_t* pool;
  CHECK_CUDA(cudaMalloc(&pool, static_cast<size_t>(page) * blocks));
  CHECK_CUDA(cudaMemset(pool, 0x3c, static_cast<size_t>(page) * blocks));  // bf16 0x3c3c ~ 0.0115
  std::vector<int32_t> tables(blocks), positions(batch, context - 1), row_seq(batch);
  std::iota(tables.begin(), tables.end(), 0);
  SplitMix64 rng(1);
  for (int i = blocks - 1; i > 0; --i) std::swap(tables[i], tables[rng.Next() % (i + 1)]);
  std::iota(row_seq.begin(), row_seq.end(), 0);
  int32_t *d_tables, *d_pos, *d_seq;
  float* q;
  uint16_t* out;
  CHECK_CUDA(cudaMalloc(&d_tables, tables.size() * 4));
  CHECK_CUDA(cudaMalloc(&d_pos, batch * 4));
  CHECK_CUDA(cudaMalloc(&d_seq, batch * 4));
  CHECK_CUDA(cudaMalloc(&q, sizeof(float) * batch * heads * d));
  CHECK_CUDA(cudaMalloc(&out, 2 * batch * heads * d));
  CHECK_CUDA(cudaMemcpy(d_tables, tables.data(), tables.size() * 4, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(d_pos, positions.data(), batch * 4, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(d_seq, row_seq.data(), batch * 4, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemset(q, 0, sizeof(float) * batch * heads * d));
  const cuda::DecodeSplit plan = cuda::PlanDecodeSplits(heads / kv_heads, d, context);
  float *partial, *ml;
  CHECK_CUDA(cudaMalloc(&partial, sizeof(float) * cuda::DecodePartialFloats(batch, heads, plan.max_splits, d)));
  CHECK_CUDA(cudaMalloc(&ml, sizeof(float) * cuda::DecodePartialMlFloats(batch, heads, plan.max_splits)));
  cuda::DecodeAttentionParams p;
  p.a.tokens = {batch, d_pos, d_seq, d_tables, blocks_per_seq};
  p.a.kv = {pool, page, bs, kv_heads, d, cuda::KvFormat::kBF16};
  p.a.num_heads = heads;
  p.a.scale = 1.0f / std::sqrt(static_cast<float>(d));
  p.a.q = q;
  p.a.out = out;
  p.a.out_type = cuda::ActType::kBF16;
  p.num_rows = batch;
  p.split_tokens = plan.split_tokens;
  p.max_splits = plan.max_splits;
  p.partial = partial;
  p.partial_ml = ml;
  *seconds = TimeEvents(20, [&] { CHECK_OK(cuda::LaunchDecodeAttention(p, nullptr)); });
  CHECK_CUDA(cudaGetLastError());
  for (void* ptr : {static_cast<void*>(pool), static_cast<void*>(d_tables), static_cast<void*>(d_pos),
                    static_cast<void*>(d_seq), static_cast<void*>(q), static_cast<void*>(out),
                    static_cast<void*>(partial), static_cast<void*>(ml)}) {
    cudaFree(ptr);
  }
  const double bytes = static_cast<double>(batch) * context * kv_heads * d * 2 /*K,V*/ * 2 /*bf16*/;
  return bytes / *seconds;
}

// cuBLASLt bf16 GEMM of 8192^3 through the ops the runner uses: FLOP/s.
double GemmPeak(cuda::DeviceOps* ops) {
  const int64_t n = 8192;
  void *x, *w, *y;
  x = *ops->Alloc(n * n * 2);
  w = *ops->Alloc(n * n * 2);
  y = *ops->Alloc(n * n * 4);
  // Random operands: on zeros the tensor cores run measurably faster than on data.
  for (void* m : {x, w}) {
    cuda::FillParams f;
    f.out = m;
    f.count = n * n;
    f.type = cuda::ActType::kBF16;
    f.seed = reinterpret_cast<uintptr_t>(m);
    CHECK_OK(ops->Fill(f));
  }
  cuda::GemmParams g;
  g.x = static_cast<uint16_t*>(x);
  g.m = g.k = g.ldx = g.n = g.ldy = n;
  g.w = static_cast<uint16_t*>(w);
  g.y = static_cast<float*>(y);
  const double s = TimeWall(10, [&] {
    CHECK_OK(ops->Gemm(g));
    CHECK_OK(ops->Synchronize());
  });
  ops->Free(x);
  ops->Free(w);
  ops->Free(y);
  return 2.0 * n * n * n / s;
}

struct RunnerFigures {
  double decode_seconds = 0, decode_bytes = 0, prefill_seconds = 0, prefill_flops = 0;
};

RunnerFigures RunnerSteps() {
  const ModelConfig c = Llama8B();
  RunnerFigures f;
  const int batch = 64, context = 1024, prompt = 4096, bs = 16;
  KvCacheSpec spec;
  spec.num_layers = c.num_layers;
  spec.num_kv_heads = c.num_kv_heads;
  spec.head_dim = c.head_dim;
  spec.block_size = bs;
  spec.dtype = KvDType::kBF16;
  const int64_t blocks = batch * context / bs + prompt / bs;
  auto pool = KvPool::Create(spec, blocks, /*reserve=*/false);  // The pages live on the GPU.
  CHECK_OK(pool.status());
  ModelRunnerOptions o;
  o.max_batch_tokens = prompt;
  o.max_logit_rows = batch;
  o.max_model_len = 8192;
  o.compute_dtype = ComputeDType::kBF16;
  auto ops = cuda::CreateCudaDeviceOps();
  CHECK_OK(ops.status());
  o.synthetic_weights_seed = 1;
  const auto shapes = ModelWeights::Synthetic(c, 1, /*materialize=*/false);
  auto runner = DeviceModelRunner::Create(o, shapes.get(), pool->get(), std::move(*ops));
  CHECK_OK(runner.status());
  // Decode: 64 sequences at position context - 1 (their KV is zeros: timing does not depend on it).
  std::vector<std::vector<int32_t>> tables(batch);
  std::vector<int32_t> token = {17};
  ForwardBatch decode;
  for (int s = 0; s < batch; ++s) {
    for (int b = 0; b < context / bs; ++b) tables[s].push_back(s * (context / bs) + b);
    decode.sequences.push_back({token, context - 1, tables[s], true});
  }
  std::vector<float> logits(static_cast<size_t>(batch) * c.vocab_size);
  f.decode_seconds = TimeWall(10, [&] { CHECK_OK((*runner)->Forward(decode, logits.data())); });
  f.decode_bytes = 2.0 * (LinearParams(c) + c.vocab_size * c.hidden_size) +
                   static_cast<double>(batch) * context * c.num_layers * 2 * c.kv_size() * 2;
  // Prefill: one 4,096-token prompt.
  std::vector<int32_t> prompt_ids(prompt), prompt_table;
  for (int i = 0; i < prompt; ++i) prompt_ids[i] = (i * 7919) % c.vocab_size;
  for (int b = 0; b < prompt / bs; ++b) prompt_table.push_back(batch * (context / bs) + b);
  ForwardBatch prefill;
  prefill.sequences.push_back({prompt_ids, 0, prompt_table, true});
  f.prefill_seconds = TimeWall(5, [&] { CHECK_OK((*runner)->Forward(prefill, logits.data())); });
  const double attention = 4.0 * c.head_dim * c.num_heads * c.num_layers * (prompt * (prompt + 1.0) / 2);
  f.prefill_flops = 2.0 * prompt * LinearParams(c) + 2.0 * c.hidden_size * c.vocab_size + attention;
  return f;
}

int Main() {
  if (cuda::DeviceCount() == 0) {
    std::fprintf(stderr, "gpu_bench: %s\n", cuda::DescribeDevice().c_str());
    return 2;
  }
  const std::string device = cuda::DescribeDevice();
  const double copy = CopyBandwidth();
  double attn_s = 0;
  const double attn = DecodeAttentionBytesPerSecond(&attn_s);
  auto ops = cuda::CreateCudaDeviceOps();
  CHECK_OK(ops.status());
  const double peak = GemmPeak(ops->get());
  ops->reset();
  const RunnerFigures r = RunnerSteps();
  const double step_bw = r.decode_bytes / r.decode_seconds;
  const double prefill = r.prefill_flops / r.prefill_seconds;

  char table[4096];
  std::snprintf(
      table, sizeof(table),
      "GPU: %s\n\n"
      "| measure | ours | limit (same run) | ratio | target |\n"
      "| --- | --- | --- | --- | --- |\n"
      "| decode paged attention, batch 64, 4k context, bf16 KV | %.0f GB/s (%.3f ms) | copy %.0f GB/s | %.2f | >= 0.80 |\n"
      "| decode step, 8B-shaped random model, batch 64, 1k context | %.0f GB/s (%.2f ms) | copy %.0f GB/s | %.2f | >= 0.60 |\n"
      "| prefill 4,096 tokens, 8B-shaped | %.0f TFLOP/s (%.1f ms) | cuBLASLt bf16 %.0f TFLOP/s | %.2f | >= 0.60 |\n"
      "| KV transfer, cuda_ipc | not built yet | cudaMemcpy D2D %.0f GB/s | - | >= 0.80 |\n",
      device.c_str(), attn / 1e9, attn_s * 1e3, copy / 1e9, attn / copy, step_bw / 1e9,
      r.decode_seconds * 1e3, copy / 1e9, step_bw / copy, prefill / 1e12, r.prefill_seconds * 1e3,
      peak / 1e12, prefill / peak, copy / 2e9);
  std::fputs(table, stdout);
  if (const char* out = std::getenv("OUT"); out != nullptr && *out != '\0') {
    std::ofstream(std::string(out) + "/gpu_check.md") << table;
    nlohmann::json j;
    j["device"] = device;
    j["copy_bytes_per_s"] = copy;
    j["decode_attention"] = {{"bytes_per_s", attn}, {"seconds", attn_s}, {"ratio", attn / copy}};
    j["decode_step"] = {{"bytes_per_s", step_bw}, {"seconds", r.decode_seconds}, {"ratio", step_bw / copy}};
    j["prefill"] = {{"flops_per_s", prefill}, {"seconds", r.prefill_seconds}, {"gemm_peak", peak},
                    {"ratio", prefill / peak}};
    std::ofstream(std::string(out) + "/gpu_check.json") << j.dump(2) << "\n";
  }
  return 0;
}

}  // namespace
}  // namespace pdserve

int main() { return pdserve::Main(); }
