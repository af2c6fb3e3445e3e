#include "common/engine/kv_offload.h"

#include <cstring>
#include <utility>

namespace pdserve {

KvOffload::KvOffload(std::vector<std::shared_ptr<KvTier>> tiers, const KvCacheSpec& spec, uint8_t* pool,
                     int64_t num_blocks, const BlockHash& model, int64_t buffers, bool events)
    : tiers_(std::move(tiers)), spec_(spec), pool_(pool), num_blocks_(num_blocks), model_(model),
      events_enabled_(events) {
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
  for (int64_t i = 0; i < buffers; ++i) free_buffers_.emplace_back(spec_.BlockBytes());
  thread_ = std::thread([this] { Run(); });
}

KvOffload::~KvOffload() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void KvOffload::OfferStored(const BlockHash& hash, const BlockHash& parent, BlockId block,
                            absl::Span<const int32_t> tokens) {
  ++stats_.offered;
  bool all = true;
  for (const auto& t : tiers_) all = all && t->Contains({model_, hash});
  if (all) return;
  std::vector<uint8_t> buffer;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (free_buffers_.empty()) {
      ++stats_.store_drops;
      return;
    }
    buffer = std::move(free_buffers_.back());
    free_buffers_.pop_back();
  }
  // The block's pages, layer by layer, while they are still this block's: BlockBytes() copied.
  const size_t page = spec_.PageBytes();
  for (int64_t l = 0; l < spec_.num_layers; ++l) {
    std::memcpy(buffer.data() + static_cast<size_t>(l) * page, Page(l, block), page);
  }
  ++stats_.queued;
  std::vector<int32_t> event_tokens;
  if (events_enabled_) event_tokens.assign(tokens.begin(), tokens.end());
  {
    std::lock_guard<std::mutex> lock(mu_);
    stores_.push_back({hash, parent, std::move(buffer), std::move(event_tokens)});
  }
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
    stats_.loaded_blocks += d.loaded;
    stats_.failed_blocks += d.requested - d.loaded;
    stats_.loaded_tokens += d.loaded * spec_.block_size;
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

void KvOffload::WaitForLoad(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait_for(lock, timeout, [this] { return !finished_.empty(); });
}

void KvOffload::FlushStores() {
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [this] { return stores_.empty() && stores_in_flight_ == 0; });
}

void KvOffload::Run() {
  const size_t page = spec_.PageBytes();
  for (;;) {
    std::unique_lock<std::mutex> lock(mu_);
    wake_.wait(lock, [this] { return stop_ || !loads_.empty() || !stores_.empty(); });
    if (!loads_.empty()) {  // Loads first: a request waits for them.
      Load job = std::move(loads_.front());
      loads_.pop_front();
      lock.unlock();
      std::vector<KvTierKey> keys;
      for (const BlockHash& h : job.hashes) keys.push_back({model_, h});
      // Each tier in turn continues the run where the one before it missed.
      size_t loaded = 0;
      for (const auto& t : tiers_) {
        if (loaded == keys.size()) break;
        const size_t base = loaded;
        loaded += static_cast<size_t>(t->LoadRun(
            absl::MakeConstSpan(keys).subspan(base), spec_.BlockBytes(), [&](size_t i, absl::Span<const uint8_t> bytes) {
              // Into the block reserved for it: no step reads it until the engine has polled this.
              for (int64_t l = 0; l < spec_.num_layers; ++l) {
                std::memcpy(Page(l, job.blocks[base + i]), bytes.data() + static_cast<size_t>(l) * page, page);
              }
            }));
      }
      lock.lock();
      if (events_enabled_) TakeRemovedLocked();  // Blocks that failed their checks went.
      finished_.push_back({job.tag, static_cast<int64_t>(loaded), static_cast<int64_t>(job.hashes.size())});
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
      if (!t->Contains({model_, job.hash}) && t->Store({model_, job.hash}, job.bytes).ok()) {
        stored.push_back(t->event_medium());
      }
    }
    lock.lock();
    if (events_enabled_) {
      for (const char* medium : stored) {
        events_.push_back({KvEvent::Type::kStored, job.hash, job.parent, job.tokens, medium});
      }
      TakeRemovedLocked();
    }
    --stores_in_flight_;
    free_buffers_.push_back(std::move(job.bytes));
    done_cv_.notify_all();
  }
}

}  // namespace pdserve
