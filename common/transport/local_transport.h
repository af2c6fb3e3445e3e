// The `local` backend: both workers in one process (`pdserve serve`, tests). Submit copies pages
// straight into the peer's pool with memcpy, or, for pools in device memory, through the
// PoolDevice (GPU to GPU, checksummed on the device as cuda_ipc does); endpoints are "local://N"
// in a process-wide registry.
#ifndef PDSERVE_COMMON_TRANSPORT_LOCAL_TRANSPORT_H_
#define PDSERVE_COMMON_TRANSPORT_LOCAL_TRANSPORT_H_

#include <memory>

#include "common/transport/kv_transport.h"
#include "common/transport/pool_device.h"

namespace pdserve {

// `device`: null for host pools.
std::unique_ptr<KvTransport> CreateLocalKvTransport(const KvTransportOptions& options,
                                                    std::unique_ptr<PoolDevice> device = nullptr);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_TRANSPORT_LOCAL_TRANSPORT_H_
