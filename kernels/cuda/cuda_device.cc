#include "kernels/cuda/cuda_device.h"

#include <cuda_runtime_api.h>

#include <string>

namespace pdserve::cuda {

int DeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // Clear the sticky error so later calls start clean.
    return 0;
  }
  return count;
}

std::string DescribeDevice() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return std::string("no GPU: ") + cudaGetErrorString(err);
  }
  if (count == 0) return "no GPU: no CUDA devices";
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return "no GPU: cannot query device 0";
  return std::string(prop.name) + ", " + std::to_string(prop.totalGlobalMem >> 30) + " GiB, sm_" +
         std::to_string(prop.major) + std::to_string(prop.minor);
}

size_t DeviceMemoryBytes() {
  if (DeviceCount() == 0) return 0;
  size_t free_bytes = 0, total = 0;
  if (cudaMemGetInfo(&free_bytes, &total) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return total;
}

}  // namespace pdserve::cuda
