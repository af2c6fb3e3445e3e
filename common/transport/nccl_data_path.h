// DeviceDataPath "nccl": a communicator per sender/receiver pair (its id travels in the HELLO);
// after the references of a batch of pages the sender sends them as one group, the receiver
// receives each checked page into its block and skips refused ones, so both stay in step.
// Waits are bounded by the transport's timeout, after which the communicator is aborted: a lost
// peer is an error, never a hang.
#ifndef PDSERVE_COMMON_TRANSPORT_NCCL_DATA_PATH_H_
#define PDSERVE_COMMON_TRANSPORT_NCCL_DATA_PATH_H_

#include <memory>

#include "common/transport/communicator.h"
#include "common/transport/device_data_path.h"

namespace pdserve {

std::unique_ptr<DeviceDataPath> CreateNcclDataPath(std::unique_ptr<PoolDevice> device,
                                                   std::unique_ptr<CommunicatorFactory> comms,
                                                   int64_t timeout_ms);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_TRANSPORT_NCCL_DATA_PATH_H_
