#include "common/transport/frame_reader.h"

#include <algorithm>

#include "common/base/strings.h"

namespace pdserve::kv_wire {

bool ByteSource::Skip(uint64_t len) {
  uint8_t scratch[1 << 16];
  while (len > 0) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(len, sizeof(scratch)));
    if (!Read(scratch, chunk)) return false;
    len -= chunk;
  }
  return true;
}

absl::StatusOr<std::string> ReadHello(ByteSource& in) {
  FrameHeader h;
  if (!in.Read(&h, sizeof(h))) return absl::InvalidArgumentError("connection closed before HELLO");
  if (h.magic != kMagic || h.type != kHello || h.length > kMaxHello) {
    return absl::InvalidArgumentError("malformed HELLO frame");
  }
  std::string layout(h.length, '\0');
  if (!in.Read(layout.data(), layout.size())) {
    return absl::InvalidArgumentError("connection closed inside HELLO");
  }
  return layout;
}

void ReceiveFrames(ByteSource& in, ReceiveTracker& tracker, uint64_t source,
                   const std::atomic<bool>& stopping) {
  FrameHeader h;
  while (!stopping.load()) {
    if (!in.Read(&h, sizeof(h)) || h.magic != kMagic) return;
    if (h.type == kPage) {
      if (h.length > kMaxPage) return;
      auto where = tracker.PageDestination(h.tag, h.offset, h.length, source);
      if (!where.ok()) {
        if (!in.Skip(h.length)) return;
        continue;
      }
      if (!in.Read(*where, h.length)) return;
      tracker.PageArrived(h.tag, *where, h.length);
    } else if (h.type == kEnd) {
      uint64_t v[3];
      if (h.length != sizeof(v) || !in.Read(v, sizeof(v))) return;
      tracker.Finish(h.tag, TransferStats{static_cast<int64_t>(v[0]), static_cast<int64_t>(v[1]), v[2]});
    } else if (h.type == kAbort) {
      if (h.length != 0) return;
      tracker.Fail(h.tag, absl::AbortedError(Str("transfer ", h.tag, " aborted by sender")));
    } else {
      return;
    }
  }
}

}  // namespace pdserve::kv_wire
