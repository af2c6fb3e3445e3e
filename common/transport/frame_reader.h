// The tcp KV transport's wire format and its receiving side, apart from sockets so that it can
// be tested and fuzzed on bytes in memory.
//
// A connection starts with HELLO (the sender's KV layout string), answered by the receiver; then
// frames: PAGE (tag, destination offset, bytes follow), END (tag; pages, bytes and XXH3-64 of the
// payload follow), ABORT (tag). Every header is checked; a page goes only into the byte ranges
// its transfer expects (ReceiveTracker), otherwise its payload is skipped and the transfer fails.
#ifndef PDSERVE_COMMON_TRANSPORT_FRAME_READER_H_
#define PDSERVE_COMMON_TRANSPORT_FRAME_READER_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/transport/receive_tracker.h"

namespace pdserve::kv_wire {

constexpr uint32_t kMagic = 0x564b4450;  // "PDKV"
enum FrameType : uint32_t { kHello = 1, kPage = 2, kEnd = 3, kAbort = 4 };

struct FrameHeader {
  uint32_t magic;
  uint32_t type;
  uint64_t tag;
  uint64_t offset;
  uint64_t length;
};
static_assert(sizeof(FrameHeader) == 32);

// A hello's layout and a page are both bounded; anything larger is a broken peer.
constexpr uint64_t kMaxHello = 1 << 16;
constexpr uint64_t kMaxPage = 1ull << 30;

// Where frames come from. Read fills exactly `len` bytes or returns false (end, error).
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  virtual bool Read(void* buf, size_t len) = 0;
  // Discards `len` bytes.
  bool Skip(uint64_t len);
};

// Reads the HELLO frame: the sender's layout string. InvalidArgument for a malformed frame.
absl::StatusOr<std::string> ReadHello(ByteSource& in);

// Applies frames to `tracker` until the stream ends, is malformed, or `stopping` is set. The
// caller then fails what `source` was feeding (ReceiveTracker::FailSource).
void ReceiveFrames(ByteSource& in, ReceiveTracker& tracker, uint64_t source,
                   const std::atomic<bool>& stopping);

}  // namespace pdserve::kv_wire

#endif  // PDSERVE_COMMON_TRANSPORT_FRAME_READER_H_
