// DeviceDataPath "cuda_ipc": the sender exports its pool once (PoolDevice::Export: a CUDA IPC
// handle), each receiver opens it and copies every checked page itself, GPU to GPU.
#ifndef PDSERVE_COMMON_TRANSPORT_IPC_DATA_PATH_H_
#define PDSERVE_COMMON_TRANSPORT_IPC_DATA_PATH_H_

#include <memory>

#include "common/transport/device_data_path.h"

namespace pdserve {

std::unique_ptr<DeviceDataPath> CreateIpcDataPath(std::unique_ptr<PoolDevice> device);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_TRANSPORT_IPC_DATA_PATH_H_
