#include "kernels/cpu/linear_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/base/dtype.h"
#include "common/base/thread_pool.h"
#include "gtest/gtest.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/linear_quant_panels.h"
#include "kernels/cpu/linear_quant_vnni.h"
#include "kernels/cpu/quant_blocks.h"

namespace pdserve::kernels {
namespace {

const GgmlType kTypes[] = {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ5_0, GgmlType::kQ4_K, GgmlType::kQ5_K,
                           GgmlType::kQ6_K};

// Random but valid blocks: any bytes, with the f16 scales made finite and of a sane size.
std::string RandomRows(GgmlType type, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string data(static_cast<size_t>(rows * GgmlRowBytes(type, cols)), '\0');
  for (char& c : data) c = static_cast<char>(rng());
  auto scale = [&](size_t at) {
    std::uniform_real_distribution<float> u(0.001f, 0.05f);
    const uint16_t h = F32ToF16(u(rng));
    std::memcpy(&data[at], &h, 2);
  };
  const int64_t bytes = GgmlBlockBytes(type);
  for (size_t b = 0; b < data.size(); b += static_cast<size_t>(bytes)) {
    switch (type) {
      case GgmlType::kQ8_0:
      case GgmlType::kQ4_0:
      case GgmlType::kQ5_0: scale(b); break;
      case GgmlType::kQ4_K:
      case GgmlType::kQ5_K: scale(b); scale(b + 2); break;
      case GgmlType::kQ6_K: scale(b + 208); break;
      default: break;
    }
  }
  return data;
}

std::vector<float> RandomX(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0, 1);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = d(rng);
  return x;
}

// x (whole blocks of 32) encoded as `type` into *q and decoded back.
std::vector<float> RoundTrip(GgmlType type, const std::vector<float>& x, std::string* q) {
  const int64_t n = static_cast<int64_t>(x.size());
  q->assign(static_cast<size_t>(GgmlRowBytes(type, n)), '\0');
  EXPECT_TRUE(EncodeRow(type, x.data(), q->data(), n));
  std::vector<float> back(x.size());
  DequantizeRow(type, q->data(), back.data(), n);
  return back;
}

// Every element within half a step (its block's max |x| / `levels`) of x; returns, per block of
// 32, the index of its element of largest magnitude (the first).
std::vector<int> ExpectWithinHalfAStep(const std::vector<float>& x, const std::vector<float>& back,
                                       float levels) {
  std::vector<int> largest;
  for (size_t b = 0; b < x.size() / 32; ++b) {
    float amax = 0;
    int at = 0;
    for (int l = 0; l < 32; ++l) {
      if (std::fabs(x[b * 32 + l]) > amax) amax = std::fabs(x[b * 32 + l]), at = l;
    }
    for (int l = 0; l < 32; ++l) {
      EXPECT_NEAR(back[b * 32 + l], x[b * 32 + l], amax / levels * 0.51 + 1e-3 * amax)
          << b << " " << l;
    }
    largest.push_back(at);
  }
  return largest;
}

TEST(QuantBlocks, Q8_0QuantizerRoundTripsWithinHalfAStep) {
  std::vector<float> x = RandomX(256, 1);
  x[5] = 0;
  std::fill(x.begin() + 32, x.begin() + 64, 0.0f);  // An all-zero block: d = 0, codes 0.
  std::string q;
  const std::vector<float> back = RoundTrip(GgmlType::kQ8_0, x, &q);
  ExpectWithinHalfAStep(x, back, 127);
  EXPECT_EQ(back[40], 0.0f);
  // The largest element maps to +-127.
  int code_max = 0;
  for (int l = 0; l < 32; ++l) code_max = std::max(code_max, std::abs(int(int8_t(q[2 + l]))));
  EXPECT_EQ(code_max, 127);
  // A block of subnormals: 1 / d is infinite; the codes are clamped before their conversion to
  // an integer (undefined for an infinity) and the block decodes to zeros (d is f16 zero).
  std::vector<float> tiny(32, 1e-40f);
  tiny[5] = -3e-40f;
  tiny[9] = 0.0f;  // 0 x infinity: NaN, clamped too.
  for (float v : RoundTrip(GgmlType::kQ8_0, tiny, &q)) EXPECT_EQ(v, 0.0f);
}

// Q5_0: the element of largest magnitude is code 0 (d = it / -16, so -16 d gives it back to f16's
// precision), the others within half a step; an all-zero block is all zero.
TEST(QuantBlocks, Q5_0QuantizerRoundTripsWithinHalfAStep) {
  std::vector<float> x = RandomX(256, 2);
  std::fill(x.begin() + 64, x.begin() + 96, 0.0f);
  std::string q;
  const std::vector<float> back = RoundTrip(GgmlType::kQ5_0, x, &q);
  const std::vector<int> largest = ExpectWithinHalfAStep(x, back, 16);
  for (int b = 0; b < 8; ++b) {
    const float amax = std::fabs(x[b * 32 + largest[b]]);
    EXPECT_NEAR(back[b * 32 + largest[b]], x[b * 32 + largest[b]], 1e-3 * amax) << b;
  }
  for (int l = 64; l < 96; ++l) EXPECT_EQ(back[l], 0.0f);
  // A block of subnormals: 1 / d is infinite, the codes are clamped before their conversion to
  // an integer (undefined for an infinity) and the block decodes to zeros (d is f16 zero).
  std::vector<float> tiny(32, 1e-40f);
  tiny[3] = -2e-40f;
  const std::vector<float> tiny_back = RoundTrip(GgmlType::kQ5_0, tiny, &q);
  for (float v : tiny_back) EXPECT_EQ(v, 0.0f);
}

// Q4_K's search: every block decodes to within a fraction of its range (4-bit codes, 6-bit scales),
// a block of one value is exact, and the fit beats the plain min/max grid of the same codes.
TEST(QuantBlocks, Q4_KQuantizerFitsEachBlock) {
  std::vector<float> x = RandomX(256 * 6, 3);
  std::fill(x.begin() + 256, x.begin() + 512, 0.25f);  // Constant block.
  for (int i = 512; i < 768; ++i) x[i] = std::fabs(x[i]);  // All positive: min > 0.
  std::string q(6 * 144, '\0');
  QuantizeRowQ4_K(x.data(), q.data(), 256 * 6);
  std::vector<float> back(x.size());
  DequantizeRow(GgmlType::kQ4_K, q.data(), back.data(), static_cast<int64_t>(x.size()));
  for (int b = 0; b < 6; ++b) {
    double err = 0, naive = 0, energy = 0;
    for (int j = 0; j < 8; ++j) {
      float lo = 1e30f, hi = -1e30f;
      for (int l = 0; l < 32; ++l) {
        lo = std::min(lo, x[b * 256 + j * 32 + l]);
        hi = std::max(hi, x[b * 256 + j * 32 + l]);
      }
      lo = std::min(lo, 0.0f);
      const float step = (hi - lo) / 15;
      for (int l = 0; l < 32; ++l) {
        const int i = b * 256 + j * 32 + l;
        err += (back[i] - x[i]) * (back[i] - x[i]);
        const float r = step > 0 ? lo + step * std::nearbyint((x[i] - lo) / step) : x[i];
        naive += (r - x[i]) * (r - x[i]);
        energy += x[i] * x[i];
      }
    }
    if (b == 1) {
      EXPECT_LT(err, 1e-6 * energy) << "constant block";
      continue;
    }
    EXPECT_LT(std::sqrt(err / energy), 0.12) << "block " << b;
    EXPECT_LT(err, 1.5 * naive) << "block " << b;  // 6-bit scales cost a little over the ideal grid.
  }
}

// Q6_K's search: every element within about half a step of its 16-element group's scale, the
// scales int8 against the block's largest (which maps to -128 or 127), an all-zero block zero.
TEST(QuantBlocks, Q6_KQuantizerFitsEachGroup) {
  std::vector<float> x = RandomX(256 * 3, 23);
  std::fill(x.begin() + 256, x.begin() + 512, 0.0f);
  std::string q(3 * 210, '\0');
  QuantizeRowQ6_K(x.data(), q.data(), 256 * 3);
  std::vector<float> back(x.size());
  DequantizeRow(GgmlType::kQ6_K, q.data(), back.data(), static_cast<int64_t>(x.size()));
  for (int b : {0, 2}) {
    const int8_t* sc = reinterpret_cast<const int8_t*>(&q[static_cast<size_t>(b * 210 + 192)]);
    uint16_t dh;
    std::memcpy(&dh, &q[static_cast<size_t>(b * 210 + 208)], 2);
    const float d = F16ToF32(dh);
    int extreme = 0;
    for (int j = 0; j < 16; ++j) extreme = std::max(extreme, std::abs(int(sc[j])));
    EXPECT_GE(extreme, 127) << b;
    double err = 0, energy = 0;
    for (int j = 0; j < 16; ++j) {
      const float step = std::fabs(d * sc[j]);
      for (int i = 0; i < 16; ++i) {
        const int e = b * 256 + 16 * j + i;
        EXPECT_LE(std::fabs(back[e] - x[e]), 0.5f * step + 0.02f * step + 1e-6f) << b << " " << j << " " << i;
        err += (back[e] - x[e]) * (back[e] - x[e]);
        energy += x[e] * x[e];
      }
    }
    EXPECT_LT(std::sqrt(err / energy), 0.03) << "block " << b;  // 6-bit codes: ~2% of the signal.
  }
  for (int e = 256; e < 512; ++e) EXPECT_EQ(back[e], 0.0f);
}

// The kernel equals a double-precision dot product of the dequantized weights (DequantizeRow is
// checked against llama.cpp's gguf-py in tests/gguf) and the dequantized activation codes, AVX2
// and scalar give the same bits, and a row's result does not depend on the batch it is in, the
// row tile it falls in, or the thread split.
TEST(LinearQuant, MatchesTheDequantizedReferenceBitwiseAcrossPathsAndBatches) {
  ThreadPool pool(3);
  for (GgmlType type : kTypes) {
    SCOPED_TRACE(std::string(GgmlTypeName(type)));
    const int64_t n = 37, k = 512, m = 21;  // 21 rows: a full row tile and a partial one.
    const std::string w_bytes = RandomRows(type, n, k, 7);
    const QuantMatrixRef w{type, w_bytes.data(), n, k};
    const std::vector<float> x = RandomX(m * k, 11);
    QuantizedActivations xq, xq_scalar;
    QuantizeActivations(x.data(), m, k, k, ActivationBlock(type), &xq);
    QuantizeActivationsScalar(x.data(), m, k, k, ActivationBlock(type), &xq_scalar);
    ASSERT_EQ(xq.q, xq_scalar.q);
    ASSERT_EQ(0, std::memcmp(xq.d.data(), xq_scalar.d.data(), xq.d.size() * 4));
    ASSERT_EQ(xq.sum16, xq_scalar.sum16);
    std::vector<float> y(m * n), y_scalar(m * n), y_one(n);
    LinearQuantColumns(xq, w, y.data(), n, 0, n);
    LinearQuantColumnsScalar(xq, w, y_scalar.data(), n, 0, n);
    EXPECT_EQ(0, std::memcmp(y.data(), y_scalar.data(), y.size() * 4));
    // Through the linear layers' entry across the pool's threads, one matrix and several
    // sharing x (LinearMulti).
    MatrixRef as_matrix{DType::kF32, w_bytes.data(), n, k};
    as_matrix.quant_type = type;
    std::vector<float> y_linear(m * n), y_multi(m * 2 * n);
    Linear(x.data(), m, k, as_matrix, y_linear.data(), n, &pool);
    EXPECT_EQ(0, std::memcmp(y.data(), y_linear.data(), y.size() * 4));
    const LinearOutput outs[2] = {{&as_matrix, y_multi.data(), 2 * n},
                                  {&as_matrix, y_multi.data() + n, 2 * n}};
    LinearMulti(x.data(), m, k, outs, 2, &pool);
    std::vector<double> ref(m * n);
    LinearQuantReference(x.data(), m, k, w, ref.data());
    for (int64_t t = 0; t < m; ++t) {
      EXPECT_EQ(0, std::memcmp(y_multi.data() + t * 2 * n, y.data() + t * n, n * 4)) << "row " << t;
      EXPECT_EQ(0, std::memcmp(y_multi.data() + t * 2 * n + n, y.data() + t * n, n * 4)) << "row " << t;
      LinearColumns(x.data() + t * k, 1, k, as_matrix, y_one.data(), n, 0, n);
      EXPECT_EQ(0, std::memcmp(y_one.data(), y.data() + t * n, n * 4)) << "row " << t;
      // Columns split at an odd place (a group of 4 cut short).
      LinearColumns(x.data() + t * k, 1, k, as_matrix, y_one.data(), n, 5, n);
      EXPECT_EQ(0, std::memcmp(y_one.data() + 5, y.data() + t * n + 5, (n - 5) * 4)) << "row " << t;
      for (int64_t j = 0; j < n; ++j) {
        EXPECT_NEAR(y[t * n + j], ref[t * n + j], 1e-5 * std::fabs(ref[t * n + j]) + 1e-4)
            << t << " " << j;
      }
    }
  }
}

// The AVX512-VNNI path gives the AVX2 path's bits for every format, any number of rows of x (a
// whole kernel of 4, a partial one, several tiles) and a column range cut inside a group.
TEST(LinearQuant, VnniPathIsBitwiseTheAvx2Path) {
  if (!QuantVnniEnabled()) GTEST_SKIP() << "needs avx512_vnni: this CPU has no AVX512-VNNI (or it is switched off)";
  for (GgmlType type : kTypes) {
    SCOPED_TRACE(std::string(GgmlTypeName(type)));
    const int64_t n = 23, k = 768;
    const std::string w_bytes = RandomRows(type, n, k, 3);
    const QuantMatrixRef w{type, w_bytes.data(), n, k};
    for (int64_t m : {1, 3, 4, 5, 16, 21}) {
      const std::vector<float> x = RandomX(m * k, 29 + static_cast<uint32_t>(m));
      QuantizedActivations xq;
      QuantizeActivations(x.data(), m, k, k, ActivationBlock(type), &xq);
      std::vector<float> vnni(m * n, -1.0f), avx2(m * n, -1.0f);
      LinearQuantColumns(xq, w, vnni.data(), n, 2, n);
      SetQuantVnniEnabled(false);
      LinearQuantColumns(xq, w, avx2.data(), n, 2, n);
      SetQuantVnniEnabled(true);
      EXPECT_EQ(0, std::memcmp(vnni.data(), avx2.data(), vnni.size() * 4)) << "m " << m;
      EXPECT_EQ(vnni[0], -1.0f);  // Columns before n_begin untouched.
    }
  }
}

// The panels (every block format on any AVX2 CPU; repacked at load) hold the row-major blocks'
// values (every row dequantizes to the same floats, a last panel padded) and give the row-major
// kernels' bits for any m (whole kernels of 8 or 6, the 4/2/1 remainders, several of each) and
// column range (cut inside a panel at both ends, a single column), through Linear's threads too;
// with the VNNI kernels and the AVX2 ones.
TEST(LinearQuant, PanelsAreBitwiseTheRowMajorKernels) {
  const bool vnni = QuantVnniEnabled();
  struct Case {
    GgmlType type;
    bool avx2;  // The AVX2 kernels (where VNNI runs, switched off for the case).
  };
  std::vector<Case> cases;
  for (GgmlType type : {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ5_0, GgmlType::kQ4_K,
                        GgmlType::kQ5_K, GgmlType::kQ6_K}) {
    cases.push_back({type, false});
    if (vnni) cases.push_back({type, true});
  }
  for (const auto& [type, avx2] : cases) {
    SetQuantVnniEnabled(vnni && !avx2);
    if (!QuantPanelsSupported(type)) GTEST_SKIP() << "needs avx2: this build has no AVX2 kernels";
    SCOPED_TRACE(std::string(GgmlTypeName(type)) + (QuantVnniEnabled() ? " vnni" : " avx2"));
    // An odd number of blocks a row: the formats stored in pairs (linear_quant_panels.h) end in
    // one stored whole.
    const int64_t n = 37, k = GgmlBlockElements(type) == 32 ? 5664 : 5888;
    const std::string w_bytes = RandomRows(type, n, k, 41);
    const QuantMatrixRef w{type, w_bytes.data(), n, k};
    std::vector<uint8_t> packed(static_cast<size_t>(QuantPanelsBytes(type, n, k)));
    ASSERT_EQ(static_cast<int64_t>(packed.size()), 3 * (k / GgmlBlockElements(type)) * GgmlPanelBlockBytes(type));
    PackQuantPanels(w, packed.data());
    const QuantMatrixRef wp{type, packed.data(), n, k, /*panels=*/true};
    std::vector<float> row(k), prow(k);
    for (int64_t j = 0; j < n; ++j) {
      DequantizeRow(type, w.row(j), row.data(), k);
      DequantizePanelRow(type, packed.data(), k, j, prow.data());
      ASSERT_EQ(0, std::memcmp(row.data(), prow.data(), k * 4)) << "row " << j;
    }
    for (int64_t m : {1, 2, 3, 7, 8, 9, 15, 16, 21, 29}) {
      const std::vector<float> x = RandomX(m * k, 53 + static_cast<uint32_t>(m));
      QuantizedActivations xq;
      QuantizeActivations(x.data(), m, k, k, ActivationBlock(type), &xq);
      for (auto [lo, hi] : {std::pair<int64_t, int64_t>{0, n}, {3, 35}, {16, 32}, {17, 18}, {32, n}}) {
        std::vector<float> got(m * n, -1.0f), want(m * n, -1.0f);
        LinearQuantColumns(xq, wp, got.data(), n, lo, hi);
        LinearQuantColumns(xq, w, want.data(), n, lo, hi);
        EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * 4))
            << "m " << m << " columns " << lo << "-" << hi;
      }
    }
    const int64_t m = 19;
    const std::vector<float> x = RandomX(m * k, 5);
    MatrixRef mp{DType::kF32, packed.data(), n, k, MatrixLayout::kQuantPanels};
    mp.quant_type = type;
    MatrixRef mr{DType::kF32, w_bytes.data(), n, k};
    mr.quant_type = type;
    EXPECT_EQ(static_cast<int64_t>(mp.bytes()), QuantPanelsBytes(type, n, k));
    ThreadPool pool(2);
    std::vector<float> got(m * n), want(m * n);
    Linear(x.data(), m, k, mp, got.data(), n, &pool);
    Linear(x.data(), m, k, mr, want.data(), n, &pool);
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * 4));
  }
  SetQuantVnniEnabled(vnni);
}

