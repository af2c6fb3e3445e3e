// An engine's side of the KV cache tiers (kv_tier.h): offers the prefix blocks it publishes to
// the tiers, and loads a new request's next prefix blocks from them into blocks of the pool.
//
// Writes never slow a step: at publication a block's pages are copied into a buffer of a fixed
// set (a block's bytes, on the scheduler thread: ~BlockBytes / memory bandwidth) and queued for
// this offloader's I/O thread; with no free buffer the block is dropped and counted. Loads are
// asynchronous: the I/O thread reads each block, checks it and writes it straight into the pool
// pages of the block the engine reserved for it (which no step reads until the load is done),
// and the engine polls the completions at each step. The scheduler thread never waits on I/O.
//
// A pool in device memory (--device cuda) is reached through two PoolDevices (two streams): the
// scheduler thread's copies a step's published blocks to host buffers (queued, then one wait per
// step in FlushOffers: the pages must be read before a later step may reuse the block), the I/O
// thread's copies loaded blocks from a pinned staging ring into the reserved pages and waits for
// them before it reports the load done. The buffers and the ring are pinned (PoolDevice::PinHost).
//
// Threads: StartLoad, OfferStored, FlushOffers, Poll and the queries are the engine's scheduler
// thread's; the I/O thread touches only the buffers queued to it, its staging ring and the pool
// pages of blocks being loaded.
#ifndef PDSERVE_COMMON_ENGINE_KV_OFFLOAD_H_
#define PDSERVE_COMMON_ENGINE_KV_OFFLOAD_H_

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/types/span.h"
#include "common/kvcache/block_manager.h"
#include "common/kvcache/kv_cache_spec.h"
#include "common/kvcache/kv_tier.h"
#include "common/transport/pool_device.h"

namespace pdserve {

struct KvOffloadStats {
  int64_t offered = 0;        // Published blocks offered to the tier.
  int64_t queued = 0;         // Of those, queued for a store (the rest: the tier had them).
  int64_t store_drops = 0;    // Queued for a store but no buffer was free: dropped.
  int64_t load_requests = 0;  // Requests that found prefix blocks in the tier.
  int64_t loaded_blocks = 0;  // Blocks loaded and checked into the pool.
  int64_t failed_blocks = 0;  // Found but failing to load or its checks: recomputed.
  int64_t loaded_tokens = 0;  // Prompt tokens those blocks hold (not computed again).
  // Of those, by the tier each block came from (in tiers() order).
  std::array<int64_t, 4> loaded_tokens_by_tier{};
  // Requests whose prefix the tiers held but the engine computed: loading was expected to take
  // longer (EngineOptions::kv_tier_load). Counted by the engine.
  int64_t declined_loads = 0;
};

class KvOffload {
 public:
  // `pool`: the pool's first byte, `num_blocks` its blocks, laid out as KvPool's
  // [layer][block] pages of spec.PageBytes(). `model`: KvTierModelKey's. `buffers`: blocks that
  // may wait for a store at once (their memory is allocated now).
  // `tiers`: asked in order for each block (local ones first), stored into each that lacks it.
  // `events`: report what the tiers hold as KV events (DrainEvents): each block stored into a
  // tier, each one a tier removed, and, now, the blocks a local tier holds already.
  // `store_device`, `load_device`: where `pool` is device memory, the scheduler thread's and the
  // I/O thread's way to it (both or neither); null: `pool` is host memory.
  KvOffload(std::vector<std::shared_ptr<KvTier>> tiers, const KvCacheSpec& spec, uint8_t* pool, int64_t num_blocks,
            const BlockHash& model, int64_t buffers, bool events = false,
            std::unique_ptr<PoolDevice> store_device = nullptr, std::unique_ptr<PoolDevice> load_device = nullptr);
  ~KvOffload();  // Finishes the loads in flight and the queued stores.

  const std::vector<std::shared_ptr<KvTier>>& tiers() const { return tiers_; }

  // A published prefix block: copied and queued for the tiers unless every one has it already.
  // `parent`, `tokens` (its tokens, or none) and `lora_name` (the LoRA adapter whose KV it is) are
  // for its KV events. The copy is done and the block queued by the next FlushOffers, which must
  // come before a step may write the block.
  void OfferStored(const BlockHash& hash, const BlockHash& parent, BlockId block, absl::Span<const int32_t> tokens,
                   std::string_view lora_name = {});
  void FlushOffers();
  // How many of `hashes`, from the first, are worth asking the tiers for: those a local tier
  // holds (a hint: a load may still miss), or all of them with a remote tier (only it knows).
  int64_t Holds(absl::Span<const BlockHash> hashes) const;

