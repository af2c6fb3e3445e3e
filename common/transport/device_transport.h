// KV pages between pools in GPU memory (backends "cuda_ipc" and "nccl"): a control connection per
// sender and receiver pair carries where each page goes; a DeviceDataPath moves the bytes
// (device_data_path.h: the receiver pulling through CUDA IPC, or a NCCL communicator of the pair).
//
// The sender connects with a HELLO (layout, device identity, what its data path needs: an IPC
// handle of its pool, a NCCL unique id); a layout or device that differs is refused, naming both.
// Per page a PAGE_REF (tag, destination offset, bytes, source offset): the receiver checks the
// destination against the tag's announced ranges (ReceiveTracker) and the source against the
// sender's pool, then receives the page into its block, or discards it (its transfer fails).
// END carries the sender's pages, bytes and checksum; the receiver waits for its pages, hashes
// what it received where it is (page_hash.h), compares, and answers ACK; only then does the
// sender's Finish report done, so its blocks stay valid until the receiver holds the bytes. The
// receiver makes every write into its pool itself, so a transfer it gave up (lease, cancel) is
// never written afterwards: nothing is quarantined, as with tcp. The checksum is XXH3-64 over the
// pages' 8-byte device hashes, in submission order.
#ifndef PDSERVE_COMMON_TRANSPORT_DEVICE_TRANSPORT_H_
#define PDSERVE_COMMON_TRANSPORT_DEVICE_TRANSPORT_H_

#include <memory>
#include <string>

#include "common/transport/device_data_path.h"
#include "common/transport/kv_transport.h"

namespace pdserve {

// `name`: the backend's name and the endpoint's scheme ("cuda_ipc", "nccl"). Listens on
// options.listen_address for control connections.
absl::StatusOr<std::unique_ptr<KvTransport>> CreateDeviceKvTransport(
    const KvTransportOptions& options, std::unique_ptr<DeviceDataPath> path, const std::string& name);

namespace kv_wire {
class ByteSource;
}
// Fuzzing and tests: `transport` (made by CreateDeviceKvTransport) serves one control connection
// whose bytes come from `in` as a receiver, its answers dropped.
void ServeDeviceControlStreamForTesting(KvTransport* transport, kv_wire::ByteSource& in);

}  // namespace pdserve

#endif  // PDSERVE_COMMON_TRANSPORT_DEVICE_TRANSPORT_H_
