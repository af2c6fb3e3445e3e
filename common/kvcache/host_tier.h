// The `host` KV tier: blocks in this process's memory beyond the pool, under a byte budget, least
// recently used first out (--kv-offload-host-gib). For a --device cuda worker it is the tier
// between the GPU's pool and the disk or store: its memory is pinned once at start (the `pin`
// option: PoolDevice::PinHost, cudaHostRegister), so blocks move to and from the GPU at PCIe
// speed. For a cpu worker it is more RAM that the process's engines share (serve's prefill and
// decode engines reuse each other's prefixes through it).
//
// The memory is one mapping of the whole budget, cut into slots of one block's size (the first
// block stored sets it; a block of another size is refused). Each slot's key and an XXH3-64 of
// its bytes are kept beside it and checked at each load, as the other tiers' are: a block that
// fails is dropped and counted, never used. Nothing survives the process.
//
// Thread-safe: the engines of one process share one tier, each storing and loading from its own
// I/O thread. Copies in and out of a slot run under the tier's lock (a slot cannot be reused
// while it is read); they are memory copies of one block.
#ifndef PDSERVE_COMMON_KVCACHE_HOST_TIER_H_
#define PDSERVE_COMMON_KVCACHE_HOST_TIER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/kvcache/kv_tier.h"

namespace pdserve {

struct HostTierOptions {
  int64_t budget_bytes = 0;  // The mapping's size: at most this many bytes of blocks.
  // Pins [p, p + bytes) for fast device copies (null: plain memory); `unpin` undoes it.
  std::function<absl::Status(void* p, size_t bytes)> pin;
  std::function<void(void* p)> unpin;
  std::string flag = "--kv-offload-host-gib";  // Named in errors.
  // The `medium` of its KV events: vLLM's "CPU" beside a GPU's pool ("GPU"); a cpu worker, whose
  // pool's events are "CPU" already, names it "HOST" so a consumer keeps the two sets apart.
  const char* event_medium = "CPU";
};

class HostTier : public KvTier {
 public:
  // InvalidArgument naming the flag for a budget <= 0; ResourceExhausted when the memory cannot
  // be mapped; `pin`'s error (naming the flag) when it cannot be pinned.
  static absl::StatusOr<std::unique_ptr<HostTier>> Create(HostTierOptions options);
  ~HostTier() override;

  std::string_view name() const override { return "host"; }
  const char* event_medium() const override { return options_.event_medium; }
  bool Contains(const KvTierKey& key) const override;
  absl::Status Store(const KvTierKey& key, absl::Span<const uint8_t> block) override;
  absl::Status Load(const KvTierKey& key, absl::Span<uint8_t> out) override;
  // Straight from the slots (no scratch copy).
  int64_t LoadRun(absl::Span<const KvTierKey> keys, size_t block_bytes,
                  absl::FunctionRef<void(size_t, absl::Span<const uint8_t>)> use) override;
  KvTierStats Stats() const override;
  std::vector<BlockHash> Held(const BlockHash& model) const override;
  void TakeRemoved(std::vector<KvTierKey>* out) override;

  // Tests: flips a byte of `key`'s slot (a corrupted slot must fail its checksum).
  void CorruptForTesting(const KvTierKey& key);

 private:
  explicit HostTier(HostTierOptions options) : options_(std::move(options)) {}
  // The slot of `key`, its checks passed (else forgotten, counted); -1 when absent or failing.
  // Holds mu_.
  int64_t FindCheckedLocked(const KvTierKey& key, size_t bytes);
  void ForgetLocked(KvTierKey key);  // Holds mu_. By value: callers pass lru_'s own entries.
  uint8_t* Slot(int64_t slot) const { return base_ + static_cast<size_t>(slot) * slot_stride_; }

  struct Entry {
    int64_t slot = 0;
    uint64_t checksum = 0;
    std::list<KvTierKey>::iterator lru;
  };
  const HostTierOptions options_;
  uint8_t* base_ = nullptr;
  size_t mapped_bytes_ = 0;
  bool pinned_ = false;

  mutable std::mutex mu_;
  size_t block_bytes_ = 0;  // Set by the first Store; then every block's size.
  size_t slot_stride_ = 0;  // block_bytes_ rounded up to 4 KiB.
  int64_t num_slots_ = 0;
  int64_t next_unused_ = 0;         // Slots [next_unused_, num_slots_) were never used.
  std::vector<int64_t> free_slots_;  // Freed by evictions and failed checks.
  absl::flat_hash_map<KvTierKey, Entry> index_;
  std::list<KvTierKey> lru_;  // Oldest first.
  std::deque<KvTierKey> removed_;  // Since the last TakeRemoved (the newest kMaxRemovedKept).
  KvTierStats stats_;
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_KVCACHE_HOST_TIER_H_
