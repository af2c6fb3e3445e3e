#include "kernels/cpu/linear_bf16.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "common/base/rng.h"
#include "common/base/thread_pool.h"
#include "gtest/gtest.h"
#include "kernels/cpu/linear_avx512.h"

namespace pdserve::kernels {
namespace {

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Values that exercise every rule of the sequence: denormal inputs (read as zero), products that
// underflow (flushed), exact cancellation (signed zeros), large magnitudes, plain normals.
enum class Values { kNormal, kAdversarial };

std::vector<uint16_t> RandomBf16(int64_t n, uint64_t seed, Values kind) {
  SplitMix64 rng(seed);
  std::vector<uint16_t> v(n);
  for (int64_t i = 0; i < n; ++i) {
    float f = static_cast<float>(rng.Normal());
    if (kind == Values::kAdversarial) {
      switch (rng.Next() % 6) {
        case 0: f *= 1e-20f; break;                                      // Products underflow.
        case 1: v[i] = static_cast<uint16_t>(1 + rng.Next() % 0x7f); continue;  // Denormal.
        case 2: f = i > 0 ? -Bf16ToF32(v[i - 1]) : 0.0f; break;          // Cancels its pair.
        case 3: f *= 1e18f; break;
        case 4: f = 0.0f; break;
        default: break;
      }
    }
    v[i] = F32ToBf16(f);
  }
  return v;
}

MatrixRef Ref(const std::vector<uint16_t>& w, int64_t n, int64_t k) {
  return MatrixRef{DType::kBF16, w.data(), n, k};
}

void ExpectBitwise(const std::vector<float>& a, const std::vector<float>& b, const char* what,
                   int64_t m, int64_t n, int64_t k) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(Bits(a[i]), Bits(b[i])) << what << " m=" << m << " n=" << n << " k=" << k
                                      << " i=" << i << ": " << a[i] << " vs " << b[i];
  }
}

TEST(RoundRowsToBf16, EqualsScalarRounding) {
  std::vector<float> x = {0.0f, -0.0f, 1.0f, 1.00390625f /* tie, even */, 1.01171875f /* tie, odd */,
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(),
                          std::numeric_limits<float>::denorm_min(), -1e-39f,
                          std::numeric_limits<float>::max(), 3.3895314e38f, -65504.0f};
  SplitMix64 rng(3);
  for (int i = 0; i < 1000; ++i) x.push_back(static_cast<float>(rng.Normal() * std::exp2(int(rng.Next() % 60) - 30)));
  for (int i = 0; i < 64; ++i) {  // Signalling NaN payloads must come back quiet.
    const uint32_t u = 0x7f800001u + static_cast<uint32_t>(rng.Next() % 0x3fffff) + (i % 2 ? 0x80000000u : 0);
    float f;
    std::memcpy(&f, &u, 4);
    x.push_back(f);
  }
  const int64_t k = static_cast<int64_t>(x.size());
  for (bool avx512 : {false, true}) {  // 8 lanes, then 16 where the CPU has AVX-512.
    SetAvx512Enabled(avx512);
    std::vector<uint16_t> out(k);
    RoundRowsToBf16(x.data(), 1, k, k, out.data(), k);
    for (int64_t i = 0; i < k; ++i) {
      ASSERT_EQ(out[i], F32ToBf16(x[i])) << "avx512=" << avx512 << " i=" << i << " x=" << x[i];
    }
    EXPECT_EQ(out[3], 0x3f80);  // 1 + 2^-8 rounds to 1 (even).
    EXPECT_EQ(out[4], 0x3f82);  // 1 + 3 * 2^-8 rounds up to the even neighbour.
    for (int64_t i = k - 64; i < k; ++i) EXPECT_TRUE(std::isnan(Bf16ToF32(out[i])));
  }
}

