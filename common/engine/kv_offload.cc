#include "common/engine/kv_offload.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "common/base/check.h"
#include "common/base/log.h"

namespace pdserve {
namespace {

// A device pool's loads go through a ring of pinned blocks of about this many bytes: the I/O
// thread waits for the ring's copies to the device before it reuses a slot.
constexpr size_t kStagingBytes = size_t{8} << 20;
constexpr size_t kAlign = 4096;

}  // namespace

KvOffload::KvOffload(std::vector<std::shared_ptr<KvTier>> tiers, const KvCacheSpec& spec, uint8_t* pool,
                     int64_t num_blocks, const BlockHash& model, int64_t buffers, bool events,
                     std::unique_ptr<PoolDevice> store_device, std::unique_ptr<PoolDevice> load_device)
    : tiers_(std::move(tiers)), spec_(spec), pool_(pool), num_blocks_(num_blocks), model_(model),
      events_enabled_(events), store_device_(std::move(store_device)), load_device_(std::move(load_device)) {
  for (const auto& t : tiers_) {
    remote_ = remote_ || t->remote();
    if (!events_enabled_) continue;
    // What a local tier holds from before (a restarted worker's directory): a consumer's view
    // starts from the worker's AllBlocksCleared, so it hears of these now. No parent is known.
    for (const BlockHash& h : t->Held(model_)) {
      events_.push_back({KvEvent::Type::kStored, h, BlockHash{}, {}, t->event_medium()});
    }
    std::vector<KvTierKey> before;
    t->TakeRemoved(&before);  // Removals before this engine existed are not its news.
  }
  const size_t block_bytes = spec_.BlockBytes();
  const size_t stride = (block_bytes + kAlign - 1) / kAlign * kAlign;
  if (load_device_ != nullptr) staging_blocks_ = std::max<size_t>(2, kStagingBytes / stride);
  arena_bytes_ = stride * (static_cast<size_t>(buffers) + staging_blocks_);
  arena_ = static_cast<uint8_t*>(std::aligned_alloc(kAlign, arena_bytes_));
  PD_CHECK_MSG(arena_ != nullptr, "out of memory for the KV tiers' buffers");
  for (int64_t i = 0; i < buffers; ++i) free_buffers_.push_back(arena_ + static_cast<size_t>(i) * stride);
  staging_ = arena_ + static_cast<size_t>(buffers) * stride;
  if (store_device_ != nullptr) {
    // Pinned, copies to and from the GPU run at the bus's speed; unpinned they still work.
    const absl::Status pinned = store_device_->PinHost(arena_, arena_bytes_);
    arena_pinned_ = pinned.ok();
    if (!pinned.ok()) {
      PD_LOG(Warning) << "KV tier buffers not pinned (slower copies): " << pinned;
    }
  }
  thread_ = std::thread([this] { Run(); });
}

KvOffload::~KvOffload() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
  if (arena_pinned_) store_device_->UnpinHost(arena_);
  std::free(arena_);
}

void KvOffload::OfferStored(const BlockHash& hash, const BlockHash& parent, BlockId block,
                            absl::Span<const int32_t> tokens, std::string_view lora_name) {
  ++stats_.offered;
  bool all = true;
  for (const auto& t : tiers_) all = all && t->Contains({model_, hash});
  if (all) return;
  uint8_t* buffer;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (free_buffers_.empty()) {
      ++stats_.store_drops;
      return;
    }
    buffer = free_buffers_.back();
    free_buffers_.pop_back();
  }
  // The block's pages, layer by layer, while they are still this block's: BlockBytes() copied
  // (from a device pool: queued, complete at FlushOffers).
  const size_t page = spec_.PageBytes();
  bool copied = true;
  for (int64_t l = 0; l < spec_.num_layers && copied; ++l) {
    uint8_t* to = buffer + static_cast<size_t>(l) * page;
    if (store_device_ == nullptr) {
      std::memcpy(to, Page(l, block), page);
    } else {
      copied = store_device_->CopyToHost(to, Page(l, block), page).ok();
    }
  }
  if (!copied) {
    std::lock_guard<std::mutex> lock(mu_);
    free_buffers_.push_back(buffer);
    ++stats_.store_drops;
    return;
  }
  ++stats_.queued;
  std::vector<int32_t> event_tokens;
  if (events_enabled_) event_tokens.assign(tokens.begin(), tokens.end());
  offered_.push_back({hash, parent, buffer, std::move(event_tokens),
                      events_enabled_ ? std::string(lora_name) : std::string()});
}

