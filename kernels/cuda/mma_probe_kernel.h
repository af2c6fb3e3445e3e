// TEST INFRASTRUCTURE (kernels_cuda_test only): launches mma_probe.h's body on the device, one
// warp, device pointers, on the default stream.
#ifndef PDSERVE_KERNELS_CUDA_MMA_PROBE_KERNEL_H_
#define PDSERVE_KERNELS_CUDA_MMA_PROBE_KERNEL_H_

#include <cstdint>

#include "absl/status/status.h"

namespace pdserve::cuda {

absl::Status LaunchMmaProbe(const uint16_t* a, const uint16_t* b, const float* c, float* d);

}  // namespace pdserve::cuda

#endif  // PDSERVE_KERNELS_CUDA_MMA_PROBE_KERNEL_H_
