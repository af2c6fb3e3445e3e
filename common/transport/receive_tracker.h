// Receiver-side bookkeeping shared by the transport backends: which tags are expected, where
// their pages may land, what arrived (count, bytes, running checksum) and how each ended.
// Thread-safe.
#ifndef PDSERVE_COMMON_TRANSPORT_RECEIVE_TRACKER_H_
#define PDSERVE_COMMON_TRANSPORT_RECEIVE_TRACKER_H_

#include <mutex>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/transport/kv_transport.h"
#include "common/transport/payload_hash.h"

namespace pdserve {

// Whether [offset, offset + len) lies inside one of `allowed` (no overflow).
bool RangesContain(const std::vector<ByteRange>& allowed, uint64_t offset, uint64_t len);

class ReceiveTracker {
 public:
  void SetPool(uint8_t* base, size_t bytes);
  uint8_t* pool() const { return base_; }
  size_t pool_bytes() const { return bytes_; }

  absl::Status Expect(uint64_t tag, std::vector<ByteRange> allowed);
  // Where a page of `len` bytes for `tag` at `offset` goes, or why it may not (the transfer is
  // then failed; the caller drops the payload).
  absl::StatusOr<uint8_t*> PageDestination(uint64_t tag, uint64_t offset, uint64_t len,
                                           uint64_t source);
  // The page's bytes are in place: count and hash them.
  void PageArrived(uint64_t tag, const uint8_t* data, uint64_t len);
  // The same for a page whose bytes were hashed where they are (device memory, page_hash.h): the
  // payload checksum then runs over the pages' 8-byte hashes, as the sender's does.
  void PageArrivedHashed(uint64_t tag, uint64_t page_hash, uint64_t len);
  // The sender's end marker: compare its summary with what arrived.
  void Finish(uint64_t tag, const TransferStats& sent);
  void Fail(uint64_t tag, const absl::Status& why);
  // Fails every unfinished transfer that `source` (a connection) was feeding.
  void FailSource(uint64_t source, const absl::Status& why);
  TransferPoll Poll(uint64_t tag);
  // The ranges announced for `tag` (empty if unknown): what a one-sided sender may write.
  std::vector<ByteRange> Allowed(uint64_t tag);
  void Release(uint64_t tag);

 private:
  struct Transfer {
    std::vector<ByteRange> allowed;
    TransferPoll poll;
    PayloadHash hash;
    uint64_t source = 0;  // 0 until the first page.
  };
  std::mutex mu_;
  uint8_t* base_ = nullptr;
  size_t bytes_ = 0;
  absl::flat_hash_map<uint64_t, std::unique_ptr<Transfer>> transfers_;
};

// Test-only fault injection: PDSERVE_FAULT_CORRUPT_KV_PAGE=N makes this process's senders flip
// one byte of the N-th page they send (1-based), after its checksum was taken, so a receiver's
// integrity check can be shown to work. Returns true (once) for that page.
bool ShouldCorruptNextPage();
// Tests: corrupt the n-th page sent from now on (0: none), whatever the environment said.
void SetCorruptKvPageForTesting(int64_t n);
// Test-only fault injection: PDSERVE_FAULT_STALL_KV_PAGE=N:MS makes this process's senders wait
// MS milliseconds before sending the N-th page (1-based): a transfer that stalls. Returns the
// wait for the next page (0 for all but that one).
int64_t StallBeforeNextPageMs();
// Tests: stall `ms` milliseconds before the n-th page sent from now on (0: none).
void SetStallKvPageForTesting(int64_t n, int64_t ms);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_TRANSPORT_RECEIVE_TRACKER_H_
