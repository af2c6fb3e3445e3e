#include "common/transport/staging_transport.h"

#include <sys/mman.h>
#include <unistd.h>

#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/base/status_macros.h"
#include "common/base/strings.h"

namespace pdserve {
namespace {

class StagingKvTransport : public KvTransport {
 public:
  StagingKvTransport(std::unique_ptr<KvTransport> inner, std::unique_ptr<PoolDevice> device)
      : inner_(std::move(inner)), device_(std::move(device)) {}
  ~StagingKvTransport() override {
    inner_.reset();  // Its threads may still touch the mirror until they are joined.
    if (mirror_ != nullptr) ::munmap(mirror_, bytes_);
  }

  std::string_view name() const override { return inner_->name(); }
  std::string endpoint() const override { return inner_->endpoint(); }
  std::string description() const override {
    return Str(inner_->description(), " (staged through host memory from ", device_->identity(), ")");
  }

  absl::Status RegisterPool(uint8_t* base, size_t bytes) override {
    void* m = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
      return absl::ResourceExhaustedError(
          Str("KV transport: no address space for a ", bytes >> 20, " MiB host mirror of the pool"));
    }
    base_ = base;
    bytes_ = bytes;
    mirror_ = static_cast<uint8_t*>(m);
    return inner_->RegisterPool(mirror_, bytes);
  }

