// Communicator (common/transport/communicator.h) over NCCL: a two-rank, non-blocking
// communicator per sender/receiver pair (ncclCommInitRankConfig with blocking = 0), point-to-point
// ncclSend/ncclRecv on its own stream, every wait polled against a deadline and answered by
// ncclCommAbort when it passes or NCCL reports an error. libnccl.so.2 (218 MB) is loaded with
// dlopen at first use, like cuBLASLt. Plain C++ header.
#ifndef PDSERVE_KERNELS_CUDA_NCCL_COMMUNICATOR_H_
#define PDSERVE_KERNELS_CUDA_NCCL_COMMUNICATOR_H_

#include <memory>

#include "absl/status/statusor.h"
#include "common/transport/communicator.h"

namespace pdserve::cuda {

// Unavailable (naming why) without a GPU or without NCCL. `init_timeout_ms` bounds the
// communicators' set-up (both ranks must join).
absl::StatusOr<std::unique_ptr<CommunicatorFactory>> CreateNcclCommunicatorFactory(
    int device = 0, int64_t init_timeout_ms = 30000);

}  // namespace pdserve::cuda

#endif  // PDSERVE_KERNELS_CUDA_NCCL_COMMUNICATOR_H_
