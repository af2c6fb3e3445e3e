// Work-arounds for the gRPC release Debian 12 ships (1.51).
#ifndef PDSERVE_COMMON_RPC_GRPC_WORKAROUNDS_H_
#define PDSERVE_COMMON_RPC_GRPC_WORKAROUNDS_H_

namespace pdserve {

// gRPC 1.51 runs the callback API on a shared "alternative" completion queue with its own
// threads, reference-counted by the servers and channels using it. When the count falls to zero
// while another user appears (a test's server going away as the next one starts, a process
// tearing down) its threads free the queue twice (AddressSanitizer: double free in
// grpc_cq_internal_unref). Holding one reference for the process's lifetime keeps the queue from
// ever being torn down. Idempotent and cheap; called before any server or channel is made.
void PinGrpcCallbackQueue();

// Protobuf prints parse complaints (e.g. a string field that is not UTF-8 in a message a client
// crafted) straight to stderr: one line per bad request, for anyone to trigger. Route them to our
// log at debug level (fatal ones at error). Idempotent.
void RouteProtobufLogs();

}  // namespace pdserve

#endif  // PDSERVE_COMMON_RPC_GRPC_WORKAROUNDS_H_
