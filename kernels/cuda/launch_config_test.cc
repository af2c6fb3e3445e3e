// Every launch configuration production makes (launch_config.h) within the limits of the GPUs we
// build for, for every shape the kernels accept (kernel_checks.h) and the split plan the runner
// makes (attention_plan.h): a launch that would fail on an A100 or H200 fails here first.
#include "kernels/cuda/launch_config.h"

#include <array>
#include <string>

#include "gtest/gtest.h"
#include "kernels/cuda/attention_plan.h"
#include "kernels/cuda/kernel_checks.h"

namespace pdserve::cuda {
namespace {

constexpr KvFormat kFormats[] = {KvFormat::kF32, KvFormat::kBF16, KvFormat::kInt8, KvFormat::kInt4};

AttentionParams Shape(int num_heads, int num_kv_heads, int head_dim, KvFormat format) {
  AttentionParams a;
  a.num_heads = num_heads;
  a.kv.num_kv_heads = num_kv_heads;
  a.kv.head_dim = head_dim;
  a.kv.format = format;
  return a;
}

TEST(LaunchConfigTest, EveryAcceptedAttentionShapeFitsTheDevices) {
  int shapes = 0, opt_in = 0;
  for (KvFormat format : kFormats) {
    for (int group = 1; group <= kMaxKernelGroup; ++group) {
      for (int head_dim = 2; head_dim <= kMaxKernelHeadDim; head_dim += 2) {
        const int kv_heads = 8;
        if (!CheckAttentionShape(group * kv_heads, kv_heads, head_dim, format).ok()) continue;
        ++shapes;
        const std::string shape = "group " + std::to_string(group) + " head_dim " +
                                  std::to_string(head_dim) + " format " +
                                  std::to_string(static_cast<int>(format));
        for (int context : {1, 257, 4096, 131072}) {
          const DecodeSplit split = PlanDecodeSplits(group, head_dim, context);
          DecodeAttentionParams d;
          d.a = Shape(group * kv_heads, kv_heads, head_dim, format);
          d.num_rows = 256;
          d.split_tokens = split.split_tokens;
          d.max_splits = split.max_splits;
          const LaunchConfig c = DecodeAttentionLaunch(d);
          EXPECT_TRUE(CheckLaunch(c, "decode", /*may_opt_in=*/false).ok()) << shape << " context " << context;
          EXPECT_EQ(c.grid_z, split.max_splits);
          EXPECT_TRUE(CheckLaunch(DecodeMergeLaunch(d), "merge", false).ok()) << shape;
        }
        PrefillAttentionParams p;
        p.a = Shape(group * kv_heads, kv_heads, head_dim, format);
        p.num_tiles = 1000;
        const LaunchConfig c = PrefillUsesMma(format, head_dim)
                                   ? PrefillMmaLaunch(p, head_dim / kMmaK)
                                   : PrefillAttentionLaunch(p);
        EXPECT_TRUE(CheckLaunch(c, "prefill", /*may_opt_in=*/true).ok()) << shape << ": " << c.shared_bytes;
        opt_in += NeedsSharedOptIn(c);
        QkvRopeStoreParams q;
        q.num_heads = group * kv_heads;
        q.num_kv_heads = kv_heads;
        q.tokens.rows = 8192;
        EXPECT_TRUE(CheckLaunch(QkvRopeStoreLaunch(q), "qkv", false).ok()) << shape;
      }
    }
  }
  EXPECT_GT(shapes, 1000);
  EXPECT_GT(opt_in, 0) << "no prefill shape needs more than the default: the opt-in path is unchecked";
}

TEST(LaunchConfigTest, LimitsAreTheDevicesAndGridsAsTheKernelsIndexThem) {
  EXPECT_EQ(kSharedBytesDefault, 48u * 1024);
  EXPECT_EQ(kDecodeSharedBytes, 48 * 1024);
  LaunchConfig c{1, 1, 1, 128, kSharedBytesOptInMax + 1};
  const absl::Status s = CheckLaunch(c, "K", true);
  EXPECT_EQ(s.message(), "K: 166913 bytes of shared memory per block, more than the 166912 it may have");
  c.shared_bytes = kSharedBytesDefault + 4;
  EXPECT_TRUE(CheckLaunch(c, "K", true).ok());
  EXPECT_FALSE(CheckLaunch(c, "K", false).ok());
  c.shared_bytes = 0;
  c.grid_y = 65536;
  EXPECT_FALSE(CheckLaunch(c, "K", false).ok());
  // The grids as the kernel bodies read their block indices (attention_kernels.h).
  DecodeAttentionParams d;
  d.a = Shape(32, 8, 128, KvFormat::kBF16);
  d.num_rows = 5;
  d.split_tokens = 256;
  d.max_splits = 3;
  const LaunchConfig dc = DecodeAttentionLaunch(d);
  EXPECT_EQ((std::array<int, 4>{dc.grid_x, dc.grid_y, dc.grid_z, dc.threads}), (std::array<int, 4>{8, 5, 3, 128}));
  const LaunchConfig mc = DecodeMergeLaunch(d);
  EXPECT_EQ((std::array<int, 3>{mc.grid_x, mc.grid_y, mc.grid_z}), (std::array<int, 3>{32, 5, 1}));
  FillParams f;
  f.count = int64_t{1} << 40;
  EXPECT_EQ(FillLaunch(f).grid_x, 65536);
}

}  // namespace
}  // namespace pdserve::cuda