  // Loads blocks[i] <- the tier's hashes[i] (a request's consecutive prefix blocks, reserved for
  // it); Poll later reports `tag` with how many of them, from the first, loaded and checked.
  void StartLoad(uint64_t tag, std::vector<BlockHash> hashes, std::vector<BlockId> blocks);
  struct LoadDone {
    uint64_t tag;
    int64_t loaded;     // Leading blocks in the pool, checked.
    int64_t requested;  // Blocks asked for (the rest, from the first that failed, are recomputed).
    std::array<int64_t, 4> by_tier{};  // Of `loaded`, from each tier (tiers() order).
  };
  static constexpr size_t kMaxTiers = 4;
  // The loads finished since the last call.
  void Poll(std::vector<LoadDone>* done);
  bool HasPendingLoads() const { return pending_loads_ > 0; }
  // What a load costs, for the engine's choice to load or compute: the I/O thread's seconds a
  // block over the loads so far (a moving average; 0 before the first), and the blocks of loads
  // started and not yet polled (a new load waits behind them).
  double SecondsPerBlock();
  int64_t PendingBlocks() const { return pending_blocks_; }
  // Waits at most `timeout` for a load to finish (the engine, with nothing else to step).
  void WaitForLoad(std::chrono::milliseconds timeout);
  // Waits until every store queued so far is done (tests; a worker's drain).
  void FlushStores();

  const KvOffloadStats& stats() const { return stats_; }
  // The tiers' KV events since the last call (with `events` on), each with its tier's medium.
  void DrainEvents(std::vector<KvEvent>* out);
  // With `events` on: events not yet drained, or stores that will make some.
  bool EventsPending();

 private:
  struct Load {
    uint64_t tag;
    std::vector<BlockHash> hashes;
    std::vector<BlockId> blocks;
  };
  struct Store {
    BlockHash hash, parent;
    uint8_t* bytes;  // A buffer of arena_.
    std::vector<int32_t> tokens;  // For its events (empty without).
    std::string lora_name;        // For its events.
  };
  // The I/O thread's: loaded `bytes` into `block`'s pages (through the staging ring for a device
  // pool); false when a device copy failed.
  bool WriteBlock(BlockId block, absl::Span<const uint8_t> bytes, size_t* staged);
  // The I/O thread's: the tiers' removals as events. Holds mu_.
  void TakeRemovedLocked();
  void Run();  // The I/O thread.
  uint8_t* Page(int64_t layer, BlockId block) const {
    return pool_ + static_cast<size_t>(layer * num_blocks_ + block) * spec_.PageBytes();
  }

  const std::vector<std::shared_ptr<KvTier>> tiers_;
  bool remote_ = false;  // Some tier is.
  const KvCacheSpec spec_;
  uint8_t* const pool_;
  const int64_t num_blocks_;
  const BlockHash model_;
  const bool events_enabled_;
  const std::unique_ptr<PoolDevice> store_device_, load_device_;
  // The store buffers and (device pools) the load staging ring: one aligned allocation, pinned.
  uint8_t* arena_ = nullptr;
  size_t arena_bytes_ = 0;
  bool arena_pinned_ = false;
  uint8_t* staging_ = nullptr;
  size_t staging_blocks_ = 0;
  KvOffloadStats stats_;      // The scheduler thread's.
  int64_t pending_loads_ = 0;  // The scheduler thread's: started, not yet polled.
  int64_t pending_blocks_ = 0;  // Their blocks.
  std::vector<Store> offered_;  // The scheduler thread's: copied (device: queued), not yet queued.

  std::mutex mu_;
  std::condition_variable wake_, done_cv_;
  std::deque<Load> loads_;
  std::deque<Store> stores_;
  std::vector<uint8_t*> free_buffers_;
  std::vector<LoadDone> finished_;
  double seconds_per_block_ = 0;  // The I/O thread's measure (mu_).
  int64_t blocks_measured_ = 0;
  std::vector<KvEvent> events_;  // Not yet drained.
  std::vector<KvTierKey> removed_;  // TakeRemovedLocked's scratch.
  int64_t stores_in_flight_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_ENGINE_KV_OFFLOAD_H_
