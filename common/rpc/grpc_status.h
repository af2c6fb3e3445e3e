// The one place absl::Status becomes grpc::Status and back (STYLE.md, habit 1).
#ifndef PDSERVE_COMMON_RPC_GRPC_STATUS_H_
#define PDSERVE_COMMON_RPC_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace pdserve {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_RPC_GRPC_STATUS_H_