// Q8_0's panel blocks (544 bytes, 32 past whole lines) are stored in pairs, the second's codes
// right after the first's and both d after them, so every block's codes start on a 64-byte line;
// an odd last block whole after the pairs.
TEST(LinearQuant, PanelBlocksInPairsStartOnALine) {
  if (!QuantPanelsSupported(GgmlType::kQ8_0)) GTEST_SKIP() << "no Q8_0 panels on this CPU";
  const int64_t n = 16, k = 96;  // Three blocks a row.
  std::string w(static_cast<size_t>(n * GgmlRowBytes(GgmlType::kQ8_0, k)), '\0');
  for (int64_t c = 0; c < n; ++c) {
    for (int64_t s = 0; s < 3; ++s) {
      char* block = &w[static_cast<size_t>((c * 3 + s) * 34)];
      const uint16_t d = static_cast<uint16_t>(0x3C00 + 16 * s + c);
      std::memcpy(block, &d, 2);
      for (int e = 0; e < 32; ++e) block[2 + e] = static_cast<char>(40 * s + e);
    }
  }
  std::vector<uint8_t> packed(static_cast<size_t>(QuantPanelsBytes(GgmlType::kQ8_0, n, k)));
  ASSERT_EQ(packed.size(), 3u * 544);
  PackQuantPanels(QuantMatrixRef{GgmlType::kQ8_0, w.data(), n, k}, packed.data());
  // Each block's codes (plus 128) at a multiple of 64 (the pair 0-1, then block 2 whole), its d
  // after.
  const int64_t codes[3] = {0, 512, 1088}, d[3] = {1024, 1056, 1088 + 512};
  for (int s = 0; s < 3; ++s) {
    for (int c = 0; c < n; c += 5) {  // Quad 1 of row c: elements 4-7.
      EXPECT_EQ(packed[codes[s] + 64 + 4 * c + 2], 40 * s + 6 + 128) << "block " << s << " row " << c;
      uint16_t got;
      std::memcpy(&got, &packed[d[s] + 2 * c], 2);
      EXPECT_EQ(got, 0x3C00 + 16 * s + c) << "block " << s << " row " << c;
    }
  }
}

