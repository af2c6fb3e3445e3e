#include "common/kvcache/host_tier.h"

#include <sys/mman.h>

#include <chrono>
#include <cstring>
#include <utility>

// Inline: XXH3 compiled with the build's vector flags (AVX2), not the library's SSE2 build.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "common/base/strings.h"

namespace pdserve {
namespace {

constexpr size_t kSlotAlign = 4096;

double Since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

absl::StatusOr<std::unique_ptr<HostTier>> HostTier::Create(HostTierOptions options) {
  if (options.budget_bytes <= 0) {
    return absl::InvalidArgumentError(Str(options.flag, ": the byte budget must be > 0"));
  }
  auto tier = std::unique_ptr<HostTier>(new HostTier(std::move(options)));
  const HostTierOptions& o = tier->options_;
  tier->mapped_bytes_ = static_cast<size_t>(o.budget_bytes);
  // Address space only until a slot is written (pinning, below, commits it all).
  void* p = ::mmap(nullptr, tier->mapped_bytes_, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        Str(o.flag, ": cannot map ", tier->mapped_bytes_, " bytes: ", std::strerror(errno)));
  }
  tier->base_ = static_cast<uint8_t*>(p);
  if (o.pin) {
    if (absl::Status s = o.pin(p, tier->mapped_bytes_); !s.ok()) {
      return absl::Status(s.code(), Str(o.flag, ": cannot pin ", tier->mapped_bytes_, " bytes of host memory: ",
                                        s.message()));
    }
    tier->pinned_ = true;
  }
  return tier;
}

HostTier::~HostTier() {
  if (base_ == nullptr) return;
  if (pinned_ && options_.unpin) options_.unpin(base_);
  ::munmap(base_, mapped_bytes_);
}

bool HostTier::Contains(const KvTierKey& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  return index_.contains(key);
}

void HostTier::ForgetLocked(KvTierKey key) {
  auto it = index_.find(key);
  if (it == index_.end()) return;
  free_slots_.push_back(it->second.slot);
  lru_.erase(it->second.lru);
  index_.erase(it);
  removed_.push_back(key);
  if (removed_.size() > kMaxRemovedKept) removed_.pop_front();
}

absl::Status HostTier::Store(const KvTierKey& key, absl::Span<const uint8_t> block) {
  const auto start = std::chrono::steady_clock::now();
  const uint64_t checksum = XXH3_64bits(block.data(), block.size());
  std::lock_guard<std::mutex> lock(mu_);
  if (index_.contains(key)) return absl::OkStatus();
  if (block_bytes_ == 0 && !block.empty()) {
    const size_t stride = (block.size() + kSlotAlign - 1) / kSlotAlign * kSlotAlign;
    if (stride > mapped_bytes_) {
      ++stats_.errors;
      return absl::ResourceExhaustedError(Str(options_.flag, ": a block of ", block.size(),
                                              " bytes is larger than the budget"));
    }
    block_bytes_ = block.size();
    slot_stride_ = stride;
    num_slots_ = static_cast<int64_t>(mapped_bytes_ / stride);
  }
  if (block.size() != block_bytes_) {
    ++stats_.errors;
    return absl::InvalidArgumentError(Str(options_.flag, ": a block of ", block.size(),
                                          " bytes where this tier holds blocks of ", block_bytes_));
  }
  // Slots never used are taken in order (no list of them: a large budget of small blocks would
  // cost a word a slot up front), then freed ones, then the least recently used block's.
  int64_t slot;
  if (!free_slots_.empty()) {
    slot = free_slots_.back();
    free_slots_.pop_back();
  } else if (next_unused_ < num_slots_) {
    slot = next_unused_++;
  } else {
    ForgetLocked(lru_.front());
    ++stats_.evictions;
    slot = free_slots_.back();
    free_slots_.pop_back();
  }
  std::memcpy(Slot(slot), block.data(), block.size());
  lru_.push_back(key);
  index_[key] = Entry{slot, checksum, std::prev(lru_.end())};
  ++stats_.stores;
  stats_.store_bytes += static_cast<int64_t>(block.size());
  stats_.store_seconds += Since(start);
  return absl::OkStatus();
}

int64_t HostTier::FindCheckedLocked(const KvTierKey& key, size_t bytes) {
  auto it = index_.find(key);
  if (it == index_.end()) {
    ++stats_.misses;
    return -1;
  }
  if (bytes != block_bytes_ || XXH3_64bits(Slot(it->second.slot), block_bytes_) != it->second.checksum) {
    ForgetLocked(key);
    ++stats_.corrupt;
    ++stats_.misses;
    return -1;
  }
  lru_.splice(lru_.end(), lru_, it->second.lru);
  return it->second.slot;
}

absl::Status HostTier::Load(const KvTierKey& key, absl::Span<uint8_t> out) {
  const auto start = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t corrupt_before = stats_.corrupt;
  const int64_t slot = FindCheckedLocked(key, out.size());
  if (slot < 0) {
    if (stats_.corrupt > corrupt_before) return absl::DataLossError("host tier: the block fails its checks");
    return absl::NotFoundError("not in the host tier");
  }
  std::memcpy(out.data(), Slot(slot), out.size());
  ++stats_.loads;
  stats_.load_bytes += static_cast<int64_t>(out.size());
  stats_.load_seconds += Since(start);
  return absl::OkStatus();
}

int64_t HostTier::LoadRun(absl::Span<const KvTierKey> keys, size_t block_bytes,
                          absl::FunctionRef<void(size_t, absl::Span<const uint8_t>)> use) {
  int64_t n = 0;
  for (size_t i = 0; i < keys.size(); ++i, ++n) {
    const auto start = std::chrono::steady_clock::now();
    std::lock_guard<std::mutex> lock(mu_);  // Per block: other engines' stores interleave.
    const int64_t slot = FindCheckedLocked(keys[i], block_bytes);
    if (slot < 0) break;
    use(i, absl::MakeConstSpan(Slot(slot), block_bytes));
    ++stats_.loads;
    stats_.load_bytes += static_cast<int64_t>(block_bytes);
    stats_.load_seconds += Since(start);
  }
  return n;
}

KvTierStats HostTier::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  KvTierStats s = stats_;
  s.blocks = static_cast<int64_t>(index_.size());
  s.bytes = s.blocks * static_cast<int64_t>(block_bytes_);
  return s;
}

std::vector<BlockHash> HostTier::Held(const BlockHash& model) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<BlockHash> out;
  for (const KvTierKey& k : lru_) {
    if (k.model == model) out.push_back(k.block);
  }
  return out;
}

void HostTier::TakeRemoved(std::vector<KvTierKey>* out) {
  std::lock_guard<std::mutex> lock(mu_);
  out->insert(out->end(), removed_.begin(), removed_.end());
  removed_.clear();
}

void HostTier::CorruptForTesting(const KvTierKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(key);
  if (it != index_.end()) Slot(it->second.slot)[block_bytes_ / 2] ^= 0x5a;
}

}  // namespace pdserve
