// What the CUDA runtime can see. Plain C++ header: no CUDA types leave kernels/cuda.
#ifndef PDSERVE_KERNELS_CUDA_CUDA_DEVICE_H_
#define PDSERVE_KERNELS_CUDA_CUDA_DEVICE_H_

#include <cstddef>
#include <string>

namespace pdserve::cuda {

// Number of usable GPUs; 0 when there is no driver, no device, or any runtime error (a machine
// without a GPU returns cudaErrorInsufficientDriver and must be treated as "no GPU").
int DeviceCount();

// "NVIDIA H200, 139 GiB, sm_90" for device 0, or the runtime's reason there is none.
std::string DescribeDevice();

// Device 0's memory in bytes (cudaMemGetInfo's total); 0 when there is no GPU.
size_t DeviceMemoryBytes();

}  // namespace pdserve::cuda

#endif  // PDSERVE_KERNELS_CUDA_CUDA_DEVICE_H_
