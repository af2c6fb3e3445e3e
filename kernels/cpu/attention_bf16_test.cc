#include "kernels/cpu/attention_bf16.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <utility>
#include <vector>

#include "common/base/rng.h"
#include "common/kvcache/kv_cache_spec.h"
#include "gtest/gtest.h"
#include "kernels/cpu/linear_bf16.h"

namespace pdserve::kernels {
namespace {

// A pool of `ctx` random tokens behind a scrambled block table.
struct Pool {
  // `adversarial`: most K and V elements zeros of both signs, denormals or values so small that
  // their products underflow (sums then become zeros of either sign).
  Pool(KvDType dtype, int64_t kvh, int64_t d, int64_t bs, int64_t ctx, uint64_t seed,
       bool adversarial = false) {
    const int64_t blocks = (ctx + bs - 1) / bs;
    const size_t page = KvCacheSpec{1, kvh, d, bs, dtype}.PageBytes();
    bytes.resize(blocks * page);
    view = KvPagesView{bytes.data(), page, bs, kvh, d, dtype};
    table.resize(blocks);
    std::iota(table.rbegin(), table.rend(), 0);
    if (blocks > 3) std::swap(table[1], table[3]);
    SplitMix64 rng(seed);
    for (int64_t p = 0; p < ctx; ++p) {
      std::vector<float> k(kvh * d), v(kvh * d);
      for (float& x : k) x = static_cast<float>(rng.Normal() * 2);
      for (float& x : v) x = static_cast<float>(rng.Normal());
      if (adversarial) {
        for (float& x : k) x = Adversarial(x, rng);
        for (int64_t e = 0; e < kvh * d; ++e) {
          // Odd columns: negative values just above FLT_MIN (any P < 1 times one underflows to
          // -0) and some +0, so their sums are zeros of both signs.
          const float tiny = -1.2e-38f * (1.0f + static_cast<float>(rng.Next() % 64) / 64.0f);
          v[e] = e % 2 == 0 ? Adversarial(v[e], rng) : rng.Next() % 8 == 0 ? 0.0f : tiny;
        }
      }
      StoreKv(view, table.data(), p, k.data(), v.data());
    }
  }
  static float Adversarial(float x, SplitMix64& rng) {
    switch (rng.Next() % 6) {
      case 0: return 0.0f;
      case 1: return -0.0f;
      case 2: return x * 1e-37f;                                            // Products underflow.
      case 3: return std::copysign(Bf16ToF32(1 + rng.Next() % 0x7f), x);  // A bf16 denormal.
      case 4: return x * 1e-30f;
      default: return x;
    }
  }
  std::vector<uint8_t> bytes;
  std::vector<int32_t> table;
  KvPagesView view;
};

std::vector<float> RandomQ(int64_t rows, int64_t heads, int64_t d, uint64_t seed) {
  SplitMix64 rng(seed);
  std::vector<float> q(rows * heads * d);
  for (float& x : q) x = static_cast<float>(rng.Normal());
  return q;
}

bool SameBits(const float* a, const float* b, int64_t n) {
  return std::memcmp(a, b, static_cast<size_t>(n) * sizeof(float)) == 0;
}

// Runs PagedAttentionBf16 over rows [0, rows) at first_position.. in tile shares of `step`, for
// each KV group (or each single head), and checks every row and head against the reference.
void CheckAgainstReference(KvDType dtype, int64_t d, int64_t bs, int64_t window,
                           int64_t first_position, int64_t rows, int64_t step, bool per_head,
                           MatrixLayout order) {
  const int64_t kvh = 2, group = 3, heads = kvh * group;
  const int64_t ctx = first_position + rows;
  Pool pool(dtype, kvh, d, bs, ctx, static_cast<uint64_t>(d * 131 + bs));
  const auto q = RandomQ(rows, heads, d, static_cast<uint64_t>(rows + window));
  std::vector<float> out(rows * heads * d, -1.0f), ref(heads * d);
  std::vector<uint8_t> scratch(PagedAttentionBf16ScratchBytes(ctx, group, d, window > 0));
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const int64_t calls = per_head ? heads : kvh;
  for (int64_t c = 0; c < calls; ++c) {
    const int64_t hb = per_head ? c : c * group, he = per_head ? c + 1 : hb + group;
    for (int64_t t = 0; t < step; ++t) {
      PagedAttentionBf16(pool.view, pool.table.data(), first_position, rows, t, step, window,
                         q.data(), heads * d, heads, scale, hb, he, out.data(), heads * d,
                         scratch.data(), scratch.size(), order);
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    PagedAttentionBf16Reference(pool.view, pool.table.data(), first_position + r, window,
                                &q[r * heads * d], heads, scale, 0, heads, ref.data(), order);
    ASSERT_TRUE(SameBits(&out[r * heads * d], ref.data(), heads * d))
        << KvDTypeName(dtype) << " d=" << d << " bs=" << bs << " window=" << window
        << " amx_order=" << (order == MatrixLayout::kBf16PanelsAmx)
        << " first=" << first_position << " row=" << r << " step=" << step
        << " per_head=" << per_head << ": " << out[r * heads * d] << " vs " << ref[0];
  }
}

constexpr MatrixLayout kOrders[] = {MatrixLayout::kBf16Panels, MatrixLayout::kBf16PanelsAmx};

// The fast path (packed panels, tiles of rows, shares of tiles, VDPBF16PS or its AVX2 twin; the
// scores on AMX tiles in AMX's order where AMX is on, else that order's scalar reference) gives
// the reference's bits for every row: any KV dtype, head sizes with partial panels and an odd one,
// windows whose rows start at both parities, tiles sharing a call and decode-like single rows.
TEST(AttentionBf16Test, TilesEqualTheReferenceBitwise) {
  for (auto [dot, order] : {std::pair{true, kOrders[0]}, std::pair{false, kOrders[0]},
                            std::pair{true, kOrders[1]}}) {
    SetBf16DotEnabled(dot);
    for (KvDType dtype : {KvDType::kF32, KvDType::kBF16, KvDType::kInt8, KvDType::kInt4}) {
      for (int64_t d : {64, 24, 10}) {
        for (int64_t window : {0, 5, 40}) {
          CheckAgainstReference(dtype, d, 16, window, 0, 37, 1, false, order);
          CheckAgainstReference(dtype, d, 4, window, 13, 29, 2, false, order);
          CheckAgainstReference(dtype, d, 16, window, 50, 1, 1, true, order);
        }
      }
    }
    CheckAgainstReference(KvDType::kF32, 17, 8, 0, 3, 12, 1, false, order);
    CheckAgainstReference(KvDType::kF32, 128, 16, 7, 100, 70, 3, true, order);
    // Contexts of several 32-key tiles (AMX's order splits P.V there), windows longer than one.
    CheckAgainstReference(KvDType::kBF16, 64, 16, 0, 90, 40, 1, false, order);
    CheckAgainstReference(KvDType::kInt8, 32, 8, 45, 70, 33, 2, false, order);
    // Decode rows (one row per call: registers instead of packed panels where the CPU has
    // AVX512-BF16): all heads of a KV head, odd and even key counts, windows, 128-wide heads.
    for (KvDType dtype : {KvDType::kF32, KvDType::kBF16}) {
      for (int64_t first : {0, 1, 30, 31, 77}) {
        CheckAgainstReference(dtype, 64, 16, 0, first, 1, 1, false, order);
        CheckAgainstReference(dtype, 128, 8, 9, first, 1, 1, false, order);
        CheckAgainstReference(dtype, 32, 4, 20, first, 1, 1, true, order);
      }
    }
  }
  SetBf16DotEnabled(true);
}

// A row computed inside a chunk equals the same row computed alone (as decode computes it),
// also when a later row of the chunk holds values that are not finite.
void ChunkRowEqualsDecodeRow(MatrixLayout order) {
  const int64_t kvh = 1, heads = 2, d = 64, bs = 16, first = 20, rows = 16;
  Pool pool(KvDType::kF32, kvh, d, bs, first + rows, 5);
  // Row 9's value is +inf in one element, row 12's key NaN.
  reinterpret_cast<float*>(pool.view.Value(pool.table[(first + 9) / bs], 0, (first + 9) % bs))[3] = INFINITY;
  reinterpret_cast<float*>(pool.view.Key(pool.table[(first + 12) / bs], 0, (first + 12) % bs))[0] = NAN;
  const auto q = RandomQ(rows, heads, d, 6);
  std::vector<uint8_t> scratch(PagedAttentionBf16ScratchBytes(first + rows, heads, d, false));
  std::vector<float> chunk(rows * heads * d), alone(heads * d);
  PagedAttentionBf16(pool.view, pool.table.data(), first, rows, 0, 1, 0, q.data(), heads * d, heads,
                     0.125f, 0, heads, chunk.data(), heads * d, scratch.data(), scratch.size(),
                     order);
  for (int64_t r = 0; r < rows; ++r) {
    PagedAttentionBf16(pool.view, pool.table.data(), first + r, 1, 0, 1, 0, &q[r * heads * d],
                       heads * d, heads, 0.125f, 0, heads, alone.data(), heads * d, scratch.data(),
                       scratch.size(), order);
    if (r < 9) {
      for (float x : alone) ASSERT_TRUE(std::isfinite(x)) << r;
    } else {
      EXPECT_TRUE(std::isinf(alone[3]) || std::isnan(alone[3])) << r;
    }
    if (r < 12) {
      ASSERT_TRUE(SameBits(&chunk[r * heads * d], alone.data(), heads * d)) << r;
    } else {
      EXPECT_TRUE(std::isnan(chunk[r * heads * d]) && std::isnan(alone[0])) << r;
    }
  }
}

// Decode rows (registers in both orders) and chunks against the reference on K and V built to
// make chains of zeros of both signs: AMX's order on VDPBF16PS masks the other element of each
// pair with a product of -0, which leaves every sum as it was (a +0 would turn -0 into +0).
TEST(AttentionBf16Test, SignedZerosAndUnderflowKeepTheirBits) {
  const int64_t kvh = 1, heads = 3, d = 64, bs = 16, ctx = 100;
  for (KvDType dtype : {KvDType::kBF16, KvDType::kF32}) {
    for (uint64_t seed : {1, 2, 3}) {
      Pool pool(dtype, kvh, d, bs, ctx, seed, /*adversarial=*/true);
      SplitMix64 rng(seed + 100);
      std::vector<float> q(ctx * heads * d);
      for (float& x : q) x = Pool::Adversarial(static_cast<float>(rng.Normal()), rng);
      std::vector<uint8_t> scratch(PagedAttentionBf16ScratchBytes(ctx, heads, d, false));
      std::vector<float> out(ctx * heads * d), ref(heads * d);
      for (MatrixLayout order : kOrders) {
        // Every row alone (decode), then all rows as one chunk.
        for (int64_t rows : {int64_t{1}, ctx}) {
          for (int64_t first = 0; first < ctx; first += rows) {
            PagedAttentionBf16(pool.view, pool.table.data(), first, rows, 0, 1, 0,
                               &q[first * heads * d], heads * d, heads, 1.0f, 0, heads,
                               &out[first * heads * d], heads * d, scratch.data(), scratch.size(),
                               order);
          }
          int zeros = 0;
          for (int64_t r = 0; r < ctx; ++r) {
            PagedAttentionBf16Reference(pool.view, pool.table.data(), r, 0, &q[r * heads * d],
                                        heads, 1.0f, 0, heads, ref.data(), order);
            ASSERT_TRUE(SameBits(&out[r * heads * d], ref.data(), heads * d))
                << KvDTypeName(dtype) << " seed " << seed << " rows " << rows << " row " << r
                << " amx_order " << (order == MatrixLayout::kBf16PanelsAmx);
            for (int64_t i = 0; i < heads * d; ++i) zeros += ref[i] == 0.0f && std::signbit(ref[i]);
          }
          // (In AMX's order a tile's end adds to +0 or to a normal value, so -0 outputs are
          // rarer; the chains still hold -0 on the way.)
          if (order == MatrixLayout::kBf16Panels) {
            EXPECT_GT(zeros, 100) << "the data should make -0";
          }
        }
      }
    }
  }
}

// One output built to be -0 in AMX's order only if the masked element's product is -0: row 95's
// P.V, column 0, over three 32-key tiles. Tile 1 sums to 2e-38 and tile 2 to -3e-38, so the
// accumulator becomes -1e-38, a denormal, flushed to -0; in tile 3 every product is -0 or
// underflows to it (P ~ 4.5e-5 times -1.2e-38), so both chains end at -0 and -0 + (-0 + -0) is -0.
// Masking with +0 would turn each chain's -0 into +0 at every step and give +0.
TEST(AttentionBf16Test, AmxOrderKeepsANegativeZeroAcrossTiles) {
  const int64_t kvh = 1, heads = 1, d = 32, bs = 16, ctx = 96;
  Pool pool(KvDType::kBF16, kvh, d, bs, ctx, 1);
  std::vector<float> k(d), v(d);
  for (int64_t j = 0; j < ctx; ++j) {
    std::fill(k.begin(), k.end(), 0.0f);
    std::fill(v.begin(), v.end(), 0.0f);
    if (j >= 64) k[0] = -10.0f;  // Score -10: P = bf16(exp(-10)).
    v[0] = j == 0    ? 2e-38f
           : j == 32 ? -3e-38f
           : j >= 94 ? -0.0f
           : j >= 64 ? -1.2e-38f
                     : 0.0f;
    StoreKv(pool.view, pool.table.data(), j, k.data(), v.data());
  }
  std::vector<float> q(d, 0.0f), out(d), ref(d);
  q[0] = 1.0f;
  std::vector<uint8_t> scratch(PagedAttentionBf16ScratchBytes(ctx, heads, d, false));
  PagedAttentionBf16Reference(pool.view, pool.table.data(), ctx - 1, 0, q.data(), heads, 1.0f, 0,
                              heads, ref.data(), MatrixLayout::kBf16PanelsAmx);
  ASSERT_EQ(ref[0], 0.0f);
  ASSERT_TRUE(std::signbit(ref[0])) << "the data should make -0 in AMX's order";
  for (int64_t rows : {int64_t{1}, ctx}) {  // The decode row's registers, a chunk's tiles.
    const int64_t first = ctx - rows;
    std::vector<float> qs(rows * d);
    for (int64_t r = 0; r < rows; ++r) std::copy(q.begin(), q.end(), qs.begin() + r * d);
    std::vector<float> outs(rows * d);
    PagedAttentionBf16(pool.view, pool.table.data(), first, rows, 0, 1, 0, qs.data(), d, heads,
                       1.0f, 0, heads, outs.data(), d, scratch.data(), scratch.size(),
                       MatrixLayout::kBf16PanelsAmx);
    EXPECT_TRUE(SameBits(&outs[(rows - 1) * d], ref.data(), d)) << "rows " << rows << ": "
                                                                << outs[(rows - 1) * d];
  }
}

TEST(AttentionBf16Test, ChunkRowEqualsDecodeRowWithInfiniteLaterValues) {
  for (MatrixLayout order : kOrders) ChunkRowEqualsDecodeRow(order);
}

// bf16 attention is attention: within bf16's rounding of the f32 kernel's result.
TEST(AttentionBf16Test, CloseToF32Attention) {
  for (KvDType dtype : {KvDType::kF32, KvDType::kBF16, KvDType::kInt8, KvDType::kInt4}) {
    const int64_t kvh = 2, group = 4, heads = kvh * group, d = 128, ctx = 300;
    Pool pool(dtype, kvh, d, 16, ctx, 11);
    const auto q = RandomQ(1, heads, d, 12);
    std::vector<float> f32(heads * d), bf16(heads * d), scratch_f32(ctx);
    std::vector<uint8_t> scratch(PagedAttentionBf16ScratchBytes(ctx, group, d, false));
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    PagedAttention(pool.view, pool.table.data(), ctx - 1, 0, q.data(), heads, scale, 0, heads,
                   f32.data(), scratch_f32.data());
    for (int64_t h = 0; h < heads; h += group) {
      PagedAttentionBf16(pool.view, pool.table.data(), ctx - 1, 1, 0, 1, 0, q.data(), heads * d,
                         heads, scale, h, h + group, bf16.data(), heads * d, scratch.data(),
                         scratch.size(), Bf16PanelLayout());
    }
    double err = 0, norm = 0;
    for (int64_t i = 0; i < heads * d; ++i) {
      err = std::max(err, std::abs(double(bf16[i]) - f32[i]));
      norm = std::max(norm, std::abs(double(f32[i])));
    }
    EXPECT_LT(err, 0.02 * norm) << KvDTypeName(dtype);
    EXPECT_GT(err, 0.0) << "bf16 rounding should show";
  }
}

// Every row of a chunk (tiles, small heads, small blocks) is close to the f32 kernel's row.
TEST(AttentionBf16Test, ChunkRowsCloseToF32Attention) {
  for (KvDType dtype : {KvDType::kF32, KvDType::kInt8, KvDType::kInt4}) {
    for (int64_t d : {16, 64}) {
      const int64_t kvh = 2, group = 2, heads = kvh * group, rows = 21, bs = 4;
      Pool pool(dtype, kvh, d, bs, rows, 13);
      const auto q = RandomQ(rows, heads, d, 14);
      std::vector<float> f32(rows * heads * d), bf16(rows * heads * d), scratch_f32(rows);
      std::vector<uint8_t> scratch(PagedAttentionBf16ScratchBytes(rows, group, d, false));
      const float scale = 1.0f / std::sqrt(static_cast<float>(d));
      for (int64_t r = 0; r < rows; ++r) {
        PagedAttention(pool.view, pool.table.data(), r, 0, &q[r * heads * d], heads, scale, 0,
                       heads, &f32[r * heads * d], scratch_f32.data());
      }
      for (int64_t h = 0; h < heads; h += group) {
        PagedAttentionBf16(pool.view, pool.table.data(), 0, rows, 0, 1, 0, q.data(), heads * d,
                           heads, scale, h, h + group, bf16.data(), heads * d, scratch.data(),
                           scratch.size(), Bf16PanelLayout());
      }
      for (int64_t i = 0; i < rows * heads * d; ++i) {
        ASSERT_NEAR(bf16[i], f32[i], 0.03) << KvDTypeName(dtype) << " d=" << d << " i=" << i;
      }
    }
  }
}

}  // namespace
}  // namespace pdserve::kernels
