#include "kernels/cuda/cuda_pool_device.h"

#include <cuda_runtime.h>

#include <cstdio>
#include <fstream>
#include <mutex>
#include <cstring>
#include <string>

#include "common/base/hex.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/page_hash_ops.h"

namespace pdserve::cuda {
namespace {

std::string BootId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return id.empty() ? "unknown-host" : id;
}

// cuMemGetAddressRange through the runtime (no link against the driver library): the base and
// size of the allocation holding p; OK when [p, p + bytes) lies inside it.
absl::Status CheckMappedSize(void* p, size_t bytes) {
  using GetRange = int (*)(unsigned long long* base, size_t* size, unsigned long long ptr);
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found;
  if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault,
                                       &found) != cudaSuccess ||
      fn == nullptr) {
    cudaGetLastError();
    return absl::InternalError("cuMemGetAddressRange is not available from the driver");
  }
  unsigned long long base = 0;
  size_t size = 0;
  const auto at = reinterpret_cast<unsigned long long>(p);
  if (reinterpret_cast<GetRange>(fn)(&base, &size, at) != 0) {
    return absl::InternalError("cuMemGetAddressRange failed on the peer's pool");
  }
  if (at < base || at - base > size || bytes > size - (at - base)) {
    return absl::InvalidArgumentError("the peer's pool is " + std::to_string(size) +
                                      " bytes, not the " + std::to_string(bytes) + " it claims");
  }
  return absl::OkStatus();
}

