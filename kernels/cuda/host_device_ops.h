// TEST INFRASTRUCTURE, never in the pdserve binary: DeviceOps on the host. "Device" memory is
// host memory, the kernels are the real kernel bodies run by the host execution layer
// (host_exec.h), and the GEMM, standing in for cuBLASLt, is a plain loop over bf16 inputs with
// f32 accumulation. Everything runs synchronously.
#ifndef PDSERVE_KERNELS_CUDA_HOST_DEVICE_OPS_H_
#define PDSERVE_KERNELS_CUDA_HOST_DEVICE_OPS_H_

#include <memory>

#include "kernels/cuda/device_ops.h"

namespace pdserve::cuda {

// threads: the block size of every kernel launch (a multiple of 32; small keeps tests fast).
std::unique_ptr<DeviceOps> CreateHostDeviceOps(int threads = 64);

}  // namespace pdserve::cuda

#endif  // PDSERVE_KERNELS_CUDA_HOST_DEVICE_OPS_H_