  // Receiver side: pages land in the mirror; the transfer is done once they are on the device.
  absl::Status Expect(uint64_t tag, std::vector<ByteRange> allowed) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!expected_.try_emplace(tag, Expected{allowed, false}).second) {
        return absl::AlreadyExistsError(Str("transfer tag ", tag, " is already expected"));
      }
    }
    absl::Status s = inner_->Expect(tag, std::move(allowed));
    if (!s.ok()) Forget(tag);  // The record just made: the inner transport refused the ranges.
    return s;
  }

  TransferPoll Poll(uint64_t tag) override {
    TransferPoll p = inner_->Poll(tag);
    if (p.state != TransferState::kDone) return p;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = expected_.find(tag);
    if (it == expected_.end() || it->second.staged) return p;
    absl::Status copied = absl::OkStatus();
    for (const ByteRange& r : it->second.allowed) {
      copied.Update(device_->CopyFromHost(base_ + r.begin, mirror_ + r.begin, r.end - r.begin));
    }
    copied.Update(device_->Synchronize());
    if (!copied.ok()) {
      p.state = TransferState::kFailed;
      p.status = absl::Status(copied.code(), Str("transfer ", tag, ": copying its pages to ",
                                                 device_->identity(), ": ", copied.message()));
      return p;
    }
    for (const ByteRange& r : it->second.allowed) Drop(r.begin, r.end);
    it->second.staged = true;
    return p;
  }

  void Release(uint64_t tag) override {
    inner_->Release(tag);
    // A transfer that failed leaves pages in the mirror: hand them back too.
    std::lock_guard<std::mutex> lock(mu_);
    auto it = expected_.find(tag);
    if (it == expected_.end()) return;
    if (!it->second.staged) {
      for (const ByteRange& r : it->second.allowed) Drop(r.begin, r.end);
    }
    expected_.erase(it);
  }

  bool ReleaseUnfinished(uint64_t tag, std::function<void()> quiesced) override {
    // Only the mirror is written by the inner transport: its quarantine rules hold for it.
    Forget(tag);
    return inner_->ReleaseUnfinished(tag, std::move(quiesced));
  }

  // Sender side: the pages go to the mirror first; the inner transport sends from there.
  absl::Status Submit(const std::string& peer, uint64_t tag,
                      absl::Span<const PageCopy> pages) override {
    for (const PageCopy& p : pages) {
      if (p.src_offset > bytes_ || p.bytes > bytes_ - p.src_offset) {
        return absl::OutOfRangeError(Str("page at ", p.src_offset, " is outside the local pool"));
      }
    }
    {
      // Counted before the copies, so another transfer's end cannot drop these mirror pages
      // between their copy and their send. (On an error below the transfer fails; its Finish or
      // Abort still releases the counts.)
      std::lock_guard<std::mutex> lock(mu_);
      std::vector<ByteRange>& sent = sending_[tag];
      for (const PageCopy& p : pages) {
        sent.push_back({p.src_offset, p.src_offset + p.bytes});
        ForEachOsPage(p.src_offset, p.src_offset + p.bytes, [&](uint64_t page) { ++in_flight_[page]; });
      }
    }
    for (const PageCopy& p : pages) {
      PD_RETURN_IF_ERROR(device_->CopyToHost(mirror_ + p.src_offset, base_ + p.src_offset, p.bytes));
    }
    PD_RETURN_IF_ERROR(device_->Synchronize());
    return inner_->Submit(peer, tag, pages);
  }

  // Once the inner transport is done with a transfer's pages (sent or failed), the mirror pages
  // no other transfer is sending go back to the kernel: a sender's mirror holds only what is in
  // flight, not everything it ever sent.
  void Finish(const std::string& peer, uint64_t tag,
              std::function<void(absl::StatusOr<TransferStats>)> done) override {
    inner_->Finish(peer, tag, [this, tag, done = std::move(done)](absl::StatusOr<TransferStats> r) {
      SentPagesDone(tag);
      if (done) done(std::move(r));
    });
  }
  void Abort(const std::string& peer, uint64_t tag) override {
    inner_->Abort(peer, tag);
    SentPagesDone(tag);
  }

 private:
  struct Expected {
    std::vector<ByteRange> allowed;
    bool staged = false;
  };

  void Forget(uint64_t tag) {
    std::lock_guard<std::mutex> lock(mu_);
    expected_.erase(tag);
  }

  // Hands the whole pages of mirror [begin, end) back to the kernel (read as zeros afterwards).
  void Drop(uint64_t begin, uint64_t end) {
    const uint64_t first = (begin + page_ - 1) / page_ * page_, last = end / page_ * page_;
    if (last > first) ::madvise(mirror_ + first, last - first, MADV_DONTNEED);
  }

  // Every OS page [begin, end) touches, partial ones included.
  template <typename F>
  void ForEachOsPage(uint64_t begin, uint64_t end, F f) {
    for (uint64_t page = begin / page_; page * page_ < end; ++page) f(page);
  }

  void SentPagesDone(uint64_t tag) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sending_.find(tag);
    if (it == sending_.end()) return;
    for (const ByteRange& r : it->second) {
      ForEachOsPage(r.begin, r.end, [&](uint64_t page) {
        auto count = in_flight_.find(page);
        if (count != in_flight_.end() && --count->second == 0) {
          in_flight_.erase(count);
          // Only OS pages wholly inside the sent range: a partial one may hold bytes of a block
          // this worker is receiving.
          if (page * page_ >= r.begin && (page + 1) * page_ <= r.end) {
            ::madvise(mirror_ + page * page_, page_, MADV_DONTNEED);
          }
        }
      });
    }
    sending_.erase(it);
  }

  std::unique_ptr<KvTransport> inner_;
  std::unique_ptr<PoolDevice> device_;
  uint8_t* base_ = nullptr;    // The pool, in device memory.
  uint8_t* mirror_ = nullptr;  // Its host mirror, registered with inner_.
  size_t bytes_ = 0;
  const uint64_t page_ = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  std::mutex mu_;
  absl::flat_hash_map<uint64_t, Expected> expected_;              // Receiving, per tag.
  absl::flat_hash_map<uint64_t, std::vector<ByteRange>> sending_;  // Sent ranges, per tag.
  absl::flat_hash_map<uint64_t, int> in_flight_;  // Mirror OS page -> transfers sending from it.
};

}  // namespace

std::unique_ptr<KvTransport> CreateStagingKvTransport(std::unique_ptr<KvTransport> inner,
                                                      std::unique_ptr<PoolDevice> device) {
  return std::make_unique<StagingKvTransport>(std::move(inner), std::move(device));
}

}  // namespace pdserve
