// The launch configuration of every CUDA kernel (grid, threads per block, dynamic shared memory):
// one source for the CUDA launchers (*_ops.cu) and the host execution layer (host_device_ops.cc,
// page_hash_test.cc), so the host tests run each kernel body with the grid, block size and shared
// memory production gives it, and the shared memory is checked against the limits of the GPUs we
// build for (launch_config_test.cc) before any of them runs it.
#ifndef PDSERVE_KERNELS_CUDA_LAUNCH_CONFIG_H_
#define PDSERVE_KERNELS_CUDA_LAUNCH_CONFIG_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "kernels/cuda/attention_kernels.h"
#include "kernels/cuda/attention_mma_kernels.h"
#include "kernels/cuda/kernel_params.h"

namespace pdserve::cuda {

struct LaunchConfig {
  int grid_x = 1, grid_y = 1, grid_z = 1;
  int threads = 0;
  size_t shared_bytes = 0;  // Dynamic shared memory per block.
};

inline constexpr int kRowThreads = 256;     // Embedding, add + RMSNorm, SiLU-mul, fill.
inline constexpr int kDecodeThreads = 128;  // Decode attention and its merge.
inline constexpr int kPrefillThreads = 128;
inline constexpr int kPageHashThreads = 256;
inline constexpr int64_t kMaxFillBlocks = 65536;  // Fill's blocks stride over the rest.


inline LaunchConfig EmbeddingLaunch(const EmbeddingParams& p) {
  return {p.rows, 1, 1, kRowThreads, 0};
}
// A warp's partial sums of squares, one float per warp.
inline LaunchConfig AddRmsNormLaunch(const AddRmsNormParams& p) {
  return {p.rows, 1, 1, kRowThreads, kWarpSize * sizeof(float)};
}
// A warp per head: enough warps for the q, k and v heads of one row, at most 8.
inline LaunchConfig QkvRopeStoreLaunch(const QkvRopeStoreParams& p) {
  const int heads = p.num_heads + 2 * p.num_kv_heads;
  return {p.tokens.rows, 1, 1, kWarpSize * (heads < 8 ? heads : 8), 0};
}
inline LaunchConfig SiluMulLaunch(const SiluMulParams& p) {
  return {p.rows, 1, 1, kRowThreads, 0};
}
inline LaunchConfig FillLaunch(const FillParams& p) {
  const int64_t blocks = (p.count + kRowThreads - 1) / kRowThreads;
  return {static_cast<int>(blocks < kMaxFillBlocks ? blocks : kMaxFillBlocks), 1, 1, kRowThreads, 0};
}
// Grid (num_kv_heads, num_rows, max_splits); launched without opting in to more shared memory
// (the split plan keeps it within kSharedBytesDefault: attention_plan.h).
inline LaunchConfig DecodeAttentionLaunch(const DecodeAttentionParams& p) {
  const AttentionParams& a = p.a;
  const int group = a.num_heads / a.kv.num_kv_heads;
  return {a.kv.num_kv_heads, p.num_rows, p.max_splits, kDecodeThreads,
          sizeof(float) * static_cast<size_t>(DecodeSharedFloats(group, a.kv.head_dim, p.split_tokens))};
}
// Grid (num_heads, num_rows): combines a row's splits when it has several.
inline LaunchConfig DecodeMergeLaunch(const DecodeAttentionParams& p) {
  return {p.a.num_heads, p.num_rows, 1, kDecodeThreads, 0};
}
// Grid (num_tiles, num_heads), CUDA cores; above kSharedBytesDefault the launcher opts in.
inline LaunchConfig PrefillAttentionLaunch(const PrefillAttentionParams& p) {
  return {p.num_tiles, p.a.num_heads, 1, kPrefillThreads,
          sizeof(float) * static_cast<size_t>(PrefillSharedFloats(p.a.kv.head_dim))};
}
// Grid (num_tiles, num_heads), tensor cores, head_dim = dk_chunks * kMmaK.
inline LaunchConfig PrefillMmaLaunch(const PrefillAttentionParams& p, int dk_chunks) {
  return {p.num_tiles, p.a.num_heads, 1, kPrefillMmaThreads,
          static_cast<size_t>(PrefillMmaSharedBytes(dk_chunks * kMmaK))};
}
// A block per page, a 64-bit partial per thread.
inline LaunchConfig PageHashLaunch(int count) {
  return {count, 1, 1, kPageHashThreads, kPageHashThreads * sizeof(uint64_t)};
}

// Whether a launch must opt in to its shared memory first.
inline bool NeedsSharedOptIn(const LaunchConfig& c) { return c.shared_bytes > kSharedBytesDefault; }

// The check every launcher (CUDA and host) makes first: the block's shared memory within what the
// kernel may have (kSharedBytesDefault where the launcher does not opt in, else the opt-in most).
inline absl::Status CheckLaunch(const LaunchConfig& c, const char* kernel, bool may_opt_in) {
  const size_t limit = may_opt_in ? kSharedBytesOptInMax : kSharedBytesDefault;
  if (c.shared_bytes > limit) {
    return absl::InvalidArgumentError(std::string(kernel) + ": " + std::to_string(c.shared_bytes) +
                                      " bytes of shared memory per block, more than the " +
                                      std::to_string(limit) + " it may have");
  }
  if (c.threads < kWarpSize || c.threads % kWarpSize != 0 || c.threads > 1024) {
    return absl::InvalidArgumentError(std::string(kernel) + ": " + std::to_string(c.threads) +
                                      " threads per block");
  }
  if (c.grid_x < 1 || c.grid_y < 1 || c.grid_z < 1 || c.grid_y > 65535 || c.grid_z > 65535) {
    return absl::InvalidArgumentError(std::string(kernel) + ": grid " + std::to_string(c.grid_x) +
                                      " x " + std::to_string(c.grid_y) + " x " +
                                      std::to_string(c.grid_z) + " is outside the device's limits");
  }
  return absl::OkStatus();
}

}  // namespace pdserve::cuda

#endif  // PDSERVE_KERNELS_CUDA_LAUNCH_CONFIG_H_
