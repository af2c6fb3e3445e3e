// Moving KV pages between workers' pools. One interface, one implementation per backend, picked
// by name (CreateKvTransport); this header names no backend.
//
// Every worker registers its own KV pool once: it is where peers' pages land (receiver side) and
// where pages to send are read from (sender side). A transfer is identified by a tag chosen by the
// receiver. The receiver announces it (Expect, with the byte ranges the sender may write), the
// sender submits page copies in order and then finishes; the finish carries the page count, byte
// count and an XXH3-64 checksum of the payload, which the receiver compares with what arrived.
// Pages outside the announced ranges, unknown tags, a checksum mismatch, an abort or a lost peer
// fail the transfer; the receiver sees it through Poll and frees its blocks.
//
// Thread-safety: all methods are thread-safe. Finish's callback runs on a transport thread.
#ifndef PDSERVE_COMMON_TRANSPORT_KV_TRANSPORT_H_
#define PDSERVE_COMMON_TRANSPORT_KV_TRANSPORT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace pdserve {

struct PageCopy {
  uint64_t src_offset = 0;  // In the sender's registered pool.
  uint64_t dst_offset = 0;  // In the receiver's registered pool.
  uint64_t bytes = 0;
};

struct ByteRange {
  uint64_t begin = 0;
  uint64_t end = 0;
};

struct TransferStats {
  int64_t pages = 0;
  int64_t bytes = 0;
  uint64_t checksum = 0;  // XXH3-64 over the payload, pages in submission order.
};

enum class TransferState { kPending, kDone, kFailed };

struct TransferPoll {
  TransferState state = TransferState::kPending;
  TransferStats stats;   // What arrived so far (all of it when kDone).
  absl::Status status;   // Why, when kFailed.
};

// PEM files for mutual TLS (all three, or none) on tcp's connections and on the control
// connections of cuda_ipc and nccl (their pages move over CUDA IPC / NCCL, outside TLS).
struct KvTransportTls {
  std::string cert, key, ca;
};

struct KvTransportOptions {
  // Where the receiver listens (tcp: "host:port", port 0 picks one). Unused by `local`.
  std::string listen_address = "127.0.0.1:0";
  // The host peers connect to (tcp). Empty: the listen host, or this machine's hostname when it
  // listens on every interface. Behind NAT or in a Kubernetes pod (whose hostname other pods
  // cannot resolve) set it to an address peers can reach, such as the pod IP.
  std::string advertise_host;
  // The worker's KV layout as "key=value;..." (KvLayout fields). Peers with a different layout
  // are refused at the handshake with a message naming the first differing key.
  std::string layout;
  KvTransportTls tls;  // tcp, cuda_ipc, nccl: mutual TLS when tls.ca is set.
  // tcp: a peer that accepts nothing (or does not answer the handshake) for this long is given up
  // and its transfers fail, so a hung host cannot pin the sender's blocks.
  int64_t send_timeout_ms = 30000;
  // Where the registered pool lives: "cpu" (host memory) or "cuda" (GPU memory: local, cuda_ipc
  // and nccl move such pages device to device; tcp and ucx stage them through host memory,
  // staging_transport.h).
  std::string device = "cpu";
};

class KvTransport {
 public:
  virtual ~KvTransport() = default;
  virtual std::string_view name() const = 0;

  // The local pool: destination of received pages and source of sent ones. Call once, first.
  virtual absl::Status RegisterPool(uint8_t* base, size_t bytes) = 0;
  // How peers reach this transport ("tcp://host:port", "local://N").
  virtual std::string endpoint() const = 0;

  // Receiver side.
  // Announces transfer `tag`; pages may only land inside `allowed` (byte ranges of the pool).
  virtual absl::Status Expect(uint64_t tag, std::vector<ByteRange> allowed) = 0;
  virtual TransferPoll Poll(uint64_t tag) = 0;
  // Forgets `tag` (done, failed or abandoned); later pages for it are dropped.
  virtual void Release(uint64_t tag) = 0;
  // Forgets `tag` of a transfer that did not complete (lease expired, cancelled, failed).
  // Returns true when no write for it can land in the pool any more: always for transports whose
  // receiver does every write itself (tcp, local). A one-sided transport (ucx: the sender puts
  // straight into the pool) returns false while the sender may still have writes in flight, and
  // calls `quiesced` later, from one of its threads, once the sender acknowledged, finished or is
  // gone; until then the tag's destination blocks must stay owned (quarantined), never reused.
  virtual bool ReleaseUnfinished(uint64_t tag, std::function<void()> quiesced) {
    (void)quiesced;
    Release(tag);
    return true;
  }
  // A line for logs and the ready line: the endpoint, or what a backend picked (ucx: its
  // transports).
  virtual std::string description() const { return endpoint(); }

  // Sender side.
  // Queues page copies to `peer` (an endpoint string); they are sent in order, asynchronously,
  // straight from the registered pool, which must not change until Finish's callback.
  virtual absl::Status Submit(const std::string& peer, uint64_t tag,
                              absl::Span<const PageCopy> pages) = 0;
  // After the submitted pages, sends the end of `tag`; `done` gets what was sent, or why not.
  virtual void Finish(const std::string& peer, uint64_t tag,
                      std::function<void(absl::StatusOr<TransferStats>)> done) = 0;
  // Tells the receiver to fail `tag` (best effort).
  virtual void Abort(const std::string& peer, uint64_t tag) = 0;
};

// Where `backend`'s pages travel for a pool on `pool_device`: "cpu" (host memory) for tcp and ucx
// (staged when the pool is on a GPU), the pool's device otherwise. Workers whose pages travel on
// the same kind of device can pair (the KV layout's `device`): a CPU worker and a CUDA worker
// over tcp, but not over cuda_ipc.
std::string_view KvPagesDevice(std::string_view backend, std::string_view pool_device);

// "local" (same process), "tcp", or "ucx" (when built with PDSERVE_UCX). InvalidArgument for
// another name.
absl::StatusOr<std::unique_ptr<KvTransport>> CreateKvTransport(std::string_view backend,
                                                               const KvTransportOptions& options);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_TRANSPORT_KV_TRANSPORT_H_
