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
  // d += A * B (dialect.h's fragments). sm_80 and later: the architectures we build for.
  __device__ __forceinline__ void mma_bf16(float* d, const uint32_t* a, const uint32_t* b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    __trap();
#endif
  }
  template <typename T>
  __device__ __forceinline__ T* shared() {
    extern __shared__ __align__(16) unsigned char pd_shared[];
    return reinterpret_cast<T*>(pd_shared);
  }
};

}  // namespace pdserve::cuda

#endif  // PDSERVE_KERNELS_CUDA_DEVICE_CTX_CUH_
