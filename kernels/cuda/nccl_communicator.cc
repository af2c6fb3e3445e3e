#include "kernels/cuda/nccl_communicator.h"

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "common/base/hex.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_device.h"

namespace pdserve::cuda {
namespace {

struct NcclApi {
  decltype(&ncclGetUniqueId) GetUniqueId;
  decltype(&ncclCommInitRankConfig) CommInitRankConfig;
  decltype(&ncclCommGetAsyncError) CommGetAsyncError;
  decltype(&ncclCommAbort) CommAbort;
  decltype(&ncclCommDestroy) CommDestroy;
  decltype(&ncclGroupStart) GroupStart;
  decltype(&ncclGroupEnd) GroupEnd;
  decltype(&ncclSend) Send;
  decltype(&ncclRecv) Recv;
  decltype(&ncclGetErrorString) GetErrorString;
};

absl::StatusOr<const NcclApi*> LoadNccl() {
  static const absl::StatusOr<NcclApi>* api = [] {
    void* lib = ::dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* err = ::dlerror();
      return new absl::StatusOr<NcclApi>(absl::UnavailableError(
          std::string("cannot load NCCL (libnccl.so.2, the libnccl2 package): ") + (err ? err : "?")));
    }
    NcclApi a;
    bool ok = true;
    auto get = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(lib, name));
      ok = ok && fn != nullptr;
    };
    get(a.GetUniqueId, "ncclGetUniqueId");
    get(a.CommInitRankConfig, "ncclCommInitRankConfig");
    get(a.CommGetAsyncError, "ncclCommGetAsyncError");
    get(a.CommAbort, "ncclCommAbort");
    get(a.CommDestroy, "ncclCommDestroy");
    get(a.GroupStart, "ncclGroupStart");
    get(a.GroupEnd, "ncclGroupEnd");
    get(a.Send, "ncclSend");
    get(a.Recv, "ncclRecv");
    get(a.GetErrorString, "ncclGetErrorString");
    if (!ok) return new absl::StatusOr<NcclApi>(absl::UnavailableError("libnccl.so.2 lacks a function pdserve calls"));
    return new absl::StatusOr<NcclApi>(a);
  }();
  if (!api->ok()) return api->status();
  return &**api;
}

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(const NcclApi* api, int device, int rank, int64_t init_timeout_ms)
      : api_(api), device_(device), peer_(1 - rank), init_timeout_ms_(init_timeout_ms) {}
  ~NcclCommunicator() override {
    cudaSetDevice(device_);
    if (comm_ != nullptr) {
      if (broken_ || !Wait(1000).ok()) {
        api_->CommAbort(comm_);
      } else {
        api_->CommDestroy(comm_);
      }
    }
    if (scratch_ != nullptr) cudaFree(scratch_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  absl::Status Init(const ncclUniqueId& id, int rank) {
    PD_CUDA_RETURN(cudaSetDevice(device_), "cudaSetDevice");
    PD_CUDA_RETURN(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // Every call returns; we poll with deadlines and abort.
    const ncclResult_t r = api_->CommInitRankConfig(&comm_, 2, id, rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) return Error(r, "ncclCommInitRankConfig");
    return absl::OkStatus();
  }

  absl::Status Send(const std::vector<std::pair<const uint8_t*, uint64_t>>& pages) override {
    if (absl::Status s = Ready(); !s.ok()) return s;
    api_->GroupStart();
    for (const auto& [p, n] : pages) api_->Send(p, n, ncclUint8, peer_, comm_, stream_);
    return Settle(api_->GroupEnd(), "ncclSend group");
  }
  absl::Status Recv(uint8_t* dst, uint64_t bytes) override {
    if (absl::Status s = Ready(); !s.ok()) return s;
    return Settle(api_->Recv(dst, bytes, ncclUint8, peer_, comm_, stream_), "ncclRecv");
  }
  absl::Status Skip(uint64_t bytes) override {
    if (bytes > scratch_bytes_) {
      if (scratch_ != nullptr) {
        PD_CUDA_RETURN(cudaStreamSynchronize(stream_), "before growing the scratch");  // In use.
        cudaFree(scratch_);
        scratch_ = nullptr;
      }
      PD_CUDA_RETURN(cudaMalloc(&scratch_, bytes), "NCCL scratch for refused pages");
      scratch_bytes_ = bytes;
    }
    return Recv(static_cast<uint8_t*>(scratch_), bytes);
  }
  absl::Status Wait(int64_t timeout_ms) override {
    if (broken_) return absl::UnavailableError("NCCL communicator aborted earlier");
    cudaSetDevice(device_);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) return absl::OkStatus();
      if (q != cudaErrorNotReady) return Abort(CudaStatus(q, "NCCL stream"));
      ncclResult_t async = ncclSuccess;
      api_->CommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) return Abort(Error(async, "NCCL"));
      if (std::chrono::steady_clock::now() > deadline) {
        return Abort(absl::DeadlineExceededError(
            "NCCL: the peer took nothing for " + std::to_string(timeout_ms) + " ms (lost?)"));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

 private:
  absl::Status Error(ncclResult_t r, const char* what) const {
    return absl::InternalError(std::string(what) + ": " + api_->GetErrorString(r));
  }
  absl::Status Abort(absl::Status why) {
    broken_ = true;
    api_->CommAbort(comm_);
    comm_ = nullptr;
    return why;
  }
  // Until the communicator is set up (both ranks joined), bounded by init_timeout_ms.
  absl::Status Ready() {
    if (broken_ || comm_ == nullptr) return absl::UnavailableError("NCCL communicator aborted");
    cudaSetDevice(device_);
    if (ready_) return absl::OkStatus();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(init_timeout_ms_);
    for (;;) {
      ncclResult_t state = ncclInProgress;
      api_->CommGetAsyncError(comm_, &state);
      if (state == ncclSuccess) {
        ready_ = true;
        return absl::OkStatus();
      }
      if (state != ncclInProgress) return Abort(Error(state, "NCCL communicator set-up"));
      if (std::chrono::steady_clock::now() > deadline) {
        return Abort(absl::DeadlineExceededError("NCCL communicator set-up timed out (the peer never joined)"));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  // A non-blocking call may return ncclInProgress: poll until it is enqueued.
  absl::Status Settle(ncclResult_t r, const char* what) {
    while (r == ncclInProgress) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      api_->CommGetAsyncError(comm_, &r);
    }
    if (r != ncclSuccess) return Abort(Error(r, what));
    return absl::OkStatus();
  }

  const NcclApi* api_;
  int device_;
  int peer_;
  int64_t init_timeout_ms_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  bool ready_ = false;
  bool broken_ = false;
  void* scratch_ = nullptr;
  uint64_t scratch_bytes_ = 0;
};

class NcclCommunicatorFactory : public CommunicatorFactory {
 public:
  NcclCommunicatorFactory(const NcclApi* api, int device, int64_t init_timeout_ms)
      : api_(api), device_(device), init_timeout_ms_(init_timeout_ms) {}
  absl::StatusOr<std::string> NewId() override {
    ncclUniqueId id;
    const ncclResult_t r = api_->GetUniqueId(&id);
    if (r != ncclSuccess) return absl::InternalError(std::string("ncclGetUniqueId: ") + api_->GetErrorString(r));
    return HexOf(id);
  }
  absl::StatusOr<std::unique_ptr<Communicator>> Join(const std::string& id_text, int rank) override {
    ncclUniqueId id;
    if (!FromHex(id_text, &id)) return absl::InvalidArgumentError("malformed NCCL unique id");
    auto comm = std::make_unique<NcclCommunicator>(api_, device_, rank, init_timeout_ms_);
    if (absl::Status s = comm->Init(id, rank); !s.ok()) return s;
    return std::unique_ptr<Communicator>(std::move(comm));
  }

 private:
  const NcclApi* api_;
  int device_;
  int64_t init_timeout_ms_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<CommunicatorFactory>> CreateNcclCommunicatorFactory(
    int device, int64_t init_timeout_ms) {
  if (DeviceCount() == 0) return absl::UnavailableError("nccl: " + DescribeDevice());
  auto api = LoadNccl();
  if (!api.ok()) return api.status();
  return std::unique_ptr<CommunicatorFactory>(
      std::make_unique<NcclCommunicatorFactory>(*api, device, init_timeout_ms));
}

}  // namespace pdserve::cuda
