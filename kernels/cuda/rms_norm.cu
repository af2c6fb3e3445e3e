#include <cuda_runtime.h>

#include <string>

#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/rms_norm.h"

namespace pdserve::cuda {
namespace {

// One block per row; a shared-memory tree reduction of x^2.
__global__ void RmsNormKernel(const float* x, const float* w, int64_t n, float eps, float* out) {
  extern __shared__ float partial[];
  const float* row = x + blockIdx.x * n;
  float sum = 0.f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) sum += row[i] * row[i];
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  const float inv = rsqrtf(partial[0] / static_cast<float>(n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    out[blockIdx.x * n + i] = w[i] * (row[i] * inv);
  }
}

absl::Status Check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(std::string(what) + ": " + cudaGetErrorString(err));
}

}  // namespace

absl::Status RmsNormHost(const float* x, const float* weight, int64_t rows, int64_t n, float eps,
                         float* out) {
  if (DeviceCount() == 0) return absl::UnavailableError(DescribeDevice());
  const size_t bytes = static_cast<size_t>(rows * n) * sizeof(float);
  float *dx = nullptr, *dw = nullptr, *dout = nullptr;
  absl::Status status = Check(cudaMalloc(&dx, bytes), "cudaMalloc");
  if (status.ok()) status = Check(cudaMalloc(&dw, n * sizeof(float)), "cudaMalloc");
  if (status.ok()) status = Check(cudaMalloc(&dout, bytes), "cudaMalloc");
  if (status.ok()) status = Check(cudaMemcpy(dx, x, bytes, cudaMemcpyHostToDevice), "copy x");
  if (status.ok()) {
    status = Check(cudaMemcpy(dw, weight, n * sizeof(float), cudaMemcpyHostToDevice), "copy w");
  }
  if (status.ok()) {
    constexpr int kThreads = 256;
    RmsNormKernel<<<static_cast<unsigned>(rows), kThreads, kThreads * sizeof(float)>>>(dx, dw, n,
                                                                                       eps, dout);
    status = Check(cudaGetLastError(), "RmsNormKernel launch");
  }
  if (status.ok()) status = Check(cudaMemcpy(out, dout, bytes, cudaMemcpyDeviceToHost), "copy out");
  cudaFree(dx);
  cudaFree(dw);
  cudaFree(dout);
  return status;
}

}  // namespace pdserve::cuda
