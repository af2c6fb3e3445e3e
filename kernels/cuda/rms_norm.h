// Launcher for the CUDA RMSNorm kernel; its CPU twin is kernels::RmsNorm (kernels/cpu/ops.h) and
// rms_norm_test.cc compares the two on a GPU.
#ifndef PDSERVE_KERNELS_CUDA_RMS_NORM_H_
#define PDSERVE_KERNELS_CUDA_RMS_NORM_H_

#include <cstdint>

#include "absl/status/status.h"

namespace pdserve::cuda {

// Host-to-host convenience entry: copies x [rows][n] and weight [n] to device 0, normalises each
// row, copies the result to out. Unavailable when there is no GPU; Internal on a CUDA error.
absl::Status RmsNormHost(const float* x, const float* weight, int64_t rows, int64_t n, float eps,
                         float* out);

}  // namespace pdserve::cuda

#endif  // PDSERVE_KERNELS_CUDA_RMS_NORM_H_
