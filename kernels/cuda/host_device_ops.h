// TEST INFRASTRUCTURE, never in the pdserve binary: DeviceOps on the host. "Device" memory is
// host memory, the kernels are the real kernel bodies run by the host execution layer
// (host_exec.h), and the GEMM, standing in for cuBLASLt, is a plain loop over bf16 inputs with
// f32 accumulation. Everything runs synchronously.
#ifndef PDSERVE_KERNELS_CUDA_HOST_DEVICE_OPS_H_
#define PDSERVE_KERNELS_CUDA_HOST_DEVICE_OPS_H_

#include <memory>

#include "kernels/cuda/device_ops.h"

namespace pdserve::cuda {

// Every launch as production makes it: grid, block size and shared memory from launch_config.h,
// with the CUDA launchers' checks. threads_override > 0 runs the block-size-generic kernels (all
// but the tensor-core prefill, whose warps own fixed rows) with that block size instead, for tests
// that the kernels hold at other sizes (a multiple of 32).
std::unique_ptr<DeviceOps> CreateHostDeviceOps(int threads_override = 0);

}  // namespace pdserve::cuda

#endif  // PDSERVE_KERNELS_CUDA_HOST_DEVICE_OPS_H_
