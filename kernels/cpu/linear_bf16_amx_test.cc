// The AMX path's logic (staging the activations, whole and partial k tiles, token tails, panel
// pairs, column ranges) on any CPU: its kernel template runs over an emulation of the eight tile
// registers written from Intel's pseudocode of LDTILECFG, TILELOADD, TILEZERO, TDPBF16PS and
// TILESTORED. The emulation stands in for hardware most of our machines lack; its TDPBF16PS is
// what a Xeon's was measured to do (an even and an odd chain of flushing FMAs per instruction,
// then one add: linear_bf16_amx.h), which AmxEnabled() checks on a real AMX CPU before use, and
// the hardware test below checks where one runs the tests.
#include "kernels/cpu/linear_bf16_amx.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "common/base/dtype.h"
#include "common/base/rng.h"
#include "gtest/gtest.h"
#include "kernels/cpu/linear_bf16.h"

namespace pdserve::kernels {
namespace {

float Flush(float f) { return std::fpclassify(f) == FP_SUBNORMAL ? std::copysign(0.0f, f) : f; }

// Eight tiles of up to 16 rows x 64 bytes, shaped by the last Configure.
struct EmulatedTiles {
  static inline amx::TileConfig cfg;
  static inline bool configured = false;
  static inline uint8_t tile[8][16][64];
  static inline int dots = 0;

