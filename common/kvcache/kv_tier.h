// KV cache tiers: content-addressed copies of prefix blocks outside a worker's pool (issue 59),
// so a prefix survives its eviction from the pool. A tier is never the truth: the pool stays the
// only place a step reads from, and a block found in a tier is loaded into freshly allocated
// blocks before its request runs, then checked (key, size, checksum) before it is used; one that
// fails its checks is a miss, never used.
//
// A block is all layers' pages of one block, as the pool lays them out (layer 0's page first),
// quantized pools' scales included: KvCacheSpec::BlockBytes() bytes. Its key is the model's
// (every input that fixes the KV's bits: the architecture, the weights and their format, the
// compute arithmetic, the KV dtype, block size and page layout; KvTierModelKey) and the chained
// block hash the prefix cache already computes, which covers the whole prefix.
//
// One interface per backend family, one file per backend (disk_tier.h, redis_tier.h), as
// KvTransport. A worker may have several (a local disk and the shared store): the engine asks
// them in order for each block and stores a published block in each that lacks it.
#ifndef PDSERVE_COMMON_KVCACHE_KV_TIER_H_
#define PDSERVE_COMMON_KVCACHE_KV_TIER_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/kvcache/block_hash.h"

namespace pdserve {

struct KvTierKey {
  BlockHash model;  // KvTierModelKey's.
  BlockHash block;  // The chained hash of the block's prefix.
  bool operator==(const KvTierKey& o) const { return model == o.model && block == o.block; }
  template <typename H>
  friend H AbslHashValue(H h, const KvTierKey& k) {
    return H::combine(std::move(h), k.model, k.block);
  }
};

// The key as the four words a stored block's header carries (model.lo, model.hi, block.lo,
// block.hi), and their check at load.
inline void KvTierKeyWords(const KvTierKey& k, uint64_t words[4]) {
  words[0] = k.model.lo;
  words[1] = k.model.hi;
  words[2] = k.block.lo;
  words[3] = k.block.hi;
}
inline bool KvTierKeyWordsMatch(const KvTierKey& k, const uint64_t words[4]) {
  return words[0] == k.model.lo && words[1] == k.model.hi && words[2] == k.block.lo && words[3] == k.block.hi;
}

// What a tier did (cumulative); exported as metrics by the engine's owner.
struct KvTierStats {
  int64_t blocks = 0, bytes = 0;        // Held now.
  int64_t stores = 0, store_bytes = 0;  // Stored.
  int64_t loads = 0, load_bytes = 0;    // Loaded (and checked).
  int64_t misses = 0;                   // Asked for and not there.
  int64_t corrupt = 0;                  // Found but failing its checks (removed, counted a miss).
  int64_t evictions = 0;                // Removed for the byte budget.
  int64_t errors = 0;                   // I/O errors (the block is skipped).
  double store_seconds = 0, load_seconds = 0;
};

class KvTier {
 public:
  virtual ~KvTier() = default;
  // "disk", ...: for messages and metrics' labels.
  virtual std::string_view name() const = 0;
  // The `medium` its blocks have in KV events ("DISK", "STORE").
  virtual const char* event_medium() const = 0;
  // Whether what the tier holds is known only by asking it (a store other workers write): the
  // engine then asks it at admission for every block its pool and local tiers lack.
  virtual bool remote() const { return false; }
  // Whether the tier holds `key` now, as far as this process knows: a hint (a Load may still
  // miss; a remote tier knows only what this process stored or loaded). Cheap, thread-safe.
  virtual bool Contains(const KvTierKey& key) const = 0;
  // Stores a block under `key` (one that is there already is kept). Errors are the tier's (a
  // full disk): the block is simply not stored. Thread-safe.
  virtual absl::Status Store(const KvTierKey& key, absl::Span<const uint8_t> block) = 0;
  // Fills `out` (exactly the block's size) with the block: NotFound when it is not there,
  // DataLoss when what is there fails its checks (it is removed). Thread-safe.
  virtual absl::Status Load(const KvTierKey& key, absl::Span<uint8_t> out) = 0;
  // Loads the longest leading run of `keys` the tier has (each block_bytes, checked), calling
  // use(i, bytes) for each in order; returns the run's length. The default loads one at a time;
  // a remote tier asks for all of them in one round trip. Thread-safe.
  virtual int64_t LoadRun(absl::Span<const KvTierKey> keys, size_t block_bytes,
                          absl::FunctionRef<void(size_t, absl::Span<const uint8_t>)> use);
  // Thread-safe.
  virtual KvTierStats Stats() const = 0;
  // For KV events: the blocks of `model` the tier holds now (a local tier: its index; a remote
  // one knows only what this process stored, and says nothing), and the keys it removed itself
  // (evicted for its budget, or failing their checks) since the last call (at most the last
  // kMaxRemovedKept). Thread-safe.
  virtual std::vector<BlockHash> Held(const BlockHash& model) const { return {}; }
  virtual void TakeRemoved(std::vector<KvTierKey>* out) {}
  static constexpr size_t kMaxRemovedKept = size_t{1} << 16;
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_KVCACHE_KV_TIER_H_