// VCVTNEPS2BF16's conversion and the portable one agree on every kind of input: denormals
// (flushed, also those F32ToBf16 would round up to the smallest normal), ties, NaN, infinities.
TEST(RoundToBf16Ftz, FlushesDenormalsAndRoundsToNearestEven) {
  std::vector<float> x;
  for (uint32_t u : {0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x007f8000u, 0x007fffffu,
                     0x00800000u, 0x3f808000u, 0x3f818000u, 0x7f800000u, 0xff800000u, 0x7fc00001u,
                     0xff800001u, 0x7f7fffffu}) {
    float f;
    std::memcpy(&f, &u, 4);
    x.push_back(f);
  }
  SplitMix64 rng(8);
  for (int i = 0; i < 2000; ++i) {
    const uint32_t u = static_cast<uint32_t>(rng.Next());
    float f;
    std::memcpy(&f, &u, 4);
    x.push_back(f);  // Every exponent, denormals and NaNs included.
  }
  const int64_t n = static_cast<int64_t>(x.size());
  for (bool dot : {false, true}) {
    SetBf16DotEnabled(dot);
    std::vector<uint16_t> out(n);
    RoundToBf16Ftz(x.data(), n, out.data());
    for (int64_t i = 0; i < n; ++i) {
      const float flushed = std::fpclassify(x[i]) == FP_SUBNORMAL ? std::copysign(0.0f, x[i]) : x[i];
      ASSERT_EQ(out[i], F32ToBf16(flushed)) << "dot=" << dot << " i=" << i << " x=" << x[i];
    }
    EXPECT_EQ(out[5], 0x0000);  // F32ToBf16 would give 0x0080.
    EXPECT_EQ(out[3], 0x8000);
  }
  SetBf16DotEnabled(true);
}

// Every element lands where Bf16PanelsAt and the kernels read it, converted as F32ToBf16; the
// padding (rows past n, the odd k's last column) is zero; bytes() is the packed size.
TEST(Bf16Panels, PackingPlacesEveryElementAndZeroPads) {
  SplitMix64 rng(5);
  for (int64_t n : {1, 16, 37}) {
    for (int64_t k : {1, 2, 13, 64}) {
      std::vector<float> wf(n * k);
      for (float& v : wf) v = static_cast<float>(rng.Normal());
      std::vector<uint16_t> wb(n * k), wh(n * k);
      for (int64_t i = 0; i < n * k; ++i) {
        wb[i] = F32ToBf16(wf[i]);
        wh[i] = F32ToF16(wf[i]);
      }
      const MatrixRef sources[3] = {{DType::kF32, wf.data(), n, k}, {DType::kBF16, wb.data(), n, k},
                                    {DType::kF16, wh.data(), n, k}};
      for (const MatrixRef& src : sources) {
        const Bf16PanelMatrix packed(src);
        const MatrixRef& p = packed.ref();
        ASSERT_EQ(p.layout, Bf16PanelLayout());
        ASSERT_EQ(p.bytes(), Bf16PanelsBytes(n, k));
        ASSERT_EQ(p.bytes(), static_cast<size_t>((n + 15) / 16 * 16 * ((k + 1) / 2 * 2) * 2));
        for (int64_t j = 0; j < n; ++j) {
          for (int64_t i = 0; i < k; ++i) {
            const float f = src.dtype == DType::kF16 ? F16ToF32(wh[j * k + i]) : wf[j * k + i];
            ASSERT_EQ(Bf16PanelsAt(p, j, i), F32ToBf16(f)) << n << "x" << k << " " << j << "," << i;
          }
        }
        size_t nonzero = 0;
        const uint16_t* raw = static_cast<const uint16_t*>(p.data);
        for (size_t e = 0; e < p.bytes() / 2; ++e) nonzero += raw[e] != 0;
        size_t expected = 0;
        for (int64_t i = 0; i < n * k; ++i) expected += Bf16PanelsAt(p, i / k, i % k) != 0;
        EXPECT_EQ(nonzero, expected) << "padding is not zero, " << n << "x" << k;
      }
    }
  }
}