  static void Configure(const amx::TileConfig& c) {
    ASSERT_EQ(c.palette_id, 1);
    for (int t = 0; t < 8; ++t) {
      ASSERT_LE(c.rows[t], 16) << "tile " << t;
      ASSERT_LE(c.colsb[t], 64) << "tile " << t;
    }
    cfg = c;
    configured = true;
    std::memset(tile, 0, sizeof(tile));  // LDTILECFG zeroes the tiles.
  }
  static void Check(int t) {
    ASSERT_TRUE(configured) << "tile " << t << " used without a configuration";
    ASSERT_GT(cfg.rows[t], 0) << "tile " << t << " is not configured";
    ASSERT_GT(cfg.colsb[t], 0) << "tile " << t << " is not configured";
  }
  template <int T>
  static void Zero() {
    Check(T);
    std::memset(tile[T], 0, sizeof(tile[T]));
  }
  template <int T>
  static void Load(const void* p, int64_t stride) {
    Check(T);
    std::memset(tile[T], 0, sizeof(tile[T]));  // Bytes past colsb and rows read as zero.
    for (int r = 0; r < cfg.rows[T]; ++r) {
      std::memcpy(tile[T][r], static_cast<const uint8_t*>(p) + r * stride, cfg.colsb[T]);
    }
  }
  static float Bf16(int t, int row, int element) {
    uint16_t v;
    std::memcpy(&v, &tile[t][row][2 * element], 2);
    return Flush(Bf16ToF32(v));  // DAZ.
  }
  template <int C, int A, int B>
  static void Dot() {
    Check(C);
    Check(A);
    Check(B);
    // TDPBF16PS's shape rules (#UD otherwise).
    ASSERT_EQ(cfg.rows[A], cfg.rows[C]);
    ASSERT_EQ(cfg.colsb[A] / 4, cfg.rows[B]);
    ASSERT_EQ(cfg.colsb[B], cfg.colsb[C]);
    for (int m = 0; m < cfg.rows[C]; ++m) {
      for (int n = 0; n < cfg.colsb[C] / 4; ++n) {
        float even = 0.0f, odd = 0.0f;
        for (int k = 0; k < cfg.colsb[A] / 4; ++k) {
          even = Flush(std::fma(Bf16(A, m, 2 * k), Bf16(B, k, 2 * n), even));
          odd = Flush(std::fma(Bf16(A, m, 2 * k + 1), Bf16(B, k, 2 * n + 1), odd));
        }
        float acc;
        std::memcpy(&acc, &tile[C][m][4 * n], 4);
        acc = Flush(acc + Flush(even + odd));
        std::memcpy(&tile[C][m][4 * n], &acc, 4);
      }
    }
    ++dots;
  }
  template <int T>
  static void Store(void* p, int64_t stride) {
    Check(T);
    for (int r = 0; r < cfg.rows[T]; ++r) {
      std::memcpy(static_cast<uint8_t*>(p) + r * stride, tile[T][r], cfg.colsb[T]);
    }
  }
  static void Release() { configured = false; }
};

std::vector<uint16_t> RandomBf16(int64_t n, uint64_t seed, bool adversarial) {
  SplitMix64 rng(seed);
  std::vector<uint16_t> v(n);
  for (int64_t i = 0; i < n; ++i) {
    float f = static_cast<float>(rng.Normal());
    if (adversarial) {
      switch (rng.Next() % 6) {
        case 0: f *= 1e-20f; break;                                             // Products underflow.
        case 1: v[i] = static_cast<uint16_t>(1 + rng.Next() % 0x7f); continue;  // Denormal.
        case 2: f = i > 0 ? -Bf16ToF32(v[i - 1]) : 0.0f; break;                 // Cancels.
        case 3: f = -0.0f; break;
        case 4: f = 0.0f; break;
        default: break;
      }
    }
    v[i] = F32ToBf16(f);
  }
  return v;
}

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// The tiled kernel over emulated tiles gives the kBf16PanelsAmx order's bits (its scalar
// reference) for every tail of k, m and n and column ranges that start and end inside panels;
// nothing outside the range is written. Where the CPU has AMX, the instructions give them too.
TEST(LinearBf16Amx, TilesGiveTheAmxOrderBits) {
  for (bool adversarial : {false, true}) {
    for (int64_t k : {1, 2, 31, 32, 33, 64, 100, 576}) {
      for (int64_t n : {1, 16, 17, 40, 97}) {
        for (int64_t m : {1, 5, 16, 17, 33}) {
          const uint64_t seed = 7919 * k + 31 * n + m + (adversarial ? 1 : 0);
          const std::vector<uint16_t> w = RandomBf16(n * k, seed, adversarial);
          const int64_t ldx = k + 1, ldy = n + 3;
          const std::vector<uint16_t> x = RandomBf16(m * ldx, seed + 1, adversarial);
          const Bf16PanelMatrix packed({DType::kBF16, w.data(), n, k},
                                       MatrixLayout::kBf16PanelsAmx);
          const int64_t ranges[2][2] = {{0, n}, {n / 3, n - n / 5}};
          for (const auto& range : ranges) {
            const int64_t lo = range[0], hi = range[1];
            std::vector<float> emulated(m * ldy, -1), ref(m * ldy, -1), hardware(m * ldy, -1);
            EmulatedTiles::dots = 0;
            amx::Columns<EmulatedTiles>(x.data(), m, ldx, packed.ref(), emulated.data(), ldy, lo,
                                        hi);
            if (lo < hi) ASSERT_GT(EmulatedTiles::dots, 0);
            ASSERT_FALSE(EmulatedTiles::configured) << "tiles not released";
            LinearBf16Reference(x.data(), m, ldx, packed.ref(), ref.data(), ldy, lo, hi);
            if (AmxEnabled()) {
              internal::LinearBf16ColumnsAmx(x.data(), m, ldx, packed.ref(), hardware.data(), ldy,
                                             lo, hi);
            }
            for (int64_t i = 0; i < m * ldy; ++i) {
              ASSERT_EQ(Bits(emulated[i]), Bits(ref[i]))
                  << "k=" << k << " n=" << n << " m=" << m << " lo=" << lo << " hi=" << hi
                  << " row=" << i / ldy << " col=" << i % ldy << ": " << emulated[i] << " vs "
                  << ref[i];
              if (AmxEnabled()) {
                ASSERT_EQ(Bits(hardware[i]), Bits(ref[i]))
                    << "TDPBF16PS: k=" << k << " n=" << n << " m=" << m << " row=" << i / ldy
                    << " col=" << i % ldy;
              }
            }
          }
        }
      }
    }
  }
  if (!AmxSupported()) GTEST_SKIP() << "needs amx_bf16: the emulated tiles only (no TDPBF16PS here)";
}

// With `accumulate` the C tiles start from y: k split at a whole tile into two calls gives one
// call's bits (attention's P.V continues its sums so), for ranges cut inside panels too.
TEST(LinearBf16Amx, AccumulateAtAWholeTileEqualsOneCall) {
  for (bool adversarial : {false, true}) {
    for (int64_t k : {33, 64, 69, 100, 160}) {
      for (int64_t split = 32; split < k; split += 32) {
        const int64_t n = 37, m = 19, ldx = k + 2, ldy = n + 1;
        const uint64_t seed = 31 * k + split + (adversarial ? 7 : 0);
        const std::vector<uint16_t> w = RandomBf16(n * k, seed, adversarial);
        const std::vector<uint16_t> x = RandomBf16(m * ldx, seed + 1, adversarial);
        const Bf16PanelMatrix packed({DType::kBF16, w.data(), n, k}, MatrixLayout::kBf16PanelsAmx);
        const MatrixRef& whole = packed.ref();
        MatrixRef head = whole, rest = whole;
        head.cols = split;
        head.panel_stride = internal::PanelElements(k);
        rest.cols = k - split;
        rest.panel_stride = internal::PanelElements(k);
        rest.data = static_cast<const uint16_t*>(whole.data) + split * internal::kPanelRows;
        for (const auto [lo, hi] : {std::pair<int64_t, int64_t>{0, n}, {5, 30}}) {
          std::vector<float> one(m * ldy, -1), emulated(m * ldy, -1), hardware(m * ldy, -1);
          LinearBf16Reference(x.data(), m, ldx, whole, one.data(), ldy, lo, hi);
          amx::Columns<EmulatedTiles>(x.data(), m, ldx, head, emulated.data(), ldy, lo, hi);
          amx::Columns<EmulatedTiles>(x.data() + split, m, ldx, rest, emulated.data(), ldy, lo, hi,
                                      /*accumulate=*/true);
          if (AmxEnabled()) {
            internal::LinearBf16ColumnsAmx(x.data(), m, ldx, head, hardware.data(), ldy, lo, hi);
            internal::LinearBf16ColumnsAmx(x.data() + split, m, ldx, rest, hardware.data(), ldy, lo,
                                           hi, /*accumulate=*/true);
          }
          for (int64_t i = 0; i < m * ldy; ++i) {
            ASSERT_EQ(Bits(emulated[i]), Bits(one[i]))
                << "k=" << k << " split=" << split << " lo=" << lo << " i=" << i;
            if (AmxEnabled()) ASSERT_EQ(Bits(hardware[i]), Bits(one[i])) << "TDPBF16PS k=" << k;
          }
        }
      }
    }
  }
  if (!AmxSupported()) GTEST_SKIP() << "needs amx_bf16: the emulated tiles only (no TDPBF16PS here)";
}

// The two orders are different sums: over a long k most outputs differ by a few ulps, and none by
// more than the rounding of k products could explain. (If the reference ignored the layout, the
// AMX path could pass its tests with the VDPBF16PS order's bits.)
TEST(LinearBf16Amx, OrdersDiffer) {
  const int64_t n = 64, k = 576, m = 4;
  const std::vector<uint16_t> w = RandomBf16(n * k, 5, false), x = RandomBf16(m * k, 6, false);
  const MatrixRef rows{DType::kBF16, w.data(), n, k};
  const Bf16PanelMatrix plain(rows, MatrixLayout::kBf16Panels);
  const Bf16PanelMatrix amx_packed(rows, MatrixLayout::kBf16PanelsAmx);
  std::vector<float> a(m * n), b(m * n);
  LinearBf16Reference(x.data(), m, k, plain.ref(), a.data(), n, 0, n);
  LinearBf16Reference(x.data(), m, k, amx_packed.ref(), b.data(), n, 0, n);
  int differ = 0;
  for (int64_t i = 0; i < m * n; ++i) {
    differ += Bits(a[i]) != Bits(b[i]);
    EXPECT_NEAR(a[i], b[i], 1e-5 * k * 4);
  }
  EXPECT_GT(differ, m * n / 4);
}

// Both layouts hold the same bytes: Bf16PanelsAt reads W back from either.
TEST(LinearBf16Amx, PackingsHoldTheSameMatrix) {
  const int64_t n = 21, k = 13;
  const std::vector<uint16_t> w = RandomBf16(n * k, 3, false);
  const MatrixRef rows{DType::kBF16, w.data(), n, k};
  const Bf16PanelMatrix amx_packed(rows, MatrixLayout::kBf16PanelsAmx);
  const Bf16PanelMatrix plain(rows, MatrixLayout::kBf16Panels);
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t i = 0; i < k; ++i) {
      ASSERT_EQ(Bf16PanelsAt(amx_packed.ref(), j, i), w[j * k + i]);
      ASSERT_EQ(Bf16PanelsAt(plain.ref(), j, i), w[j * k + i]);
    }
  }
  ASSERT_EQ(std::memcmp(plain.ref().data, amx_packed.ref().data, plain.ref().bytes()), 0);
}

// The path is on exactly where the CPU offers AMX-BF16 and neither PDSERVE_AMX=0 nor
// PDSERVE_KERNEL_ISA=avx2 is set (the hardware then gave its order's bits at start-up: the check
// failing on an AMX CPU fails this test), and the weights are packed for the path in use. ctest
// runs this binary once more with PDSERVE_AMX=0.
TEST(LinearBf16Amx, OnWhereTheCpuHasIt) {
  const char* flag = std::getenv("PDSERVE_AMX");
  const char* isa = std::getenv("PDSERVE_KERNEL_ISA");
  const bool off = (flag != nullptr && std::strcmp(flag, "0") == 0) ||
                   (isa != nullptr && std::strcmp(isa, "avx2") == 0);
  EXPECT_EQ(AmxEnabled(), AmxSupported() && !off);
  EXPECT_EQ(Bf16PanelLayout(),
            AmxEnabled() ? MatrixLayout::kBf16PanelsAmx : MatrixLayout::kBf16Panels);
  std::printf("AMX-BF16: supported %d, enabled %d\n", AmxSupported(), AmxEnabled());
}

}  // namespace
}  // namespace pdserve::kernels
