// How the device-pool transport (device_transport.h) moves a page's bytes once its control
// connection said where they go. One implementation per way:
//   IPC  (ipc_data_path.h):  the sender's pool is opened by the receiver (CUDA IPC), which
//                            copies each page itself (cuda_ipc);
//   NCCL (nccl_data_path.h): the sender sends each page over a communicator of the pair, the
//                            receiver receives it into the reserved block (nccl).
// Both checksum pages where they are (PoolDevice::HashPages).
#ifndef PDSERVE_COMMON_TRANSPORT_DEVICE_DATA_PATH_H_
#define PDSERVE_COMMON_TRANSPORT_DEVICE_DATA_PATH_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/transport/pool_device.h"

namespace pdserve {

using PageSpans = std::vector<std::pair<const uint8_t*, uint64_t>>;

// The sender's side of one control connection.
class SenderLink {
 public:
  virtual ~SenderLink() = default;
  // What the HELLO carries for the receiver (after the layout and device identity).
  virtual std::string hello() const = 0;
  // The receiver accepted the HELLO.
  virtual absl::Status Start() = 0;
  // The references of `pages` (in the sender's pool) went out, in this order.
  virtual absl::Status Send(const PageSpans& pages) = 0;
};

// The receiver's side of one control connection.
class ReceiverLink {
 public:
  virtual ~ReceiverLink() = default;
  // A checked page: its bytes go to dst (in the receiver's pool).
  virtual absl::Status Receive(uint8_t* dst, uint64_t src_offset, uint64_t bytes) = 0;
  // A refused page: its bytes must not land, but may still be on their way (nccl).
  virtual absl::Status Discard(uint64_t src_offset, uint64_t bytes) = 0;
  // Until every Receive and Discard so far is done; an error if it cannot be (a lost peer).
  virtual absl::Status Wait() = 0;
};

class DeviceDataPath {
 public:
  virtual ~DeviceDataPath() = default;
  virtual PoolDevice& device() = 0;
  // The local pool, once.
  virtual absl::Status Register(uint8_t* base, size_t bytes) = 0;
  virtual absl::StatusOr<std::unique_ptr<SenderLink>> NewSender() = 0;
  // For a sender's HELLO; `peer_pool_bytes`: the size of the sender's pool.
  virtual absl::StatusOr<std::unique_ptr<ReceiverLink>> NewReceiver(const std::string& hello,
                                                                    uint64_t peer_pool_bytes) = 0;
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_TRANSPORT_DEVICE_DATA_PATH_H_
