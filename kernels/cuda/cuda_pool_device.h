// PoolDevice (common/transport/pool_device.h) on a CUDA GPU: pools shared by CUDA IPC handles
// (cudaIpcGetMemHandle of the pool's allocation; opened with peer access where the peer's pool is
// on another GPU of the host), copies by cudaMemcpyAsync on the device's own stream, page hashes
// by a kernel. Identity "cuda@<boot id>": pools pair within one host. Plain C++ header.
#ifndef PDSERVE_KERNELS_CUDA_CUDA_POOL_DEVICE_H_
#define PDSERVE_KERNELS_CUDA_CUDA_POOL_DEVICE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "common/transport/pool_device.h"

namespace pdserve::cuda {

// Unavailable (naming why) without a GPU.
absl::StatusOr<std::unique_ptr<PoolDevice>> CreateCudaPoolDevice(int device = 0);

}  // namespace pdserve::cuda

#endif  // PDSERVE_KERNELS_CUDA_CUDA_POOL_DEVICE_H_
