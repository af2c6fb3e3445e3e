// The host execution layer itself (test infrastructure): indices, barriers, shuffles and shared
// memory behave as the kernels assume.
#include "kernels/cuda/host_exec.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/base/dtype.h"
#include "common/base/rng.h"
#include "gtest/gtest.h"
#include "kernels/cuda/dialect.h"
#include "kernels/cuda/mma_probe.h"

namespace pdserve::cuda::host {
namespace {

TEST(HostExecTest, EveryThreadOfEveryBlockRunsOnceWithItsIndices) {
  const Grid grid{3, 2, 2};
  const int threads = 64;
  std::vector<std::atomic<int>> seen(static_cast<size_t>(3 * 2 * 2 * threads));
  Launch(grid, threads, 0, [&](HostCtx& ctx) {
    EXPECT_EQ(ctx.threads(), threads);
    EXPECT_EQ(ctx.blocks(0), 3);
    EXPECT_EQ(ctx.blocks(1), 2);
    EXPECT_EQ(ctx.blocks(2), 2);
    const int b = (ctx.block(2) * 2 + ctx.block(1)) * 3 + ctx.block(0);
    seen[static_cast<size_t>(b * threads + ctx.thread())]++;
  });
  for (auto& s : seen) EXPECT_EQ(s.load(), 1);
}

TEST(HostExecTest, SyncOrdersSharedMemoryAndReductionsMatch) {
  // Each thread writes its slot, then reads its neighbour's after sync; then a block sum and max.
  const int threads = 96;
  std::vector<float> got(threads), sums(threads), maxes(threads), warp_sums(threads);
  Launch(Grid{1, 1, 1}, threads, (threads + 32) * sizeof(float), [&](HostCtx& ctx) {
    float* s = ctx.shared<float>();
    const int t = ctx.thread();
    s[t] = static_cast<float>(t * t);
    ctx.sync();
    got[t] = s[(t + 1) % threads];
    ctx.sync();
    sums[t] = BlockSum(ctx, static_cast<float>(t), s + threads);
    maxes[t] = BlockMax(ctx, static_cast<float>((t * 37) % threads), s + threads);
    warp_sums[t] = WarpSum(ctx, 1.0f + static_cast<float>(t % kWarpSize));
  });
  for (int t = 0; t < threads; ++t) {
    EXPECT_EQ(got[t], static_cast<float>(((t + 1) % threads) * ((t + 1) % threads)));
    EXPECT_EQ(sums[t], threads * (threads - 1) / 2.0f);
    EXPECT_EQ(maxes[t], threads - 1.0f);
    EXPECT_EQ(warp_sums[t], 32.0f * 33.0f / 2.0f);
  }
}

// Dynamic shared memory is exactly what the launch asked for: a block that writes past it ends
// the launch naming the block and the byte (on a GPU the same write would corrupt another block's
// memory or fault), and a read past it reads NaN.
TEST(HostExecDeathTest, SharedMemoryHasNoSlack) {
  float past = 0;
  Launch(Grid{1, 1, 1}, 32, 8 * sizeof(float), [&](HostCtx& ctx) {
    if (ctx.thread() == 0) past = ctx.shared<float>()[8];
  });
  EXPECT_TRUE(std::isnan(past));
  EXPECT_DEATH(Launch(Grid{2, 1, 1}, 32, 8 * sizeof(float),
                      [&](HostCtx& ctx) {
                        if (ctx.thread() == 31 && ctx.block(0) == 1) ctx.shared<float>()[8] = 1.0f;
                      }),
               "block \\(1, 0, 0\\) wrote past its 32 bytes of dynamic shared memory \\(at byte 3[2-5]\\)");
}

TEST(HostExecTest, ShuffleXorSwapsLanesWithinAWarp) {
  std::vector<int> got(64);
  Launch(Grid{1, 1, 1}, 64, 0, [&](HostCtx& ctx) {
    const int t = ctx.thread();
    got[t] = ctx.shfl_xor(t, 5);
  });
  for (int t = 0; t < 64; ++t) EXPECT_EQ(got[t], (t / 32) * 32 + ((t % 32) ^ 5));
}

TEST(HostExecTest, SharedMemoryStartsAsNanInEveryBlock) {
  std::vector<float> first(4);
  Launch(Grid{4, 1, 1}, 32, 8 * sizeof(float), [&](HostCtx& ctx) {
    float* s = ctx.shared<float>();
    if (ctx.thread() == 0) first[ctx.block(0)] = s[3];
    ctx.sync();
    s[3] = 1.0f;  // Written by the previous block: must not be seen by the next.
  });
  for (float f : first) EXPECT_TRUE(std::isnan(f));
}

TEST(HostExecTest, Bf16HelpersMatchTheHostConversion) {
  // The dialect's bf16 helpers must give the bits of common/base/dtype.h on every value class.
  for (float f : {0.0f, -0.0f, 1.0f, 1.00390625f, 1.01171875f, -3.5e-39f, 3.4e38f, INFINITY,
                  -INFINITY, NAN, 65504.0f, 1e-45f}) {
    EXPECT_EQ(FloatBf16(f), F32ToBf16(f)) << f;
    EXPECT_EQ(FloatBits(Bf16Float(FloatBf16(f))), FloatBits(pdserve::Bf16ToF32(F32ToBf16(f))));
  }
}

// The emulated tensor-core product, through the fragments as dialect.h lays them out, equals the
// matrix product (the probe the GPU test runs on the hardware too). Values are small integers and
// halves, so every sum is exact and the comparison bitwise.
TEST(HostExecTest, MmaThroughTheFragmentsIsTheMatrixProduct) {
  SplitMix64 rng(3);
  std::vector<uint16_t> a(16 * 16), b(16 * 8);
  std::vector<float> c(16 * 8), d(16 * 8, NAN);
  auto small = [&] { return static_cast<float>(static_cast<int>(rng.Next() % 17) - 8) / 2; };
  for (uint16_t& x : a) x = F32ToBf16(small());
  for (uint16_t& x : b) x = F32ToBf16(small());
  for (float& x : c) x = small();
  Launch(Grid{1, 1, 1}, 32, 0,
         [&](HostCtx& ctx) { MmaProbeBody(ctx, a.data(), b.data(), c.data(), d.data()); });
  for (int i = 0; i < 16; ++i) {
    for (int j = 0; j < 8; ++j) {
      float want = c[i * 8 + j];
      for (int k = 0; k < 16; ++k) want += Bf16ToF32(a[i * 16 + k]) * Bf16ToF32(b[k * 8 + j]);
      ASSERT_EQ(d[i * 8 + j], want) << "D[" << i << "][" << j << "]";
    }
  }
}

TEST(HostExecTest, ReverseOrderRunsThreadsAndBlocksBackwards) {
  ScopedScheduleOrder forward(ScheduleOrder::kForward);  // Whatever PDSERVE_HOST_EXEC_ORDER says.
  std::vector<int> order;
  {
    ScopedScheduleOrder reverse(ScheduleOrder::kReverse);
    Launch(Grid{2, 1, 1}, 32, 0,
           [&](HostCtx& ctx) { order.push_back(ctx.block(0) * 100 + ctx.thread()); });
  }
  ASSERT_EQ(order.size(), 64u);
  EXPECT_EQ(order.front(), 131);  // Block 1, thread 31 first.
  EXPECT_EQ(order.back(), 0);
  order.clear();
  Launch(Grid{1, 1, 1}, 32, 0, [&](HostCtx& ctx) { order.push_back(ctx.thread()); });
  EXPECT_EQ(order.front(), 0) << "the scope restored the order before it";
}

// A kernel that reads a neighbour's shared slot without a sync gives other results reversed:
// what the kernel tests' forward-vs-reverse comparisons rely on to find races.
TEST(HostExecTest, ARaceShowsAsADifferenceBetweenOrders) {
  auto run = [](ScheduleOrder order, bool with_sync) {
    ScopedScheduleOrder scope(order);
    std::vector<float> got(64);
    Launch(Grid{1, 1, 1}, 64, 64 * sizeof(float), [&](HostCtx& ctx) {
      float* s = ctx.shared<float>();
      const int t = ctx.thread();
      s[t] = static_cast<float>(t);
      if (with_sync) ctx.sync();
      got[t] = s[(t + 1) % 64];
      ctx.sync();
    });
    return got;
  };
  const auto racy_f = run(ScheduleOrder::kForward, false),
             racy_r = run(ScheduleOrder::kReverse, false);
  EXPECT_NE(std::memcmp(racy_f.data(), racy_r.data(), 64 * sizeof(float)), 0);
  EXPECT_EQ(run(ScheduleOrder::kForward, true), run(ScheduleOrder::kReverse, true));
}

}  // namespace
}  // namespace pdserve::cuda::host
