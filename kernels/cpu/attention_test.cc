#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "common/base/rng.h"
#include "gtest/gtest.h"

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

}  // namespace
}  // namespace pdserve::kernels
