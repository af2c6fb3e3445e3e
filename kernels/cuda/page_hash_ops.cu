#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_ctx.cuh"
#include "kernels/cuda/launch_config.h"
#include "kernels/cuda/page_hash.h"
#include "kernels/cuda/page_hash_ops.h"

namespace pdserve::cuda {
namespace {

__global__ void PageHashKernel(const uint8_t* const* pages, const uint64_t* bytes, uint64_t* out) {
  DeviceCtx ctx;
  PageHashBody(ctx, pages, bytes, out);
}

}  // namespace

absl::Status LaunchPageHash(const uint8_t* const* pages, const uint64_t* bytes, uint64_t* out,
                            int count, void* stream) {
  if (count == 0) return absl::OkStatus();
  const LaunchConfig c = PageHashLaunch(count);
  PageHashKernel<<<dim3(static_cast<unsigned>(c.grid_x)), c.threads, c.shared_bytes,
                   static_cast<cudaStream_t>(stream)>>>(pages, bytes, out);
  return LaunchStatus("PageHashKernel");
}

}  // namespace pdserve::cuda
