// The device side of dialect.h: the context a kernel body gets when nvcc compiles it. Included
// only by .cu files.
#ifndef PDSERVE_KERNELS_CUDA_DEVICE_CTX_CUH_
#define PDSERVE_KERNELS_CUDA_DEVICE_CTX_CUH_

#include <cuda_runtime.h>

#include "kernels/cuda/dialect.h"

namespace pdserve::cuda {

struct DeviceCtx {
  __device__ __forceinline__ int thread() const { return static_cast<int>(threadIdx.x); }
  __device__ __forceinline__ int threads() const { return static_cast<int>(blockDim.x); }
  __device__ __forceinline__ int block(int axis) const {
    return static_cast<int>(axis == 0 ? blockIdx.x : axis == 1 ? blockIdx.y : blockIdx.z);
  }
  __device__ __forceinline__ int blocks(int axis) const {
    return static_cast<int>(axis == 0 ? gridDim.x : axis == 1 ? gridDim.y : gridDim.z);
  }
  __device__ __forceinline__ void sync() { __syncthreads(); }
  __device__ __forceinline__ float shfl_xor(float v, int mask) {
    return __shfl_xor_sync(0xffffffffu, v, mask);
  }
  __device__ __forceinline__ int shfl_xor(int v, int mask) {
    return __shfl_xor_sync(0xffffffffu, v, mask);
  }
  template <typename T>
  __device__ __forceinline__ T* shared() {
    extern __shared__ __align__(16) unsigned char pd_shared[];
    return reinterpret_cast<T*>(pd_shared);
  }
};

}  // namespace pdserve::cuda

#endif  // PDSERVE_KERNELS_CUDA_DEVICE_CTX_CUH_
