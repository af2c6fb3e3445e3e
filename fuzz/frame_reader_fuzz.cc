// libFuzzer target: the tcp KV transport's receiving side on arbitrary bytes. Pages may only land
// in the ranges their transfers expect (AddressSanitizer guards the pool's edges).
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/transport/frame_reader.h"
#include "fuzz/memory_source.h"

namespace {

using pdserve::fuzz::MemorySource;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> pool(4096, 0);
  pdserve::ReceiveTracker tracker;
  tracker.SetPool(pool.data(), pool.size());
  (void)tracker.Expect(1, {{0, 1024}});
  (void)tracker.Expect(2, {{2048, 2560}, {3072, 4096}});
  if (size == 0) return 0;
  // The first byte says whether the stream starts with a HELLO, as a connection does.
  const bool with_hello = data[0] & 1;
  MemorySource in(data + 1, size - 1);
  std::atomic<bool> stopping{false};
  if (with_hello && !pdserve::kv_wire::ReadHello(in).ok()) return 0;
  pdserve::kv_wire::ReceiveFrames(in, tracker, 1, stopping);
  // Nothing was written outside the expected ranges.
  for (size_t i = 1024; i < 2048; ++i) {
    if (pool[i] != 0) __builtin_trap();
  }
  for (size_t i = 2560; i < 3072; ++i) {
    if (pool[i] != 0) __builtin_trap();
  }
  tracker.FailSource(1, absl::UnavailableError("end"));
  (void)tracker.Poll(1);
  (void)tracker.Poll(2);
  return 0;
}
