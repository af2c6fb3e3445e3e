// One KV page transfer through real KvTransports (a sender and a receiver in this process), timed
// from the receiver's Expect to its kDone, the bytes checked: bench-transport and profile.
#ifndef PDSERVE_CLI_KV_TRANSFER_TIMING_H_
#define PDSERVE_CLI_KV_TRANSFER_TIMING_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "common/transport/kv_transport.h"

namespace pdserve::cli {

struct KvTransferRun {
  double seconds = 0;
  int64_t bytes = 0;
  int64_t pages = 0;
};

// Moves `bytes` of pages from `sender`'s pool to `receiver`'s in `pages_per_submit` batches, as
// a prefill worker does per chunk. DataLoss when the receiver's checksum is not the sender's.
absl::StatusOr<KvTransferRun> TimeKvTransfer(KvTransport& sender, KvTransport& receiver,
                                             uint64_t tag, size_t bytes, size_t page_bytes,
                                             size_t pages_per_submit);

}  // namespace pdserve::cli

#endif  // PDSERVE_CLI_KV_TRANSFER_TIMING_H_
