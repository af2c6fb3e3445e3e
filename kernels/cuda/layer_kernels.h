// Kernel bodies of a transformer layer's row-wise steps, in the dialect of dialect.h (compiled by
// nvcc in layer_ops.cu and by the host compiler in the host execution tests). Each body's CPU
// twin is named beside it; layer_kernels_test.cc compares them.
#ifndef PDSERVE_KERNELS_CUDA_LAYER_KERNELS_H_
#define PDSERVE_KERNELS_CUDA_LAYER_KERNELS_H_

#include "kernels/cuda/dialect.h"
#include "kernels/cuda/kernel_params.h"
#include "kernels/cuda/kv_page.h"

namespace pdserve::cuda {

// Grid (rows); any block size. Twin: kernels::EmbeddingRow.
template <typename Ctx>
PD_DEVICE void EmbeddingBody(Ctx& ctx, const EmbeddingParams& p) {
  const int r = ctx.block(0);
  const int64_t id = p.ids[r];
  float* out = p.out + r * p.hidden;
  for (int64_t i = ctx.thread(); i < p.hidden; i += ctx.threads()) {
    out[i] = p.table_type == ActType::kBF16
                 ? Bf16Float(static_cast<const uint16_t*>(p.table)[id * p.hidden + i])
                 : static_cast<const float*>(p.table)[id * p.hidden + i];
  }
}

// Grid (rows); shared memory: 32 floats. Twin: kernels::AddBias + AddInPlace + RmsNorm.
template <typename Ctx>
PD_DEVICE void AddRmsNormBody(Ctx& ctx, const AddRmsNormParams& p) {
  float* scratch = ctx.template shared<float>();
  const int r = ctx.block(0);
  const int64_t in_row = p.row_index != nullptr ? p.row_index[r] : r;
  float* x = p.residual + in_row * p.n;
  float sum = 0.0f;
  for (int64_t i = ctx.thread(); i < p.n; i += ctx.threads()) {
    float v = x[i];
    if (p.delta != nullptr) {
      float d = p.delta[in_row * p.n + i];
      if (p.delta_bias != nullptr) d += p.delta_bias[i];
      v += d;
      x[i] = v;
    }
    sum += v * v;
  }
  sum = BlockSum(ctx, sum, scratch);
  const float inv = 1.0f / Sqrt(sum / static_cast<float>(p.n) + p.eps);
  for (int64_t i = ctx.thread(); i < p.n; i += ctx.threads()) {
    const float v = p.weight[i] * (x[i] * inv);
    if (p.out_type == ActType::kBF16) {
      static_cast<uint16_t*>(p.out)[r * p.n + i] = FloatBf16(v);
    } else {
      static_cast<float*>(p.out)[r * p.n + i] = v;
    }
  }
}

// Grid (rows); block: warps, each taking heads warp, warp + warps, ... of the row's q heads, then
// k heads, then v heads. Twin: AddBias, RmsNorm per head (qk norm), ApplyRope, StoreKv.
template <KvFormat F, typename Ctx>
PD_DEVICE void QkvRopeStoreBody(Ctx& ctx, const QkvRopeStoreParams& p) {
  const int r = ctx.block(0);
  const int warp = ctx.thread() / kWarpSize, lane = ctx.thread() % kWarpSize;
  const int warps = ctx.threads() / kWarpSize;
  const int d = p.head_dim, half = d / 2;
  const int pairs = (half + kWarpSize - 1) / kWarpSize;
  const int32_t position = p.tokens.positions[r];
  const int32_t* table = p.tokens.block_tables + p.tokens.row_seq[r] * p.tokens.block_table_stride;
  const int32_t block = table[position / p.kv.block_size];
  const int slot = position % p.kv.block_size;
  const float* cs = p.cos_sin + static_cast<int64_t>(position) * d;
  const int heads = p.num_heads + 2 * p.num_kv_heads;
  for (int h = warp; h < heads; h += warps) {
    // Which projection and head: q [0, H), k [H, H + KVH), v after.
    const bool is_q = h < p.num_heads, is_k = !is_q && h < p.num_heads + p.num_kv_heads;
    const int head = is_q ? h : is_k ? h - p.num_heads : h - p.num_heads - p.num_kv_heads;
    float* x = (is_q ? p.q + static_cast<int64_t>(r) * p.num_heads * d
                     : (is_k ? p.k : p.v) + static_cast<int64_t>(r) * p.num_kv_heads * d) +
               head * d;
    const float* bias = is_q ? p.q_bias : is_k ? p.k_bias : p.v_bias;
    const float* norm = is_q ? p.q_norm : is_k ? p.k_norm : nullptr;
    float lo[kMaxPairsPerLane], hi[kMaxPairsPerLane];
    float sum = 0.0f;
    for (int j = 0; j < kMaxPairsPerLane && j < pairs; ++j) {
      const int i = lane + j * kWarpSize;
      lo[j] = hi[j] = 0.0f;
      if (i < half) {
        lo[j] = x[i];
        hi[j] = x[i + half];
        if (bias != nullptr) {
          lo[j] += bias[head * d + i];
          hi[j] += bias[head * d + i + half];
        }
        sum += lo[j] * lo[j] + hi[j] * hi[j];
      }
    }
    if (norm != nullptr) {
      sum = WarpSum(ctx, sum);
      const float inv = 1.0f / Sqrt(sum / static_cast<float>(d) + p.eps);
      for (int j = 0; j < kMaxPairsPerLane && j < pairs; ++j) {
        const int i = lane + j * kWarpSize;
        if (i < half) {
          lo[j] = norm[i] * (lo[j] * inv);
          hi[j] = norm[i + half] * (hi[j] * inv);
        }
      }
    }
    if (is_q || is_k) {
      for (int j = 0; j < kMaxPairsPerLane && j < pairs; ++j) {
        const int i = lane + j * kWarpSize;
        if (i < half) {
          const float x1 = lo[j], x2 = hi[j];
          lo[j] = x1 * cs[i] - x2 * cs[half + i];
          hi[j] = x2 * cs[i] + x1 * cs[half + i];
        }
      }
    }
    for (int j = 0; j < kMaxPairsPerLane && j < pairs; ++j) {
      const int i = lane + j * kWarpSize;
      if (i < half) {
        x[i] = lo[j];
        x[i + half] = hi[j];
      }
    }
    if (!is_q) {
      const int kv_row = is_k ? head : p.num_kv_heads + head;
      WarpStoreRow<F>(ctx, lo, hi, pairs, d, KvRow(p.kv, block, kv_row, slot),
                      (F == KvFormat::kInt8 || F == KvFormat::kInt4)
                          ? KvScale(p.kv, block, kv_row, slot)
                          : nullptr);
    }
  }
}

// Grid (rows); any block size. Twin: AddBias + kernels::SiluMul.
template <typename Ctx>
PD_DEVICE void SiluMulBody(Ctx& ctx, const SiluMulParams& p) {
  const int r = ctx.block(0);
  for (int64_t i = ctx.thread(); i < p.n; i += ctx.threads()) {
    float g = p.gate[r * p.ld_in + i], u = p.up[r * p.ld_in + i];
    if (p.gate_bias != nullptr) g += p.gate_bias[i];
    if (p.up_bias != nullptr) u += p.up_bias[i];
    const float v = g / (1.0f + Exp(-g)) * u;
    if (p.out_type == ActType::kBF16) {
      static_cast<uint16_t*>(p.out)[r * p.n + i] = FloatBf16(v);
    } else {
      static_cast<float*>(p.out)[r * p.n + i] = v;
    }
  }
}

PD_HD float FillValue(const FillParams& p, int64_t i) {
  uint64_t z = p.seed + static_cast<uint64_t>(i) * 0x9e3779b97f4a7c15ull + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  const float u = static_cast<float>(z >> 40) * (1.0f / 8388608.0f) - 1.0f;  // 24 bits: [-1, 1)
  return p.offset + p.scale * u;
}

// Grid-stride over count elements. Twin: FillValue on the host.
template <typename Ctx>
PD_DEVICE void FillBody(Ctx& ctx, const FillParams& p) {
  const int64_t stride = static_cast<int64_t>(ctx.threads()) * ctx.blocks(0);
  for (int64_t i = static_cast<int64_t>(ctx.block(0)) * ctx.threads() + ctx.thread(); i < p.count;
       i += stride) {
    const float v = FillValue(p, i);
    if (p.type == ActType::kBF16) {
      static_cast<uint16_t*>(p.out)[i] = FloatBf16(v);
    } else {
      static_cast<float*>(p.out)[i] = v;
    }
  }
}

}  // namespace pdserve::cuda

#endif  // PDSERVE_KERNELS_CUDA_LAYER_KERNELS_H_
