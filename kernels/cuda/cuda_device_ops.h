// DeviceOps on a CUDA GPU: one stream, cudaMalloc'd memory, cuBLASLt bf16 GEMMs with f32
// accumulation (heuristic algorithm per shape, cached), our kernels (layer_ops.h,
// attention_ops.h), a CUDA event per layer mark. Plain C++ header.
#ifndef PDSERVE_KERNELS_CUDA_CUDA_DEVICE_OPS_H_
#define PDSERVE_KERNELS_CUDA_CUDA_DEVICE_OPS_H_

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/cuda/device_ops.h"

namespace pdserve::cuda {

// Device `device` (0: the first visible). Unavailable, naming what the runtime says, when there
// is no GPU or driver.
absl::StatusOr<std::unique_ptr<DeviceOps>> CreateCudaDeviceOps(int device = 0);

}  // namespace pdserve::cuda

#endif  // PDSERVE_KERNELS_CUDA_CUDA_DEVICE_OPS_H_
