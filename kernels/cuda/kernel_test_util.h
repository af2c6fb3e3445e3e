// Test helpers shared by the host-executed kernel tests and the device kernel tests: a one-layer
// KV pool in the CPU's layout, seen both as the CPU kernels' KvPagesView and as the CUDA kernels'
// KvLayer; random data; the attention cases and their CPU reference.
#ifndef PDSERVE_KERNELS_CUDA_KERNEL_TEST_UTIL_H_
#define PDSERVE_KERNELS_CUDA_KERNEL_TEST_UTIL_H_

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"

#include "common/base/rng.h"
#include "common/kvcache/kv_cache_spec.h"
#include "kernels/cpu/attention.h"
#include "kernels/cuda/kernel_params.h"
#include "kernels/cuda/kv_format.h"

namespace pdserve::cuda::testing {

struct TestPool {
  TestPool(KvDType dtype, int num_kv_heads, int head_dim, int block_size, int num_blocks)
      : num_blocks(num_blocks) {
    spec.num_layers = 1;
    spec.num_kv_heads = num_kv_heads;
    spec.head_dim = head_dim;
    spec.block_size = block_size;
    spec.dtype = dtype;
    bytes.assign(spec.PageBytes() * static_cast<size_t>(num_blocks), 0);
  }
  kernels::KvPagesView Cpu() {
    kernels::KvPagesView v;
    v.layer_base = bytes.data();
    v.page_bytes = spec.PageBytes();
    v.block_size = spec.block_size;
    v.num_kv_heads = spec.num_kv_heads;
    v.head_dim = spec.head_dim;
    v.dtype = spec.dtype;
    return v;
  }
  // The same pages for the kernels; `base` is where they live (host bytes, or a device copy).
  KvLayer Kernel(uint8_t* base) const {
    KvLayer l;
    l.base = base;
    l.page_bytes = static_cast<int64_t>(spec.PageBytes());
    l.block_size = static_cast<int>(spec.block_size);
    l.num_kv_heads = static_cast<int>(spec.num_kv_heads);
    l.head_dim = static_cast<int>(spec.head_dim);
    l.format = ToKvFormat(spec.dtype);
    return l;
  }

  KvCacheSpec spec;
  int num_blocks;
  std::vector<uint8_t> bytes;
};

inline std::vector<float> RandomVector(SplitMix64& rng, size_t n, double scale = 1.0) {
  std::vector<float> v(n);
  for (float& f : v) f = static_cast<float>(scale * rng.Normal());
  return v;
}

// A permutation of [0, n): block tables that are not in order, as after a while of serving.
inline std::vector<int32_t> ShuffledBlocks(SplitMix64& rng, int n) {
  std::vector<int32_t> b(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) b[i] = i;
  for (int i = n - 1; i > 0; --i) std::swap(b[i], b[rng.Next() % static_cast<uint64_t>(i + 1)]);
  return b;
}

struct AttnCase {
  KvDType dtype;
  int heads;
  int kv_heads;
  int head_dim;
  int window;
  int split_tokens;  // Decode: keys per split.
};

inline std::string CaseName(const ::testing::TestParamInfo<AttnCase>& info) {
  const AttnCase& c = info.param;
  return std::string(KvDTypeName(c.dtype)) + "_h" + std::to_string(c.heads) + "kv" +
         std::to_string(c.kv_heads) + "_d" + std::to_string(c.head_dim) + "_w" +
         std::to_string(c.window) + "_s" + std::to_string(c.split_tokens);
}

// Sequences of lengths `lens` in one pool, K/V stored by the CPU's StoreKv, blocks shuffled.
struct AttentionFixture {
  AttentionFixture(const AttnCase& c, const std::vector<int>& lens, uint64_t seed,
                   int blocks = kBlocks)
      : c(c), rng(seed), pool(c.dtype, c.kv_heads, c.head_dim, kBlockSize, blocks) {
    tables = testing::ShuffledBlocks(rng, blocks);
    stride = blocks / static_cast<int>(lens.size());
    kernels::KvPagesView view = pool.Cpu();
    for (size_t s = 0; s < lens.size(); ++s) {
      for (int pos = 0; pos < lens[s]; ++pos) {
        const std::vector<float> k = RandomVector(rng, c.kv_heads * c.head_dim, 2.0);
        const std::vector<float> v = RandomVector(rng, c.kv_heads * c.head_dim);
        kernels::StoreKv(view, &tables[s * stride], pos, k.data(), v.data());
      }
    }
  }
  AttentionParams Params(const std::vector<int32_t>& positions, const std::vector<int32_t>& row_seq,
                         const std::vector<float>& q, std::vector<float>* out) {
    AttentionParams a;
    a.tokens.rows = static_cast<int>(positions.size());
    a.tokens.positions = positions.data();
    a.tokens.row_seq = row_seq.data();
    a.tokens.block_tables = tables.data();
    a.tokens.block_table_stride = stride;
    a.kv = pool.Kernel(pool.bytes.data());  // The device test points it at its copy.
    a.num_heads = c.heads;
    a.window = c.window;
    a.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    a.q = q.data();
    out->assign(positions.size() * c.heads * c.head_dim, NAN);
    a.out = out->data();
    a.out_type = ActType::kF32;
    return a;
  }
  std::vector<float> Cpu(const std::vector<int32_t>& positions, const std::vector<int32_t>& row_seq,
                         const std::vector<float>& q) {
    const int hd = c.heads * c.head_dim;
    std::vector<float> out(positions.size() * hd), scratch(4096);
    const kernels::KvPagesView view = pool.Cpu();
    for (size_t r = 0; r < positions.size(); ++r) {
      kernels::PagedAttention(view, &tables[row_seq[r] * stride], positions[r], c.window, &q[r * hd],
                              c.heads, 1.0f / std::sqrt(static_cast<float>(c.head_dim)), 0, c.heads,
                              &out[r * hd], scratch.data());
    }
    return out;
  }

  static constexpr int kBlockSize = 8;
  static constexpr int kBlocks = 24;
  AttnCase c;
  SplitMix64 rng;
  TestPool pool;
  std::vector<int32_t> tables;
  int stride = 0;
};

inline void ExpectClose(const std::vector<float>& got, const std::vector<float>& want,
                        float tolerance = 3e-6f) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], tolerance * (1.0f + std::fabs(want[i]))) << "element " << i;
  }
}

// The prefill kernel's output against the CPU's f32 attention: within f32 rounding for the f32
// kernel; for the tensor-core kernel within what its two-bf16 operands leave (each of q and p as
// hi + lo, about 2^-17 of the value: observed at most 1.6e-5 on the host tests' cases). 1e-4
// tells a wrong mask, a missed key, a wrong rescale or a dropped low part apart (each seen
// failing it).
inline float PrefillTolerance(KvDType dtype, int head_dim) {
  return PrefillUsesMma(ToKvFormat(dtype), head_dim) ? 1e-4f : 3e-6f;
}

}  // namespace pdserve::cuda::testing

#endif  // PDSERVE_KERNELS_CUDA_KERNEL_TEST_UTIL_H_
