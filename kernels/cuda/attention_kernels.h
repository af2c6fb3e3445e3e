// Kernel bodies of paged attention, in the dialect of dialect.h (compiled by nvcc in
// attention_ops.cu and by the host compiler in attention_kernels_test.cc). The CPU twin of all
// three is kernels::PagedAttention over the same pool bytes.
//
// Quantized pools are read as the CPU reads them: a score is (dot(q, codes) * key scale) * scale
// and a value row enters as (p * value scale) * code.
#ifndef PDSERVE_KERNELS_CUDA_ATTENTION_KERNELS_H_
#define PDSERVE_KERNELS_CUDA_ATTENTION_KERNELS_H_

#include "kernels/cuda/dialect.h"
#include "kernels/cuda/kernel_params.h"
#include "kernels/cuda/kv_page.h"

namespace pdserve::cuda {

// Query heads per KV head that the decode kernel handles in one block.
inline constexpr int kMaxGroup = 16;
// Decode keys whose loads a warp (scores) or a thread (values) issues before it sums them.
inline constexpr int kDecodeKeysPerWarp = 4;
inline constexpr int kDecodeValueKeys = 8;
// Elements of a head a lane holds when a warp reads a row (i = lane + 32 e): the decode kernel is
// built for rows of up to 128 elements (4 a lane: 72-80 registers) and of up to kMaxHeadDim (8:
// 126-136 registers, which would cost the common head sizes occupancy).
PD_HD constexpr int DecodeElemsPerLane(int head_dim) { return head_dim <= 128 ? 4 : 8; }

PD_HD constexpr bool KvQuantized(KvFormat f) { return f == KvFormat::kInt8 || f == KvFormat::kInt4; }

// The keys row r attends to: [lo, pos].
PD_HD int AttentionLow(const AttentionParams& a, int32_t pos) {
  return a.window > 0 ? MaxInt(0, pos - a.window + 1) : 0;
}

// Element `at` of the attention output, as its type (f32 or bf16).
PD_DEVICE void StoreAttentionOut(const AttentionParams& a, int64_t at, float o) {
  if (a.out_type == ActType::kBF16) {
    static_cast<uint16_t*>(a.out)[at] = FloatBf16(o);
  } else {
    static_cast<float*>(a.out)[at] = o;
  }
}

// Shared memory of the decode kernel, in floats.
PD_HD int DecodeSharedFloats(int group, int head_dim, int split_tokens) {
  return group * head_dim + group * split_tokens + 2 * group + kWarpSize;
}

// Grid (num_kv_heads, num_rows, max_splits). Split s of row r covers keys
// [s * split_tokens, (s + 1) * split_tokens) of [lo, pos]; a row whose keys fall in one split
// writes its output directly, otherwise each split writes its partial (unnormalised output,
// max, sum) and DecodeMergeBody combines them.
// E: DecodeElemsPerLane(head_dim).
template <KvFormat F, int E, typename Ctx>
PD_DEVICE void DecodeAttentionBody(Ctx& ctx, const DecodeAttentionParams& p) {
  static_assert(E * kWarpSize <= kMaxHeadDim);
  const AttentionParams& a = p.a;
  const int kvh = ctx.block(0), y = ctx.block(1), split = ctx.block(2);
  const int r = p.rows != nullptr ? p.rows[y] : y;
  const int d = a.kv.head_dim, group = a.num_heads / a.kv.num_kv_heads, T = p.split_tokens;
  const int32_t pos = a.tokens.positions[r];
  const int lo = AttentionLow(a, pos);
  const int begin = MaxInt(lo, static_cast<int64_t>(split) * T);
  const int end = MinInt(pos + 1, static_cast<int64_t>(split + 1) * T);
  if (begin >= end) return;  // The same for every thread of the block.
  const bool single = lo / T == pos / T;
  const int len = end - begin;
  const int32_t* table = a.tokens.block_tables + a.tokens.row_seq[r] * a.tokens.block_table_stride;
  const int warp = ctx.thread() / kWarpSize, lane = ctx.thread() % kWarpSize;
  const int warps = ctx.threads() / kWarpSize;
  float* qs = ctx.template shared<float>();  // [group][d]
  float* logits = qs + group * d;           // [group][T]
  float* ml = logits + group * T;           // [group][2]
  float* scratch = ml + 2 * group;          // [32]
  const float* q = a.q + (static_cast<int64_t>(r) * a.num_heads + kvh * group) * d;
  for (int i = ctx.thread(); i < group * d; i += ctx.threads()) qs[i] = q[i];
  ctx.sync();

  // Scores: a warp per key; the key row is read once for the group's query heads. A warp takes
  // kDecodeKeysPerWarp consecutive keys at a time and loads all their elements before it sums
  // any (a lane's loads of a key's row, i = lane + 32 e, are independent): a load per warp in
  // flight held the kernel to a tenth of the memory's bandwidth (RESULTS.md). Each key's sums
  // are the same operations in the same order as one key at a time.
  for (int t0 = warp * kDecodeKeysPerWarp; t0 < len; t0 += warps * kDecodeKeysPerWarp) {
    float kv[kDecodeKeysPerWarp][E];
    float kscale[kDecodeKeysPerWarp];
    PD_UNROLL
    for (int u = 0; u < kDecodeKeysPerWarp; ++u) {
      const int t = t0 + u;
      const uint8_t* row = nullptr;
      int32_t block = 0;
      int slot = 0;
      if (t < len) {
        const int key = begin + t;
        block = table[key / a.kv.block_size];
        slot = key % a.kv.block_size;
        row = KvRow(a.kv, block, kvh, slot);
      }
      PD_UNROLL
      for (int e = 0; e < E; ++e) {
        const int i = lane + e * kWarpSize;
        kv[u][e] = row != nullptr && i < d ? KvElem<F>(row, i) : 0.0f;
      }
      kscale[u] = row != nullptr ? KvRowScale<F>(a.kv, block, kvh, slot) : 0.0f;
    }
    PD_UNROLL
    for (int u = 0; u < kDecodeKeysPerWarp; ++u) {
      const int t = t0 + u;
      if (t >= len) break;  // The same for every lane of the warp.
      float acc[kMaxGroup];
      PD_UNROLL
      for (int g = 0; g < kMaxGroup; ++g) acc[g] = 0.0f;
      PD_UNROLL
      for (int e = 0; e < E; ++e) {
        const int i = lane + e * kWarpSize;
        if (i >= d) break;
        PD_UNROLL
        for (int g = 0; g < kMaxGroup; ++g) {
          if (g < group) acc[g] += qs[g * d + i] * kv[u][e];
        }
      }
      PD_UNROLL
      for (int g = 0; g < kMaxGroup; ++g) {
        if (g >= group) break;
        float s = WarpSum(ctx, acc[g]);
        if constexpr (KvQuantized(F)) s *= kscale[u];
        if (lane == 0) logits[g * T + t] = s * a.scale;
      }
    }
  }
  ctx.sync();

  // Softmax of each query head: max, exp, sum.
  for (int g = 0; g < group; ++g) {
    float m = kNegInf;
    for (int t = ctx.thread(); t < len; t += ctx.threads()) m = Max(m, logits[g * T + t]);
    m = BlockMax(ctx, m, scratch);
    float sum = 0.0f;
    for (int t = ctx.thread(); t < len; t += ctx.threads()) {
      const float e = Exp(logits[g * T + t] - m);
      logits[g * T + t] = e;
      sum += e;
    }
    sum = BlockSum(ctx, sum, scratch);  // Ends with a sync: every exp is in shared memory.
    if (ctx.thread() == 0) {
      ml[2 * g] = m;
      ml[2 * g + 1] = sum;
    }
  }
  ctx.sync();

  // Weighted sum of values: a thread per element of the head; each value row read once. The
  // loads of kDecodeValueKeys keys are issued before their products are summed (in key order,
  // as one at a time), so they are in flight together.
  for (int i = ctx.thread(); i < d; i += ctx.threads()) {
    float acc[kMaxGroup];
    PD_UNROLL
    for (int g = 0; g < kMaxGroup; ++g) acc[g] = 0.0f;
    for (int t0 = 0; t0 < len; t0 += kDecodeValueKeys) {
      float v[kDecodeValueKeys], vscale[kDecodeValueKeys];
      PD_UNROLL
      for (int u = 0; u < kDecodeValueKeys; ++u) {
        v[u] = vscale[u] = 0.0f;
        if (t0 + u < len) {
          const int key = begin + t0 + u;
          const int32_t block = table[key / a.kv.block_size];
          const int slot = key % a.kv.block_size;
          v[u] = KvElem<F>(KvRow(a.kv, block, a.kv.num_kv_heads + kvh, slot), i);
          vscale[u] = KvRowScale<F>(a.kv, block, a.kv.num_kv_heads + kvh, slot);
        }
      }
      PD_UNROLL
      for (int u = 0; u < kDecodeValueKeys; ++u) {
        if (t0 + u >= len) break;
        const int t = t0 + u;
        PD_UNROLL
        for (int g = 0; g < kMaxGroup; ++g) {
          if (g >= group) break;
          if constexpr (KvQuantized(F)) {
            acc[g] += (logits[g * T + t] * vscale[u]) * v[u];
          } else {
            acc[g] += logits[g * T + t] * v[u];
          }
        }
      }
    }
    for (int g = 0; g < kMaxGroup; ++g) {  // Constant bounds: acc stays in registers.
      if (g >= group) break;
      const int h = kvh * group + g;
      if (single) {
        const float o = acc[g] / ml[2 * g + 1];
        const int64_t at = (static_cast<int64_t>(r) * a.num_heads + h) * d + i;
        StoreAttentionOut(a, at, o);
      } else {
        const int64_t part = (static_cast<int64_t>(y) * a.num_heads + h) * p.max_splits + split;
        p.partial[part * d + i] = acc[g];
        if (i == 0) {
          p.partial_ml[2 * part] = ml[2 * g];
          p.partial_ml[2 * part + 1] = ml[2 * g + 1];
        }
      }
    }
  }
}

// Grid (num_heads, num_rows); any block size. Combines the splits of rows with more than one.
template <typename Ctx>
PD_DEVICE void DecodeMergeBody(Ctx& ctx, const DecodeAttentionParams& p) {
  const AttentionParams& a = p.a;
  const int h = ctx.block(0), y = ctx.block(1);
  const int r = p.rows != nullptr ? p.rows[y] : y;
  const int d = a.kv.head_dim, T = p.split_tokens;
  const int32_t pos = a.tokens.positions[r];
  const int first = AttentionLow(a, pos) / T, last = pos / T;
  if (first == last) return;
  const int64_t base = (static_cast<int64_t>(y) * a.num_heads + h) * p.max_splits;
  float m = kNegInf;
  for (int s = first; s <= last; ++s) m = Max(m, p.partial_ml[2 * (base + s)]);
  float total = 0.0f;
  for (int s = first; s <= last; ++s) {
    total += Exp(p.partial_ml[2 * (base + s)] - m) * p.partial_ml[2 * (base + s) + 1];
  }
  for (int i = ctx.thread(); i < d; i += ctx.threads()) {
    float acc = 0.0f;
    for (int s = first; s <= last; ++s) {
      acc += Exp(p.partial_ml[2 * (base + s)] - m) * p.partial[(base + s) * d + i];
    }
    const float o = acc / total;
    const int64_t at = (static_cast<int64_t>(r) * a.num_heads + h) * d + i;
    StoreAttentionOut(a, at, o);
  }
}

// Shared memory of the prefill kernel, in floats.
PD_HD int PrefillSharedFloats(int head_dim) {
  constexpr int R = kPrefillTileRows, K = kPrefillTileKeys;
  return 2 * R * head_dim + K * (head_dim + 1) + K * head_dim + R * (K + 1) + 3 * R + 2 * K;
}

// Grid (num_tiles, num_heads). A tile's rows are consecutive positions of one sequence; keys are
// walked in tiles of kPrefillTileKeys (= warp size: a lane per key in the online softmax) from
// the first row's lowest key to the last row's position, each row masked to its own causal
// window.
template <KvFormat F, typename Ctx>
PD_DEVICE void PrefillAttentionBody(Ctx& ctx, const PrefillAttentionParams& p) {
  static_assert(kPrefillTileKeys == kWarpSize, "a lane per key in the softmax");
  constexpr int R = kPrefillTileRows, K = kPrefillTileKeys;
  const AttentionParams& a = p.a;
  const int tile = ctx.block(0), h = ctx.block(1);
  const int d = a.kv.head_dim, kvh = h / (a.num_heads / a.kv.num_kv_heads);
  const int first_row = p.tile_first_row[tile], nrows = p.tile_rows[tile];
  const int32_t* table =
      a.tokens.block_tables + a.tokens.row_seq[first_row] * a.tokens.block_table_stride;
  const int32_t pos0 = a.tokens.positions[first_row];
  const int32_t pos_last = a.tokens.positions[first_row + nrows - 1];
  const int warp = ctx.thread() / kWarpSize, lane = ctx.thread() % kWarpSize;
  const int warps = ctx.threads() / kWarpSize;

  float* qs = ctx.template shared<float>();  // [R][d]
  float* os = qs + R * d;                   // [R][d] unnormalised output
  // Keys padded to d + 1 floats a row: the score loop reads key j's element c on lane j, which
  // with a stride of d (a multiple of 32) would put all 32 lanes on one shared-memory bank.
  const int kd = d + 1;
  float* ks = os + R * d;                   // [K][d + 1] key codes / values
  float* vs = ks + K * kd;                  // [K][d]
  float* ss = vs + K * d;                   // [R][K + 1] scores, then probabilities
  float* m = ss + R * (K + 1);              // [R] running max
  float* l = m + R;                         // [R] running sum
  float* alpha = l + R;                     // [R] rescale of this key tile
  float* kscale = alpha + R;                // [K]
  float* vscale = kscale + K;               // [K]

  for (int idx = ctx.thread(); idx < R * d; idx += ctx.threads()) {
    const int i = idx / d, c = idx % d;
    qs[idx] = i < nrows ? a.q[(static_cast<int64_t>(first_row + i) * a.num_heads + h) * d + c] : 0.0f;
    os[idx] = 0.0f;
  }
  for (int i = ctx.thread(); i < R; i += ctx.threads()) {
    m[i] = kNegInf;
    l[i] = 0.0f;
  }
  ctx.sync();

  for (int k0 = AttentionLow(a, pos0); k0 <= pos_last; k0 += K) {
    const int nk = MinInt(K, pos_last - k0 + 1);
    for (int idx = ctx.thread(); idx < K * d; idx += ctx.threads()) {
      const int j = idx / d, c = idx % d;
      float kv_k = 0.0f, kv_v = 0.0f;
      if (j < nk) {
        const int key = k0 + j;
        const int32_t block = table[key / a.kv.block_size];
        const int slot = key % a.kv.block_size;
        kv_k = KvElem<F>(KvRow(a.kv, block, kvh, slot), c);
        kv_v = KvElem<F>(KvRow(a.kv, block, a.kv.num_kv_heads + kvh, slot), c);
        if (c == 0) {
          kscale[j] = KvRowScale<F>(a.kv, block, kvh, slot);
          vscale[j] = KvRowScale<F>(a.kv, block, a.kv.num_kv_heads + kvh, slot);
        }
      } else if (c == 0) {
        kscale[j] = vscale[j] = 0.0f;
      }
      ks[j * kd + c] = kv_k;
      vs[idx] = kv_v;
    }
    ctx.sync();

    for (int idx = ctx.thread(); idx < R * K; idx += ctx.threads()) {
      const int i = idx / K, j = idx % K;
      const int key = k0 + j, row_pos = pos0 + i;
      const bool valid = i < nrows && j < nk && key <= row_pos &&
                         (a.window <= 0 || key > row_pos - a.window);
      float s = kNegInf;
      if (valid) {
        float dot = 0.0f;
        for (int c = 0; c < d; ++c) dot += qs[i * d + c] * ks[j * kd + c];
        if constexpr (KvQuantized(F)) dot *= kscale[j];
        s = dot * a.scale;
      }
      ss[i * (K + 1) + j] = s;
    }
    ctx.sync();

    // Online softmax: a warp per row, a lane per key.
    for (int i = warp; i < R; i += warps) {
      const float s = ss[i * (K + 1) + lane];
      const float m_old = m[i];
      const float m_new = Max(m_old, WarpMax(ctx, s));
      const float pr = m_new == kNegInf ? 0.0f : Exp(s - m_new);
      const float sum = WarpSum(ctx, pr);
      ss[i * (K + 1) + lane] = pr;
      if (lane == 0) {
        const float rescale = m_old == kNegInf ? 0.0f : Exp(m_old - m_new);
        alpha[i] = rescale;
        l[i] = l[i] * rescale + sum;
        m[i] = m_new;
      }
    }
    ctx.sync();

    for (int idx = ctx.thread(); idx < R * d; idx += ctx.threads()) {
      const int i = idx / d, c = idx % d;
      float acc = os[idx] * alpha[i];
      for (int j = 0; j < nk; ++j) {
        const float pr = ss[i * (K + 1) + j];
        if constexpr (KvQuantized(F)) {
          acc += (pr * vscale[j]) * vs[j * d + c];
        } else {
          acc += pr * vs[j * d + c];
        }
      }
      os[idx] = acc;
    }
    ctx.sync();
  }

  for (int idx = ctx.thread(); idx < nrows * d; idx += ctx.threads()) {
    const int i = idx / d, c = idx % d;
    const float o = os[idx] / l[i];
    const int64_t at = (static_cast<int64_t>(first_row + i) * a.num_heads + h) * d + c;
    StoreAttentionOut(a, at, o);
  }
}

}  // namespace pdserve::cuda

#endif  // PDSERVE_KERNELS_CUDA_ATTENTION_KERNELS_H_
