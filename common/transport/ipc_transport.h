// KV pages between pools in device memory of one host, pulled by the receiver (backend
// "cuda_ipc" over CudaPoolDevice: CUDA IPC handles and cudaMemcpyAsync).
//
// Each sender exports its pool once, in the HELLO of its control connection to a receiver
// (layout, device identity, pool handle and size; a layout or device that differs is refused,
// naming both). Then per page a PAGE_REF (tag, destination offset, bytes, source offset): the
// receiver checks the destination against the tag's announced ranges (ReceiveTracker) and the
// source against the sender's pool, and queues the copy from the mapped sender pool into its
// own. END carries the sender's pages, bytes and checksum; the receiver waits for its copies,
// hashes the pages it received where they are (page_hash.h), compares, and answers ACK; only
// then does the sender's Finish report done, so its blocks stay valid until the receiver holds
// the bytes. The receiver makes every write into its pool itself, so a transfer it gives up
// (lease, cancel) cannot be written to afterwards: nothing is quarantined, as with tcp.
// The checksum is XXH3-64 over the pages' 8-byte device hashes, in submission order.
#ifndef PDSERVE_COMMON_TRANSPORT_IPC_TRANSPORT_H_
#define PDSERVE_COMMON_TRANSPORT_IPC_TRANSPORT_H_

#include <memory>
#include <string>

#include "common/transport/kv_transport.h"
#include "common/transport/pool_device.h"

namespace pdserve {

// `name`: the backend's name and the endpoint's scheme ("cuda_ipc"). Listens on
// options.listen_address for control connections.
absl::StatusOr<std::unique_ptr<KvTransport>> CreateIpcKvTransport(
    const KvTransportOptions& options, std::unique_ptr<PoolDevice> device, const std::string& name);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_TRANSPORT_IPC_TRANSPORT_H_