// VDPBF16PS, the AVX2 twin and the scalar reference perform one sequence: bitwise equal for every
// tile shape, remainder, tail and column range, on normal and adversarial values. (The AMX order:
// linear_bf16_amx_test.cc.)
TEST(LinearBf16, ThreePathsAreBitwiseEqual) {
  const bool hardware = Bf16DotSupported();
  for (Values kind : {Values::kNormal, Values::kAdversarial}) {
    for (int64_t k : {1, 7, 31, 32, 33, 64, 100, 576}) {
      for (int64_t n : {1, 5, 13, 16, 17, 40, 50, 97}) {
        for (int64_t m : {1, 2, 3, 4, 5, 8, 9, 11, 17}) {
          const uint64_t seed = 1000 * k + 10 * n + m;
          std::vector<uint16_t> w = RandomBf16(n * k, seed, kind);
          std::vector<uint16_t> x = RandomBf16(m * (k + 3), seed + 1, kind);
          const Bf16PanelMatrix packed(Ref(w, n, k), MatrixLayout::kBf16Panels);
          const int64_t ldx = k + 3, ldy = n + 2;  // Leading dimensions wider than the data.
          // The whole matrix, and a range that starts and ends inside panels.
          const int64_t ranges[2][2] = {{0, n}, {n / 3, n - n / 4}};
          for (const auto& range : ranges) {
            const int64_t lo = range[0], hi = range[1];
            std::vector<float> ref(m * ldy, -1), twin(m * ldy, -1), dot(m * ldy, -1);
            LinearBf16Reference(x.data(), m, ldx, packed.ref(), ref.data(), ldy, lo, hi);
            internal::LinearBf16ColumnsAvx2(x.data(), m, ldx, packed.ref(), twin.data(), ldy, lo, hi);
            ExpectBitwise(ref, twin, "avx2 twin", m, n, k);
            if (hardware) {
              internal::LinearBf16ColumnsAvx512(x.data(), m, ldx, packed.ref(), dot.data(), ldy, lo, hi);
              ExpectBitwise(ref, dot, "vdpbf16ps", m, n, k);
            }
            for (int64_t t = 0; t < m; ++t) {  // Nothing outside the range was written.
              for (int64_t j = 0; j < ldy; ++j) {
                if (j >= lo && j < hi) continue;
                ASSERT_EQ(ref[t * ldy + j], -1);
                ASSERT_EQ(twin[t * ldy + j], -1) << "twin wrote column " << j;
                if (hardware) ASSERT_EQ(dot[t * ldy + j], -1) << "vdpbf16ps wrote column " << j;
              }
            }
          }
        }
      }
    }
  }
  if (!hardware) GTEST_SKIP() << "needs avx512_bf16: this CPU has no AVX512-BF16: the twin and the reference were compared";
}

// The column kernels that take `accumulate` (AMX does not): the reference, the AVX2 twin, and
// VDPBF16PS where the CPU has it.
using ColumnPath = void (*)(const uint16_t*, int64_t, int64_t, const MatrixRef&, float*, int64_t,
                            int64_t, int64_t, bool);
std::vector<std::pair<const char*, ColumnPath>> ColumnPaths() {
  std::vector<std::pair<const char*, ColumnPath>> paths = {
      {"reference", &LinearBf16Reference}, {"avx2 twin", &internal::LinearBf16ColumnsAvx2}};
  if (Bf16DotSupported()) paths.push_back({"vdpbf16ps", &internal::LinearBf16ColumnsAvx512});
  return paths;
}

