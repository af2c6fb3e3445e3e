// The prefix cache's index: which block holds the KV of a published block hash.
//
// Open addressing with linear probing over 16-byte entries (the hash's low 64 bits and the
// block), at a power-of-two capacity of at least twice the entries it may hold, so a probe
// usually reads one cache line. The caller keeps each block's whole hash beside the block and
// confirms a match (`same`); the index never stores more than it needs to find the candidates.
// An entry's place follows from its hash alone, so the line can be prefetched exactly before it
// is needed (BlockManager does so for the next block it will evict and for blocks about to be
// published): with pools of tens of thousands of blocks that line is otherwise a miss, and a
// general-purpose map reads a control group and then a slot, two dependent misses.
// Deletion shifts the rest of the run back (no tombstones, nothing to clean up later).
#ifndef PDSERVE_COMMON_KVCACHE_BLOCK_HASH_INDEX_H_
#define PDSERVE_COMMON_KVCACHE_BLOCK_HASH_INDEX_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace pdserve {

class BlockHashIndex {
 public:
  using Block = int32_t;

  // Room for `max_entries` entries (more are a bug of the caller's, checked).
  explicit BlockHashIndex(int64_t max_entries);

  // The block whose entry has this `lo` and for which same(block) holds, or -1.
  template <typename Same>
  Block Find(uint64_t lo, Same same) const {
    for (size_t i = Home(lo);; i = (i + 1) & mask_) {
      const Entry& e = entries_[i];
      if (e.block < 0) return -1;
      if (e.lo == lo && same(e.block)) return e.block;
    }
  }
  // Adds (lo -> block); the caller has found no equal entry.
  void Insert(uint64_t lo, Block block);
  // Removes block's entry, which must be there under `lo`.
  void Erase(uint64_t lo, Block block);
  // Brings the line where `lo`'s probe starts towards the core.
  void Prefetch(uint64_t lo) const { __builtin_prefetch(&entries_[Home(lo)]); }

  int64_t size() const { return size_; }
  // f(lo, block) for every entry, in no particular order.
  template <typename F>
  void ForEach(F f) const {
    for (const Entry& e : entries_) {
      if (e.block >= 0) f(e.lo, e.block);
    }
  }

 private:
  struct Entry {
    uint64_t lo = 0;
    Block block = -1;  // -1: empty.
  };
  // Fibonacci hashing: the top bits of lo times 2^64 / phi (tests use small, regular hashes).
  size_t Home(uint64_t lo) const { return static_cast<size_t>((lo * 0x9E3779B97F4A7C15ull) >> shift_); }

  std::vector<Entry> entries_;
  size_t mask_ = 0;
  int shift_ = 0;
  int64_t size_ = 0;
  int64_t max_entries_ = 0;
};

}  // namespace pdserve

#endif  // PDSERVE_COMMON_KVCACHE_BLOCK_HASH_INDEX_H_