void KvOffload::FlushOffers() {
  if (offered_.empty()) return;
  if (store_device_ != nullptr && !store_device_->Synchronize().ok()) {
    // The copies may not have happened: nothing of them is stored.
    std::lock_guard<std::mutex> lock(mu_);
    for (const Store& s : offered_) free_buffers_.push_back(s.bytes);
    stats_.store_drops += static_cast<int64_t>(offered_.size());
    stats_.queued -= static_cast<int64_t>(offered_.size());
    offered_.clear();
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (Store& s : offered_) stores_.push_back(std::move(s));
  }
  offered_.clear();
  wake_.notify_one();
}

int64_t KvOffload::Holds(absl::Span<const BlockHash> hashes) const {
  if (remote_) return static_cast<int64_t>(hashes.size());
  const auto any = [&](const BlockHash& h) {
    for (const auto& t : tiers_) {
      if (t->Contains({model_, h})) return true;
    }
    return false;
  };
  int64_t n = 0;
  while (n < static_cast<int64_t>(hashes.size()) && any(hashes[static_cast<size_t>(n)])) ++n;
  return n;
}

void KvOffload::StartLoad(uint64_t tag, std::vector<BlockHash> hashes, std::vector<BlockId> blocks) {
  ++stats_.load_requests;
  ++pending_loads_;
  pending_blocks_ += static_cast<int64_t>(hashes.size());
  {
    std::lock_guard<std::mutex> lock(mu_);
    loads_.push_back({tag, std::move(hashes), std::move(blocks)});
  }
  wake_.notify_one();
}

void KvOffload::Poll(std::vector<LoadDone>* done) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const LoadDone& d : finished_) {
    done->push_back(d);
    --pending_loads_;
    pending_blocks_ -= d.requested;
    stats_.loaded_blocks += d.loaded;
    stats_.failed_blocks += d.requested - d.loaded;
    stats_.loaded_tokens += d.loaded * spec_.block_size;
    for (size_t t = 0; t < kMaxTiers; ++t) stats_.loaded_tokens_by_tier[t] += d.by_tier[t] * spec_.block_size;
  }
  finished_.clear();
}

void KvOffload::DrainEvents(std::vector<KvEvent>* out) {
  if (!events_enabled_) return;
  std::lock_guard<std::mutex> lock(mu_);
  for (KvEvent& e : events_) out->push_back(std::move(e));
  events_.clear();
}

bool KvOffload::EventsPending() {
  if (!events_enabled_) return false;
  std::lock_guard<std::mutex> lock(mu_);
  return !events_.empty() || !stores_.empty() || stores_in_flight_ > 0;
}

void KvOffload::TakeRemovedLocked() {
  for (const auto& t : tiers_) {
    removed_.clear();
    t->TakeRemoved(&removed_);
    for (const KvTierKey& k : removed_) {
      if (k.model == model_) events_.push_back({KvEvent::Type::kRemoved, k.block, BlockHash{}, {}, t->event_medium()});
    }
  }
  // A consumer that never drains (a worker without event consumers drains every step) is bounded.
  if (events_.size() > 2 * KvTier::kMaxRemovedKept) {
    events_.erase(events_.begin(), events_.begin() + static_cast<std::ptrdiff_t>(KvTier::kMaxRemovedKept));
  }
}

double KvOffload::SecondsPerBlock() {
  std::lock_guard<std::mutex> lock(mu_);
  return seconds_per_block_;
}

