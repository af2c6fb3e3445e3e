// A KV cache tier as the simulator models it (issue 59): which prefix blocks it holds, least
// recently used first out past its capacity, and what loading a run of them costs. A worker's
// disk (`--kv-offload-disk-gib`) is one per worker; the shared store (`--kv-store-gib`) one for
// the cluster. Blocks enter when a worker publishes them (write-through, as KvOffload offers
// every newly indexed block) and are touched when loaded; the bytes are not simulated.
//
// Not thread-safe: the simulation thread owns it.
#ifndef PDSERVE_PLANNER_SIM_TIER_H_
#define PDSERVE_PLANNER_SIM_TIER_H_

#include <cstdint>
#include <list>

#include "absl/container/flat_hash_map.h"
#include "common/kvcache/block_hash.h"

namespace pdserve {

struct SimTierCost {
  double latency_seconds = 0;   // One round trip (a request's run is one batched read).
  double bytes_per_second = 0;  // Read bandwidth.
  // The time to load `blocks` blocks of `block_bytes` each.
  double Load(int64_t blocks, double block_bytes) const {
    if (blocks <= 0) return 0;
    return latency_seconds + (bytes_per_second > 0 ? static_cast<double>(blocks) * block_bytes / bytes_per_second : 0);
  }
};

class SimTier {
 public:
  SimTier(int64_t capacity_blocks, SimTierCost cost) : capacity_(capacity_blocks), cost_(cost) {}

  // A published block: held (the least recently used one dropped past the capacity), or touched.
  void Insert(const BlockHash& h);
  bool Contains(const BlockHash& h) const { return index_.contains(h); }
  // A loaded block: most recently used now.
  void Touch(const BlockHash& h);

  const SimTierCost& cost() const { return cost_; }
  int64_t size() const { return static_cast<int64_t>(index_.size()); }
  int64_t evictions() const { return evictions_; }

 private:
  const int64_t capacity_;
  const SimTierCost cost_;
  std::list<BlockHash> lru_;  // Oldest first.
  absl::flat_hash_map<BlockHash, std::list<BlockHash>::iterator> index_;
  int64_t evictions_ = 0;
};

}  // namespace pdserve

#endif  // PDSERVE_PLANNER_SIM_TIER_H_