// Blocks from the quantizers (real scales and mins, not random bytes), several blocks per row.
TEST(LinearQuant, QuantizedWeightsMatchTheReference) {
  for (GgmlType type : {GgmlType::kQ8_0, GgmlType::kQ5_0, GgmlType::kQ4_K, GgmlType::kQ6_K}) {
    SCOPED_TRACE(std::string(GgmlTypeName(type)));
    const int64_t n = 9, k = 768, m = 3;
    const std::vector<float> wf = RandomX(n * k, 17), x = RandomX(m * k, 19);
    std::string w_bytes(static_cast<size_t>(n * GgmlRowBytes(type, k)), '\0');
    for (int64_t j = 0; j < n; ++j) {
      void* out = &w_bytes[static_cast<size_t>(j * GgmlRowBytes(type, k))];
      ASSERT_TRUE(EncodeRow(type, wf.data() + j * k, out, k));
    }
    const QuantMatrixRef w{type, w_bytes.data(), n, k};
    QuantizedActivations xq;
    QuantizeActivations(x.data(), m, k, k, ActivationBlock(type), &xq);
    std::vector<float> y(m * n), y_scalar(m * n);
    std::vector<double> ref(m * n);
    LinearQuantColumns(xq, w, y.data(), n, 0, n);
    LinearQuantColumnsScalar(xq, w, y_scalar.data(), n, 0, n);
    LinearQuantReference(x.data(), m, k, w, ref.data());
    EXPECT_EQ(0, std::memcmp(y.data(), y_scalar.data(), y.size() * 4));
    for (int64_t i = 0; i < m * n; ++i) EXPECT_NEAR(y[i], ref[i], 1e-5 * std::fabs(ref[i]) + 1e-4) << i;
  }
}

