#include "common/kvcache/block_manager.h"

#include <algorithm>

#include "common/base/check.h"
#include "common/base/strings.h"

namespace pdserve {

BlockManager::BlockManager(int64_t num_blocks, int64_t block_size, bool enable_prefix_caching)
    : num_blocks_(num_blocks),
      block_size_(block_size),
      prefix_caching_(enable_prefix_caching),
      blocks_(num_blocks),
      index_(num_blocks) {  // Never more entries than blocks.
  PD_CHECK(num_blocks > 0 && block_size > 0);
  free_list_.reserve(num_blocks);
  // Lowest ids on top of the stack: allocation order is 0, 1, 2, ... on a fresh pool.
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_list_.push_back(static_cast<BlockId>(b));
  num_free_ = num_blocks;
}

absl::StatusOr<BlockManager::AdmitPlan> BlockManager::PlanAdmit(
    absl::Span<const BlockHash> prefix_hashes, int64_t max_cached_blocks, int64_t num_tokens,
    int64_t num_query_tokens) const {
  AdmitPlan plan;
  plan.num_query_tokens = num_query_tokens;
  int64_t reused_evictable = 0;
  if (prefix_caching_) {
    const int64_t limit = std::min<int64_t>(max_cached_blocks, prefix_hashes.size());
    for (int64_t i = 0; i < limit; ++i) {
      const BlockId b = Lookup(prefix_hashes[i]);
      if (b < 0) break;
      plan.cached_blocks.push_back(b);
      if (blocks_[b].ref == 0) ++reused_evictable;
    }
  }
  plan.num_cached_tokens = static_cast<int64_t>(plan.cached_blocks.size()) * block_size_;
  const int64_t blocks_total = (num_tokens + block_size_ - 1) / block_size_;
  plan.num_new_blocks = std::max<int64_t>(0, blocks_total - plan.cached_blocks.size());
  const int64_t available = num_free_ + num_cached_ - reused_evictable;
  if (plan.num_new_blocks > available) {
    return absl::ResourceExhaustedError(Str("KV cache: ", plan.num_new_blocks,
                                            " blocks needed, ", available, " available"));
  }
  return plan;
}

BlockManager::SeqBlocks* BlockManager::Find(SeqId seq) {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? nullptr : &slots_[static_cast<size_t>(it->second)];
}

const BlockManager::SeqBlocks* BlockManager::Find(SeqId seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? nullptr : &slots_[static_cast<size_t>(it->second)];
}

void BlockManager::CommitAdmit(SeqId seq, const AdmitPlan& plan, int64_t max_tokens) {
  auto [it, inserted] = seqs_.try_emplace(seq, -1);
  PD_CHECK_MSG(inserted, "CommitAdmit: sequence already has blocks");
  if (!free_slots_.empty()) {
    it->second = free_slots_.back();
    free_slots_.pop_back();
  } else {
    it->second = static_cast<int32_t>(slots_.size());
    slots_.emplace_back();
  }
  SeqBlocks& s = slots_[static_cast<size_t>(it->second)];
  s.owner = seq;
  s.live = true;
  s.table.reserve(std::max<size_t>(plan.cached_blocks.size() + plan.num_new_blocks,
                                   static_cast<size_t>((max_tokens + block_size_ - 1) / block_size_)));
  for (BlockId b : plan.cached_blocks) {
    BlockMeta& m = blocks_[b];
    PD_CHECK(m.hashed);
    if (m.ref == 0) {
      LruRemove(b);
      --num_cached_;
    }
    ++m.ref;
    s.table.push_back(b);
  }
  s.published = static_cast<int64_t>(plan.cached_blocks.size());
  for (int64_t i = 0; i < plan.num_new_blocks; ++i) s.table.push_back(TakeBlock());
  prefix_query_tokens_ += plan.num_query_tokens;
  prefix_hit_tokens_ += plan.num_cached_tokens;
}

int64_t BlockManager::BlocksBeyond(int64_t have, int64_t num_tokens) const {
  return std::max<int64_t>(0, (num_tokens + block_size_ - 1) / block_size_ - have);
}

int64_t BlockManager::BlocksNeeded(SeqId seq, int64_t num_tokens) const {
  const SeqBlocks* s = Find(seq);
  return BlocksBeyond(s == nullptr ? 0 : static_cast<int64_t>(s->table.size()), num_tokens);
}

absl::Status BlockManager::ReserveSlow(SeqId seq, int64_t num_tokens, int32_t* slot_hint,
                                       SeqBlocks* hinted) {
  SeqBlocks* s = hinted;
  if (s == nullptr) {
    auto it = seqs_.find(seq);
    PD_CHECK_MSG(it != seqs_.end(), "Reserve: unknown sequence");
    if (slot_hint != nullptr) *slot_hint = it->second;
    s = &slots_[static_cast<size_t>(it->second)];
  }
  const int64_t have = static_cast<int64_t>(s->table.size());
  if (num_tokens <= have * block_size_) return absl::OkStatus();  // No division on this path.
  const int64_t need = BlocksBeyond(have, num_tokens);
  if (need > NumAvailableBlocks()) {
    return absl::ResourceExhaustedError(
        Str("KV cache: ", need, " blocks needed, ", NumAvailableBlocks(), " available"));
  }
  for (int64_t i = 0; i < need; ++i) s->table.push_back(TakeBlock());
  return absl::OkStatus();
}

void BlockManager::Publish(SeqId seq, absl::Span<const BlockHash> hashes,
                           absl::Span<const int32_t> tokens,
                           std::vector<std::pair<BlockHash, BlockId>>* indexed,
                           std::string_view lora_name) {
  if (!prefix_caching_) return;
  SeqBlocks* found = Find(seq);
  PD_CHECK_MSG(found != nullptr, "Publish: unknown sequence");
  SeqBlocks& s = *found;
  const int64_t n = std::min<int64_t>(hashes.size(), s.table.size());
  for (int64_t i = s.published; i < n; ++i) {
    BlockMeta& m = blocks_[s.table[i]];
    if (m.hashed) continue;  // A reused block: already in the index.
    // If another block already holds this prefix (computed concurrently), keep that one; ours
    // stays unhashed and returns to the free list when released.
    if (Lookup(hashes[i]) < 0) {
      index_.Insert(hashes[i].lo, s.table[i]);
      m.hashed = true;
      m.hash = hashes[i];
      if (indexed != nullptr) indexed->emplace_back(hashes[i], s.table[i]);
      if (events_on_) {
        KvEvent e{KvEvent::Type::kStored, hashes[i], i > 0 ? hashes[i - 1] : BlockHash{}, {}};
        e.lora_name = lora_name;
        if (static_cast<int64_t>(tokens.size()) >= (i + 1) * block_size_) {
          e.tokens.assign(tokens.begin() + i * block_size_, tokens.begin() + (i + 1) * block_size_);
        }
        events_.push_back(std::move(e));
      }
    }
  }
  s.published = std::max(s.published, n);
}

void BlockManager::Free(SeqId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  SeqBlocks& s = slots_[static_cast<size_t>(it->second)];
  for (auto b = s.table.rbegin(); b != s.table.rend(); ++b) Release(*b);
  s.live = false;
  s.table.clear();  // Keeps its capacity for the slot's next sequence.
  s.published = 0;
  free_slots_.push_back(it->second);
  seqs_.erase(it);
}

void BlockManager::Truncate(SeqId seq, int64_t num_tokens) {
  SeqBlocks* found = Find(seq);
  if (found == nullptr) return;
  SeqBlocks& s = *found;
  const int64_t keep = std::max<int64_t>((num_tokens + block_size_ - 1) / block_size_, s.published);
  while (static_cast<int64_t>(s.table.size()) > keep) {
    Release(s.table.back());
    s.table.pop_back();
  }
}

absl::Span<const BlockId> BlockManager::BlockTable(SeqId seq) const {
  const SeqBlocks* s = Find(seq);
  if (s == nullptr) return {};
  return s->table;
}

KvCacheStats BlockManager::Stats() const {
  KvCacheStats s;
  s.total_blocks = num_blocks_;
  s.free_blocks = num_free_;
  s.cached_blocks = num_cached_;
  s.used_blocks = num_blocks_ - num_free_ - num_cached_;
  s.prefix_query_tokens = prefix_query_tokens_;
  s.prefix_hit_tokens = prefix_hit_tokens_;
  s.evictions = evictions_;
  return s;
}

BlockId BlockManager::TakeBlock() {
  BlockId b;
  if (!free_list_.empty()) {
    b = free_list_.back();
    free_list_.pop_back();
    --num_free_;
  } else {
    PD_CHECK_MSG(lru_oldest_ >= 0, "TakeBlock: no block (callers check availability first)");
    b = lru_oldest_;
    LruRemove(b);
    --num_cached_;
    BlockMeta& m = blocks_[b];
    index_.Erase(m.hash.lo, b);
    if (events_on_) events_.push_back({KvEvent::Type::kRemoved, m.hash, {}, {}});
    m.hashed = false;
    ++evictions_;
    // With a full pool every new block evicts one, and the victim's index entry and metadata
    // are cache misses: fetch the next eviction's now, one ahead (the new oldest block's
    // metadata was fetched by the eviction before; evictions that come back to back, as an
    // admission's do, still wait for theirs).
    if (lru_oldest_ >= 0) {
      const BlockMeta& next = blocks_[lru_oldest_];
      index_.Prefetch(next.hash.lo);
      if (next.lru_next >= 0) __builtin_prefetch(&blocks_[next.lru_next]);
    }
  }
  blocks_[b].ref = 1;
  return b;
}

void BlockManager::Release(BlockId b) {
  BlockMeta& m = blocks_[b];
  PD_CHECK_MSG(m.ref > 0, "Release: block not referenced (double free)");
  if (--m.ref > 0) return;
  if (m.hashed) {
    LruPushNewest(b);
    ++num_cached_;
  } else {
    free_list_.push_back(b);
    ++num_free_;
  }
}

void BlockManager::LruRemove(BlockId b) {
  BlockMeta& m = blocks_[b];
  if (m.lru_prev >= 0) blocks_[m.lru_prev].lru_next = m.lru_next; else lru_oldest_ = m.lru_next;
  if (m.lru_next >= 0) blocks_[m.lru_next].lru_prev = m.lru_prev; else lru_newest_ = m.lru_prev;
  m.lru_prev = m.lru_next = -1;
}

void BlockManager::LruPushNewest(BlockId b) {
  BlockMeta& m = blocks_[b];
  m.lru_prev = lru_newest_;
  m.lru_next = -1;
  if (lru_newest_ >= 0) blocks_[lru_newest_].lru_next = b; else lru_oldest_ = b;
  lru_newest_ = b;
}

void BlockManager::DrainEvents(std::vector<KvEvent>* out) {
  out->insert(out->end(), events_.begin(), events_.end());
  events_.clear();
}

std::vector<BlockHash> BlockManager::IndexedHashes() const {
  std::vector<BlockHash> out;
  out.reserve(static_cast<size_t>(index_.size()));
  index_.ForEach([&](uint64_t, BlockId b) { out.push_back(blocks_[static_cast<size_t>(b)].hash); });
  return out;
}

absl::Status BlockManager::CheckInvariants() const {
  std::vector<int32_t> refs(num_blocks_, 0);
  int64_t live_slots = 0;
  for (const SeqBlocks& s : slots_) live_slots += s.live ? 1 : 0;
  if (live_slots != static_cast<int64_t>(seqs_.size()) ||
      live_slots + static_cast<int64_t>(free_slots_.size()) != static_cast<int64_t>(slots_.size())) {
    return absl::InternalError("sequence slots disagree with the sequence index");
  }
  for (const auto& [seq, slot] : seqs_) {
    const SeqBlocks& s = slots_[static_cast<size_t>(slot)];
    if (!s.live || s.owner != seq) return absl::InternalError(Str("seq ", seq, ": slot ", slot, " not its own"));
    for (BlockId b : s.table) {
      if (b < 0 || b >= num_blocks_) return absl::InternalError(Str("seq ", seq, ": bad block ", b));
      ++refs[b];
    }
  }
  std::vector<int> state(num_blocks_, 0);  // 1 free, 2 cached
  for (BlockId b : free_list_) {
    if (state[b] != 0) return absl::InternalError(Str("block ", b, " twice on the free list"));
    state[b] = 1;
  }
  int64_t lru_count = 0;
  BlockId prev = -1;
  for (BlockId b = lru_oldest_; b >= 0; b = blocks_[b].lru_next) {
    if (state[b] != 0) return absl::InternalError(Str("block ", b, " both free and cached"));
    if (blocks_[b].lru_prev != prev) return absl::InternalError("broken LRU back link");
    state[b] = 2;
    prev = b;
    if (++lru_count > num_blocks_) return absl::InternalError("LRU cycle");
  }
  if (prev != lru_newest_) return absl::InternalError("LRU tail mismatch");
  if (static_cast<int64_t>(free_list_.size()) != num_free_ || lru_count != num_cached_) {
    return absl::InternalError("free/cached counters disagree with the lists");
  }
  for (int64_t b = 0; b < num_blocks_; ++b) {
    const BlockMeta& m = blocks_[b];
    if (m.ref != refs[b]) {
      return absl::InternalError(Str("block ", b, ": ref ", m.ref, " but ", refs[b], " tables"));
    }
    if (m.ref > 0 && state[b] != 0) return absl::InternalError(Str("block ", b, " used and listed"));
    if (m.ref == 0 && state[b] == 0) return absl::InternalError(Str("block ", b, " leaked"));
    if (state[b] == 2 && !m.hashed) return absl::InternalError(Str("block ", b, " cached unhashed"));
    if (state[b] == 1 && m.hashed) return absl::InternalError(Str("block ", b, " free but hashed"));
    if (m.hashed) {
      if (Lookup(m.hash) != b) {
        return absl::InternalError(Str("block ", b, " hashed but not indexed"));
      }
    }
  }
  absl::Status stale = absl::OkStatus();
  int64_t hashed = 0;
  for (const BlockMeta& m : blocks_) hashed += m.hashed ? 1 : 0;
  if (index_.size() != hashed) stale = absl::InternalError(Str("index holds ", index_.size(), " entries for ", hashed, " hashed blocks"));
  index_.ForEach([&](uint64_t lo, BlockId b) {
    if (stale.ok() && (b < 0 || b >= num_blocks_ || !blocks_[b].hashed || blocks_[b].hash.lo != lo)) {
      stale = absl::InternalError(Str("index entry for block ", b, " is stale"));
    }
  });
  if (!stale.ok()) return stale;
  return absl::OkStatus();
}

}  // namespace pdserve
