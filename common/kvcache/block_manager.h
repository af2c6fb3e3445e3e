// Allocation of KV blocks to sequences, with prefix reuse.
//
// Every block is in exactly one state:
//   free    - ref 0, no hash; on the free list.
//   cached  - ref 0, holds the KV of a published prefix (has a hash); on the LRU list, evictable.
//   used    - ref > 0; in the block table of one or more sequences (more than one when a cached
//             prefix is shared).
// A sequence's full blocks are published (hash -> block) once their KV is computed, so later
// requests with the same prefix reuse them and skip their compute. When free blocks run out,
// the least recently released cached block is evicted.
//
// Allocation is plan-then-commit: PlanAdmit inspects, CommitAdmit applies, and nothing changes in
// between or when a plan fails. Not thread-safe: owned by the worker's scheduler thread.
#ifndef PDSERVE_COMMON_KVCACHE_BLOCK_MANAGER_H_
#define PDSERVE_COMMON_KVCACHE_BLOCK_MANAGER_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/kvcache/block_hash.h"
#include "common/kvcache/block_hash_index.h"

namespace pdserve {

using BlockId = int32_t;
using SeqId = int64_t;

// Documented counters; exported by the metrics layer, read by the router's load reports.
struct KvCacheStats {
  int64_t total_blocks = 0;
  int64_t free_blocks = 0;    // Never used or released without a hash.
  int64_t cached_blocks = 0;  // Released, reusable by prefix, evictable.
  int64_t used_blocks = 0;    // Referenced by running sequences.
  int64_t prefix_query_tokens = 0;  // Prompt tokens looked up in the prefix cache.
  int64_t prefix_hit_tokens = 0;    // Of which found cached.
  int64_t evictions = 0;
  double hit_rate() const {
    return prefix_query_tokens == 0 ? 0.0
                                    : static_cast<double>(prefix_hit_tokens) / prefix_query_tokens;
  }
  // Fraction of blocks that running sequences hold (vLLM's kv_cache_usage_perc).
  double usage() const {
    return total_blocks == 0 ? 0.0 : static_cast<double>(used_blocks) / total_blocks;
  }
};

// A change to the set of reusable prefix blocks, for routers that track workers' caches. A
// stored block also names its parent (the previous block's hash; BlockHash{} for a prompt's
// first block) and, when the publisher was given them, its tokens (for consumers that key blocks
// by their own hash of the tokens, as vLLM's KV event stream allows).
struct KvEvent {
  enum class Type { kStored, kRemoved };
  Type type;
  BlockHash hash;
  BlockHash parent;
  std::vector<int32_t> tokens;  // Stored only: block_size tokens, or empty.
  // Where the block is (vLLM's `medium`): null for the pool (the publisher's medium, "CPU" or
  // "GPU"); a KV cache tier's KvTier::event_medium() ("DISK", "STORE") otherwise.
  const char* medium = nullptr;
  std::string lora_name;  // Stored only: the LoRA adapter whose KV it is ("": the base model).
};

class BlockManager {
 public:
  BlockManager(int64_t num_blocks, int64_t block_size, bool enable_prefix_caching);

  struct AdmitPlan {
    std::vector<BlockId> cached_blocks;  // Reused prefix, in order.
    int64_t num_cached_tokens = 0;
    int64_t num_new_blocks = 0;
    int64_t num_query_tokens = 0;
  };
  // Plans a new sequence that must hold `num_tokens` tokens after its first step. `prefix_hashes`
  // are the hashes of the prompt's full blocks; at most `max_cached_blocks` of them are reused
  // (the caller keeps at least one token to compute). ResourceExhausted when the blocks cannot be
  // found even by evicting every cached block the plan does not reuse.
  absl::StatusOr<AdmitPlan> PlanAdmit(absl::Span<const BlockHash> prefix_hashes,
                                      int64_t max_cached_blocks, int64_t num_tokens,
                                      int64_t num_query_tokens) const;
  // Applies a plan made by PlanAdmit against the current state. `seq` must be new.
  // `max_tokens` (optional): the most tokens the sequence may reach, so its block table is sized
  // once and decode never grows it.
  void CommitAdmit(SeqId seq, const AdmitPlan& plan, int64_t max_tokens = 0);

  // Grows `seq`'s block table to hold `num_tokens`. ResourceExhausted, with nothing changed, when
  // there are not enough free + evictable blocks. `slot_hint` (optional, the caller's per-sequence
  // int initialised to -1): where the sequence's table was last found, so that the scheduler's
  // call for every running sequence every step skips the hash lookup. A stale hint is detected
  // (each slot records its owner) and replaced, never trusted.
  absl::Status Reserve(SeqId seq, int64_t num_tokens, int32_t* slot_hint = nullptr) {
    SeqBlocks* s = FromHint(seq, slot_hint);
    if (s != nullptr && num_tokens <= static_cast<int64_t>(s->table.size()) * block_size_) {
      return absl::OkStatus();  // The common case, inline: no lookup, no call.
    }
    return ReserveSlow(seq, num_tokens, slot_hint, s);
  }
  // Number of blocks Reserve would need to take.
  int64_t BlocksNeeded(SeqId seq, int64_t num_tokens) const;

