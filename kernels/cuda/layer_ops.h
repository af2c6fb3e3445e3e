// Launchers of the row-wise layer kernels (layer_kernels.h) on a CUDA stream. Plain C++: the
// params hold device pointers; `stream` is a cudaStream_t (nullptr: the legacy default stream).
// Each returns the launch's error as Internal; the kernels' errors surface at the next sync.
#ifndef PDSERVE_KERNELS_CUDA_LAYER_OPS_H_
#define PDSERVE_KERNELS_CUDA_LAYER_OPS_H_

#include "absl/status/status.h"
#include "kernels/cuda/kernel_params.h"

namespace pdserve::cuda {

absl::Status LaunchEmbedding(const EmbeddingParams& p, void* stream);
absl::Status LaunchAddRmsNorm(const AddRmsNormParams& p, void* stream);
// InvalidArgument for a shape the kernel does not take (kernel_checks.h).
absl::Status LaunchQkvRopeStore(const QkvRopeStoreParams& p, void* stream);
absl::Status LaunchSiluMul(const SiluMulParams& p, void* stream);
absl::Status LaunchFill(const FillParams& p, void* stream);

}  // namespace pdserve::cuda

#endif  // PDSERVE_KERNELS_CUDA_LAYER_OPS_H_
