// The row-wise layer kernels (layer_kernels.h), run by the host execution layer (test
// infrastructure, host_exec.h), against their CPU twins in kernels/cpu. No GPU needed.
#include "kernels/cuda/layer_kernels.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "common/base/dtype.h"
#include "common/base/tensor_ref.h"
#include "gtest/gtest.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/host_exec.h"
#include "kernels/cuda/kernel_test_util.h"

namespace pdserve::cuda {
namespace {

using host::Grid;
using host::HostCtx;
using testing::RandomVector;
using testing::TestPool;

void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, float rel,
                 const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], rel * (1.0f + std::fabs(want[i]))) << what << " at " << i;
  }
}

TEST(LayerKernelsHostTest, EmbeddingEqualsCpuRowForBf16AndF32Tables) {
  SplitMix64 rng(3);
  const int64_t vocab = 50, hidden = 72;
  const std::vector<float> f32 = RandomVector(rng, vocab * hidden);
  std::vector<uint16_t> bf16(f32.size());
  for (size_t i = 0; i < f32.size(); ++i) bf16[i] = F32ToBf16(f32[i]);
  const std::vector<int32_t> ids = {7, 0, 49, 7, 13};
  for (ActType type : {ActType::kBF16, ActType::kF32}) {
    const MatrixRef table{type == ActType::kBF16 ? DType::kBF16 : DType::kF32,
                          type == ActType::kBF16 ? static_cast<const void*>(bf16.data())
                                                 : static_cast<const void*>(f32.data()),
                          vocab, hidden};
    std::vector<float> got(ids.size() * hidden), want(got.size());
    EmbeddingParams p;
    p.rows = static_cast<int>(ids.size());
    p.hidden = hidden;
    p.ids = ids.data();
    p.table = table.data;
    p.table_type = type;
    p.out = got.data();
    host::Launch(Grid{p.rows, 1, 1}, 32, 0, [&](HostCtx& ctx) { EmbeddingBody(ctx, p); });
    for (size_t r = 0; r < ids.size(); ++r) kernels::EmbeddingRow(table, ids[r], &want[r * hidden]);
    EXPECT_EQ(got, want);
  }
}

TEST(LayerKernelsHostTest, AddRmsNormEqualsCpuAddThenNorm) {
  SplitMix64 rng(4);
  const int rows = 6;
  const int64_t n = 200;  // Not a multiple of the block: tails.
  const std::vector<float> x0 = RandomVector(rng, rows * n), delta = RandomVector(rng, rows * n);
  const std::vector<float> bias = RandomVector(rng, n, 0.1), w = RandomVector(rng, n);
  for (bool with_delta : {true, false}) {
    for (ActType out_type : {ActType::kF32, ActType::kBF16}) {
      std::vector<float> x = x0, cpu_x = x0, out_f32(rows * n), cpu(rows * n);
      std::vector<uint16_t> out_bf16(rows * n);
      AddRmsNormParams p;
      p.rows = rows;
      p.n = n;
      p.residual = x.data();
      p.delta = with_delta ? delta.data() : nullptr;
      p.delta_bias = with_delta ? bias.data() : nullptr;
      p.weight = w.data();
      p.eps = 1e-5f;
      p.out_type = out_type;
      p.out = out_type == ActType::kF32 ? static_cast<void*>(out_f32.data()) : out_bf16.data();
      host::Launch(Grid{rows, 1, 1}, 64, 32 * sizeof(float),
                   [&](HostCtx& ctx) { AddRmsNormBody(ctx, p); });
      for (int r = 0; r < rows; ++r) {
        float* xr = &cpu_x[r * n];
        if (with_delta) {
          std::vector<float> tmp(delta.begin() + r * n, delta.begin() + (r + 1) * n);
          kernels::AddBias(tmp.data(), bias.data(), n);
          kernels::AddInPlace(xr, tmp.data(), n);
        }
        kernels::RmsNorm(xr, w.data(), n, 1e-5f, &cpu[r * n]);
      }
      EXPECT_EQ(x, cpu_x) << "the residual add is the same two float adds";
      if (out_type == ActType::kF32) {
        ExpectClose(out_f32, cpu, 2e-6f, "norm");
      } else {
        for (size_t i = 0; i < cpu.size(); ++i) {
          ASSERT_NEAR(Bf16ToF32(out_bf16[i]), cpu[i], 8e-3f * std::fabs(cpu[i]) + 1e-6f) << i;
        }
      }
    }
  }
}

TEST(LayerKernelsHostTest, FinalNormOfSelectedRowsOnly) {
  SplitMix64 rng(5);
  const int64_t n = 64;
  std::vector<float> x = RandomVector(rng, 5 * n), w = RandomVector(rng, n), out(2 * n), cpu(2 * n);
  const std::vector<int32_t> rows = {4, 1};
  AddRmsNormParams p;
  p.rows = 2;
  p.n = n;
  p.residual = x.data();
  p.row_index = rows.data();
  p.weight = w.data();
  p.out = out.data();
  p.out_type = ActType::kF32;
  host::Launch(Grid{2, 1, 1}, 32, 32 * sizeof(float), [&](HostCtx& ctx) { AddRmsNormBody(ctx, p); });
  for (int i = 0; i < 2; ++i) kernels::RmsNorm(&x[rows[i] * n], w.data(), n, 1e-6f, &cpu[i * n]);
  ExpectClose(out, cpu, 2e-6f, "final norm");
}