class CudaPoolDevice final : public PoolDevice {
 public:
  ~CudaPoolDevice() override {
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    cudaFree(d_pages_);
    cudaFree(d_bytes_);
    cudaFree(d_hashes_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  absl::Status Init(int device) {
    if (DeviceCount() == 0) return absl::UnavailableError("cuda_ipc: " + DescribeDevice());
    device_ = device;
    PD_CUDA_RETURN(cudaSetDevice(device), "cudaSetDevice");
    PD_CUDA_RETURN(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    identity_ = "cuda@" + BootId();
    return absl::OkStatus();
  }

  std::string identity() const override { return identity_; }
  absl::StatusOr<std::string> Export(uint8_t* base, size_t) override {
    PD_CUDA_RETURN(cudaSetDevice(device_), "cudaSetDevice");
    cudaIpcMemHandle_t h;
    PD_CUDA_RETURN(cudaIpcGetMemHandle(&h, base),
                   "cudaIpcGetMemHandle (cuda_ipc needs the KV pool in GPU memory: --device cuda)");
    return HexOf(h);
  }
  absl::StatusOr<uint8_t*> Open(const std::string& handle, size_t bytes) override {
    PD_CUDA_RETURN(cudaSetDevice(device_), "cudaSetDevice");
    cudaIpcMemHandle_t h;
    if (!FromHex(handle, &h)) return absl::InvalidArgumentError("malformed CUDA IPC handle");
    void* p = nullptr;
    PD_CUDA_RETURN(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess),
                   "cudaIpcOpenMemHandle (is the peer on this host?)");
    // The peer says how big its pool is; copies trust that bound, so check it against the
    // allocation the handle opened (a larger claim would let page references read past it).
    if (absl::Status s = CheckMappedSize(p, bytes); !s.ok()) {
      cudaIpcCloseMemHandle(p);
      return s;
    }
    return static_cast<uint8_t*>(p);
  }
  void Close(uint8_t* mapped, size_t) override {
    if (mapped != nullptr) cudaIpcCloseMemHandle(mapped);
  }
  absl::Status CopyAsync(uint8_t* dst, const uint8_t* src, size_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    PD_CUDA_RETURN(cudaSetDevice(device_), "cudaSetDevice");
    return CudaStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_),
                      "cudaMemcpyAsync (KV page)");
  }
  absl::Status CopyToHost(uint8_t* host, const uint8_t* device, size_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    PD_CUDA_RETURN(cudaSetDevice(device_), "cudaSetDevice");
    return CudaStatus(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream_),
                      "cudaMemcpyAsync (KV page to host)");
  }
  absl::Status CopyFromHost(uint8_t* device, const uint8_t* host, size_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    PD_CUDA_RETURN(cudaSetDevice(device_), "cudaSetDevice");
    return CudaStatus(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, stream_),
                      "cudaMemcpyAsync (KV page from host)");
  }
  absl::Status Synchronize() override {
    std::lock_guard<std::mutex> lock(mu_);
    return CudaStatus(cudaStreamSynchronize(stream_), "KV copies");
  }
  absl::Status PinHost(void* host, size_t bytes) override {
    PD_CUDA_RETURN(cudaSetDevice(device_), "cudaSetDevice");
    return CudaStatus(cudaHostRegister(host, bytes, cudaHostRegisterPortable), "cudaHostRegister");
  }
  void UnpinHost(void* host) override {
    if (cudaHostUnregister(host) != cudaSuccess) cudaGetLastError();
  }
  absl::Status FlipByteForTesting(uint8_t* p) override {
    std::lock_guard<std::mutex> lock(mu_);
    uint8_t b = 0;
    PD_CUDA_RETURN(cudaMemcpy(&b, p, 1, cudaMemcpyDeviceToHost), "fault injection");
    b ^= 0x5a;
    return CudaStatus(cudaMemcpy(p, &b, 1, cudaMemcpyHostToDevice), "fault injection");
  }
  absl::Status HashPages(const std::vector<std::pair<const uint8_t*, uint64_t>>& pages,
                         std::vector<uint64_t>* hashes) override {
    std::lock_guard<std::mutex> lock(mu_);
    PD_CUDA_RETURN(cudaSetDevice(device_), "cudaSetDevice");
    const size_t n = pages.size();
    hashes->assign(n, 0);
    if (n == 0) return CudaStatus(cudaStreamSynchronize(stream_), "KV copies");
    if (n > capacity_) {
      cudaFree(d_pages_);
      cudaFree(d_bytes_);
      cudaFree(d_hashes_);
      d_pages_ = nullptr;
      d_bytes_ = d_hashes_ = nullptr;
      PD_CUDA_RETURN(cudaMalloc(&d_pages_, n * sizeof(void*)), "page hash buffers");
      PD_CUDA_RETURN(cudaMalloc(&d_bytes_, n * sizeof(uint64_t)), "page hash buffers");
      PD_CUDA_RETURN(cudaMalloc(&d_hashes_, n * sizeof(uint64_t)), "page hash buffers");
      capacity_ = n;
    }
    std::vector<const uint8_t*> ptrs(n);
    std::vector<uint64_t> sizes(n);
    for (size_t i = 0; i < n; ++i) {
      ptrs[i] = pages[i].first;
      sizes[i] = pages[i].second;
    }
    PD_CUDA_RETURN(cudaMemcpyAsync(d_pages_, ptrs.data(), n * sizeof(void*), cudaMemcpyHostToDevice, stream_), "hash args");
    PD_CUDA_RETURN(cudaMemcpyAsync(d_bytes_, sizes.data(), n * sizeof(uint64_t), cudaMemcpyHostToDevice, stream_), "hash args");
    if (absl::Status s = LaunchPageHash(d_pages_, d_bytes_, d_hashes_, static_cast<int>(n), stream_); !s.ok()) {
      return s;
    }
    PD_CUDA_RETURN(cudaMemcpyAsync(hashes->data(), d_hashes_, n * sizeof(uint64_t), cudaMemcpyDeviceToHost, stream_), "hashes");
    return CudaStatus(cudaStreamSynchronize(stream_), "page hashes");
  }

 private:
  int device_ = 0;
  std::string identity_;
  cudaStream_t stream_ = nullptr;
  std::mutex mu_;  // The stream and the hash buffers: receivers' threads share them.
  const uint8_t** d_pages_ = nullptr;
  uint64_t* d_bytes_ = nullptr;
  uint64_t* d_hashes_ = nullptr;
  size_t capacity_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<PoolDevice>> CreateCudaPoolDevice(int device) {
  auto d = std::make_unique<CudaPoolDevice>();
  if (absl::Status s = d->Init(device); !s.ok()) return s;
  return std::unique_ptr<PoolDevice>(std::move(d));
}

}  // namespace pdserve::cuda
