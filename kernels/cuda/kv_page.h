// Reading and writing KV rows of a paged pool from kernel code (dialect.h): the CPU's page format
// (kernels/cpu/attention.h, kv_quant.h), so pages move between CPU and CUDA workers unchanged.
#ifndef PDSERVE_KERNELS_CUDA_KV_PAGE_H_
#define PDSERVE_KERNELS_CUDA_KV_PAGE_H_

#include "kernels/cuda/dialect.h"
#include "kernels/cuda/kernel_params.h"

namespace pdserve::cuda {

PD_HD int KvRowBytes(KvFormat f, int head_dim) {
  return f == KvFormat::kF32 ? head_dim * 4 : f == KvFormat::kBF16 ? head_dim * 2
         : f == KvFormat::kInt8 ? head_dim : head_dim / 2;
}

// Row `kv_row` (0..num_kv_heads-1: K of that head; num_kv_heads..: V) of slot `slot` in `block`.
PD_HD uint8_t* KvRow(const KvLayer& kv, int32_t block, int kv_row, int slot) {
  return kv.base + block * kv.page_bytes +
         static_cast<int64_t>(kv_row * kv.block_size + slot) * KvRowBytes(kv.format, kv.head_dim);
}
// Its f32 scale (int8/int4 only), after the page's 2 * num_kv_heads * block_size rows.
PD_HD float* KvScale(const KvLayer& kv, int32_t block, int kv_row, int slot) {
  uint8_t* scales = kv.base + block * kv.page_bytes +
                    static_cast<int64_t>(2 * kv.num_kv_heads * kv.block_size) *
                        KvRowBytes(kv.format, kv.head_dim);
  return reinterpret_cast<float*>(scales) + kv_row * kv.block_size + slot;
}

// Element d of a row as f32: the value (f32, bf16) or the code (int8, int4; the caller applies
// the row's scale once, as the CPU kernels do).
template <KvFormat F>
PD_HD float KvElem(const uint8_t* row, int d) {
  if constexpr (F == KvFormat::kF32) {
    return reinterpret_cast<const float*>(row)[d];
  } else if constexpr (F == KvFormat::kBF16) {
    return Bf16Float(reinterpret_cast<const uint16_t*>(row)[d]);
  } else if constexpr (F == KvFormat::kInt8) {
    return static_cast<float>(reinterpret_cast<const int8_t*>(row)[d]);
  } else {
    const int nibble = (row[d >> 1] >> ((d & 1) * 4)) & 0xf;
    return static_cast<float>(nibble >= 8 ? nibble - 16 : nibble);
  }
}
template <KvFormat F>
PD_HD float KvRowScale(const KvLayer& kv, int32_t block, int kv_row, int slot) {
  if constexpr (F == KvFormat::kInt8 || F == KvFormat::kInt4) {
    return *KvScale(kv, block, kv_row, slot);
  } else {
    return 1.0f;
  }
}

// The longest head_dim the register layout of WarpStoreRow (and the kernels using it) holds.
inline constexpr int kMaxHeadDim = 256;
inline constexpr int kMaxPairsPerLane = kMaxHeadDim / 2 / kWarpSize;

// One warp stores a row held in registers as rotate-half pairs: lane l holds elements
// i = l + 32 j and i + d/2 in lo[j], hi[j] (j < pairs; lanes past d/2 hold zeros). int8/int4 rows
// are quantized as kernels/cpu/kv_quant.cc does, to the same bytes: scale = max|x| / L, codes
// round-half-even(x * (L / max|x|)) with the factor in double, a row with inf/NaN stored as zero
// codes with a NaN scale. int4 needs head_dim % 4 == 0 (a byte's two nibbles are on lanes l, l^1).
template <KvFormat F, typename Ctx>
PD_DEVICE void WarpStoreRow(Ctx& ctx, const float* lo, const float* hi, int pairs, int head_dim,
                            uint8_t* row, float* scale_out) {
  const int lane = ctx.thread() % kWarpSize, half = head_dim / 2;
  if constexpr (F == KvFormat::kF32 || F == KvFormat::kBF16) {
    for (int j = 0; j < kMaxPairsPerLane && j < pairs; ++j) {
      const int i = lane + j * kWarpSize;
      if (i >= half) break;
      if constexpr (F == KvFormat::kF32) {
        reinterpret_cast<float*>(row)[i] = lo[j];
        reinterpret_cast<float*>(row)[i + half] = hi[j];
      } else {
        reinterpret_cast<uint16_t*>(row)[i] = FloatBf16(lo[j]);
        reinterpret_cast<uint16_t*>(row)[i + half] = FloatBf16(hi[j]);
      }
    }
  } else {
    constexpr int kLevels = F == KvFormat::kInt8 ? 127 : 7;
    float amax = 0.0f, bad = 0.0f;
    for (int j = 0; j < kMaxPairsPerLane && j < pairs; ++j) {
      if (lane + j * kWarpSize >= half) break;
      if (!IsFinite(lo[j]) || !IsFinite(hi[j])) bad = 1.0f;
      amax = Max(amax, Max(lo[j] < 0 ? -lo[j] : lo[j], hi[j] < 0 ? -hi[j] : hi[j]));
    }
    amax = WarpMax(ctx, amax);
    bad = WarpMax(ctx, bad);
    const double inv = (bad != 0.0f || amax == 0.0f) ? 0.0 : static_cast<double>(kLevels) / amax;
    auto code = [&](float x) {
      if (inv == 0.0) return 0;  // A zero row, or one with inf/NaN: zero codes, as the CPU writes.
      double c = RoundEven(static_cast<double>(x) * inv);
      c = c > kLevels ? kLevels : c < -kLevels ? -kLevels : c;
      return static_cast<int>(c);
    };
    for (int j = 0; j < kMaxPairsPerLane && j < pairs; ++j) {  // All lanes, every j (int4 shuffles).
      const int i = lane + j * kWarpSize;
      const bool mine = i < half;
      const int c_lo = mine ? code(lo[j]) : 0, c_hi = mine ? code(hi[j]) : 0;
      if constexpr (F == KvFormat::kInt8) {
        if (mine) {
          reinterpret_cast<int8_t*>(row)[i] = static_cast<int8_t>(c_lo);
          reinterpret_cast<int8_t*>(row)[i + half] = static_cast<int8_t>(c_hi);
        }
      } else {
        const int n_lo = ctx.shfl_xor(c_lo, 1), n_hi = ctx.shfl_xor(c_hi, 1);
        if (mine && (lane & 1) == 0) {  // Byte i/2 = element i (low nibble), i + 1 (high).
          row[i >> 1] = static_cast<uint8_t>((c_lo & 0xf) | ((n_lo & 0xf) << 4));
          row[(i + half) >> 1] = static_cast<uint8_t>((c_hi & 0xf) | ((n_hi & 0xf) << 4));
        }
      }
    }
    if (lane == 0) {
      *scale_out = bad != 0.0f ? BitsFloat(0x7fc00000u)
                               : static_cast<float>(static_cast<double>(amax) / kLevels);
    }
  }
}

}  // namespace pdserve::cuda

#endif  // PDSERVE_KERNELS_CUDA_KV_PAGE_H_
