// TEST INFRASTRUCTURE: one warp multiplies a 16x16 bf16 matrix A by a 16x8 bf16 matrix B onto a
// 16x8 f32 matrix C through ctx.mma_bf16, loading the fragments as dialect.h documents them. The
// host execution test runs it on the host layer's emulation, the GPU test on the tensor cores
// (mma_probe_kernel.cu), both against a plain matrix product: on a GPU this is the first check
// that the fragment layout the kernels assume is the hardware's.
#ifndef PDSERVE_KERNELS_CUDA_MMA_PROBE_H_
#define PDSERVE_KERNELS_CUDA_MMA_PROBE_H_

#include <cstdint>

#include "kernels/cuda/dialect.h"

namespace pdserve::cuda {

// a: [16][16] row-major, b: [16][8] row-major (k x n), c and d: [16][8]. One warp.
template <typename Ctx>
PD_DEVICE void MmaProbeBody(Ctx& ctx, const uint16_t* a, const uint16_t* b, const float* c,
                            float* d) {
  const int lane = ctx.thread() % kWarpSize, g = lane / 4, t = lane % 4;
  auto pair = [](uint16_t lo, uint16_t hi) {
    return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
  };
  const uint32_t fa[4] = {
      pair(a[g * 16 + 2 * t], a[g * 16 + 2 * t + 1]),
      pair(a[(g + 8) * 16 + 2 * t], a[(g + 8) * 16 + 2 * t + 1]),
      pair(a[g * 16 + 2 * t + 8], a[g * 16 + 2 * t + 9]),
      pair(a[(g + 8) * 16 + 2 * t + 8], a[(g + 8) * 16 + 2 * t + 9]),
  };
  const uint32_t fb[2] = {
      pair(b[(2 * t) * 8 + g], b[(2 * t + 1) * 8 + g]),
      pair(b[(2 * t + 8) * 8 + g], b[(2 * t + 9) * 8 + g]),
  };
  float acc[4] = {c[g * 8 + 2 * t], c[g * 8 + 2 * t + 1], c[(g + 8) * 8 + 2 * t],
                  c[(g + 8) * 8 + 2 * t + 1]};
  ctx.mma_bf16(acc, fa, fb);
  d[g * 8 + 2 * t] = acc[0];
  d[g * 8 + 2 * t + 1] = acc[1];
  d[(g + 8) * 8 + 2 * t] = acc[2];
  d[(g + 8) * 8 + 2 * t + 1] = acc[3];
}

}  // namespace pdserve::cuda

#endif  // PDSERVE_KERNELS_CUDA_MMA_PROBE_H_
