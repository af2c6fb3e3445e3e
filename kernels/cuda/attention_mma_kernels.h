// Prefill attention on tensor cores, in the dialect of dialect.h (compiled by nvcc in
// attention_ops.cu and by the host compiler for the host execution tests). The CPU twin is
// kernels::PagedAttention over the same pool bytes, as for the f32 kernel of
// attention_kernels.h, which serves what this one does not (PrefillUsesMma in kernel_params.h).
//
// A thread block of 4 warps takes a tile of up to 64 consecutive rows of one sequence and one
// query head; each warp owns 16 rows. Keys are walked in tiles of 64 from the first row's lowest
// key to the last row's position: the block copies the tile's K rows and its V rows transposed
// into shared memory as bf16 (int8/int4 codes are exact in bf16), then each warp computes its
// 16 x 64 scores S = Q K^T with mma.m16n8k16 (Q in registers as bf16 fragments), masks them
// (causal, window, tails), runs the online softmax on them in registers, and accumulates
// P V with P, rounded to bf16, taken straight from the score registers as A fragments
// (FlashAttention-2's order). Accumulation is f32 throughout.
//
// Numerics against the CPU's f32 attention: q and p are rounded to bf16 (as the CPU's bf16
// compute path rounds them, kernels/cpu/attention_bf16.h) and the sums run in the tensor cores'
// order, so results agree within bf16 rounding, not bitwise. Quantized pools are read as the CPU
// reads them: score = dot(q, codes) * key scale * scale; a value row enters as
// (p * value scale) * code, the product rounded to bf16.
//
// Cost per tile of 64 rows and 64 keys: 2 * 64 * 64 * head_dim * 2 flops on tensor cores, 64 x 64
// exponentials, 64 * head_dim * 2 KV elements read (from L2 mostly: every tile of rows of a
// sequence reads the same keys).
#ifndef PDSERVE_KERNELS_CUDA_ATTENTION_MMA_KERNELS_H_
#define PDSERVE_KERNELS_CUDA_ATTENTION_MMA_KERNELS_H_

#include "kernels/cuda/attention_kernels.h"
#include "kernels/cuda/dialect.h"
#include "kernels/cuda/kernel_params.h"
#include "kernels/cuda/kv_page.h"

