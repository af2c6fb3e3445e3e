// GPU test (ctest label `gpu`; skips cleanly without a device): the CUDA kernels launched on the
// device (layer_ops.h, attention_ops.h) against the CPU kernels, on the cases the host-executed
// tests use plus device-sized ones (many splits, long prefill tiles walks), and the tensor cores'
// fragment layout (mma_probe.h).
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "common/base/dtype.h"
#include "gtest/gtest.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/attention_ops.h"
#include "kernels/cuda/attention_plan.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/kernel_test_util.h"
#include "kernels/cuda/kv_format.h"
#include "kernels/cuda/layer_ops.h"
#include "kernels/cuda/mma_probe_kernel.h"

namespace pdserve::cuda {
namespace {

using testing::AttnCase;
using testing::ExpectClose;
using testing::RandomVector;

// A device copy of a host vector; Get() copies it back.
template <typename T>
class DeviceVector {
 public:
  explicit DeviceVector(const std::vector<T>& host) : n_(host.size()) {
    EXPECT_EQ(cudaMalloc(&ptr_, Bytes()), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(ptr_, host.data(), Bytes(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceVector() { cudaFree(ptr_); }
  T* get() { return static_cast<T*>(ptr_); }
  std::vector<T> Get() const {
    std::vector<T> host(n_);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(host.data(), ptr_, Bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }

 private:
  size_t Bytes() const { return n_ * sizeof(T); }
  void* ptr_ = nullptr;
  size_t n_;
};

class DeviceAttentionTest : public ::testing::TestWithParam<AttnCase> {
 protected:
  void SetUp() override {
    if (DeviceCount() == 0) GTEST_SKIP() << "needs gpu: " << DescribeDevice();
  }
};

TEST_P(DeviceAttentionTest, DecodeEqualsCpu) {
  const AttnCase c = GetParam();
  testing::AttentionFixture f(c, {61, 1, 30}, 11);
  const std::vector<int32_t> positions = {60, 0, 29, 17}, row_seq = {0, 1, 2, 0};
  SplitMix64 rng(12);
  const std::vector<float> q = RandomVector(rng, positions.size() * c.heads * c.head_dim);
  std::vector<float> out;
  DecodeAttentionParams p;
  p.a = f.Params(positions, row_seq, q, &out);
  DeviceVector<uint8_t> pool(f.pool.bytes);
  DeviceVector<int32_t> d_pos(positions), d_seq(row_seq), d_tables(f.tables);
  DeviceVector<float> d_q(q), d_out(out);
  p.a.kv.base = pool.get();
  p.a.tokens.positions = d_pos.get();
  p.a.tokens.row_seq = d_seq.get();
  p.a.tokens.block_tables = d_tables.get();
  p.a.q = d_q.get();
  p.a.out = d_out.get();
  p.num_rows = static_cast<int>(positions.size());
  p.split_tokens = c.split_tokens;
  p.max_splits = (61 + c.split_tokens - 1) / c.split_tokens;
  DeviceVector<float> partial(std::vector<float>(
      DecodePartialFloats(4, c.heads, p.max_splits, c.head_dim)));
  DeviceVector<float> ml(std::vector<float>(DecodePartialMlFloats(4, c.heads, p.max_splits)));
  p.partial = partial.get();
  p.partial_ml = ml.get();
  ASSERT_TRUE(LaunchDecodeAttention(p, nullptr).ok());
  ExpectClose(d_out.Get(), f.Cpu(positions, row_seq, q));
}

// The prefill kernel that serves this pool, on the device, over `positions` of the fixture's
// sequences; its output against the CPU's attention.
void ExpectDevicePrefillEqualsCpu(testing::AttentionFixture& f,
                                  const std::vector<int32_t>& positions,
                                  const std::vector<int32_t>& row_seq, uint64_t seed) {
  const AttnCase& c = f.c;
  SplitMix64 rng(seed);
  const std::vector<float> q = RandomVector(rng, positions.size() * c.heads * c.head_dim);
  std::vector<float> out;
  PrefillAttentionParams p;
  p.a = f.Params(positions, row_seq, q, &out);
  std::vector<int32_t> first, n;
  MakePrefillTiles(row_seq, PrefillTileRows(ToKvFormat(c.dtype), c.head_dim), &first, &n);
  DeviceVector<uint8_t> pool(f.pool.bytes);
  DeviceVector<int32_t> d_pos(positions), d_seq(row_seq), d_tables(f.tables), d_first(first), d_n(n);
  DeviceVector<float> d_q(q), d_out(out);
  p.a.kv.base = pool.get();
  p.a.tokens.positions = d_pos.get();
  p.a.tokens.row_seq = d_seq.get();
  p.a.tokens.block_tables = d_tables.get();
  p.a.q = d_q.get();
  p.a.out = d_out.get();
  p.num_tiles = static_cast<int>(first.size());
  p.tile_first_row = d_first.get();
  p.tile_rows = d_n.get();
  ASSERT_TRUE(LaunchPrefillAttention(p, nullptr).ok());
  ExpectClose(d_out.Get(), f.Cpu(positions, row_seq, q),
              testing::PrefillTolerance(c.dtype, c.head_dim));
}

TEST_P(DeviceAttentionTest, PrefillEqualsCpu) {
  testing::AttentionFixture f(GetParam(), {60, 19}, 21);
  std::vector<int32_t> positions, row_seq;
  for (int pos = 23; pos < 60; ++pos) positions.push_back(pos), row_seq.push_back(0);
  for (int pos = 0; pos < 19; ++pos) positions.push_back(pos), row_seq.push_back(1);
  ExpectDevicePrefillEqualsCpu(f, positions, row_seq, 22);
}

// Device-sized prefill: a 1,000-token chunk after a cached prefix of 500 (tiles of 64 rows, each
// walking up to 24 key tiles), head_dim 128 with GQA 4, every format.
TEST(DeviceAttentionLongTest, PrefillOfALongChunkEqualsCpu) {
  if (DeviceCount() == 0) GTEST_SKIP() << "needs gpu: " << DescribeDevice();
  for (KvDType dtype : {KvDType::kF32, KvDType::kBF16, KvDType::kInt8, KvDType::kInt4}) {
    testing::AttentionFixture f(AttnCase{dtype, 8, 2, 128, 0, 0}, {1500}, 31, /*blocks=*/192);
    std::vector<int32_t> positions, row_seq;
    for (int pos = 500; pos < 1500; ++pos) positions.push_back(pos), row_seq.push_back(0);
    SCOPED_TRACE(KvDTypeName(dtype));
    ExpectDevicePrefillEqualsCpu(f, positions, row_seq, 32);
  }
}

// The tensor cores multiply through the fragments as dialect.h lays them out (mma_probe.h): if
// this fails, every tensor-core kernel does, and the layout is what to fix.
TEST(DeviceMmaTest, FragmentLayoutIsTheHardwares) {
  if (DeviceCount() == 0) GTEST_SKIP() << "needs gpu: " << DescribeDevice();
  SplitMix64 rng(3);
  std::vector<uint16_t> a(16 * 16), b(16 * 8);
  std::vector<float> c(16 * 8);
  auto small = [&] { return static_cast<float>(static_cast<int>(rng.Next() % 17) - 8) / 2; };
  for (uint16_t& x : a) x = F32ToBf16(small());
  for (uint16_t& x : b) x = F32ToBf16(small());
  for (float& x : c) x = small();
  DeviceVector<uint16_t> d_a(a), d_b(b);
  DeviceVector<float> d_c(c), d_d(std::vector<float>(16 * 8, NAN));
  ASSERT_TRUE(LaunchMmaProbe(d_a.get(), d_b.get(), d_c.get(), d_d.get()).ok());
  const std::vector<float> d = d_d.Get();
  for (int i = 0; i < 16; ++i) {
    for (int j = 0; j < 8; ++j) {
      float want = c[i * 8 + j];
      for (int k = 0; k < 16; ++k) want += Bf16ToF32(a[i * 16 + k]) * Bf16ToF32(b[k * 8 + j]);
      ASSERT_EQ(d[i * 8 + j], want) << "D[" << i << "][" << j << "]";  // Exact: small values.
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, DeviceAttentionTest,
    ::testing::Values(AttnCase{KvDType::kF32, 4, 4, 32, 0, 16}, AttnCase{KvDType::kBF16, 8, 2, 64, 0, 24},
                      AttnCase{KvDType::kBF16, 32, 8, 128, 0, 32},  // Llama-8B's heads
                      AttnCase{KvDType::kBF16, 6, 2, 128, 20, 16},
                      AttnCase{KvDType::kInt8, 8, 1, 64, 0, 16},
                      AttnCase{KvDType::kInt4, 4, 2, 80, 13, 8}),
    testing::CaseName);

TEST(DeviceLayerKernelsTest, QkvRopeStoreWritesTheCpuBytes) {
  if (DeviceCount() == 0) GTEST_SKIP() << "needs gpu: " << DescribeDevice();
  for (KvDType dtype : {KvDType::kF32, KvDType::kBF16, KvDType::kInt8, KvDType::kInt4}) {
    SplitMix64 rng(7);
    const int heads = 8, kv_heads = 2, d = 128, rows = 5, blocks = 4, bs = 4;
    testing::TestPool gpu_pool(dtype, kv_heads, d, bs, blocks), cpu_pool(dtype, kv_heads, d, bs, blocks);
    const std::vector<int32_t> tables = {2, 0, 3, 1}, positions = {0, 3, 4, 9, 15}, row_seq(rows, 0);
    std::vector<float> cos_sin(16 * d);
    kernels::RopeParams rope;
    for (int pos = 0; pos < 16; ++pos) kernels::RopeCosSin(rope, d, pos, &cos_sin[pos * d]);
    const std::vector<float> q = RandomVector(rng, rows * heads * d), k = RandomVector(rng, rows * kv_heads * d),
                             v = RandomVector(rng, rows * kv_heads * d), kn = RandomVector(rng, d);
    DeviceVector<uint8_t> pool(gpu_pool.bytes);
    DeviceVector<int32_t> d_pos(positions), d_seq(row_seq), d_tables(tables);
    DeviceVector<float> d_q(q), d_k(k), d_v(v), d_kn(kn), d_cs(cos_sin);
    QkvRopeStoreParams p;
    p.tokens = {rows, d_pos.get(), d_seq.get(), d_tables.get(), blocks};
    p.num_heads = heads;
    p.num_kv_heads = kv_heads;
    p.head_dim = d;
    p.q = d_q.get();
    p.k = d_k.get();
    p.v = d_v.get();
    p.q_norm = d_kn.get();
    p.k_norm = d_kn.get();
    p.cos_sin = d_cs.get();
    p.kv = gpu_pool.Kernel(pool.get());
    ASSERT_TRUE(LaunchQkvRopeStore(p, nullptr).ok());
    const std::vector<float> k_out = d_k.Get(), v_out = d_v.Get();
    // The CPU storing the device's k and v rows writes the device's bytes.
    kernels::KvPagesView view = cpu_pool.Cpu();
    for (int r = 0; r < rows; ++r) {
      kernels::StoreKv(view, tables.data(), positions[r], &k_out[r * kv_heads * d], &v_out[r * kv_heads * d]);
    }
    EXPECT_EQ(pool.Get(), cpu_pool.bytes) << KvDTypeName(dtype);
    // And the device's k is the CPU's norm + rope within float rounding.
    std::vector<float> cpu_k = k;
    for (int r = 0; r < rows; ++r) {
      for (int h = 0; h < kv_heads; ++h) {
        float* x = &cpu_k[(r * kv_heads + h) * d];
        kernels::RmsNorm(x, kn.data(), d, 1e-6f, x);
        kernels::ApplyRope(x, d, &cos_sin[positions[r] * d]);
      }
    }
    ExpectClose(k_out, cpu_k);
  }
}

TEST(DeviceLayerKernelsTest, AddRmsNormAndSiluMulEqualCpu) {
  if (DeviceCount() == 0) GTEST_SKIP() << "needs gpu: " << DescribeDevice();
  SplitMix64 rng(9);
  const int rows = 9;
  const int64_t n = 4096;
  const std::vector<float> x = RandomVector(rng, rows * n), delta = RandomVector(rng, rows * n),
                           w = RandomVector(rng, n);
  DeviceVector<float> d_x(x), d_delta(delta), d_w(w), d_out(std::vector<float>(rows * n));
  AddRmsNormParams p;
  p.rows = rows;
  p.n = n;
  p.residual = d_x.get();
  p.delta = d_delta.get();
  p.weight = d_w.get();
  p.out = d_out.get();
  p.out_type = ActType::kF32;
  ASSERT_TRUE(LaunchAddRmsNorm(p, nullptr).ok());
  std::vector<float> cpu_x = x, cpu(rows * n);
  for (int r = 0; r < rows; ++r) {
    kernels::AddInPlace(&cpu_x[r * n], &delta[r * n], n);
    kernels::RmsNorm(&cpu_x[r * n], w.data(), n, 1e-6f, &cpu[r * n]);
  }
  EXPECT_EQ(d_x.Get(), cpu_x);
  ExpectClose(d_out.Get(), cpu);

  SiluMulParams s;
  s.rows = rows;
  s.n = n / 2;
  s.gate = d_delta.get();
  s.up = d_delta.get() + n / 2;
  s.ld_in = n;
  s.out = d_out.get();
  s.out_type = ActType::kF32;
  ASSERT_TRUE(LaunchSiluMul(s, nullptr).ok());
  const std::vector<float> got = d_out.Get();
  for (int r = 0; r < rows; ++r) {
    std::vector<float> want(n / 2);
    kernels::SiluMul(&delta[r * n], &delta[r * n + n / 2], n / 2, want.data());
    for (int64_t i = 0; i < n / 2; ++i) {
      ASSERT_NEAR(got[r * (n / 2) + i], want[i], 2e-6f * (1 + std::fabs(want[i])));
    }
  }
}

TEST(DeviceLayerKernelsTest, WithoutAGpuALaunchIsAnErrorNotACrash) {
  if (DeviceCount() != 0) GTEST_SKIP() << "needs no-gpu: a GPU is present";
  AddRmsNormParams p;
  p.rows = 1;
  p.n = 8;
  const absl::Status s = LaunchAddRmsNorm(p, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
}

}  // namespace
}  // namespace pdserve::cuda