  // Publishes `seq`'s full blocks whose KV is computed: hashes[i] is the hash of block i.
  // `tokens` (the sequence's tokens, at least hashes.size() blocks of them, or empty) go into the
  // stored events. `indexed` (optional): each block this call put in the prefix index, appended
  // (the KV tiers' offer). `lora_name`: the adapter the sequence runs with, for the events.
  void Publish(SeqId seq, absl::Span<const BlockHash> hashes,
               absl::Span<const int32_t> tokens = {},
               std::vector<std::pair<BlockHash, BlockId>>* indexed = nullptr,
               std::string_view lora_name = {});

  // A hint: the prefix index's entry for `hash` will be looked up soon (Publish, PlanAdmit).
  void PrefetchIndex(const BlockHash& hash) const { index_.Prefetch(hash.lo); }

  // Releases `seq`'s blocks (last block first, so a prompt's tail is evicted before its head).
  void Free(SeqId seq);
  // Releases the blocks of `seq` past the first `num_tokens` tokens (speculative positions that
  // were rejected). Published blocks are never released here: `num_tokens` must cover them.
  void Truncate(SeqId seq, int64_t num_tokens);

  bool Has(SeqId seq) const { return seqs_.contains(seq); }
  absl::Span<const BlockId> BlockTable(SeqId seq) const;
  // Free plus evictable blocks.
  int64_t NumAvailableBlocks() const { return num_free_ + num_cached_; }
  int64_t block_size() const { return block_size_; }
  int64_t num_blocks() const { return num_blocks_; }
  KvCacheStats Stats() const;

  // Event log of the prefix index (a hash published, a cached block evicted). Off by default;
  // when on, the owner drains it regularly.
  void EnableEvents(bool on) { events_on_ = on; }
  void DrainEvents(std::vector<KvEvent>* out);
  // Every hash a new sequence could reuse now.
  std::vector<BlockHash> IndexedHashes() const;

  // Verifies every invariant (ref counts equal table occurrences, each block in exactly one
  // state, index and hashes agree). For tests; O(num_blocks + table sizes).
  absl::Status CheckInvariants() const;

 private:
  struct BlockMeta {
    int32_t ref = 0;
    bool hashed = false;
    BlockHash hash;
    // LRU links (valid while cached): prev towards the oldest, next towards the newest.
    BlockId lru_prev = -1;
    BlockId lru_next = -1;
  };
  // One cache line each: Reserve's inline check reads owner, live and the table's size.
  struct alignas(64) SeqBlocks {
    SeqId owner = 0;
    std::vector<BlockId> table;
    bool live = false;
    int64_t published = 0;  // Leading blocks already offered to the prefix index.
  };

  // The table the hint names if it is still `seq`'s, else null.
  SeqBlocks* FromHint(SeqId seq, const int32_t* slot_hint) {
    if (slot_hint == nullptr || static_cast<size_t>(static_cast<uint32_t>(*slot_hint)) >= slots_.size()) {
      return nullptr;
    }
    SeqBlocks& s = slots_[static_cast<size_t>(*slot_hint)];
    return s.live && s.owner == seq ? &s : nullptr;
  }
  // Reserve past its inline case; `hinted`: FromHint's answer (null: look the sequence up).
  absl::Status ReserveSlow(SeqId seq, int64_t num_tokens, int32_t* slot_hint, SeqBlocks* hinted);
  // The live table of `seq`, or null.
  SeqBlocks* Find(SeqId seq);
  const SeqBlocks* Find(SeqId seq) const;
  // The index's block whose whole hash is `hash`, or -1.
  BlockId Lookup(const BlockHash& hash) const {
    return index_.Find(hash.lo, [&](BlockId b) { return blocks_[static_cast<size_t>(b)].hash == hash; });
  }
  // Blocks a table of `have` blocks lacks to hold `num_tokens`.
  int64_t BlocksBeyond(int64_t have, int64_t num_tokens) const;
  BlockId TakeBlock();  // From the free list, else evicts the oldest cached block.
  void Release(BlockId b);
  void LruRemove(BlockId b);
  void LruPushNewest(BlockId b);

  const int64_t num_blocks_;
  const int64_t block_size_;
  const bool prefix_caching_;
  std::vector<BlockMeta> blocks_;
  std::vector<BlockId> free_list_;  // Stack.
  int64_t num_free_ = 0;
  int64_t num_cached_ = 0;
  BlockId lru_oldest_ = -1;
  BlockId lru_newest_ = -1;
  BlockHashIndex index_;  // Published hash -> block (the hashed blocks, used or cached).
  // Sequences' tables live in slots (reused, so they stay few and warm); seqs_ finds a slot.
  std::vector<SeqBlocks> slots_;
  std::vector<int32_t> free_slots_;
  absl::flat_hash_map<SeqId, int32_t> seqs_;
  bool events_on_ = false;
  std::vector<KvEvent> events_;
  int64_t prefix_query_tokens_ = 0;
  int64_t prefix_hit_tokens_ = 0;
  int64_t evictions_ = 0;
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_KVCACHE_BLOCK_MANAGER_H_