bool KvOffload::WriteBlock(BlockId block, absl::Span<const uint8_t> bytes, size_t* staged) {
  const size_t page = spec_.PageBytes();
  if (load_device_ == nullptr) {
    for (int64_t l = 0; l < spec_.num_layers; ++l) {
      std::memcpy(Page(l, block), bytes.data() + static_cast<size_t>(l) * page, page);
    }
    return true;
  }
  // Through the pinned ring: a slot is reused only after the copies queued from it are done.
  if (*staged == staging_blocks_) {
    if (!load_device_->Synchronize().ok()) return false;
    *staged = 0;
  }
  const size_t stride = (bytes.size() + kAlign - 1) / kAlign * kAlign;
  uint8_t* slot = staging_ + *staged * stride;
  ++*staged;
  std::memcpy(slot, bytes.data(), bytes.size());
  for (int64_t l = 0; l < spec_.num_layers; ++l) {
    if (!load_device_->CopyFromHost(Page(l, block), slot + static_cast<size_t>(l) * page, page).ok()) return false;
  }
  return true;
}

void KvOffload::WaitForLoad(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait_for(lock, timeout, [this] { return !finished_.empty(); });
}

void KvOffload::FlushStores() {
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [this] { return stores_.empty() && stores_in_flight_ == 0; });
}

void KvOffload::Run() {
  for (;;) {
    std::unique_lock<std::mutex> lock(mu_);
    wake_.wait(lock, [this] { return stop_ || !loads_.empty() || !stores_.empty(); });
    if (!loads_.empty()) {  // Loads first: a request waits for them.
      Load job = std::move(loads_.front());
      loads_.pop_front();
      lock.unlock();
      const auto start = std::chrono::steady_clock::now();
      std::vector<KvTierKey> keys;
      for (const BlockHash& h : job.hashes) keys.push_back({model_, h});
      // Each tier in turn continues the run where the one before it missed.
      size_t loaded = 0, staged = 0;
      bool written = true;
      std::array<int64_t, kMaxTiers> by_tier{};
      for (size_t ti = 0; ti < tiers_.size(); ++ti) {
        const auto& t = tiers_[ti];
        if (loaded == keys.size() || !written) break;
        const size_t base = loaded;
        loaded += static_cast<size_t>(t->LoadRun(
            absl::MakeConstSpan(keys).subspan(base), spec_.BlockBytes(), [&](size_t i, absl::Span<const uint8_t> bytes) {
              // Into the block reserved for it: no step reads it until the engine has polled this.
              if (written) written = WriteBlock(job.blocks[base + i], bytes, &staged);
            }));
        by_tier[ti] = static_cast<int64_t>(loaded - base);
      }
      // A device pool's copies must be done before the engine hears of them; a failed one
      // leaves every block of the run to be computed.
      if (load_device_ != nullptr && staged > 0 && written) written = load_device_->Synchronize().ok();
      if (!written) {
        loaded = 0;
        by_tier = {};
      }
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      lock.lock();
      if (loaded > 0) {
        // A moving average by blocks: a run of n weighs n blocks (about the last 256 count).
        const double per_block = seconds / static_cast<double>(loaded);
        const double w = std::min(1.0, static_cast<double>(loaded) / std::min<double>(256.0, static_cast<double>(blocks_measured_ + loaded)));
        seconds_per_block_ += w * (per_block - seconds_per_block_);
        blocks_measured_ += static_cast<int64_t>(loaded);
      }
      if (events_enabled_) TakeRemovedLocked();  // Blocks that failed their checks went.
      finished_.push_back({job.tag, static_cast<int64_t>(loaded), static_cast<int64_t>(job.hashes.size()), by_tier});
      done_cv_.notify_all();
      continue;
    }
    if (stop_) return;  // The loads are done; queued stores are dropped with the engine.
    Store job = std::move(stores_.front());
    stores_.pop_front();
    ++stores_in_flight_;
    lock.unlock();
    std::vector<const char*> stored;
    for (const auto& t : tiers_) {
      // Failures are the tier's (counted there): the block is simply not in it.
      if (!t->Contains({model_, job.hash}) &&
          t->Store({model_, job.hash}, absl::MakeConstSpan(job.bytes, spec_.BlockBytes())).ok()) {
        stored.push_back(t->event_medium());
      }
    }
    lock.lock();
    if (events_enabled_) {
      for (const char* medium : stored) {
        events_.push_back({KvEvent::Type::kStored, job.hash, job.parent, job.tokens, medium, job.lora_name});
      }
      TakeRemovedLocked();
    }
    --stores_in_flight_;
    free_buffers_.push_back(job.bytes);
    done_cv_.notify_all();
  }
}

}  // namespace pdserve
