#include "common/transport/receive_tracker.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <utility>

#include "common/base/strings.h"

namespace pdserve {

bool RangesContain(const std::vector<ByteRange>& allowed, uint64_t offset, uint64_t len) {
  for (const ByteRange& r : allowed) {
    if (offset >= r.begin && offset + len <= r.end && offset + len >= offset) return true;
  }
  return false;
}

std::vector<ByteRange> ReceiveTracker::Allowed(uint64_t tag) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = transfers_.find(tag);
  return it == transfers_.end() ? std::vector<ByteRange>() : it->second->allowed;
}

void ReceiveTracker::SetPool(uint8_t* base, size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  base_ = base;
  bytes_ = bytes;
}

absl::Status ReceiveTracker::Expect(uint64_t tag, std::vector<ByteRange> allowed) {
  std::lock_guard<std::mutex> lock(mu_);
  if (base_ == nullptr) return absl::FailedPreconditionError("no pool registered");
  for (const ByteRange& r : allowed) {
    if (r.begin > r.end || r.end > bytes_) {
      return absl::InvalidArgumentError(Str("range [", r.begin, ", ", r.end,
                                            ") is outside the ", bytes_, "-byte pool"));
    }
  }
  auto t = std::make_unique<Transfer>();
  t->allowed = std::move(allowed);
  if (!transfers_.try_emplace(tag, std::move(t)).second) {
    return absl::AlreadyExistsError(Str("transfer tag ", tag, " is already expected"));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint8_t*> ReceiveTracker::PageDestination(uint64_t tag, uint64_t offset,
                                                         uint64_t len, uint64_t source) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = transfers_.find(tag);
  if (it == transfers_.end()) {
    return absl::NotFoundError(Str("page for unknown transfer tag ", tag));
  }
  Transfer& t = *it->second;
  if (t.poll.state != TransferState::kPending) {
    return absl::FailedPreconditionError(Str("page for finished transfer tag ", tag));
  }
  if (t.source == 0) t.source = source;
  if (!RangesContain(t.allowed, offset, len)) {
    const absl::Status why = absl::PermissionDeniedError(
        Str("transfer ", tag, ": page [", offset, ", ", offset + len,
            ") is outside the blocks reserved for it"));
    t.poll.state = TransferState::kFailed;
    t.poll.status = why;
    return why;
  }
  return base_ + offset;
}

void ReceiveTracker::PageArrived(uint64_t tag, const uint8_t* data, uint64_t len) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = transfers_.find(tag);
  if (it == transfers_.end()) return;
  Transfer& t = *it->second;
  t.hash.Update(data, len);
  ++t.poll.stats.pages;
  t.poll.stats.bytes += static_cast<int64_t>(len);
}

void ReceiveTracker::PageArrivedHashed(uint64_t tag, uint64_t page_hash, uint64_t len) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = transfers_.find(tag);
  if (it == transfers_.end()) return;
  Transfer& t = *it->second;
  t.hash.Update(reinterpret_cast<const uint8_t*>(&page_hash), sizeof(page_hash));
  ++t.poll.stats.pages;
  t.poll.stats.bytes += static_cast<int64_t>(len);
}

void ReceiveTracker::Finish(uint64_t tag, const TransferStats& sent) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = transfers_.find(tag);
  if (it == transfers_.end()) return;
  Transfer& t = *it->second;
  if (t.poll.state != TransferState::kPending) return;
  t.poll.stats.checksum = t.hash.Digest();
  if (sent.pages != t.poll.stats.pages || sent.bytes != t.poll.stats.bytes) {
    t.poll.state = TransferState::kFailed;
    t.poll.status = absl::DataLossError(Str("transfer ", tag, ": sender sent ", sent.pages,
                                            " pages / ", sent.bytes, " bytes, received ",
                                            t.poll.stats.pages, " / ", t.poll.stats.bytes));
  } else if (sent.checksum != t.poll.stats.checksum) {
    t.poll.state = TransferState::kFailed;
    t.poll.status = absl::DataLossError(
        Str("transfer ", tag, ": checksum mismatch (corrupted in flight), pages refused"));
  } else {
    t.poll.state = TransferState::kDone;
  }
}

void ReceiveTracker::Fail(uint64_t tag, const absl::Status& why) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = transfers_.find(tag);
  if (it == transfers_.end() || it->second->poll.state != TransferState::kPending) return;
  it->second->poll.state = TransferState::kFailed;
  it->second->poll.status = why;
}

void ReceiveTracker::FailSource(uint64_t source, const absl::Status& why) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [tag, t] : transfers_) {
    if (t->source == source && t->poll.state == TransferState::kPending) {
      t->poll.state = TransferState::kFailed;
      t->poll.status = why;
    }
  }
}

TransferPoll ReceiveTracker::Poll(uint64_t tag) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = transfers_.find(tag);
  if (it == transfers_.end()) {
    return TransferPoll{TransferState::kFailed, {},
                        absl::NotFoundError(Str("transfer tag ", tag, " is not expected"))};
  }
  return it->second->poll;
}

void ReceiveTracker::Release(uint64_t tag) {
  std::lock_guard<std::mutex> lock(mu_);
  transfers_.erase(tag);
}

namespace {

struct CorruptFault {
  std::atomic<int64_t> target{[] {
    const char* v = std::getenv("PDSERVE_FAULT_CORRUPT_KV_PAGE");
    return v ? std::atoll(v) : int64_t{0};
  }()};
  std::atomic<int64_t> count{0};
};

CorruptFault& TheCorruptFault() {
  static CorruptFault fault;
  return fault;
}

}  // namespace

bool ShouldCorruptNextPage() {
  CorruptFault& f = TheCorruptFault();
  const int64_t target = f.target.load();
  if (target <= 0) return false;
  return f.count.fetch_add(1) + 1 == target;
}

void SetCorruptKvPageForTesting(int64_t n) {
  CorruptFault& f = TheCorruptFault();
  f.target.store(0);
  f.count.store(0);
  f.target.store(n);
}

namespace {
std::atomic<int64_t> g_stall_page{0};
std::atomic<int64_t> g_stall_ms{0};
std::atomic<int64_t> g_stall_count{0};

void StallFromEnvironmentOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* v = std::getenv("PDSERVE_FAULT_STALL_KV_PAGE");
    if (v == nullptr) return;
    const char* colon = std::strchr(v, ':');
    g_stall_ms.store(colon ? std::atoll(colon + 1) : 0);
    g_stall_page.store(std::atoll(v));
  });
}
}  // namespace

int64_t StallBeforeNextPageMs() {
  StallFromEnvironmentOnce();
  const int64_t target = g_stall_page.load();
  if (target <= 0) return 0;
  return g_stall_count.fetch_add(1) + 1 == target ? g_stall_ms.load() : 0;
}

void SetStallKvPageForTesting(int64_t n, int64_t ms) {
  StallFromEnvironmentOnce();
  g_stall_page.store(0);
  g_stall_count.store(0);
  g_stall_ms.store(ms);
  g_stall_page.store(n);
}

}  // namespace pdserve
