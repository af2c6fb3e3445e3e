// The `tcp` backend: the default across hosts. One persistent connection per peer, opened on the
// first transfer with a handshake that compares KV layouts. Each page travels as a small header
// followed by its bytes, which the sender writes straight from its pool (writev, no staging copy)
// and the receiver reads straight into the destination block of its pool (no intermediate copy of
// the payload). Per-transfer integrity: page count, byte count and XXH3-64 of the payload.
//
// Wire format, little-endian: header {u32 magic "PDKV", u32 type, u64 tag, u64 offset,
// u64 length}; HELLO (payload: layout) answered by {u32 status, u32 length, message}; PAGE
// (payload: the page); END (payload: u64 pages, u64 bytes, u64 checksum); ABORT.
#ifndef PDSERVE_COMMON_TRANSPORT_TCP_TRANSPORT_H_
#define PDSERVE_COMMON_TRANSPORT_TCP_TRANSPORT_H_

#include <memory>

#include "absl/status/statusor.h"
#include "common/transport/kv_transport.h"

namespace pdserve {

// Binds and listens on options.listen_address; Unavailable if it cannot.
absl::StatusOr<std::unique_ptr<KvTransport>> CreateTcpKvTransport(
    const KvTransportOptions& options);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_TRANSPORT_TCP_TRANSPORT_H_
