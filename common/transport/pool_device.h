// What a transport that moves KV pages between pools in device memory needs of the device: share
// a pool with another process, copy between pools, and checksum pages where they are. One
// implementation per device: CudaPoolDevice (kernels/cuda/cuda_pool_device.h: CUDA IPC handles,
// cudaMemcpyAsync, a hash kernel) and, as test infrastructure only, SharedMemoryPoolDevice
// (shared_memory_pool_device.h: host shared memory standing in for GPU memory). Plain C++.
#ifndef PDSERVE_COMMON_TRANSPORT_POOL_DEVICE_H_
#define PDSERVE_COMMON_TRANSPORT_POOL_DEVICE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace pdserve {

class PoolDevice {
 public:
  virtual ~PoolDevice() = default;
  // Which memory this is, e.g. "cuda:GPU-8f3c..." (the GPU's UUID): two pools can be paired
  // only on the same kind of device, and IPC only works within one host.
  virtual std::string identity() const = 0;
  // A handle another process can open to reach [base, base + bytes) (a pool registered here).
  virtual absl::StatusOr<std::string> Export(uint8_t* base, size_t bytes) = 0;
  // Maps a peer's exported pool into this process; Close undoes it.
  virtual absl::StatusOr<uint8_t*> Open(const std::string& handle, size_t bytes) = 0;
  virtual void Close(uint8_t* mapped, size_t bytes) = 0;
  // Queues a copy (both pointers in device memory: a pool or a mapped peer pool).
  virtual absl::Status CopyAsync(uint8_t* dst, const uint8_t* src, size_t bytes) = 0;
  // Queues a copy between device memory and host memory (the staging of tcp and ucx transfers
  // of a GPU pool, staging_transport.h).
  virtual absl::Status CopyToHost(uint8_t* host, const uint8_t* device, size_t bytes) = 0;
  virtual absl::Status CopyFromHost(uint8_t* device, const uint8_t* host, size_t bytes) = 0;
  // Waits for the queued copies.
  virtual absl::Status Synchronize() = 0;
  // Pins host memory [host, host + bytes) so copies to and from it run at the bus's speed (the
  // host KV tier's slots, the tiers' staging buffers); UnpinHost undoes it. A device that reads
  // host memory directly pins nothing.
  virtual absl::Status PinHost(void* host, size_t bytes) = 0;
  virtual void UnpinHost(void* host) = 0;
  // Tests only (fault injection): flips a byte at p, which is in device memory.
  virtual absl::Status FlipByteForTesting(uint8_t* p) = 0;
  // Waits for the queued copies, then hashes each (pointer, bytes) page (kernels/cuda/page_hash.h)
  // into `hashes`, in order.
  virtual absl::Status HashPages(const std::vector<std::pair<const uint8_t*, uint64_t>>& pages,
                                 std::vector<uint64_t>* hashes) = 0;
};

// The PoolDevice of `device`'s pools: "cuda" (GPU 0; Unavailable without a GPU, InvalidArgument
// in a build without CUDA); InvalidArgument for "cpu" (host pools need none) and other names.
// Defined with the transports (transport_registry.cc).
absl::StatusOr<std::unique_ptr<PoolDevice>> CreatePoolDevice(std::string_view device);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_TRANSPORT_POOL_DEVICE_H_
