// libFuzzer target: the receiving side of the device transports' control connection (cuda_ipc,
// nccl) on arbitrary bytes: the HELLO, page references, END and ABORT frames. The data path here
// copies from a host buffer of the size the sender claims (capped), so AddressSanitizer guards
// both the receiver's pool and the sender's: a reference may only be honoured inside the ranges
// its transfer expects and inside the sender's pool.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "common/transport/device_transport.h"
#include "common/transport/frame_reader.h"
#include "fuzz/memory_source.h"
#include "common/transport/shared_memory_pool_device.h"

namespace pdserve {
namespace {

using fuzz::MemorySource;

class BufferReceiver : public ReceiverLink {
 public:
  explicit BufferReceiver(uint64_t bytes) : peer_(bytes, 0x5a) {}
  absl::Status Receive(uint8_t* dst, uint64_t src, uint64_t bytes) override {
    if (bytes > 0) std::memcpy(dst, peer_.data() + src, bytes);
    return absl::OkStatus();
  }
  absl::Status Discard(uint64_t, uint64_t) override { return absl::OkStatus(); }
  absl::Status Wait() override { return absl::OkStatus(); }

 private:
  std::vector<uint8_t> peer_;
};

class BufferDataPath : public DeviceDataPath {
 public:
  BufferDataPath() : device_(CreateSharedMemoryPoolDevice("0")) {}
  PoolDevice& device() override { return *device_; }
  absl::Status Register(uint8_t*, size_t) override { return absl::OkStatus(); }
  absl::StatusOr<std::unique_ptr<SenderLink>> NewSender() override {
    return absl::UnimplementedError("receiver only");
  }
  absl::StatusOr<std::unique_ptr<ReceiverLink>> NewReceiver(const std::string&,
                                                            uint64_t peer_bytes) override {
    if (peer_bytes > (1u << 20)) return absl::InvalidArgumentError("too big for the fuzzer");
    return std::make_unique<BufferReceiver>(peer_bytes);
  }

 private:
  std::unique_ptr<PoolDevice> device_;
};

constexpr size_t kPool = 16384;

}  // namespace
}  // namespace pdserve

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pdserve;
  static std::vector<uint8_t>* pool = new std::vector<uint8_t>(kPool);
  static KvTransport* transport = [] {
    KvTransportOptions o;
    o.layout = "kv_dtype=bf16";  // A HELLO must carry this layout and the identity host-shm:0.
    auto t = CreateDeviceKvTransport(o, std::make_unique<BufferDataPath>(), "cuda_ipc");
    if (!t.ok() || !(*t)->RegisterPool(pool->data(), pool->size()).ok()) std::abort();
    return t->release();
  }();
  (void)transport->Expect(1, {{0, 4096}});
  (void)transport->Expect(2, {{8192, 9000}, {12000, kPool}});
  MemorySource in(data, size);
  ServeDeviceControlStreamForTesting(transport, in);
  transport->Release(1);
  transport->Release(2);
  return 0;
}
