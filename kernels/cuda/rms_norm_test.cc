// GPU test (ctest label `gpu`): skips cleanly on a machine without one.
#include "kernels/cuda/rms_norm.h"

#include <vector>

#include "common/base/rng.h"
#include "gtest/gtest.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/cuda_device.h"

namespace pdserve::cuda {
namespace {

TEST(CudaRmsNormTest, MatchesCpuTwin) {
  if (DeviceCount() == 0) GTEST_SKIP() << DescribeDevice();
  const int64_t rows = 5, n = 576;
  SplitMix64 rng(1);
  std::vector<float> x(rows * n), w(n), gpu(rows * n), cpu(rows * n);
  for (float& v : x) v = static_cast<float>(rng.Normal());
  for (float& v : w) v = static_cast<float>(1 + 0.1 * rng.Normal());
  ASSERT_TRUE(RmsNormHost(x.data(), w.data(), rows, n, 1e-5f, gpu.data()).ok());
  for (int64_t r = 0; r < rows; ++r) kernels::RmsNorm(&x[r * n], w.data(), n, 1e-5f, &cpu[r * n]);
  for (int64_t i = 0; i < rows * n; ++i) EXPECT_NEAR(gpu[i], cpu[i], 1e-5f * (1 + std::abs(cpu[i])));
}

TEST(CudaRmsNormTest, NoGpuIsUnavailableNotACrash) {
  if (DeviceCount() != 0) GTEST_SKIP() << "a GPU is present";
  std::vector<float> x(8, 1.0f), w(8, 1.0f), out(8);
  const absl::Status s = RmsNormHost(x.data(), w.data(), 1, 8, 1e-5f, out.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace pdserve::cuda
