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

// Returns the Status of a failed CUDA call from the enclosing function.
#define PD_CUDA_RETURN(call, what)                                                   \
  do {                                                                               \
    if (absl::Status pd_cuda_status = ::pdserve::cuda::CudaStatus((call), (what));   \
        !pd_cuda_status.ok()) {                                                      \
      return pd_cuda_status;                                                         \
    }                                                                                \
  } while (0)

#endif  // PDSERVE_KERNELS_CUDA_CUDA_CHECK_H_