// The activation codes: each block's largest element maps to +-127, every code is x / d rounded
// to nearest (ties to even), an all-zero block has d = 0, and the sums are the codes' sums.
TEST(LinearQuant, ActivationCodesRoundToNearest) {
  for (int block : {32, 256}) {
    std::vector<float> x = RandomX(2 * 512, 5);
    std::fill(x.begin(), x.begin() + block, 0.0f);
    QuantizedActivations xq;
    QuantizeActivations(x.data(), 2, 512, 512, block, &xq);
    for (int64_t t = 0; t < 2; ++t) {
      for (int64_t b = 0; b < 512 / block; ++b) {
        const float d = xq.scales(t)[b];
        float amax = 0;
        int cmax = 0;
        for (int i = 0; i < block; ++i) {
          const float v = x[t * 512 + b * block + i];
          const int q = xq.codes(t)[b * block + i];
          amax = std::max(amax, std::fabs(v));
          cmax = std::max(cmax, std::abs(q));
          if (d > 0) {
            EXPECT_LE(std::fabs(v / d - q), 0.5f + 1e-4f) << t << " " << b << " " << i;
          }
        }
        EXPECT_EQ(d, amax / 127.0f);
        EXPECT_EQ(cmax, amax > 0 ? 127 : 0);
      }
      for (int64_t g = 0; g < 512 / 16; ++g) {
        int s = 0;
        for (int i = 0; i < 16; ++i) s += xq.codes(t)[16 * g + i];
        EXPECT_EQ(s, xq.sum16[t * 32 + g]);
      }
    }
  }
}

}  // namespace
}  // namespace pdserve::kernels