TEST(LayerKernelsHostTest, SiluMulEqualsCpu) {
  SplitMix64 rng(6);
  const int rows = 3;
  const int64_t n = 100, ld = 2 * n;  // gate and up side by side in one row, as a fused GEMM.
  const std::vector<float> gu = RandomVector(rng, rows * ld, 3.0), gb = RandomVector(rng, n),
                           ub = RandomVector(rng, n);
  std::vector<float> out(rows * n), cpu(rows * n);
  SiluMulParams p;
  p.rows = rows;
  p.n = n;
  p.gate = gu.data();
  p.up = gu.data() + n;
  p.ld_in = ld;
  p.gate_bias = gb.data();
  p.up_bias = ub.data();
  p.out = out.data();
  p.out_type = ActType::kF32;
  host::Launch(Grid{rows, 1, 1}, 64, 0, [&](HostCtx& ctx) { SiluMulBody(ctx, p); });
  for (int r = 0; r < rows; ++r) {
    std::vector<float> g(gu.begin() + r * ld, gu.begin() + r * ld + n);
    std::vector<float> u(gu.begin() + r * ld + n, gu.begin() + (r + 1) * ld);
    kernels::AddBias(g.data(), gb.data(), n);
    kernels::AddBias(u.data(), ub.data(), n);
    kernels::SiluMul(g.data(), u.data(), n, &cpu[r * n]);
  }
  ExpectClose(out, cpu, 1e-6f, "silu");
}

TEST(LayerKernelsHostTest, FillIsTheCounterHashInRange) {
  for (ActType type : {ActType::kF32, ActType::kBF16}) {
    std::vector<float> f32(1000, NAN);
    std::vector<uint16_t> bf16(1000);
    FillParams p;
    p.out = type == ActType::kF32 ? static_cast<void*>(f32.data()) : bf16.data();
    p.count = 1000;
    p.type = type;
    p.offset = 0.5f;
    p.scale = 2.0f;
    p.seed = 77;
    host::Launch(Grid{3, 1, 1}, 64, 0, [&](HostCtx& ctx) { FillBody(ctx, p); });  // Grid-stride.
    double sum = 0;
    for (int64_t i = 0; i < 1000; ++i) {
      const float want = FillValue(p, i);
      ASSERT_GE(want, -1.5f);
      ASSERT_LT(want, 2.5f);
      sum += want;
      if (type == ActType::kF32) {
        ASSERT_EQ(f32[i], want) << i;
      } else {
        ASSERT_EQ(bf16[i], F32ToBf16(want)) << i;
      }
    }
    EXPECT_NEAR(sum / 1000, 0.5, 0.15) << "uniform around the offset";
  }
}

struct QkvCase {
  KvDType dtype;
  int head_dim;
  bool bias;
  bool qk_norm;
};

class QkvRopeStoreHostTest : public ::testing::TestWithParam<QkvCase> {};

