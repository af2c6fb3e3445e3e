// cudaError_t to absl::Status for the launchers (host code of .cu files and CUDA-side .cc files).
#ifndef PDSERVE_KERNELS_CUDA_CUDA_CHECK_H_
#define PDSERVE_KERNELS_CUDA_CUDA_CHECK_H_

#include <cuda_runtime.h>

#include <string>

#include "absl/status/status.h"

namespace pdserve::cuda {

inline absl::Status CudaStatus(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(std::string(what) + ": " + cudaGetErrorString(err));
}

// After a launch: the launch's own error (bad configuration, too much shared memory).
inline absl::Status LaunchStatus(const char* kernel) {
  return CudaStatus(cudaGetLastError(), kernel);
}

}  // namespace pdserve::cuda

#endif  // PDSERVE_KERNELS_CUDA_CUDA_CHECK_H_