// With `accumulate` every path continues y's sums: k split at an even column into two calls gives
// one call's bits (attention_bf16.cc continues a tile's common keys row by row), and columns
// outside the range stay untouched.
TEST(LinearBf16, AccumulateContinuesTheSums) {
  const auto paths = ColumnPaths();
  for (Values kind : {Values::kNormal, Values::kAdversarial}) {
    for (int64_t k : {3, 9, 40, 101}) {
      for (int64_t n : {5, 16, 37}) {
        for (int64_t m : {1, 3, 8, 11}) {
          const uint64_t seed = 77 * k + 5 * n + m;
          const std::vector<uint16_t> w = RandomBf16(n * k, seed, kind);
          const std::vector<uint16_t> x = RandomBf16(m * k, seed + 1, kind);
          const int64_t split = k / 2 & ~int64_t{1};
          std::vector<uint16_t> w1(n * split), w2(n * (k - split));
          for (int64_t j = 0; j < n; ++j) {
            std::copy(w.begin() + j * k, w.begin() + j * k + split, w1.begin() + j * split);
            std::copy(w.begin() + j * k + split, w.begin() + (j + 1) * k, w2.begin() + j * (k - split));
          }
          const Bf16PanelMatrix whole(Ref(w, n, k), MatrixLayout::kBf16Panels);
          const Bf16PanelMatrix first(Ref(w1, n, split), MatrixLayout::kBf16Panels);
          const Bf16PanelMatrix second(Ref(w2, n, k - split), MatrixLayout::kBf16Panels);
          const int64_t lo = n / 4, hi = n - n / 5, ldy = n + 1;
          for (const auto& [name, path] : paths) {
            std::vector<float> once(m * ldy, -1), twice(m * ldy, -1);
            path(x.data(), m, k, whole.ref(), once.data(), ldy, lo, hi, false);
            if (split > 0) path(x.data(), m, k, first.ref(), twice.data(), ldy, lo, hi, false);
            if (split == 0) {
              for (int64_t t = 0; t < m; ++t) std::fill(&twice[t * ldy + lo], &twice[t * ldy + hi], 0.0f);
            }
            path(x.data() + split, m, k, second.ref(), twice.data(), ldy, lo, hi, true);
            ExpectBitwise(once, twice, name, m, n, k);
          }
        }
      }
    }
  }
}

// MatrixRef::panel_stride: the first `cols` columns of panels packed for a wider matrix (a
// sub-range of k read in place, as attention_bf16 reads a range of its packed values) give the
// bits of those columns packed alone, on every path; with accumulate too.
TEST(LinearBf16, PanelStrideViewsTheFirstColumnsOfWiderPanels) {
  const auto paths = ColumnPaths();
  for (int64_t wide : {40, 101}) {
    for (int64_t k : {2, 17, 38}) {
      for (int64_t n : {5, 16, 64, 70}) {
        for (int64_t m : {1, 8, 11}) {
          const uint64_t seed = 31 * wide + 7 * k + n + m;
          const std::vector<uint16_t> w = RandomBf16(n * wide, seed, Values::kNormal);
          const std::vector<uint16_t> x = RandomBf16(m * k, seed + 1, Values::kNormal);
          std::vector<uint16_t> narrow(n * k);
          for (int64_t j = 0; j < n; ++j) std::copy(&w[j * wide], &w[j * wide + k], &narrow[j * k]);
          const Bf16PanelMatrix packed_wide(Ref(w, n, wide), MatrixLayout::kBf16Panels);
          const Bf16PanelMatrix packed_narrow(Ref(narrow, n, k), MatrixLayout::kBf16Panels);
          MatrixRef view = packed_wide.ref();
          view.cols = k;
          view.panel_stride = internal::PanelElements(wide);
          for (bool accumulate : {false, true}) {
            for (const auto& [name, path] : paths) {
              std::vector<float> want(m * n, 0.5f), got(m * n, 0.5f);
              path(x.data(), m, k, packed_narrow.ref(), want.data(), n, 0, n, accumulate);
              path(x.data(), m, k, view, got.data(), n, 0, n, accumulate);
              ExpectBitwise(want, got, name, m, n, k);
            }
          }
        }
      }
    }
  }
}

