// What a KV transfer is judged against, measured in the same run: a plain loopback TCP stream
// (one writer thread, one reader thread, large writes, no framing or checksums) and memcpy.
#ifndef PDSERVE_BENCH_LINK_LIMITS_H_
#define PDSERVE_BENCH_LINK_LIMITS_H_

#include <cstddef>

#include "absl/status/statusor.h"

namespace pdserve::bench {

// Bytes/s of streaming `bytes` over a 127.0.0.1 TCP connection in `chunk`-byte writes into a
// reader that drains it. Best of `repeats`.
absl::StatusOr<double> LoopbackStreamBandwidth(size_t bytes, size_t chunk, int repeats);

// Bytes/s of one-thread memcpy of `bytes` (source and destination warmed). Best of `repeats`.
double MemcpyBandwidth(size_t bytes, int repeats);

}  // namespace pdserve::bench

#endif  // PDSERVE_BENCH_LINK_LIMITS_H_
