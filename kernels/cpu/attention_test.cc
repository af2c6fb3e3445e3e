#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "common/base/rng.h"
#include "gtest/gtest.h"
#include "kernels/cpu/linear_avx512.h"

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

void RunCase(DType dtype, int64_t window) {
  const int64_t bs = 4, kvh = 2, d = 16, heads = 6, num_blocks = 12, ctx = 37;
  const size_t page = 2 * kvh * bs * d * DTypeSize(dtype);
  std::vector<uint8_t> pool(num_blocks * page);
  KvPagesView view{pool.data(), page, bs, kvh, d, dtype};
  // A scrambled block table: pages are not in order in the pool.
  std::vector<int32_t> table(num_blocks);
  std::iota(table.begin(), table.end(), 0);
  std::reverse(table.begin(), table.end());
  std::swap(table[0], table[5]);

  SplitMix64 rng(9);
  auto round = [&](float x) { return dtype == DType::kBF16 ? Bf16ToF32(F32ToBf16(x)) : x; };
  // keys[h][pos] as stored (rounded to the pool dtype).
  std::vector<std::vector<std::vector<float>>> keys(kvh), values(kvh);
  for (int64_t p = 0; p < ctx; ++p) {
    std::vector<float> k(kvh * d), v(kvh * d);
    for (float& x : k) x = static_cast<float>(rng.Normal());
    for (float& x : v) x = static_cast<float>(rng.Normal());
    StoreKv(view, table.data(), p, k.data(), v.data());
    for (int64_t h = 0; h < kvh; ++h) {
      std::vector<float> kr(d), vr(d);
      for (int64_t i = 0; i < d; ++i) {
        kr[i] = round(k[h * d + i]);
        vr[i] = round(v[h * d + i]);
      }
      keys[h].push_back(kr);
      values[h].push_back(vr);
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

TEST(AttentionTest, PagedEqualsContiguousF32) { RunCase(DType::kF32, 0); }
TEST(AttentionTest, PagedEqualsContiguousBf16Pool) { RunCase(DType::kBF16, 0); }
TEST(AttentionTest, SlidingWindow) { RunCase(DType::kF32, 7); }

// The grouped path (a KV head's query heads together, AVX-512 where the CPU has it) gives the
// per-head path's bits for every group size, head size (64 and 128 grouped; 16 falls back),
// pool dtype, window and context length, including tails of fewer than 8 keys.
TEST(AttentionTest, KvGroupIsBitwiseThePerHeadPath) {
  SetAvx512Enabled(true);
  if (!Avx512Enabled()) GTEST_SKIP() << "no AVX-512: the grouped path is the per-head path";
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (int64_t d : {16, 64, 128}) {
      for (int64_t group : {1, 2, 3, 4, 5}) {
        const int64_t bs = 16, kvh = 2, heads = kvh * group, num_blocks = 6, ctx = 83;
        const size_t page = 2 * kvh * bs * d * DTypeSize(dtype);
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
              ASSERT_EQ(grouped[i], per_head[i]) << DTypeName(dtype) << " d=" << d << " group="
                                                 << group << " pos=" << pos << " window=" << window
                                                 << " i=" << i;
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace pdserve::kernels
