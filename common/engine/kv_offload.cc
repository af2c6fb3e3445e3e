#include "common/engine/kv_offload.h"

#include <cstring>
#include <utility>

namespace pdserve {

KvOffload::KvOffload(std::shared_ptr<KvTier> tier, const KvCacheSpec& spec, uint8_t* pool, int64_t num_blocks,
                     const BlockHash& model, int64_t buffers)
    : tier_(std::move(tier)), spec_(spec), pool_(pool), num_blocks_(num_blocks), model_(model) {
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

void KvOffload::OfferStored(const BlockHash& hash, BlockId block) {
  ++stats_.offered;
  if (tier_->Contains({model_, hash})) return;
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
  {
    std::lock_guard<std::mutex> lock(mu_);
    stores_.push_back({hash, std::move(buffer)});
  }
  wake_.notify_one();
}

int64_t KvOffload::Holds(absl::Span<const BlockHash> hashes) const {
  int64_t n = 0;
  while (n < static_cast<int64_t>(hashes.size()) && tier_->Contains({model_, hashes[static_cast<size_t>(n)]})) ++n;
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

void KvOffload::WaitForLoad(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait_for(lock, timeout, [this] { return !finished_.empty(); });
}

void KvOffload::FlushStores() {
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [this] { return stores_.empty() && stores_in_flight_ == 0; });
}

void KvOffload::Run() {
  std::vector<uint8_t> scratch(spec_.BlockBytes());
  const size_t page = spec_.PageBytes();
  for (;;) {
    std::unique_lock<std::mutex> lock(mu_);
    wake_.wait(lock, [this] { return stop_ || !loads_.empty() || !stores_.empty(); });
    if (!loads_.empty()) {  // Loads first: a request waits for them.
      Load job = std::move(loads_.front());
      loads_.pop_front();
      lock.unlock();
      int64_t loaded = 0;
      for (size_t i = 0; i < job.hashes.size(); ++i) {
        if (!tier_->Load({model_, job.hashes[i]}, absl::MakeSpan(scratch)).ok()) break;
        // Into the block reserved for it: no step reads it until the engine has polled this.
        for (int64_t l = 0; l < spec_.num_layers; ++l) {
          std::memcpy(Page(l, job.blocks[i]), scratch.data() + static_cast<size_t>(l) * page, page);
        }
        ++loaded;
      }
      lock.lock();
      finished_.push_back({job.tag, loaded, static_cast<int64_t>(job.hashes.size())});
      done_cv_.notify_all();
      continue;
    }
    if (stop_) return;  // The loads are done; queued stores are dropped with the engine.
    Store job = std::move(stores_.front());
    stores_.pop_front();
    ++stores_in_flight_;
    lock.unlock();
    (void)tier_->Store({model_, job.hash}, job.bytes);  // A failure is the tier's to count.
    lock.lock();
    --stores_in_flight_;
    free_buffers_.push_back(std::move(job.bytes));
    done_cv_.notify_all();
  }
}

}  // namespace pdserve
