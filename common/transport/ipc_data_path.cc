#include "common/transport/ipc_data_path.h"

#include "common/base/status_macros.h"

namespace pdserve {
namespace {

class IpcSender : public SenderLink {
 public:
  explicit IpcSender(std::string handle) : handle_(std::move(handle)) {}
  std::string hello() const override { return handle_; }
  absl::Status Start() override { return absl::OkStatus(); }
  absl::Status Send(const PageSpans&) override { return absl::OkStatus(); }  // The receiver pulls.

 private:
  std::string handle_;
};

class IpcReceiver : public ReceiverLink {
 public:
  IpcReceiver(PoolDevice* device, uint8_t* peer_pool, uint64_t peer_bytes)
      : device_(device), peer_pool_(peer_pool), peer_bytes_(peer_bytes) {}
  ~IpcReceiver() override {
    (void)device_->Synchronize();  // No copy may still read the mapping.
    device_->Close(peer_pool_, peer_bytes_);
  }
  absl::Status Receive(uint8_t* dst, uint64_t src_offset, uint64_t bytes) override {
    return device_->CopyAsync(dst, peer_pool_ + src_offset, bytes);
  }
  absl::Status Discard(uint64_t, uint64_t) override { return absl::OkStatus(); }
  absl::Status Wait() override { return device_->Synchronize(); }

 private:
  PoolDevice* device_;
  uint8_t* peer_pool_;
  uint64_t peer_bytes_;
};

class IpcDataPath : public DeviceDataPath {
 public:
  explicit IpcDataPath(std::unique_ptr<PoolDevice> device) : device_(std::move(device)) {}
  PoolDevice& device() override { return *device_; }
  absl::Status Register(uint8_t* base, size_t bytes) override {
    PD_ASSIGN_OR_RETURN(handle_, device_->Export(base, bytes));
    return absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<SenderLink>> NewSender() override {
    return std::make_unique<IpcSender>(handle_);
  }
  absl::StatusOr<std::unique_ptr<ReceiverLink>> NewReceiver(const std::string& hello,
                                                            uint64_t peer_pool_bytes) override {
    PD_ASSIGN_OR_RETURN(uint8_t * mapped, device_->Open(hello, peer_pool_bytes));
    return std::make_unique<IpcReceiver>(device_.get(), mapped, peer_pool_bytes);
  }

 private:
  std::unique_ptr<PoolDevice> device_;
  std::string handle_;
};

}  // namespace

std::unique_ptr<DeviceDataPath> CreateIpcDataPath(std::unique_ptr<PoolDevice> device) {
  return std::make_unique<IpcDataPath>(std::move(device));
}

}  // namespace pdserve
