#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "common/base/rng.h"
#include "common/kvcache/kv_cache_spec.h"
#include "gtest/gtest.h"
#include "kernels/cpu/kv_quant.h"
#include "kernels/cpu/linear_avx512.h"
#include "kernels/cpu/simd.h"

namespace pdserve::kernels {
namespace {

// Contiguous float64 attention for one query head: the independent reference.
std::vector<double> Contiguous(const std::vector<float>& q, const std::vector<std::vector<float>>& k,
                               const std::vector<std::vector<float>>& v, int64_t start, double scale) {
  const size_t n = k.size();
  std::vector<double> s(n, -INFINITY);
  double max = -INFINITY;
  for (size_t j = start; j < n; ++j) {
    s[j] = 0;
    for (size_t i = 0; i < q.size(); ++i) s[j] += double(q[i]) * k[j][i];
    s[j] *= scale;
    max = std::max(max, s[j]);
  }
  double sum = 0;
  for (size_t j = start; j < n; ++j) sum += std::exp(s[j] - max);
  std::vector<double> out(q.size(), 0);
  for (size_t j = start; j < n; ++j)
    for (size_t i = 0; i < q.size(); ++i) out[i] += std::exp(s[j] - max) / sum * v[j][i];
  return out;
}

size_t PageBytes(int64_t kvh, int64_t bs, int64_t d, KvDType dtype) {
  return KvCacheSpec{1, kvh, d, bs, dtype}.PageBytes();
}

// Row h of K (kv = 0) or V (kv = 1) at `position` as the pool holds it, dequantized.
std::vector<float> ReadBack(const KvPagesView& view, const int32_t* table, int64_t position,
                            int kv, int64_t h) {
  const int32_t block = table[position / view.block_size];
  const int64_t slot = position % view.block_size;
  const uint8_t* row = kv == 0 ? view.Key(block, h, slot) : view.Value(block, h, slot);
  const float scale = KvDTypeQuantized(view.dtype)
                          ? *(kv == 0 ? view.KeyScale(block, h, slot) : view.ValueScale(block, h, slot))
                          : 1.0f;
  std::vector<float> out(view.head_dim);
  for (int64_t i = 0; i < view.head_dim; ++i) {
    switch (view.dtype) {
      case KvDType::kF32: out[i] = reinterpret_cast<const float*>(row)[i]; break;
      case KvDType::kBF16: out[i] = Bf16ToF32(reinterpret_cast<const uint16_t*>(row)[i]); break;
      case KvDType::kInt8: out[i] = static_cast<float>(static_cast<int8_t>(row[i])) * scale; break;
      case KvDType::kInt4: out[i] = static_cast<float>(Int4Code(row, i)) * scale; break;
    }
  }
  return out;
}

void RunCase(KvDType dtype, int64_t window) {
  const int64_t bs = 4, kvh = 2, d = 16, heads = 6, num_blocks = 12, ctx = 37;
  const size_t page = PageBytes(kvh, bs, d, dtype);
  std::vector<uint8_t> pool(num_blocks * page);
  KvPagesView view{pool.data(), page, bs, kvh, d, dtype};
  // A scrambled block table: pages are not in order in the pool.
  std::vector<int32_t> table(num_blocks);
  std::iota(table.begin(), table.end(), 0);
  std::reverse(table.begin(), table.end());
  std::swap(table[0], table[5]);

  SplitMix64 rng(9);
  // keys[h][pos] as stored (rounded or quantized to the pool dtype, read back independently).
  std::vector<std::vector<std::vector<float>>> keys(kvh), values(kvh);
  for (int64_t p = 0; p < ctx; ++p) {
    std::vector<float> k(kvh * d), v(kvh * d);
    for (float& x : k) x = static_cast<float>(rng.Normal());
    for (float& x : v) x = static_cast<float>(rng.Normal());
    StoreKv(view, table.data(), p, k.data(), v.data());
    for (int64_t h = 0; h < kvh; ++h) {
      keys[h].push_back(ReadBack(view, table.data(), p, 0, h));
      values[h].push_back(ReadBack(view, table.data(), p, 1, h));
      // The stored row is the input within the format's bound.
      for (int64_t i = 0; i < d; ++i) {
        const double tol = dtype == KvDType::kF32 ? 0 : dtype == KvDType::kBF16 ? 0.01 : 0.5;
        ASSERT_NEAR(keys[h].back()[i], k[h * d + i], tol);
      }
    }
  }
  std::vector<float> q(heads * d), out(heads * d), scratch(ctx);
  for (float& x : q) x = static_cast<float>(rng.Normal());
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (int64_t pos : {0, 5, 36}) {
    PagedAttention(view, table.data(), pos, window, q.data(), heads, scale, 0, heads, out.data(),
                   scratch.data());
    const int64_t start = window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0;
    for (int64_t h = 0; h < heads; ++h) {
      std::vector<float> qh(q.begin() + h * d, q.begin() + (h + 1) * d);
      const int64_t g = h / (heads / kvh);
      std::vector<std::vector<float>> kk(keys[g].begin(), keys[g].begin() + pos + 1);
      std::vector<std::vector<float>> vv(values[g].begin(), values[g].begin() + pos + 1);
      const auto ref = Contiguous(qh, kk, vv, start, scale);
      for (int64_t i = 0; i < d; ++i) EXPECT_NEAR(out[h * d + i], ref[i], 2e-5) << pos << " " << h;
    }
  }
}

// Quantized pools: attention read in place equals float64 attention over the dequantized copy.
TEST(AttentionTest, PagedEqualsContiguousF32) { RunCase(KvDType::kF32, 0); }
TEST(AttentionTest, PagedEqualsContiguousBf16Pool) { RunCase(KvDType::kBF16, 0); }
TEST(AttentionTest, PagedEqualsContiguousInt8Pool) { RunCase(KvDType::kInt8, 0); }
TEST(AttentionTest, PagedEqualsContiguousInt4Pool) { RunCase(KvDType::kInt4, 0); }
TEST(AttentionTest, SlidingWindow) { RunCase(KvDType::kF32, 7); }
TEST(AttentionTest, SlidingWindowInt4) { RunCase(KvDType::kInt4, 7); }

// The engine's own f32 attention over a dequantized copy of a quantized pool agrees with the
// quantized kernels within float rounding (they factor the row scale out of the sums), for the
// per-head and grouped paths, head sizes with and without the 64-wide value path, and AVX2.
TEST(AttentionTest, QuantizedPoolEqualsItsDequantizedCopy) {
  for (bool avx512 : {false, true}) {
    SetAvx512Enabled(avx512);
    for (KvDType dtype : {KvDType::kInt8, KvDType::kInt4}) {
      for (int64_t d : {20, 24, 64, 128}) {
        const int64_t bs = 16, kvh = 2, group = 3, heads = kvh * group, num_blocks = 5, ctx = 75;
        std::vector<uint8_t> pool(num_blocks * PageBytes(kvh, bs, d, dtype));
        std::vector<uint8_t> copy(num_blocks * PageBytes(kvh, bs, d, KvDType::kF32));
        KvPagesView view{pool.data(), PageBytes(kvh, bs, d, dtype), bs, kvh, d, dtype};
        KvPagesView fview{copy.data(), PageBytes(kvh, bs, d, KvDType::kF32), bs, kvh, d,
                          KvDType::kF32};
        const std::vector<int32_t> table = {3, 0, 4, 1, 2};
        SplitMix64 rng(static_cast<uint64_t>(d));
        for (int64_t p = 0; p < ctx; ++p) {
          std::vector<float> k(kvh * d), v(kvh * d);
          for (float& x : k) x = static_cast<float>(rng.Normal() * 3);
          for (float& x : v) x = static_cast<float>(rng.Normal());
          StoreKv(view, table.data(), p, k.data(), v.data());
          for (int64_t h = 0; h < kvh; ++h) {
            const auto kr = ReadBack(view, table.data(), p, 0, h);
            const auto vr = ReadBack(view, table.data(), p, 1, h);
            std::copy(kr.begin(), kr.end(), k.begin() + h * d);
            std::copy(vr.begin(), vr.end(), v.begin() + h * d);
          }
          StoreKv(fview, table.data(), p, k.data(), v.data());
        }
        std::vector<float> q(heads * d), scratch(group * ctx);
        for (float& x : q) x = static_cast<float>(rng.Normal());
        for (int64_t pos : {0, 9, 74}) {
          std::vector<float> quant(heads * d), deq(heads * d);
          for (int64_t h = 0; h < kvh; ++h) {
            PagedAttentionKvGroup(view, table.data(), pos, 0, q.data(), heads, 0.125f, h,
                                  quant.data(), scratch.data());
          }
          PagedAttention(fview, table.data(), pos, 0, q.data(), heads, 0.125f, 0, heads,
                         deq.data(), scratch.data());
          for (int64_t i = 0; i < heads * d; ++i) {
            ASSERT_NEAR(quant[i], deq[i], 2e-6 + 2e-6 * std::fabs(deq[i]))
                << KvDTypeName(dtype) << " d=" << d << " pos=" << pos << " i=" << i;
          }
        }
      }
    }
  }
  SetAvx512Enabled(true);
}

// The grouped path (a KV head's query heads together, AVX-512 where the CPU has it; groups of
// more than 4 in parts of 4) gives the per-head path's bits for every group size, head size (64 and 128 grouped; 16 falls back),
// pool dtype, window and context length, including tails of fewer than 8 keys.
TEST(AttentionTest, KvGroupIsBitwiseThePerHeadPath) {
  SetAvx512Enabled(true);
  if (!Avx512Enabled()) GTEST_SKIP() << "needs avx512: no AVX-512: the grouped path is the per-head path";
  for (KvDType dtype : {KvDType::kF32, KvDType::kBF16, KvDType::kInt8, KvDType::kInt4}) {
    for (int64_t d : {16, 64, 128}) {
      for (int64_t group : {1, 2, 3, 4, 5, 8}) {
        const int64_t bs = 16, kvh = 2, heads = kvh * group, num_blocks = 6, ctx = 83;
        const size_t page = PageBytes(kvh, bs, d, dtype);
        std::vector<uint8_t> pool(num_blocks * page);
        KvPagesView view{pool.data(), page, bs, kvh, d, dtype};
        std::vector<int32_t> table = {4, 1, 5, 0, 3, 2};
        SplitMix64 rng(static_cast<uint64_t>(d * 10 + group));
        for (int64_t p = 0; p < ctx; ++p) {
          std::vector<float> k(kvh * d), v(kvh * d);
          for (float& x : k) x = static_cast<float>(rng.Normal());
          for (float& x : v) x = static_cast<float>(rng.Normal());
          StoreKv(view, table.data(), p, k.data(), v.data());
        }
        std::vector<float> q(heads * d);
        for (float& x : q) x = static_cast<float>(rng.Normal());
        std::vector<float> scratch(group * ctx);
        for (int64_t window : {0, 21}) {
          for (int64_t pos : {0, 6, 7, 8, 40, 82}) {
            std::vector<float> grouped(heads * d, -1.0f), per_head(heads * d, -2.0f);
            for (int64_t h = 0; h < kvh; ++h) {
              PagedAttentionKvGroup(view, table.data(), pos, window, q.data(), heads, 0.125f, h,
                                    grouped.data(), scratch.data());
            }
            PagedAttention(view, table.data(), pos, window, q.data(), heads, 0.125f, 0, heads,
                           per_head.data(), scratch.data());
            for (int64_t i = 0; i < heads * d; ++i) {
              ASSERT_EQ(grouped[i], per_head[i]) << KvDTypeName(dtype) << " d=" << d << " group="
                                                 << group << " pos=" << pos << " window=" << window
                                                 << " i=" << i;
            }
          }
        }
      }
    }
  }
}

// The softmax's exp on 16 lanes (AVX-512) gives the 8-lane path's bits: PagedAttention's per-head
// path differs between the two settings only there. Scores over a moderate range (every exp
// counts: an error in one lane shows) and a wide one (exps underflowing to zero), at every context
// length across the 8- and 16-lane boundaries.
#if PDSERVE_AVX2
// The scalar exp (tails, portable builds) is Exp8 lane for lane on every input: NaN (clamped to
// the lower bound, as MAXPS does), infinities, the clamp bounds, denormals, ordinary values.
TEST(AttentionTest, ExpScalarIsExp8OnEveryInput) {
  std::vector<float> x = {NAN, -NAN, INFINITY, -INFINITY, 88.0f, -88.0f, 200.0f, -200.0f, 0.0f,
                          -0.0f, 1e-40f, -1e-40f, 1.0f, -1.0f, 0.5f, -3.25f};
  SplitMix64 rng(3);
  while (x.size() % 8 != 0 || x.size() < 1024) x.push_back(static_cast<float>(rng.Normal() * 30));
  for (size_t i = 0; i < x.size(); i += 8) {
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, Exp8(_mm256_loadu_ps(&x[i])));
    for (int l = 0; l < 8; ++l) {
      const float s = ExpScalar(x[i + l]);
      ASSERT_EQ(std::memcmp(&s, &lanes[l], 4), 0) << "x=" << x[i + l] << ": " << s << " vs " << lanes[l];
    }
  }
}
#endif

// A key whose score is NaN or +inf makes the row's output NaN on every path (as torch's softmax
// over such scores), whatever lane or tail it falls in; a row that does not reach it is finite.
TEST(AttentionTest, ANonFiniteScoreMakesTheRowNaN) {
  const int64_t bs = 16, kvh = 1, d = 64, heads = 2, ctx = 40;
  std::vector<uint8_t> pool(3 * PageBytes(kvh, bs, d, KvDType::kF32));
  KvPagesView view{pool.data(), PageBytes(kvh, bs, d, KvDType::kF32), bs, kvh, d, KvDType::kF32};
  const std::vector<int32_t> table = {2, 0, 1};
  SplitMix64 rng(21);
  for (int64_t p = 0; p < ctx; ++p) {
    std::vector<float> k(d), v(d);
    for (float& x : k) x = static_cast<float>(rng.Normal());
    for (float& x : v) x = static_cast<float>(rng.Normal());
    StoreKv(view, table.data(), p, k.data(), v.data());
  }
  std::vector<float> q(heads * d, 0.1f), out(heads * d), scratch(heads * ctx);
  for (float bad : {NAN, INFINITY}) {
    for (int64_t at : {3, 20, 38}) {  // Inside the 8-lane body and in the scalar tail.
      float* key = reinterpret_cast<float*>(view.Key(table[at / bs], 0, at % bs));
      const float saved = key[5];
      key[5] = bad;
      for (bool avx512 : {false, true}) {
        SetAvx512Enabled(avx512);
        PagedAttentionKvGroup(view, table.data(), ctx - 1, 0, q.data(), heads, 0.125f, 0,
                              out.data(), scratch.data());
        for (float x : out) ASSERT_TRUE(std::isnan(x)) << bad << " at " << at;
        PagedAttention(view, table.data(), at - 1, 0, q.data(), heads, 0.125f, 0, heads, out.data(),
                       scratch.data());
        for (float x : out) ASSERT_TRUE(std::isfinite(x)) << "row before the key, " << at;
      }
      key[5] = saved;
    }
  }
}

TEST(AttentionTest, SoftmaxOnSixteenLanesIsBitwiseEight) {
  SetAvx512Enabled(true);
  if (!Avx512Enabled()) GTEST_SKIP() << "needs avx512: no AVX-512: one path only";
  const int64_t bs = 16, kvh = 1, heads = 2, d = 64, num_blocks = 8;
  const size_t page = PageBytes(kvh, bs, d, KvDType::kF32);
  std::vector<uint8_t> pool(num_blocks * page);
  KvPagesView view{pool.data(), page, bs, kvh, d, KvDType::kF32};
  std::vector<int32_t> table = {3, 7, 0, 5, 1, 6, 2, 4};
  SplitMix64 rng(41);
  for (int64_t p = 0; p < bs * num_blocks; ++p) {
    std::vector<float> k(d), v(d);
    const double spread = p % 3 == 0 ? 3.0 : 1.0;  // Some keys above the rest.
    for (float& x : k) x = static_cast<float>(rng.Normal() * spread);
    for (float& x : v) x = static_cast<float>(rng.Normal());
    StoreKv(view, table.data(), p, k.data(), v.data());
  }
  std::vector<float> q(heads * d), scratch(bs * num_blocks);
  for (float& x : q) x = static_cast<float>(rng.Normal());
  for (float scale : {0.25f, 8.0f}) {
    for (int64_t pos = 0; pos < bs * num_blocks; ++pos) {
      std::vector<float> wide(heads * d), narrow(heads * d);
      PagedAttention(view, table.data(), pos, 0, q.data(), heads, scale, 0, heads, wide.data(),
                     scratch.data());
      SetAvx512Enabled(false);
      PagedAttention(view, table.data(), pos, 0, q.data(), heads, scale, 0, heads, narrow.data(),
                     scratch.data());
      SetAvx512Enabled(true);
      for (int64_t i = 0; i < heads * d; ++i) {
        ASSERT_EQ(wide[i], narrow[i]) << "scale=" << scale << " pos=" << pos << " i=" << i;
      }
    }
  }
}

}  // namespace
}  // namespace pdserve::kernels
