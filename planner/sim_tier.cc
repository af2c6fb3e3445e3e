#include "planner/sim_tier.h"

namespace pdserve {

void SimTier::Insert(const BlockHash& h) {
  auto it = index_.find(h);
  if (it != index_.end()) {
    lru_.splice(lru_.end(), lru_, it->second);
    return;
  }
  if (capacity_ <= 0) return;
  if (static_cast<int64_t>(index_.size()) >= capacity_) {
    index_.erase(lru_.front());
    lru_.pop_front();
    ++evictions_;
  }
  lru_.push_back(h);
  index_.emplace(h, std::prev(lru_.end()));
}

void SimTier::Touch(const BlockHash& h) {
  auto it = index_.find(h);
  if (it != index_.end()) lru_.splice(lru_.end(), lru_, it->second);
}

}  // namespace pdserve
