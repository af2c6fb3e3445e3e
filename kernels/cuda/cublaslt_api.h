// cuBLASLt loaded at run time (dlopen), not linked: its library is 540 MB, and a binary that
// links it pays for loading it at every start, GPU or not (a CPU worker told to stop while it
// starts must find its signal handlers already there). Host code of kernels/cuda only.
#ifndef PDSERVE_KERNELS_CUDA_CUBLASLT_API_H_
#define PDSERVE_KERNELS_CUDA_CUBLASLT_API_H_

#include <cublasLt.h>

#include "absl/status/statusor.h"

namespace pdserve::cuda {

struct CublasLtApi {
  decltype(&cublasLtCreate) Create;
  decltype(&cublasLtDestroy) Destroy;
  decltype(&cublasLtMatmulDescCreate) MatmulDescCreate;
  decltype(&cublasLtMatmulDescDestroy) MatmulDescDestroy;
  decltype(&cublasLtMatmulDescSetAttribute) MatmulDescSetAttribute;
  decltype(&cublasLtMatrixLayoutCreate) MatrixLayoutCreate;
  decltype(&cublasLtMatrixLayoutDestroy) MatrixLayoutDestroy;
  decltype(&cublasLtMatmulPreferenceCreate) MatmulPreferenceCreate;
  decltype(&cublasLtMatmulPreferenceDestroy) MatmulPreferenceDestroy;
  decltype(&cublasLtMatmulPreferenceSetAttribute) MatmulPreferenceSetAttribute;
  decltype(&cublasLtMatmulAlgoGetHeuristic) MatmulAlgoGetHeuristic;
  decltype(&cublasLtMatmul) Matmul;
};

// Loads libcublasLt.so.13 once (thread-safe); Unavailable naming the library when it is missing.
absl::StatusOr<const CublasLtApi*> LoadCublasLt();

}  // namespace pdserve::cuda

#endif  // PDSERVE_KERNELS_CUDA_CUBLASLT_API_H_
