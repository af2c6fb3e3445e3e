#include "common/transport/nccl_data_path.h"

#include "common/base/status_macros.h"

namespace pdserve {
namespace {

class NcclSender : public SenderLink {
 public:
  NcclSender(CommunicatorFactory* comms, std::string id, int64_t timeout_ms)
      : comms_(comms), id_(std::move(id)), timeout_ms_(timeout_ms) {}
  std::string hello() const override { return id_; }
  absl::Status Start() override {
    PD_ASSIGN_OR_RETURN(comm_, comms_->Join(id_, 0));
    return absl::OkStatus();
  }
  absl::Status Send(const PageSpans& pages) override { return comm_->Send(pages); }
  ~NcclSender() override {
    if (comm_ != nullptr) (void)comm_->Wait(timeout_ms_);  // Sends still queued read the pool.
  }

 private:
  CommunicatorFactory* comms_;
  std::string id_;
  int64_t timeout_ms_;
  std::unique_ptr<Communicator> comm_;
};

class NcclReceiver : public ReceiverLink {
 public:
  NcclReceiver(std::unique_ptr<Communicator> comm, int64_t timeout_ms)
      : comm_(std::move(comm)), timeout_ms_(timeout_ms) {}
  absl::Status Receive(uint8_t* dst, uint64_t, uint64_t bytes) override {
    return comm_->Recv(dst, bytes);
  }
  absl::Status Discard(uint64_t, uint64_t bytes) override { return comm_->Skip(bytes); }
  absl::Status Wait() override { return comm_->Wait(timeout_ms_); }

 private:
  std::unique_ptr<Communicator> comm_;
  int64_t timeout_ms_;
};

class NcclDataPath : public DeviceDataPath {
 public:
  NcclDataPath(std::unique_ptr<PoolDevice> device, std::unique_ptr<CommunicatorFactory> comms,
               int64_t timeout_ms)
      : device_(std::move(device)), comms_(std::move(comms)), timeout_ms_(timeout_ms) {}
  PoolDevice& device() override { return *device_; }
  absl::Status Register(uint8_t*, size_t) override { return absl::OkStatus(); }
  absl::StatusOr<std::unique_ptr<SenderLink>> NewSender() override {
    PD_ASSIGN_OR_RETURN(std::string id, comms_->NewId());
    return std::make_unique<NcclSender>(comms_.get(), std::move(id), timeout_ms_);
  }
  absl::StatusOr<std::unique_ptr<ReceiverLink>> NewReceiver(const std::string& hello,
                                                            uint64_t) override {
    PD_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> comm, comms_->Join(hello, 1));
    return std::make_unique<NcclReceiver>(std::move(comm), timeout_ms_);
  }

 private:
  std::unique_ptr<PoolDevice> device_;
  std::unique_ptr<CommunicatorFactory> comms_;
  int64_t timeout_ms_;
};

}  // namespace

std::unique_ptr<DeviceDataPath> CreateNcclDataPath(std::unique_ptr<PoolDevice> device,
                                                   std::unique_ptr<CommunicatorFactory> comms,
                                                   int64_t timeout_ms) {
  return std::make_unique<NcclDataPath>(std::move(device), std::move(comms), timeout_ms);
}

}  // namespace pdserve