// q/k roped (and normed, biased) as the CPU does, and the pool's bytes for k and v exactly what
// the CPU's StoreKv writes for those rows: codes, scales, packing, slots and block-table walk.
TEST_P(QkvRopeStoreHostTest, MatchesCpuRopeAndStoresTheCpuBytes) {
  const QkvCase c = GetParam();
  SplitMix64 rng(7 + c.head_dim);
  const int heads = 6, kv_heads = 2, d = c.head_dim, block_size = 4, num_blocks = 8;
  const int rows = 7;
  TestPool gpu_pool(c.dtype, kv_heads, d, block_size, num_blocks);
  TestPool cpu_pool(c.dtype, kv_heads, d, block_size, num_blocks);
  // Two sequences with shuffled tables; rows at scattered positions (one with a NaN k row).
  const std::vector<int32_t> tables = testing::ShuffledBlocks(rng, num_blocks);
  const std::vector<int32_t> positions = {0, 5, 13, 2, 3, 14, 9};
  const std::vector<int32_t> row_seq = {0, 0, 0, 1, 1, 1, 0};
  kernels::RopeParams rope;
  rope.theta = 500000.0;
  rope.type = 2;
  rope.factor = 8.0;
  rope.original_max_position = 32;  // Short, so test positions cross the llama3 bands.
  const int max_pos = 16;
  std::vector<float> cos_sin(static_cast<size_t>(max_pos) * d);
  for (int pos = 0; pos < max_pos; ++pos) kernels::RopeCosSin(rope, d, pos, &cos_sin[pos * d]);

  std::vector<float> q = RandomVector(rng, rows * heads * d), k = RandomVector(rng, rows * kv_heads * d, 4.0),
                     v = RandomVector(rng, rows * kv_heads * d);
  k[5 * kv_heads * d + d + 3] = NAN;  // Row 5, kv head 1: a NaN key row gets a NaN scale.
  const std::vector<float> qb = RandomVector(rng, heads * d, 0.1), kb = RandomVector(rng, kv_heads * d, 0.1),
                           vb = RandomVector(rng, kv_heads * d, 0.1);
  const std::vector<float> qn = RandomVector(rng, d), kn = RandomVector(rng, d);
  std::vector<float> cpu_q = q, cpu_k = k, cpu_v = v;

  QkvRopeStoreParams p;
  p.tokens.rows = rows;
  p.tokens.positions = positions.data();
  p.tokens.row_seq = row_seq.data();
  p.tokens.block_tables = tables.data();
  p.tokens.block_table_stride = num_blocks / 2;
  p.num_heads = heads;
  p.num_kv_heads = kv_heads;
  p.head_dim = d;
  p.q = q.data();
  p.k = k.data();
  p.v = v.data();
  if (c.bias) {
    p.q_bias = qb.data();
    p.k_bias = kb.data();
    p.v_bias = vb.data();
  }
  if (c.qk_norm) {
    p.q_norm = qn.data();
    p.k_norm = kn.data();
  }
  p.eps = 1e-6f;
  p.cos_sin = cos_sin.data();
  p.kv = gpu_pool.Kernel(gpu_pool.bytes.data());
  auto body = [&](HostCtx& ctx) {
    switch (p.kv.format) {
      case KvFormat::kF32: return QkvRopeStoreBody<KvFormat::kF32>(ctx, p);
      case KvFormat::kBF16: return QkvRopeStoreBody<KvFormat::kBF16>(ctx, p);
      case KvFormat::kInt8: return QkvRopeStoreBody<KvFormat::kInt8>(ctx, p);
      case KvFormat::kInt4: return QkvRopeStoreBody<KvFormat::kInt4>(ctx, p);
    }
  };
  host::Launch(Grid{rows, 1, 1}, 64, 0, body);  // 2 warps for 10 heads: each warp loops.

  // The CPU model runner's steps for the same rows.
  kernels::KvPagesView view = cpu_pool.Cpu();
  for (int r = 0; r < rows; ++r) {
    float* qr = &cpu_q[r * heads * d];
    float* kr = &cpu_k[r * kv_heads * d];
    float* vr = &cpu_v[r * kv_heads * d];
    if (c.bias) {
      kernels::AddBias(qr, qb.data(), heads * d);
      kernels::AddBias(kr, kb.data(), kv_heads * d);
      kernels::AddBias(vr, vb.data(), kv_heads * d);
    }
    const float* cs = &cos_sin[positions[r] * d];
    for (int h = 0; h < heads; ++h) {
      if (c.qk_norm) kernels::RmsNorm(qr + h * d, qn.data(), d, 1e-6f, qr + h * d);
      kernels::ApplyRope(qr + h * d, d, cs);
    }
    for (int h = 0; h < kv_heads; ++h) {
      if (c.qk_norm) kernels::RmsNorm(kr + h * d, kn.data(), d, 1e-6f, kr + h * d);
      kernels::ApplyRope(kr + h * d, d, cs);
    }
  }
  ExpectClose(q, cpu_q, 2e-6f, "q");
  for (size_t i = 0; i < k.size(); ++i) {
    if (std::isnan(cpu_k[i])) {
      ASSERT_TRUE(std::isnan(k[i])) << i;
    } else {
      ASSERT_NEAR(k[i], cpu_k[i], 2e-6f * (1 + std::fabs(cpu_k[i]))) << "k at " << i;
    }
  }
  ExpectClose(v, cpu_v, 0.0f, "v");
  // The CPU's StoreKv of the kernel's own k and v rows must produce the kernel's pool bytes.
  for (int r = 0; r < rows; ++r) {
    const int32_t* table = &tables[row_seq[r] * (num_blocks / 2)];
    kernels::StoreKv(view, table, positions[r], &k[r * kv_heads * d], &v[r * kv_heads * d]);
  }
  EXPECT_EQ(gpu_pool.bytes, cpu_pool.bytes);
  if (KvDTypeQuantized(c.dtype)) {
    const int32_t block = tables[(num_blocks / 2) + 14 / block_size];
    EXPECT_TRUE(std::isnan(*view.KeyScale(block, 1, 14 % block_size)));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Formats, QkvRopeStoreHostTest,
    ::testing::Values(QkvCase{KvDType::kF32, 64, false, false}, QkvCase{KvDType::kBF16, 64, true, false},
                      QkvCase{KvDType::kInt8, 128, false, true}, QkvCase{KvDType::kInt4, 64, true, true},
                      QkvCase{KvDType::kInt4, 80, false, false},  // 40 pairs: lanes past the tail.
                      QkvCase{KvDType::kInt8, 256, true, true}),
    [](const ::testing::TestParamInfo<QkvCase>& info) {
      return std::string(KvDTypeName(info.param.dtype)) + "_d" + std::to_string(info.param.head_dim) +
             (info.param.bias ? "_bias" : "") + (info.param.qk_norm ? "_qknorm" : "");
    });

}  // namespace
}  // namespace pdserve::cuda