namespace pdserve::cuda {

// Row strides in shared memory, in bf16 elements. The padding of 8 puts the 8 rows that one
// fragment load reads (lane 4g + t reads word t of row g) on distinct groups of 4 banks: with a
// stride of 4 (mod 8) words, rows g = 0..7 start at 8 different multiples of 4 (mod 32 banks),
// for every head_dim that is a multiple of 16.
PD_HD constexpr int MmaKeyStride(int head_dim) { return head_dim + 8; }
inline constexpr int kMmaValueStride = kPrefillMmaTileKeys + 8;

// Shared memory of the tensor-core prefill kernel, bytes: K [keys][d + 8] and V^T [d][keys + 8]
// as bf16, the keys' K and V scales as f32. 36,352 bytes at head_dim 128.
PD_HD constexpr int PrefillMmaSharedBytes(int head_dim) {
  return 2 * (kPrefillMmaTileKeys * MmaKeyStride(head_dim) + head_dim * kMmaValueStride) +
         2 * 4 * kPrefillMmaTileKeys;
}

// Two bf16 at an even index of shared memory, as one fragment register.
PD_DEVICE uint32_t LoadBf16Pair(const uint16_t* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const uint32_t*>(p);
#else
  uint32_t w;
  std::memcpy(&w, p, sizeof(w));
  return w;
#endif
}

// Grid (num_tiles, num_heads), kPrefillMmaThreads threads; head_dim == 16 * DK.
template <KvFormat F, int DK, typename Ctx>
PD_DEVICE void PrefillAttentionMmaBody(Ctx& ctx, const PrefillAttentionParams& p) {
  static_assert(F != KvFormat::kF32, "f32 pools keep the f32 kernel (the exact mode)");
  constexpr int D = DK * kMmaK, KT = kPrefillMmaTileKeys, NT = KT / kMmaN, DN = D / kMmaN;
  constexpr int KS = MmaKeyStride(D), VS = kMmaValueStride;
  const AttentionParams& a = p.a;
  const int tile = ctx.block(0), h = ctx.block(1);
  const int kvh = h / (a.num_heads / a.kv.num_kv_heads);
  const int first_row = p.tile_first_row[tile], nrows = p.tile_rows[tile];
  const int32_t* table =
      a.tokens.block_tables + a.tokens.row_seq[first_row] * a.tokens.block_table_stride;
  const int32_t pos0 = a.tokens.positions[first_row];
  const int32_t pos_last = a.tokens.positions[first_row + nrows - 1];
  const int warp = ctx.thread() / kWarpSize, lane = ctx.thread() % kWarpSize;
  const int g = lane / 4, t = lane % 4;

  uint16_t* ks = ctx.template shared<uint16_t>();         // [KT][KS]
  uint16_t* vt = ks + KT * KS;                            // [D][VS]
  float* kscale = reinterpret_cast<float*>(vt + D * VS);  // [KT]
  float* vscale = kscale + KT;                            // [KT]

  // This lane's two rows (tile rows warp * 16 + g and + 8) and the warp's span of positions.
  const int row[2] = {warp * kMmaM + g, warp * kMmaM + g + 8};
  const bool valid[2] = {row[0] < nrows, row[1] < nrows};
  const int32_t row_pos[2] = {pos0 + row[0], pos0 + row[1]};
  const bool warp_has_rows = warp * kMmaM < nrows;  // Warp-uniform, as every branch around mma.
  const int32_t warp_first = pos0 + warp * kMmaM;
  const int32_t warp_last = pos0 + MinInt(nrows, warp * kMmaM + kMmaM) - 1;

  // Q as A fragments, each element as the sum of two bf16 (q = hi + lo, |lo| <= 2^-9 |q|, so
  // hi + lo holds q to about 2^-17): qa[0][kk] the high parts, qa[1][kk] the rest, covering head
  // elements [16 kk, 16 kk + 16). Scores are then as exact as f32 ones would be (rounding q to
  // bf16 alone moves a score by up to 2^-9 of its size, which the softmax turns into percent).
  uint32_t qa[2][DK][4];
  PD_UNROLL
  for (int kk = 0; kk < DK; ++kk) {
    const int c = kk * kMmaK + 2 * t;
    PD_UNROLL
    for (int half = 0; half < 2; ++half) {
      float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      if (valid[half]) {
        const float* q = a.q + (static_cast<int64_t>(first_row + row[half]) * a.num_heads + h) * D;
        x[0] = q[c], x[1] = q[c + 1], x[2] = q[c + 8], x[3] = q[c + 9];
      }
      float rest[4];
      PD_UNROLL
      for (int e = 0; e < 4; ++e) rest[e] = x[e] - Bf16Float(FloatBf16(x[e]));
      // a[0]: row g, a[1]: row g + 8; a[2], a[3]: the same rows, elements + 8.
      qa[0][kk][half] = PackBf16x2(x[0], x[1]);
      qa[0][kk][2 + half] = PackBf16x2(x[2], x[3]);
      qa[1][kk][half] = PackBf16x2(rest[0], rest[1]);
      qa[1][kk][2 + half] = PackBf16x2(rest[2], rest[3]);
    }
  }
  float o[DN][4];
  PD_UNROLL
  for (int n = 0; n < DN; ++n) {
    PD_UNROLL
    for (int e = 0; e < 4; ++e) o[n][e] = 0.0f;
  }
  float m[2] = {kNegInf, kNegInf}, l[2] = {0.0f, 0.0f};  // l: this lane's columns only.

  for (int k0 = AttentionLow(a, pos0); k0 <= pos_last; k0 += KT) {
    const int nk = MinInt(KT, pos_last - k0 + 1);
    // The key tile into shared memory: element pairs, consecutive threads along a row (coalesced
    // reads of the pool); keys past the tile's end as zeros (masked, and 0 * 0 in P V).
    for (int idx = ctx.thread(); idx < KT * (D / 2); idx += ctx.threads()) {
      const int j = idx / (D / 2), c = 2 * (idx % (D / 2));
      float k_lo = 0.0f, k_hi = 0.0f, v_lo = 0.0f, v_hi = 0.0f;
      if (j < nk) {
        const int key = k0 + j;
        const int32_t block = table[key / a.kv.block_size];
        const int slot = key % a.kv.block_size;
        const uint8_t* krow = KvRow(a.kv, block, kvh, slot);
        const uint8_t* vrow = KvRow(a.kv, block, a.kv.num_kv_heads + kvh, slot);
        k_lo = KvElem<F>(krow, c);
        k_hi = KvElem<F>(krow, c + 1);
        v_lo = KvElem<F>(vrow, c);
        v_hi = KvElem<F>(vrow, c + 1);
        if (c == 0) {
          kscale[j] = KvRowScale<F>(a.kv, block, kvh, slot);
          vscale[j] = KvRowScale<F>(a.kv, block, a.kv.num_kv_heads + kvh, slot);
        }
      } else if (c == 0) {
        kscale[j] = vscale[j] = 0.0f;
      }
      ks[j * KS + c] = FloatBf16(k_lo);
      ks[j * KS + c + 1] = FloatBf16(k_hi);
      vt[c * VS + j] = FloatBf16(v_lo);
      vt[(c + 1) * VS + j] = FloatBf16(v_hi);
    }
    ctx.sync();

    // Warps whose rows see none of these keys (past their last row, or before every row's
    // window) skip the tile; their state is what processing it would leave.
    const bool useful =
        warp_has_rows && k0 <= warp_last && (a.window <= 0 || k0 + nk - 1 > warp_first - a.window);
    if (useful) {
      float s[NT][4];
      PD_UNROLL
      for (int j = 0; j < NT; ++j) {
        PD_UNROLL
        for (int e = 0; e < 4; ++e) s[j][e] = 0.0f;
        const uint16_t* kr = ks + (j * kMmaN + g) * KS + 2 * t;
        PD_UNROLL
        for (int kk = 0; kk < DK; ++kk) {
          const uint32_t b[2] = {LoadBf16Pair(kr + kk * kMmaK), LoadBf16Pair(kr + kk * kMmaK + 8)};
          ctx.mma_bf16(s[j], qa[1][kk], b);  // The small parts first.
          ctx.mma_bf16(s[j], qa[0][kk], b);
        }
      }
      // Mask and scale: s[j][e] is row row[e / 2], key k0 + 8 j + 2 t + (e & 1).
      PD_UNROLL
      for (int j = 0; j < NT; ++j) {
        PD_UNROLL
        for (int e = 0; e < 4; ++e) {
          const int col = j * kMmaN + 2 * t + (e & 1), key = k0 + col, half = e / 2;
          const bool ok = valid[half] && col < nk && key <= row_pos[half] &&
                          (a.window <= 0 || key > row_pos[half] - a.window);
          float v = s[j][e];
          if constexpr (KvQuantized(F)) v *= kscale[col];
          s[j][e] = ok ? v * a.scale : kNegInf;
        }
      }
      // Online softmax per row; a row's 64 scores are on the 4 lanes of its group.
      PD_UNROLL
      for (int half = 0; half < 2; ++half) {
        float mx = kNegInf;
        PD_UNROLL
        for (int j = 0; j < NT; ++j) mx = Max(mx, Max(s[j][2 * half], s[j][2 * half + 1]));
        mx = Max(mx, ctx.shfl_xor(mx, 1));
        mx = Max(mx, ctx.shfl_xor(mx, 2));
        const float m_new = Max(m[half], mx);
        const float alpha = m[half] == kNegInf ? 0.0f : Exp(m[half] - m_new);
        float sum = 0.0f;
        PD_UNROLL
        for (int j = 0; j < NT; ++j) {
          PD_UNROLL
          for (int e = 2 * half; e < 2 * half + 2; ++e) {
            const float pr = m_new == kNegInf ? 0.0f : Exp(s[j][e] - m_new);
            s[j][e] = pr;
            sum += pr;
          }
        }
        l[half] = l[half] * alpha + sum;
        m[half] = m_new;
        PD_UNROLL
        for (int n = 0; n < DN; ++n) {
          o[n][2 * half] *= alpha;
          o[n][2 * half + 1] *= alpha;
        }
      }
      // O += P V: P's score registers of key tiles 2 kk and 2 kk + 1 are the A fragment of keys
      // [16 kk, 16 kk + 16).
      PD_UNROLL
      for (int kk = 0; kk < KT / kMmaK; ++kk) {
        float pv[2][4];
        PD_UNROLL
        for (int side = 0; side < 2; ++side) {
          PD_UNROLL
          for (int e = 0; e < 4; ++e) {
            float pr = s[2 * kk + side][e];
            if constexpr (KvQuantized(F)) pr *= vscale[(2 * kk + side) * kMmaN + 2 * t + (e & 1)];
            pv[side][e] = pr;
          }
        }
        // p as two bf16 too (hi + lo), so P V is as exact as in f32.
        float rest[2][4];
        PD_UNROLL
        for (int side = 0; side < 2; ++side) {
          PD_UNROLL
          for (int e = 0; e < 4; ++e)
            rest[side][e] = pv[side][e] - Bf16Float(FloatBf16(pv[side][e]));
        }
        const uint32_t pa[4] = {PackBf16x2(pv[0][0], pv[0][1]), PackBf16x2(pv[0][2], pv[0][3]),
                                PackBf16x2(pv[1][0], pv[1][1]), PackBf16x2(pv[1][2], pv[1][3])};
        const uint32_t pa_rest[4] = {
            PackBf16x2(rest[0][0], rest[0][1]), PackBf16x2(rest[0][2], rest[0][3]),
            PackBf16x2(rest[1][0], rest[1][1]), PackBf16x2(rest[1][2], rest[1][3])};
        PD_UNROLL
        for (int n = 0; n < DN; ++n) {
          const uint16_t* vr = vt + (n * kMmaN + g) * VS + kk * kMmaK + 2 * t;
          const uint32_t b[2] = {LoadBf16Pair(vr), LoadBf16Pair(vr + 8)};
          ctx.mma_bf16(o[n], pa_rest, b);
          ctx.mma_bf16(o[n], pa, b);
        }
      }
    }
    ctx.sync();  // Every warp is done with the tile before the next one overwrites it.
  }

  PD_UNROLL
  for (int half = 0; half < 2; ++half) {
    float total = l[half] + ctx.shfl_xor(l[half], 1);
    total += ctx.shfl_xor(total, 2);
    if (!valid[half]) continue;
    const int64_t base = (static_cast<int64_t>(first_row + row[half]) * a.num_heads + h) * D;
    PD_UNROLL
    for (int n = 0; n < DN; ++n) {
      PD_UNROLL
      for (int e = 2 * half; e < 2 * half + 2; ++e) {
        const float out = o[n][e] / total;
        const int64_t at = base + n * kMmaN + 2 * t + (e & 1);
        StoreAttentionOut(a, at, out);
      }
    }
  }
}

// Host side, for the launchers (CUDA and the host execution layer): returns
// Op<F, DK>::Run(args...) for the pool's format F and DK = head_dim / 16, or `unsupported` where
// PrefillUsesMma does not hold.
template <template <KvFormat, int> class Op, KvFormat F, typename R, typename... Args>
R DispatchPrefillMmaDim(int head_dim, R unsupported, const Args&... args) {
  switch (head_dim / kMmaK) {
    case 1:
      return Op<F, 1>::Run(args...);
    case 2:
      return Op<F, 2>::Run(args...);
    case 3:
      return Op<F, 3>::Run(args...);
    case 4:
      return Op<F, 4>::Run(args...);
    case 5:
      return Op<F, 5>::Run(args...);
    case 6:
      return Op<F, 6>::Run(args...);
    case 7:
      return Op<F, 7>::Run(args...);
    case 8:
      return Op<F, 8>::Run(args...);
  }
  return unsupported;
}
template <template <KvFormat, int> class Op, typename R, typename... Args>
R DispatchPrefillMma(KvFormat format, int head_dim, R unsupported, const Args&... args) {
  if (!PrefillUsesMma(format, head_dim)) return unsupported;
  switch (format) {
    case KvFormat::kBF16:
      return DispatchPrefillMmaDim<Op, KvFormat::kBF16>(head_dim, unsupported, args...);
    case KvFormat::kInt8:
      return DispatchPrefillMmaDim<Op, KvFormat::kInt8>(head_dim, unsupported, args...);
    case KvFormat::kInt4:
      return DispatchPrefillMmaDim<Op, KvFormat::kInt4>(head_dim, unsupported, args...);
    case KvFormat::kF32:
      break;
  }
  return unsupported;
}

}  // namespace pdserve::cuda

#endif  // PDSERVE_KERNELS_CUDA_ATTENTION_MMA_KERNELS_H_
