// The `ucx` backend: KV pages by one-sided puts (UCX's ucp_put_nbx) straight into the receiver's
// registered pool, so the receiving CPU does no work per byte. The same code runs over RDMA
// verbs (rc/dc), shared memory on one host (posix/sysv/cma) and TCP, as UCX picks (UCX_TLS and
// UCX_NET_DEVICES pass through).
//
// The endpoint string carries what a sender needs: "ucx:" + hex of {receiver id, pool base and
// size, KV layout, UCX worker address, packed remote key of the whole pool}. One UCX endpoint per
// peer, created on its first transfer and reused.
//
// Protocol per transfer (small active messages beside the puts), tag chosen by the receiver:
//   sender -> BEGIN(tag, its id, its worker address)
//   receiver -> GO(tag, the announced byte ranges) | REFUSE(tag, why)
//   sender: checks every page against those ranges (the remote key covers the whole pool, so an
//           out-of-range copy is refused before it is posted), puts them (contiguous pages in one
//           put; PUTTING tells the receiver to poll meanwhile), -> FLUSHING, flushes the
//           endpoint, then -> DONE(tag, pages, bytes, XXH3-64, page list)
//   receiver: hashes the listed pages in its pool in that order (ReceiveTracker, as tcp) and
//           compares with the summary.
// The receiver can give a transfer up (ReleaseUnfinished): if the sender began and has not
// finished, -> CANCEL(tag); the sender drops what it has not posted, flushes, -> CANCELLED(tag);
// only then (or when the sender's endpoint fails) are the blocks reported quiescent. A sender
// aborting flushes first and -> ABORT(tag). A lost peer fails its transfers on both sides
// (error-handling mode PEER; UCX's keepalive finds a dead process).
//
// Threads: every UCX call runs on the transport's own progress thread; the public methods queue
// commands for it. Stalled transfers are failed after send_timeout_ms on the sender (its endpoint
// is then closed, which the receiver sees as a lost peer).
#ifndef PDSERVE_COMMON_TRANSPORT_UCX_TRANSPORT_H_
#define PDSERVE_COMMON_TRANSPORT_UCX_TRANSPORT_H_

#include <memory>

#include "absl/status/statusor.h"
#include "common/transport/kv_transport.h"

namespace pdserve {

absl::StatusOr<std::unique_ptr<KvTransport>> CreateUcxKvTransport(const KvTransportOptions& options);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_TRANSPORT_UCX_TRANSPORT_H_
