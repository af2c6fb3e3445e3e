// A point-to-point channel between the two ranks of one sender/receiver pair, as NCCL gives one
// (kernels/cuda/nccl_communicator.h), for the nccl data path. Ops are queued in order and match
// the peer's in order (the i-th Send with the i-th Recv or Skip); Wait tells when all queued ops
// are done or why they never will be. Plain C++; one implementation per library, and a fake in
// the tests (fake_communicator.h).
#ifndef PDSERVE_COMMON_TRANSPORT_COMMUNICATOR_H_
#define PDSERVE_COMMON_TRANSPORT_COMMUNICATOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace pdserve {

class Communicator {
 public:
  virtual ~Communicator() = default;
  // Queues the pages, in order, to the other rank (one group).
  virtual absl::Status Send(const std::vector<std::pair<const uint8_t*, uint64_t>>& pages) = 0;
  virtual absl::Status Recv(uint8_t* dst, uint64_t bytes) = 0;
  // Receives `bytes` that must not land anywhere (a refused page).
  virtual absl::Status Skip(uint64_t bytes) = 0;
  // Until every queued op is done. After `timeout_ms` without that, or when the peer is lost,
  // the communicator is aborted and an error returned: it never hangs.
  virtual absl::Status Wait(int64_t timeout_ms) = 0;
};

class CommunicatorFactory {
 public:
  virtual ~CommunicatorFactory() = default;
  // A new pair's id (an ncclUniqueId, as text), made by the sender.
  virtual absl::StatusOr<std::string> NewId() = 0;
  // Joins pair `id` as rank 0 (sender) or 1 (receiver). May return before the other rank joined.
  virtual absl::StatusOr<std::unique_ptr<Communicator>> Join(const std::string& id, int rank) = 0;
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_TRANSPORT_COMMUNICATOR_H_