// A row's result does not depend on the batch, its position in it, the thread count, the column
// range a thread took, or how outputs share a parallel region; on both vector paths.
TEST(LinearBf16, BitwiseBatchAndThreadInvariant) {
  const int64_t n = 100, n2 = 37, k = 200, m = 45;
  std::vector<uint16_t> w = RandomBf16(n * k, 7, Values::kNormal);
  std::vector<uint16_t> w2 = RandomBf16(n2 * k, 9, Values::kNormal);
  std::vector<uint16_t> x = RandomBf16(m * k, 8, Values::kNormal);
  const Bf16PanelMatrix packed(Ref(w, n, k)), packed2(Ref(w2, n2, k));
  const MatrixRef& ref = packed.ref();
  ThreadPool one(1), three(3);
  for (bool dot : {true, false}) {
    SetBf16DotEnabled(dot);
    LinearOutput all{&ref, nullptr, n};
    std::vector<float> batched(m * n);
    all.y = batched.data();
    LinearBf16Multi(x.data(), m, k, &all, 1, &three);
    for (int64_t t = 0; t < m; ++t) {
      std::vector<float> alone(n);
      LinearOutput o{&ref, alone.data(), n};
      LinearBf16Multi(x.data() + t * k, 1, k, &o, 1, &one);
      for (int64_t j = 0; j < n; ++j) ASSERT_EQ(Bits(alone[j]), Bits(batched[t * n + j])) << t << "," << j;
    }
    // Columns in uneven ranges, one call each.
    std::vector<float> pieces(m * n, -1);
    for (const auto& [lo, hi] : {std::pair<int64_t, int64_t>{0, 13}, {13, 40}, {40, 41}, {41, 100}}) {
      LinearBf16Columns(x.data(), m, k, ref, pieces.data(), n, lo, hi);
    }
    for (int64_t i = 0; i < m * n; ++i) ASSERT_EQ(Bits(pieces[i]), Bits(batched[i])) << i;
    // Two matrices in one region (37 rows: the second output's chunks start inside panels).
    std::vector<float> y2_alone(m * n2), y2(m * n2), y1(m * n);
    LinearOutput o2{&packed2.ref(), y2_alone.data(), n2};
    LinearBf16Multi(x.data(), m, k, &o2, 1, &one);
    LinearOutput outs[2] = {{&packed2.ref(), y2.data(), n2}, {&ref, y1.data(), n}};
    LinearBf16Multi(x.data(), m, k, outs, 2, &three);
    for (int64_t i = 0; i < m * n2; ++i) ASSERT_EQ(Bits(y2[i]), Bits(y2_alone[i])) << i;
    for (int64_t i = 0; i < m * n; ++i) ASSERT_EQ(Bits(y1[i]), Bits(batched[i])) << i;
  }
  SetBf16DotEnabled(true);
}

// Against float64 over the same bf16 inputs, from the row-major matrix: only f32 accumulation
// error remains (products of two bf16 values are exact in f32).
TEST(LinearBf16, MatchesDoubleReferenceOfRoundedInputs) {
  ThreadPool pool(2);
  for (int64_t k : {8, 45, 576, 1536}) {
    const int64_t n = 33, m = 5;
    std::vector<uint16_t> w = RandomBf16(n * k, k, Values::kNormal);
    SplitMix64 rng(k + 1);
    std::vector<float> xf(m * k);
    for (float& v : xf) v = static_cast<float>(rng.Normal());
    std::vector<uint16_t> x(m * k);
    RoundRowsToBf16(xf.data(), m, k, k, x.data(), k);
    const Bf16PanelMatrix packed(Ref(w, n, k));
    std::vector<float> y(m * n);
    LinearOutput o{&packed.ref(), y.data(), n};
    LinearBf16Multi(x.data(), m, k, &o, 1, &pool);
    for (int64_t t = 0; t < m; ++t) {
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t i = 0; i < k; ++i) s += double(Bf16ToF32(x[t * k + i])) * Bf16ToF32(w[j * k + i]);
        EXPECT_NEAR(y[t * n + j], s, 2e-6 * k + 1e-5) << "k=" << k << " t=" << t << " j=" << j;
      }
    }
    EXPECT_NE(Bf16ToF32(x[1]), xf[1]);  // The rounding of x really happened.
  }
}

}  // namespace
}  // namespace pdserve::kernels
