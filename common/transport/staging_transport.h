// tcp and ucx for a KV pool in GPU memory: pages staged through host memory. The wrapped (inner)
// transport moves pages between host pools; this keeps a host mirror of the GPU pool (address
// space only, MAP_NORESERVE: it costs RAM only for pages in flight, handed back after each
// transfer) and copies through the PoolDevice: the sender's pages GPU -> mirror before the inner
// transport sends them, the receiver's mirror -> GPU once the inner transport has them all and
// their checksum held, before Poll reports the transfer done. So a worker with --device cuda can
// pair with any host-memory peer over tcp (a CPU worker, or a GPU worker on a host that NCCL and
// CUDA IPC cannot reach), at the cost of two extra copies over PCIe.
#ifndef PDSERVE_COMMON_TRANSPORT_STAGING_TRANSPORT_H_
#define PDSERVE_COMMON_TRANSPORT_STAGING_TRANSPORT_H_

#include <memory>

#include "common/transport/kv_transport.h"
#include "common/transport/pool_device.h"

namespace pdserve {

// `inner` was created for a host pool; `device` is where the pool registered here lives.
std::unique_ptr<KvTransport> CreateStagingKvTransport(std::unique_ptr<KvTransport> inner,
                                                      std::unique_ptr<PoolDevice> device);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_TRANSPORT_STAGING_TRANSPORT_H_
