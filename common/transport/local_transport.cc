#include "common/transport/local_transport.h"

#include <atomic>
#include <cstring>
#include <mutex>

#include "absl/container/flat_hash_map.h"
#include "common/base/status_macros.h"
#include "common/base/strings.h"
#include "common/transport/layout_check.h"
#include "common/transport/receive_tracker.h"

namespace pdserve {
namespace {

class LocalKvTransport;

// Endpoint -> live transport. Transports unregister in their destructor.
struct Registry {
  std::mutex mu;
  absl::flat_hash_map<std::string, LocalKvTransport*> by_endpoint;
  std::atomic<int64_t> next{1};
};
Registry& GetRegistry() {
  static Registry* r = new Registry();
  return *r;
}

class LocalKvTransport : public KvTransport {
 public:
  LocalKvTransport(const KvTransportOptions& options, std::unique_ptr<PoolDevice> device)
      : layout_(options.layout), device_(std::move(device)) {
    Registry& r = GetRegistry();
    endpoint_ = Str("local://", r.next.fetch_add(1));
    std::lock_guard<std::mutex> lock(r.mu);
    r.by_endpoint[endpoint_] = this;
  }
  ~LocalKvTransport() override {
    Registry& r = GetRegistry();
    std::lock_guard<std::mutex> lock(r.mu);
    r.by_endpoint.erase(endpoint_);
  }

  std::string_view name() const override { return "local"; }
  absl::Status RegisterPool(uint8_t* base, size_t bytes) override {
    tracker_.SetPool(base, bytes);
    return absl::OkStatus();
  }
  std::string endpoint() const override { return endpoint_; }
  absl::Status Expect(uint64_t tag, std::vector<ByteRange> allowed) override {
    return tracker_.Expect(tag, std::move(allowed));
  }
  TransferPoll Poll(uint64_t tag) override { return tracker_.Poll(tag); }
  void Release(uint64_t tag) override { tracker_.Release(tag); }

  absl::Status Submit(const std::string& peer, uint64_t tag,
                      absl::Span<const PageCopy> pages) override {
    // The registry lock keeps the peer alive while we copy into it.
    Registry& r = GetRegistry();
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.by_endpoint.find(peer);
    if (it == r.by_endpoint.end()) {
      return absl::UnavailableError(Str("KV transport peer ", peer, " is not in this process"));
    }
    LocalKvTransport* dst = it->second;
    if (absl::Status s = CheckLayouts(layout_, dst->layout_); !s.ok()) return s;
    for (const PageCopy& p : pages) {
      if (p.src_offset > tracker_.pool_bytes() || p.bytes > tracker_.pool_bytes() - p.src_offset) {
        return absl::OutOfRangeError(Str("page at ", p.src_offset, " is outside the local pool"));
      }
    }
    if (device_ != nullptr) return SubmitOnDevice(dst, tag, pages);
    for (const PageCopy& p : pages) {
      const uint8_t* src = tracker_.pool() + p.src_offset;
      {
        std::lock_guard<std::mutex> slock(send_mu_);
        sent_[tag].pages += 1;
        sent_[tag].bytes += static_cast<int64_t>(p.bytes);
        hashes_[tag].Update(src, p.bytes);
      }
      auto where = dst->tracker_.PageDestination(tag, p.dst_offset, p.bytes, /*source=*/1);
      if (!where.ok()) continue;  // The receiver has failed the transfer; keep the tally.
      std::memcpy(*where, src, p.bytes);
      if (ShouldCorruptNextPage()) (*where)[p.bytes / 2] ^= 0x5a;
      dst->tracker_.PageArrived(tag, *where, p.bytes);
    }
    return absl::OkStatus();
  }

  void Finish(const std::string& peer, uint64_t tag,
              std::function<void(absl::StatusOr<TransferStats>)> done) override {
    TransferStats stats;
    {
      std::lock_guard<std::mutex> slock(send_mu_);
      stats = sent_[tag];
      stats.checksum = hashes_[tag].Digest();
      sent_.erase(tag);
      hashes_.erase(tag);
    }
    {
      Registry& r = GetRegistry();
      std::lock_guard<std::mutex> lock(r.mu);
      auto it = r.by_endpoint.find(peer);
      if (it == r.by_endpoint.end()) {
        done(absl::UnavailableError(Str("KV transport peer ", peer, " went away")));
        return;
      }
      it->second->tracker_.Finish(tag, stats);
    }
    done(stats);
  }

  void Abort(const std::string& peer, uint64_t tag) override {
    {
      std::lock_guard<std::mutex> slock(send_mu_);
      sent_.erase(tag);
      hashes_.erase(tag);
    }
    Registry& r = GetRegistry();
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.by_endpoint.find(peer);
    if (it != r.by_endpoint.end()) {
      it->second->tracker_.Fail(tag, absl::AbortedError(Str("transfer ", tag, " aborted by sender")));
    }
  }

 private:
  // Device pools: copies on the device, then both sides' page hashes computed there (the
  // checksum runs over the 8-byte hashes, as cuda_ipc's). Called with the registry lock held.
  absl::Status SubmitOnDevice(LocalKvTransport* dst, uint64_t tag, absl::Span<const PageCopy> pages) {
    std::vector<std::pair<const uint8_t*, uint64_t>> sent, arrived;
    std::vector<uint8_t*> corrupt;  // Fault injection (tests).
    for (const PageCopy& p : pages) {
      const uint8_t* src = tracker_.pool() + p.src_offset;
      sent.emplace_back(src, p.bytes);
      auto where = dst->tracker_.PageDestination(tag, p.dst_offset, p.bytes, /*source=*/1);
      if (!where.ok()) continue;
      PD_RETURN_IF_ERROR(device_->CopyAsync(*where, src, p.bytes));
      if (ShouldCorruptNextPage()) corrupt.push_back(*where + p.bytes / 2);
      arrived.emplace_back(*where, p.bytes);
    }
    PD_RETURN_IF_ERROR(device_->Synchronize());
    for (uint8_t* at : corrupt) PD_RETURN_IF_ERROR(device_->FlipByteForTesting(at));
    std::vector<uint64_t> sent_hashes, arrived_hashes;
    PD_RETURN_IF_ERROR(device_->HashPages(sent, &sent_hashes));
    PD_RETURN_IF_ERROR(device_->HashPages(arrived, &arrived_hashes));
    {
      std::lock_guard<std::mutex> slock(send_mu_);
      for (size_t i = 0; i < sent.size(); ++i) {
        sent_[tag].pages += 1;
        sent_[tag].bytes += static_cast<int64_t>(sent[i].second);
        hashes_[tag].Update(reinterpret_cast<const uint8_t*>(&sent_hashes[i]), sizeof(uint64_t));
      }
    }
    for (size_t i = 0; i < arrived.size(); ++i) {
      dst->tracker_.PageArrivedHashed(tag, arrived_hashes[i], arrived[i].second);
    }
    return absl::OkStatus();
  }

  std::string layout_;
  std::unique_ptr<PoolDevice> device_;
  std::string endpoint_;
  ReceiveTracker tracker_;
  std::mutex send_mu_;
  absl::flat_hash_map<uint64_t, TransferStats> sent_;
  absl::flat_hash_map<uint64_t, PayloadHash> hashes_;
};

}  // namespace

std::unique_ptr<KvTransport> CreateLocalKvTransport(const KvTransportOptions& options,
                                                    std::unique_ptr<PoolDevice> device) {
  return std::make_unique<LocalKvTransport>(options, std::move(device));
}

}  // namespace pdserve
