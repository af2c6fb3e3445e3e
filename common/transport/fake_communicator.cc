// TEST INFRASTRUCTURE (see fake_communicator.h).
#include "common/transport/fake_communicator.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>

#include "absl/container/flat_hash_map.h"
#include "common/base/strings.h"

namespace pdserve {
namespace {

struct Pair {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::vector<uint8_t>> to[2];  // Messages for rank r.
  bool gone[2] = {false, false};
};

std::mutex& RegistryMu() {
  static std::mutex mu;
  return mu;
}
absl::flat_hash_map<std::string, std::shared_ptr<Pair>>& Registry() {
  static auto* r = new absl::flat_hash_map<std::string, std::shared_ptr<Pair>>();
  return *r;
}

class FakeCommunicator : public Communicator {
 public:
  FakeCommunicator(std::shared_ptr<Pair> pair, int rank) : pair_(std::move(pair)), rank_(rank) {}
  ~FakeCommunicator() override {
    std::lock_guard<std::mutex> lock(pair_->mu);
    pair_->gone[rank_] = true;
    pair_->cv.notify_all();
  }
  absl::Status Send(const std::vector<std::pair<const uint8_t*, uint64_t>>& pages) override {
    std::lock_guard<std::mutex> lock(pair_->mu);
    for (const auto& [p, n] : pages) pair_->to[1 - rank_].emplace_back(p, p + n);
    pair_->cv.notify_all();
    return absl::OkStatus();
  }
  absl::Status Recv(uint8_t* dst, uint64_t bytes) override {
    pending_.push_back({dst, bytes});
    return absl::OkStatus();
  }
  absl::Status Skip(uint64_t bytes) override { return Recv(nullptr, bytes); }
  absl::Status Wait(int64_t timeout_ms) override {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    std::unique_lock<std::mutex> lock(pair_->mu);
    while (!pending_.empty()) {
      auto& inbox = pair_->to[rank_];
      if (!pair_->cv.wait_until(lock, deadline, [&] { return !inbox.empty() || pair_->gone[1 - rank_]; })) {
        return absl::DeadlineExceededError(
            Str("fake communicator: nothing from the peer for ", timeout_ms, " ms (aborted)"));
      }
      if (inbox.empty()) return absl::UnavailableError("fake communicator: the peer is gone");
      const std::vector<uint8_t> msg = std::move(inbox.front());
      inbox.pop_front();
      const Op op = pending_.front();
      pending_.pop_front();
      if (msg.size() != op.bytes) {
        return absl::InternalError(Str("fake communicator: received ", msg.size(), " bytes for a ",
                                       op.bytes, "-byte receive (on NCCL: a hang or a fault)"));
      }
      if (op.dst != nullptr) std::memcpy(op.dst, msg.data(), msg.size());
    }
    return absl::OkStatus();
  }

 private:
  struct Op {
    uint8_t* dst;
    uint64_t bytes;
  };
  std::shared_ptr<Pair> pair_;
  int rank_;
  std::deque<Op> pending_;
};

class FakeCommunicatorFactory : public CommunicatorFactory {
 public:
  absl::StatusOr<std::string> NewId() override {
    static std::atomic<uint64_t> next{1};
    return Str("fake-", next.fetch_add(1));
  }
  absl::StatusOr<std::unique_ptr<Communicator>> Join(const std::string& id, int rank) override {
    if (rank != 0 && rank != 1) return absl::InvalidArgumentError("rank must be 0 or 1");
    std::lock_guard<std::mutex> lock(RegistryMu());
    std::shared_ptr<Pair>& pair = Registry()[id];
    if (pair == nullptr) pair = std::make_shared<Pair>();
    return std::unique_ptr<Communicator>(new FakeCommunicator(pair, rank));
  }
};

}  // namespace

std::unique_ptr<CommunicatorFactory> CreateFakeCommunicatorFactory() {
  return std::make_unique<FakeCommunicatorFactory>();
}

}  // namespace pdserve
