// TEST INFRASTRUCTURE, never in the pdserve binary: a PoolDevice whose "device memory" is host
// shared memory (memfd), standing in for GPU memory so the device-pool transports' logic (the
// cuda_ipc control protocol, range checks, checksums, failures) is tested on machines without a
// GPU. Export gives "pid:fd", Open maps /proc/pid/fd/fd; copies are memcpy; page hashes are the
// host twin of the device kernel (kernels/cuda/page_hash.h).
#ifndef PDSERVE_COMMON_TRANSPORT_SHARED_MEMORY_POOL_DEVICE_H_
#define PDSERVE_COMMON_TRANSPORT_SHARED_MEMORY_POOL_DEVICE_H_

#include <memory>
#include <string>

#include "common/transport/pool_device.h"

namespace pdserve {

// A pool of `bytes` that SharedMemoryPoolDevice can export (mapped shared, zeroed).
struct SharedPool {
  ~SharedPool();
  uint8_t* data = nullptr;
  size_t bytes = 0;
  int fd = -1;
};
absl::StatusOr<std::unique_ptr<SharedPool>> AllocateSharedPool(size_t bytes);

// identity: "host-shm:" + `identity_suffix` (tests make two devices differ with it).
std::unique_ptr<PoolDevice> CreateSharedMemoryPoolDevice(const std::string& identity_suffix = "0");

}  // namespace pdserve

#endif  // PDSERVE_COMMON_TRANSPORT_SHARED_MEMORY_POOL_DEVICE_H_
