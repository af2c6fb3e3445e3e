// TEST INFRASTRUCTURE (kernels_cuda_test only): mma_probe.h's body on the device.
#include "kernels/cuda/mma_probe_kernel.h"

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_ctx.cuh"
#include "kernels/cuda/mma_probe.h"

namespace pdserve::cuda {
namespace {

__global__ void MmaProbeKernel(const uint16_t* a, const uint16_t* b, const float* c, float* d) {
  DeviceCtx ctx;
  MmaProbeBody(ctx, a, b, c, d);
}

}  // namespace

absl::Status LaunchMmaProbe(const uint16_t* a, const uint16_t* b, const float* c, float* d) {
  MmaProbeKernel<<<1, kWarpSize>>>(a, b, c, d);
  return LaunchStatus("MmaProbeKernel");
}

}  // namespace pdserve::cuda
