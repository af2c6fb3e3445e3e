// TEST INFRASTRUCTURE (see shared_memory_pool_device.h).
#include "common/transport/shared_memory_pool_device.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <mutex>

#include "absl/container/flat_hash_map.h"
#include "common/base/strings.h"
#include "kernels/cuda/page_hash.h"

namespace pdserve {
namespace {

// Which fd backs a pool this process allocated.
std::mutex& PoolsMu() {
  static std::mutex mu;
  return mu;
}
absl::flat_hash_map<const uint8_t*, int>& Pools() {
  static auto* pools = new absl::flat_hash_map<const uint8_t*, int>();
  return *pools;
}

class SharedMemoryPoolDevice : public PoolDevice {
 public:
  explicit SharedMemoryPoolDevice(std::string identity) : identity_(std::move(identity)) {}
  std::string identity() const override { return identity_; }
  absl::StatusOr<std::string> Export(uint8_t* base, size_t) override {
    std::lock_guard<std::mutex> lock(PoolsMu());
    auto it = Pools().find(base);
    if (it == Pools().end()) {
      return absl::InvalidArgumentError("shared-memory device: the pool was not made by AllocateSharedPool");
    }
    return Str(::getpid(), ":", it->second);
  }
  absl::StatusOr<uint8_t*> Open(const std::string& handle, size_t bytes) override {
    const size_t colon = handle.find(':');
    if (colon == std::string::npos) return absl::InvalidArgumentError(Str("bad handle '", handle, "'"));
    const std::string path = Str("/proc/", handle.substr(0, colon), "/fd/", handle.substr(colon + 1));
    const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) return absl::UnavailableError(Str("cannot open the peer's pool ", path, ": ", std::strerror(errno)));
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (p == MAP_FAILED) return absl::UnavailableError("cannot map the peer's pool");
    return static_cast<uint8_t*>(p);
  }
  void Close(uint8_t* mapped, size_t bytes) override {
    if (mapped != nullptr) ::munmap(mapped, bytes);
  }
  absl::Status CopyAsync(uint8_t* dst, const uint8_t* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
  absl::Status CopyToHost(uint8_t* host, const uint8_t* device, size_t bytes) override {
    std::memcpy(host, device, bytes);
    return absl::OkStatus();
  }
  absl::Status CopyFromHost(uint8_t* device, const uint8_t* host, size_t bytes) override {
    std::memcpy(device, host, bytes);
    return absl::OkStatus();
  }
  absl::Status Synchronize() override { return absl::OkStatus(); }
  absl::Status PinHost(void*, size_t) override { return absl::OkStatus(); }  // Host memory already.
  void UnpinHost(void*) override {}
  absl::Status FlipByteForTesting(uint8_t* p) override {
    *p ^= 0x5a;
    return absl::OkStatus();
  }
  absl::Status HashPages(const std::vector<std::pair<const uint8_t*, uint64_t>>& pages,
                         std::vector<uint64_t>* hashes) override {
    hashes->clear();
    for (const auto& [p, n] : pages) hashes->push_back(cuda::PageHashHost(p, n));
    return absl::OkStatus();
  }

 private:
  std::string identity_;
};

}  // namespace

SharedPool::~SharedPool() {
  if (data != nullptr) {
    std::lock_guard<std::mutex> lock(PoolsMu());
    Pools().erase(data);
    ::munmap(data, bytes);
  }
  if (fd >= 0) ::close(fd);
}

absl::StatusOr<std::unique_ptr<SharedPool>> AllocateSharedPool(size_t bytes) {
  auto pool = std::make_unique<SharedPool>();
  pool->fd = ::memfd_create("pdserve-test-pool", MFD_CLOEXEC);
  if (pool->fd < 0 || ::ftruncate(pool->fd, static_cast<off_t>(bytes)) != 0) {
    return absl::ResourceExhaustedError("memfd for a shared test pool");
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, pool->fd, 0);
  if (p == MAP_FAILED) return absl::ResourceExhaustedError("mmap of a shared test pool");
  pool->data = static_cast<uint8_t*>(p);
  pool->bytes = bytes;
  std::lock_guard<std::mutex> lock(PoolsMu());
  Pools()[pool->data] = pool->fd;
  return pool;
}

std::unique_ptr<PoolDevice> CreateSharedMemoryPoolDevice(const std::string& identity_suffix) {
  return std::make_unique<SharedMemoryPoolDevice>("host-shm:" + identity_suffix);
}

}  // namespace pdserve
